package notify

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/poller"
	"github.com/image-refresh/image-refresh/internal/registry"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

const secret = "n0tify-s3cret-5d1e9a7c44b2"

// world is a real poller on a real test registry behind the handler.
// Every ask of the registry is reported on asked (after it was answered);
// kicks counts the handler's calls of Kick.
type world struct {
	t       *testing.T
	reg     *testregistry.Server
	poller  *poller.Poller
	handler *Handler
	metrics *Metrics
	logs    *bytes.Buffer
	asked   chan string
	changed chan string

	mu    sync.Mutex
	kicks int
}

func (w *world) Kick(match func(config.Image) bool, delay time.Duration) ([]string, bool) {
	w.mu.Lock()
	w.kicks++
	w.mu.Unlock()
	return w.poller.Kick(match, delay)
}

func (w *world) kickCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.kicks
}

// newWorld pushes acme/api:prod and acme/web:prod, starts the poller (an
// hour's interval: only a kick asks again) and waits for its first asks.
func newWorld(t *testing.T) *world {
	reg := testregistry.Start(t)
	res, err := registry.NewResolver(registry.Options{Hosts: []registry.HostConfig{{Host: reg.Host(), Insecure: true}}, UserAgent: "image-refresh/test"})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, reg: reg, logs: &bytes.Buffer{}, asked: make(chan string, 100), changed: make(chan string, 100)}
	// Only changes after the first answers count. A key's first answer is
	// a change too, reported after its ask was (Resolve returns first):
	// they go to first, and newWorld waits for both before arming.
	var armed atomic.Bool
	first := make(chan string, 2)
	w.poller = &poller.Poller{Interval: time.Hour, Resolve: func(ctx context.Context, img config.Image) (string, error) {
		defer func() { w.asked <- poller.Key(img) }()
		return res.Latest(ctx, img.Repository, img.Tag, nil)
	}, OnChange: func(k string) {
		if armed.Load() {
			w.changed <- k
			return
		}
		first <- k
	}}
	reg.MustPushRandomImage(t, "acme/api", "prod")
	reg.MustPushRandomImage(t, "acme/web", "prod")
	w.poller.Add(
		config.Image{Name: "api", Repository: reg.Host() + "/acme/api", Tag: "prod"},
		config.Image{Name: "web", Repository: reg.Host() + "/acme/web", Tag: "prod"},
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.poller.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	for range 2 { // the first asks of both, in either order
		testwait.Recv(t, w.asked, "the poller's first asks")
	}
	for range 2 {
		testwait.Recv(t, first, "the poller's first answers to be reported")
	}
	armed.Store(true)
	w.metrics = NewMetrics(prometheus.NewRegistry())
	w.handler = NewHandler(secret, w, w.metrics, slog.New(slog.NewTextHandler(w.logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	// The settle delay is the poller's to prove (internal/poller); these
	// tests count asks, and the real registry has no tag race.
	w.handler.Delay = 0
	return w
}

func (w *world) key(name string) string { return w.reg.Host() + "/acme/" + name + ":prod" }

func (w *world) waitAsked(key string) {
	w.t.Helper()
	for testwait.Recv(w.t, w.asked, "the registry to be asked for "+key) != key {
	}
}

// barrier kicks acme/web:prod through the handler and waits for its ask:
// the poller asks one key at a time, so every ask kicked before has ended
// (OnChange included).
func (w *world) barrier() {
	w.t.Helper()
	if code := w.post("/distribution", bearer(secret), distributionPush(w.reg.Host(), "acme/web", "prod")); code != http.StatusAccepted {
		w.t.Fatalf("barrier: %d", code)
	}
	w.waitAsked(w.key("web"))
}

func (w *world) post(path string, header http.Header, body string) int {
	w.t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	w.handler.ServeHTTP(rec, req)
	return rec.Code
}

func (w *world) heads(name string) int { return w.reg.Count("HEAD", "/acme/"+name+"/manifests/prod") }

func bearer(s string) http.Header { return http.Header{"Authorization": {"Bearer " + s}} }

// distributionPush is the envelope Distribution sends for a manifest push
// by tag; the digest in it is a forgery (all zeros) that must never count.
func distributionPush(host, repo, tag string) string {
	return fmt.Sprintf(`{"events":[{"action":"push","target":{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%064d","repository":%q,"tag":%q},"request":{"host":%q,"method":"PUT"}}]}`, 0, repo, tag, host)
}

func TestNotify_R1_AForgedPushOfAKnownImageCostsExactlyOneHeadAndChangesNothing(t *testing.T) {
	w := newWorld(t)
	api := config.Image{Name: "api", Repository: w.reg.Host() + "/acme/api", Tag: "prod"}
	before := w.poller.Latest(context.Background(), api, nil).Digest
	w.reg.ResetRequests()

	if code := w.post("/distribution", bearer(secret), distributionPush(w.reg.Host(), "acme/api", "prod")); code != http.StatusAccepted {
		t.Fatalf("forged push: %d, want 202", code)
	}
	w.waitAsked(w.key("api"))
	w.barrier()
	if n := w.heads("api"); n != 1 {
		t.Errorf("%d HEADs of acme/api:prod for one notification, want exactly 1", n)
	}
	select {
	case k := <-w.changed:
		t.Errorf("a change was reported for %s: the digest did not move", k)
	default:
	}
	if got := w.poller.Latest(context.Background(), api, nil).Digest; got != before || strings.Contains(got, "000000") {
		t.Errorf("latest %s after the forged push, want %s (the registry's answer, never the body's)", got, before)
	}
	if got := count(w.metrics.Hints, "distribution", "accepted"); got != 2 {
		t.Errorf("accepted hints %v, want 2 (the forged push and the barrier)", got)
	}
}

func TestNotify_APushOfANewDigestIsSeenAtOnceNotAtTheNextInterval(t *testing.T) {
	w := newWorld(t)
	next := w.reg.MustPushRandomImage(t, "acme/api", "prod")
	if code := w.post("/distribution", bearer(secret), distributionPush(w.reg.Host(), "acme/api", "prod")); code != http.StatusAccepted {
		t.Fatalf("push notification: %d, want 202", code)
	}
	if k := testwait.Recv(t, w.changed, "the new digest to be seen (the poll interval is an hour)"); k != w.key("api") {
		t.Errorf("change reported for %s", k)
	}
	api := config.Image{Name: "api", Repository: w.reg.Host() + "/acme/api", Tag: "prod"}
	if got := w.poller.Latest(context.Background(), api, nil).Digest; got != next {
		t.Errorf("latest %s, want the pushed %s", got, next)
	}
}

func TestNotify_AuthMissingOrWrongIs401AndAsksNothing(t *testing.T) {
	w := newWorld(t)
	body := distributionPush(w.reg.Host(), "acme/api", "prod")
	for _, tc := range []struct {
		name, path string
		header     http.Header
	}{
		{"no Authorization", "/distribution", nil},
		{"a wrong bearer", "/distribution", bearer("wrong-" + secret)},
		{"a prefix of the secret", "/distribution", bearer(secret[:len(secret)-1])},
		{"basic auth with the secret", "/distribution", http.Header{"Authorization": {"Basic " + secret}}},
		{"a wrong path secret", "/hooks/wrong-" + secret + "/distribution", nil},
		{"an empty path secret", "/hooks//distribution", bearer("x")},
		{"a GitHub signature on another sender", "/distribution", http.Header{"X-Hub-Signature-256": {sign(secret, body)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code := w.post(tc.path, tc.header, body); code != http.StatusUnauthorized && code != http.StatusNotFound {
				t.Errorf("answered %d, want 401", code)
			}
		})
	}
	if n := w.kickCount(); n != 0 {
		t.Errorf("%d kicks from unauthenticated requests, want 0", n)
	}
	if got := count(w.metrics.Rejected, "distribution", "auth"); got != 6 {
		t.Errorf("rejected{reason=auth} %v, want 6", got)
	}
	if strings.Contains(w.logs.String(), secret) {
		t.Errorf("R20: the secret is in the logs:\n%s", w.logs)
	}
}

func TestNotify_APathSecretAuthenticatesSendersThatCannotSetAHeader(t *testing.T) {
	w := newWorld(t)
	w.reg.ResetRequests()
	hub := fmt.Sprintf(`{"push_data":{"tag":"prod"},"repository":{"repo_name":"acme/api"}}`)
	// Docker Hub names docker.io: no managed image, so ignored, but authenticated.
	if code := w.post("/hooks/"+secret+"/dockerhub", nil, hub); code != http.StatusAccepted {
		t.Fatalf("path secret: %d, want 202", code)
	}
	if code := w.post("/hooks/"+secret+"/distribution", nil, distributionPush(w.reg.Host(), "acme/api", "prod")); code != http.StatusAccepted {
		t.Fatalf("path secret: %d, want 202", code)
	}
	w.waitAsked(w.key("api"))
	if got := count(w.metrics.Hints, "dockerhub", "ignored-unknown"); got != 1 {
		t.Errorf("dockerhub ignored-unknown %v, want 1", got)
	}
}

func sign(key, body string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(body))
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

func TestNotify_GitHubIsAuthenticatedByItsHMACSignature(t *testing.T) {
	w := newWorld(t)
	body := `{"action":"published","package":{"name":"api","namespace":"acme","package_type":"CONTAINER","package_version":{"container_metadata":{"tag":{"name":"prod"}}}}}`
	event := func(sig string) http.Header {
		return http.Header{"X-Github-Event": {"package"}, "X-Hub-Signature-256": {sig}}
	}
	for _, tc := range []struct {
		name   string
		header http.Header
		want   int
	}{
		{"signed with the secret", event(sign(secret, body)), http.StatusAccepted},
		{"signed with another key", event(sign("another-key-0123456789", body)), http.StatusUnauthorized},
		{"signed over another body", event(sign(secret, body+" ")), http.StatusUnauthorized},
		{"a sha1 signature", event(strings.Replace(sign(secret, body), "sha256=", "sha1=", 1)), http.StatusUnauthorized},
		{"not hex", event("sha256=zz"), http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code := w.post("/github", tc.header, body); code != tc.want {
				t.Errorf("answered %d, want %d", code, tc.want)
			}
		})
	}
	if n := w.kickCount(); n != 1 {
		t.Errorf("%d kicks, want 1 (the good signature only)", n)
	}
	if got := count(w.metrics.Hints, "github", "ignored-unknown"); got != 1 {
		t.Errorf("github ignored-unknown %v, want 1 (ghcr.io/acme/api is not managed here)", got)
	}
}

func TestNotify_AnUnknownRepositoryIsIgnoredAndCounted(t *testing.T) {
	w := newWorld(t)
	w.reg.ResetRequests()
	for _, body := range []string{
		distributionPush(w.reg.Host(), "acme/other", "prod"), // another repository
		distributionPush(w.reg.Host(), "acme/api", "dev"),    // another tag
		distributionPush("127.0.0.2:1", "acme/api", "prod"),  // another registry
	} {
		if code := w.post("/distribution", bearer(secret), body); code != http.StatusAccepted {
			t.Fatalf("answered %d, want 202 (a sender must not retry an ignored event)", code)
		}
	}
	w.barrier()
	if got := count(w.metrics.Hints, "distribution", "ignored-unknown"); got != 3 {
		t.Errorf("ignored-unknown %v, want 3", got)
	}
	if n := w.heads("api") + w.heads("other"); n != 0 {
		t.Errorf("%d HEADs for unknown images, want 0", n)
	}
}

func TestNotify_AnOversizeBodyIsRefusedWith413(t *testing.T) {
	w := newWorld(t)
	big := `{"events":[],"pad":"` + strings.Repeat("x", MaxBody) + `"}`
	if code := w.post("/distribution", bearer(secret), big); code != http.StatusRequestEntityTooLarge {
		t.Errorf("answered %d, want 413", code)
	}
	// GitHub's body is read before its signature is checked: still limited.
	if code := w.post("/github", http.Header{"X-Github-Event": {"package"}, "X-Hub-Signature-256": {sign(secret, big)}}, big); code != http.StatusRequestEntityTooLarge {
		t.Errorf("signed GitHub body: answered %d, want 413", code)
	}
	if got := count(w.metrics.Rejected, "distribution", "size"); got != 1 {
		t.Errorf("rejected{reason=size} %v, want 1", got)
	}
	if n := w.kickCount(); n != 0 {
		t.Errorf("%d kicks, want 0", n)
	}
}

func TestNotify_OtherRequestsAreRefused(t *testing.T) {
	w := newWorld(t)
	if code := w.post("/distribution", bearer(secret), `{"events":`); code != http.StatusBadRequest {
		t.Errorf("malformed body: %d, want 400", code)
	}
	if code := w.post("/quay", bearer(secret), `{}`); code != http.StatusNotFound {
		t.Errorf("unknown sender: %d, want 404", code)
	}
	req := httptest.NewRequest(http.MethodGet, "/distribution", nil)
	req.Header.Set("Authorization", "Bearer "+secret)
	rec := httptest.NewRecorder()
	w.handler.ServeHTTP(rec, req)
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d, want 405", rec.Code)
	}
}

func TestNotify_AStandbyAnswers503SoTheSenderRetries(t *testing.T) {
	p := &poller.Poller{Interval: time.Hour}
	p.Add(config.Image{Name: "api", Repository: "r.example/acme/api", Tag: "prod"})
	h := NewHandler(secret, p, NewMetrics(prometheus.NewRegistry()), slog.New(slog.NewTextHandler(io.Discard, nil)))
	req := httptest.NewRequest(http.MethodPost, "/distribution", strings.NewReader(distributionPush("r.example", "acme/api", "prod")))
	req.Header.Set("Authorization", "Bearer "+secret)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("standby answered %d, want 503", rec.Code)
	}
}

func TestNotify_HintsMatchImagesAsTheirNamesNormalise(t *testing.T) {
	h := NewHandler(secret, nil, NewMetrics(prometheus.NewRegistry()), slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, tc := range []struct {
		hint      Hint
		repo, tag string
		want      bool
	}{
		{Hint{"docker.io/library/nginx", "1"}, "nginx", "1", true},
		{Hint{"docker.io/acme/api", "prod"}, "acme/api", "prod", true},
		{Hint{"docker.io/acme/api", "prod"}, "index.docker.io/acme/api", "prod", true},
		{Hint{"ghcr.io/acme/api", "prod"}, "ghcr.io/acme/api", "prod", true},
		{Hint{"ghcr.io/acme/api", "prod"}, "docker.io/acme/api", "prod", false},
		{Hint{"r.example:5000/acme/api", "prod"}, "r.example/acme/api", "prod", false},
		{Hint{"r.example/acme/api", "Prod"}, "r.example/acme/api", "prod", false},
		{Hint{"not a repository", "prod"}, "r.example/acme/api", "prod", false},
	} {
		if got := h.matcher(tc.hint)(config.Image{Repository: tc.repo, Tag: tc.tag}); got != tc.want {
			t.Errorf("hint %s matches %s:%s: %v, want %v", tc.hint, tc.repo, tc.tag, got, tc.want)
		}
	}
}

func count(c *prometheus.CounterVec, labels ...string) float64 {
	var m dto.Metric
	if err := c.WithLabelValues(labels...).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
