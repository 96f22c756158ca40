package registry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"

	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

func newResolver(t *testing.T, opts Options) *Resolver {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	r, err := NewResolver(opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// wantKind fails unless err is an *Error of kind want, and returns it.
func wantKind(t *testing.T, err error, want ErrorKind) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v (%T), want an *Error of kind %s", err, err, want)
	}
	if e.Kind != want {
		t.Fatalf("kind = %s, want %s (err: %v)", e.Kind, want, err)
	}
	return e
}

// staticKeychain hands out one username/password for one registry host.
type staticKeychain struct{ host, user, pass string }

func (k staticKeychain) Resolve(res authn.Resource) (authn.Authenticator, error) {
	if res.RegistryStr() != k.host {
		return authn.Anonymous, nil
	}
	return authn.FromConfig(authn.AuthConfig{Username: k.user, Password: k.pass}), nil
}

func TestLatest_R1_SingleArchDigest(t *testing.T) {
	s := testregistry.Start(t)
	r := newResolver(t, Options{})
	for _, tc := range []struct {
		name string
		push func(tag string) string
	}{
		{"docker v2 manifest", func(tag string) string { return s.MustPushRandomImage(t, "acme/api", tag) }},
		{"oci manifest", func(tag string) string { return s.MustPushRandomOCIImage(t, "acme/api", tag) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tag := strings.ReplaceAll(tc.name, " ", "-")
			want := tc.push(tag)
			got, err := r.Latest(context.Background(), s.Host()+"/acme/api", tag, nil)
			if err != nil || got != want {
				t.Fatalf("Latest = %q, %v; want %q", got, err, want)
			}
		})
	}
}

func TestLatest_R1_IndexDigestForMultiArchTag(t *testing.T) {
	s := testregistry.Start(t)
	want := s.MustPushRandomIndex(t, "acme/api", "prod", 3)
	got, err := newResolver(t, Options{}).Latest(context.Background(), s.Host()+"/acme/api", "prod", nil)
	if err != nil || got != want {
		t.Fatalf("Latest = %q, %v; want the index digest %q", got, err, want)
	}
}

func TestLatest_R1_FollowsTagMove(t *testing.T) {
	s := testregistry.Start(t)
	r := newResolver(t, Options{})
	s.MustPushRandomImage(t, "acme/api", "prod")
	next := s.MustPushRandomImage(t, "acme/api", "next")
	s.MustTag(t, "acme/api", "prod", next)
	if got, err := r.Latest(context.Background(), s.Host()+"/acme/api", "prod", nil); err != nil || got != next {
		t.Fatalf("after the tag moved: Latest = %q, %v; want %q", got, err, next)
	}
}

func TestLatest_C2_ExactlyOneHeadPerCall(t *testing.T) {
	s := testregistry.Start(t)
	s.MustPushRandomIndex(t, "acme/api", "prod", 2)
	r := newResolver(t, Options{})
	for i := 1; i <= 3; i++ {
		if _, err := r.Latest(context.Background(), s.Host()+"/acme/api", "prod", nil); err != nil {
			t.Fatal(err)
		}
		if n := s.Count(http.MethodHead, "/v2/acme/api/manifests/prod"); n != i {
			t.Fatalf("after %d calls: %d HEADs", i, n)
		}
	}
	if n := s.Count(http.MethodGet, "/manifests/"); n != 0 {
		t.Errorf("%d manifest GETs, want none (a HEAD is enough)", n)
	}
}

func TestLatest_R1_FailuresAreClassifiedAndNotRetried(t *testing.T) {
	for _, tc := range []struct {
		name       string
		fault      *testregistry.Fault
		tag        string
		kind       ErrorKind
		status     int
		retryAfter time.Duration
	}{
		{name: "unknown tag", tag: "missing", kind: KindNotFound, status: 404},
		{name: "401", fault: &testregistry.Fault{Status: 401}, kind: KindUnauthorized, status: 401},
		{name: "403", fault: &testregistry.Fault{Status: 403}, kind: KindUnauthorized, status: 403},
		{name: "429 with Retry-After", fault: &testregistry.Fault{Status: 429, RetryAfter: "7"}, kind: KindRateLimited, status: 429, retryAfter: 7 * time.Second},
		{name: "429 without Retry-After", fault: &testregistry.Fault{Status: 429}, kind: KindRateLimited, status: 429},
		{name: "500", fault: &testregistry.Fault{Status: 500}, kind: KindServerError, status: 500},
		{name: "502", fault: &testregistry.Fault{Status: 502}, kind: KindServerError, status: 502},
		{name: "503 with Retry-After", fault: &testregistry.Fault{Status: 503, RetryAfter: "3"}, kind: KindServerError, status: 503, retryAfter: 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testregistry.Start(t)
			s.MustPushRandomImage(t, "acme/api", "prod")
			if tc.fault != nil {
				s.SetFault(*tc.fault)
			}
			tag := tc.tag
			if tag == "" {
				tag = "prod"
			}
			got, err := newResolver(t, Options{}).Latest(context.Background(), s.Host()+"/acme/api", tag, nil)
			if got != "" {
				t.Errorf("Latest returned digest %q with an error", got)
			}
			e := wantKind(t, err, tc.kind)
			if e.Status != tc.status || e.RetryAfter != tc.retryAfter {
				t.Errorf("status %d, RetryAfter %s; want %d, %s", e.Status, e.RetryAfter, tc.status, tc.retryAfter)
			}
			if n := s.Count(http.MethodHead, "/manifests/"); n != 1 {
				t.Errorf("%d HEADs, want 1: the caller owns retries", n)
			}
		})
	}
}

func TestLatest_R14_HangingRegistryTimesOut(t *testing.T) {
	s := testregistry.Start(t)
	s.MustPushRandomImage(t, "acme/api", "prod")
	s.SetFault(testregistry.Fault{Hang: true})
	r := newResolver(t, Options{Timeout: 300 * time.Millisecond})
	start := time.Now()
	_, err := r.Latest(context.Background(), s.Host()+"/acme/api", "prod", nil)
	wantKind(t, err, KindTimeout)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("returned after %s with a 300ms timeout", d)
	}
}

func TestLatest_R14_SlowAnswerWithinTimeoutSucceeds(t *testing.T) {
	s := testregistry.Start(t)
	want := s.MustPushRandomImage(t, "acme/api", "prod")
	s.SetFault(testregistry.Fault{Delay: 100 * time.Millisecond})
	got, err := newResolver(t, Options{Timeout: 2 * time.Second}).Latest(context.Background(), s.Host()+"/acme/api", "prod", nil)
	if err != nil || got != want {
		t.Fatalf("Latest = %q, %v; want %q", got, err, want)
	}
}

func TestLatest_R1_UnusableDigestHeaderIsNeverADigest(t *testing.T) {
	for _, tc := range []struct{ name, header string }{
		{"missing", ""},
		{"malformed", "not-a-digest"},
		{"uppercase hex", "sha256:" + strings.Repeat("ABCDEF0123456789", 4)},
		{"short sha256", "sha256:abc"},
		{"unknown algorithm", "md5:" + strings.Repeat("a", 32)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testregistry.Start(t)
			s.MustPushRandomImage(t, "acme/api", "prod")
			s.SetFault(testregistry.Fault{DigestHeader: &tc.header})
			got, err := newResolver(t, Options{}).Latest(context.Background(), s.Host()+"/acme/api", "prod", nil)
			if got != "" {
				t.Errorf("Latest returned %q for Docker-Content-Digest %q", got, tc.header)
			}
			wantKind(t, err, KindInvalidDigest)
		})
	}
}

// R1 asks for algorithm:hex; a well-formed sha512 digest is one, so it is
// returned as served rather than refused.
func TestLatest_R1_Sha512DigestAccepted(t *testing.T) {
	s := testregistry.Start(t)
	s.MustPushRandomImage(t, "acme/api", "prod")
	want := "sha512:" + strings.Repeat("0123456789abcdef", 8)
	s.SetFault(testregistry.Fault{DigestHeader: &want})
	got, err := newResolver(t, Options{}).Latest(context.Background(), s.Host()+"/acme/api", "prod", nil)
	if err != nil || got != want {
		t.Fatalf("Latest = %q, %v; want %q", got, err, want)
	}
}

func TestLatest_R1_NetworkError(t *testing.T) {
	s := testregistry.Start(t)
	host := s.Host()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := newResolver(t, Options{}).Latest(context.Background(), host+"/acme/api", "prod", nil)
	wantKind(t, err, KindNetwork)
}

func TestLatest_R20_BasicAuthAndNoSecretInErrors(t *testing.T) {
	const password = "hunter2-very-secret"
	s := testregistry.Start(t, testregistry.WithBasicAuth("robot", password))
	want := s.MustPushRandomImage(t, "acme/api", "prod")
	repo := s.Host() + "/acme/api"
	r := newResolver(t, Options{})

	_, err := r.Latest(context.Background(), repo, "prod", nil)
	wantKind(t, err, KindUnauthorized)

	wrong := staticKeychain{s.Host(), "robot", password + "-wrong"}
	_, err = r.Latest(context.Background(), repo, "prod", wrong)
	wantKind(t, err, KindUnauthorized)
	if strings.Contains(err.Error(), password) {
		t.Errorf("error text holds the password: %v", err)
	}
	_, err = r.Has(context.Background(), repo, want, wrong)
	wantKind(t, err, KindUnauthorized)
	if strings.Contains(err.Error(), password) {
		t.Errorf("Has error text holds the password: %v", err)
	}

	got, err := r.Latest(context.Background(), repo, "prod", Keychain(staticKeychain{s.Host(), "robot", password}))
	if err != nil || got != want {
		t.Fatalf("with credentials: Latest = %q, %v; want %q", got, err, want)
	}
}

func TestKeychain_R20_ReadsDockerConfig(t *testing.T) {
	s := testregistry.Start(t, testregistry.WithBasicAuth("robot", "s3cret"))
	want := s.MustPushRandomImage(t, "acme/api", "prod")
	dir := t.TempDir()
	config := `{"auths":{"` + s.Host() + `":{"username":"robot","password":"s3cret"}}}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dir)
	got, err := newResolver(t, Options{}).Latest(context.Background(), s.Host()+"/acme/api", "prod", Keychain())
	if err != nil || got != want {
		t.Fatalf("Latest = %q, %v; want %q", got, err, want)
	}
}

func TestHas_R3_MirrorProof(t *testing.T) {
	s := testregistry.Start(t)
	held := s.MustPushRandomImage(t, "acme/api", "prod")
	other := "sha256:" + strings.Repeat("0", 64)
	repo := s.Host() + "/acme/api"
	r := newResolver(t, Options{})

	if ok, err := r.Has(context.Background(), repo, held, nil); !ok || err != nil {
		t.Errorf("Has(held) = %v, %v; want true", ok, err)
	}
	if ok, err := r.Has(context.Background(), repo, other, nil); ok || err != nil {
		t.Errorf("Has(absent) = %v, %v; want false, nil", ok, err)
	}
	if ok, err := r.Has(context.Background(), s.Host()+"/acme/nothing", held, nil); ok || err != nil {
		t.Errorf("Has(absent repository) = %v, %v; want false, nil", ok, err)
	}
	ok, err := r.Has(context.Background(), repo, "sha256:ABC", nil)
	if ok {
		t.Error("Has(malformed digest) = true")
	}
	wantKind(t, err, KindInvalidDigest)

	// Cannot tell: never a false "absent".
	s.SetFault(testregistry.Fault{Status: 503})
	ok, err = r.Has(context.Background(), repo, held, nil)
	if ok {
		t.Error("Has during a 503 = true")
	}
	wantKind(t, err, KindServerError)

	// A registry that answers another digest than asked proves nothing.
	s.SetFault(testregistry.Fault{DigestHeader: &other})
	ok, err = r.Has(context.Background(), repo, held, nil)
	if ok {
		t.Error("Has with a mismatching answer = true")
	}
	wantKind(t, err, KindInvalidDigest)
}

func TestResolver_R1_TLSWithCAFile(t *testing.T) {
	s := testregistry.New()
	caPEM, err := s.StartTLS("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	want := s.MustPushRandomImage(t, "acme/api", "prod")
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	repo := s.Host() + "/acme/api"

	trusting := newResolver(t, Options{Hosts: []HostConfig{{Host: s.Host(), CAFile: caFile}}})
	if got, err := trusting.Latest(context.Background(), repo, "prod", nil); err != nil || got != want {
		t.Errorf("with caFile: Latest = %q, %v; want %q", got, err, want)
	}

	insecure := newResolver(t, Options{Hosts: []HostConfig{{Host: s.Host(), Insecure: true}}})
	if got, err := insecure.Latest(context.Background(), repo, "prod", nil); err != nil || got != want {
		t.Errorf("insecure: Latest = %q, %v; want %q", got, err, want)
	}

	_, err = newResolver(t, Options{}).Latest(context.Background(), repo, "prod", nil)
	wantKind(t, err, KindTLS)
}

func TestNewResolver_CAFileErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not-pem.txt")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{filepath.Join(dir, "missing.pem"), notPEM} {
		_, err := NewResolver(Options{Hosts: []HostConfig{{Host: "registry.example.com", CAFile: file}}})
		if err == nil || !strings.Contains(err.Error(), file) {
			t.Errorf("caFile %s: err = %v, want one naming the file", file, err)
		}
	}
	if _, err := NewResolver(Options{Hosts: []HostConfig{{Host: "a.example"}, {Host: "a.example"}}}); err == nil {
		t.Error("duplicate host accepted")
	}
	if _, err := NewResolver(Options{Timeout: -time.Second}); err == nil {
		t.Error("negative timeout accepted")
	}
}

func TestOptions_OnRequestReportsEachHeadStatus(t *testing.T) {
	s := testregistry.Start(t)
	s.MustPushRandomImage(t, "acme/api", "prod")
	type call struct {
		host   string
		status int
	}
	var (
		mu    sync.Mutex
		calls []call
	)
	r := newResolver(t, Options{Timeout: 300 * time.Millisecond, OnRequest: func(host string, status int) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, call{host, status})
	}})
	repo := s.Host() + "/acme/api"
	_, _ = r.Latest(context.Background(), repo, "prod", nil)
	s.SetFault(testregistry.Fault{Status: 429})
	_, _ = r.Latest(context.Background(), repo, "prod", nil)
	s.SetFault(testregistry.Fault{Hang: true})
	_, _ = r.Latest(context.Background(), repo, "prod", nil)

	mu.Lock()
	defer mu.Unlock()
	want := []call{{s.Host(), 200}, {s.Host(), 429}, {s.Host(), 0}}
	if len(calls) != len(want) {
		t.Fatalf("OnRequest calls = %v, want %v", calls, want)
	}
	for i := range want {
		if calls[i] != want[i] {
			t.Errorf("call %d = %v, want %v", i, calls[i], want[i])
		}
	}
}

func TestClassify(t *testing.T) {
	if Classify(nil) != nil {
		t.Error("Classify(nil) != nil")
	}
	orig := &Error{Ref: "r:t", Kind: KindRateLimited, Status: 429, RetryAfter: 7 * time.Second}
	if got := Classify(fmt.Errorf("resolve: %w", orig)); got != orig {
		t.Errorf("Classify(wrapped) = %v, want the wrapped *Error", got)
	}
	if got := Classify(fmt.Errorf("x: %w", context.DeadlineExceeded)); got.Kind != KindTimeout {
		t.Errorf("deadline: kind %s, want timeout", got.Kind)
	}
	if msg := orig.Error(); !strings.Contains(msg, "rate-limited") || !strings.Contains(msg, "retry after 7s") {
		t.Errorf("Error() = %q, want kind and retry delay", msg)
	}
}

func TestNewResolver_DockerHubAliasSharesOneRoute(t *testing.T) {
	r := newResolver(t, Options{Hosts: []HostConfig{{Host: "docker.io", Insecure: true}}})
	for _, repo := range []string{"acme/api", "docker.io/acme/api", "index.docker.io/library/nginx"} {
		if got := r.route(repo); !got.insecure || got.transport != r.hosts["index.docker.io"].transport {
			t.Errorf("route(%s) is not the docker.io host config", repo)
		}
	}
	if r.route("ghcr.io/acme/api").transport != r.fallback.transport {
		t.Error("an unconfigured host does not use the shared fallback transport")
	}
}

// R1: a HEAD that names one digest while the GET of the same tag serves
// other content is reported as inconsistent, never taken as the digest.
func TestVerify_R1_HeadAndGetOfOneTagMustAgree(t *testing.T) {
	s := testregistry.Start(t)
	repo := s.Host() + "/acme/api"
	served := s.MustPushRandomImage(t, "acme/api", "prod")
	r := newResolver(t, Options{})
	ctx := context.Background()

	if err := r.Verify(ctx, repo, "prod", served, nil); err != nil {
		t.Fatalf("Verify of the served digest: %v", err)
	}
	index := s.MustPushRandomIndex(t, "acme/api", "multi", 2)
	if err := r.Verify(ctx, repo, "multi", index, nil); err != nil {
		t.Fatalf("Verify of a multi-arch index digest: %v", err)
	}

	other := "sha256:" + strings.Repeat("0", 64)
	s.SetFault(testregistry.Fault{Method: http.MethodHead, DigestHeader: &other})
	head, err := r.Latest(ctx, repo, "prod", nil)
	if err != nil || head != other {
		t.Fatalf("setup: HEAD answered %q, %v; want the injected %s", head, err, other)
	}
	e := wantKind(t, r.Verify(ctx, repo, "prod", head, nil), KindInconsistent)
	for _, want := range []string{repo + ":prod", other, served, "not pinned"} {
		if !strings.Contains(e.Error(), want) {
			t.Errorf("error %q does not name %s", e.Error(), want)
		}
	}

	// A sha512 digest is checked with sha512, not taken on the HEAD's word.
	sha512 := "sha512:" + strings.Repeat("0123456789abcdef", 8)
	wantKind(t, r.Verify(ctx, repo, "prod", sha512, nil), KindInconsistent)

	s.SetFault(testregistry.Fault{Method: http.MethodGet, Status: http.StatusNotFound})
	wantKind(t, r.Verify(ctx, repo, "prod", served, nil), KindNotFound)
	s.SetFault(testregistry.Fault{Method: http.MethodGet, Hang: true})
	start := time.Now()
	wantKind(t, newResolver(t, Options{Timeout: 300 * time.Millisecond}).Verify(ctx, repo, "prod", served, nil), KindTimeout)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("a hanging GET took %s to fail, want about the 300ms timeout (R14)", took)
	}
}

// N1: the platform manifests of a pinned index are what its pods report.
func TestPlatforms_N1_AnIndexListsItsPlatformManifestsAnImageNone(t *testing.T) {
	s := testregistry.Start(t)
	r := newResolver(t, Options{Hosts: []HostConfig{{Host: s.Host(), Insecure: true}}})
	ctx := context.Background()
	index := s.MustPushRandomIndex(t, "acme/multi", "prod", 3)
	got, err := r.Platforms(ctx, s.Host()+"/acme/multi", index, nil)
	if err != nil || len(got) != 3 {
		t.Fatalf("Platforms of an index of 3 = %v, %v; want 3 digests", got, err)
	}
	for _, d := range got {
		if has, err := r.Has(ctx, s.Host()+"/acme/multi", d, nil); !has || err != nil || d == index {
			t.Errorf("platform %s: in the registry %v (%v); want a manifest other than the index", d, has, err)
		}
	}
	single := s.MustPushRandomImage(t, "acme/single", "prod")
	if got, err := r.Platforms(ctx, s.Host()+"/acme/single", single, nil); err != nil || got != nil {
		t.Errorf("Platforms of a single image = %v, %v; want nil, nil", got, err)
	}
	_, err = r.Platforms(ctx, s.Host()+"/acme/multi", "sha256:"+strings.Repeat("0", 64), nil)
	wantKind(t, err, KindNotFound)
	_, err = r.Platforms(ctx, s.Host()+"/acme/multi", "not-a-digest", nil)
	wantKind(t, err, KindInvalidDigest)
}

// passwordOf returns a func that resolves repo with kc and returns the
// password of its authorization, failing t unless the username is user.
func passwordOf(t *testing.T, kc authn.Keychain, repo name.Repository, user string) func() string {
	return func() string {
		t.Helper()
		auth, err := kc.Resolve(repo)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := auth.Authorization()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Username != user {
			t.Fatalf("username %q, want %s", cfg.Username, user)
		}
		return cfg.Password
	}
}

// faultCase is a registry fault and the ErrorKind a request made under it
// fails with; kc says whether the request carries credentials.
type faultCase struct {
	name  string
	fault testregistry.Fault
	kc    bool
	want  ErrorKind
}

// The faults a request by digest is checked under.
var (
	noCredentials = faultCase{name: "401 (no credentials)", want: KindUnauthorized}
	status500     = faultCase{name: "500", fault: testregistry.Fault{Status: http.StatusInternalServerError}, kc: true, want: KindServerError}
	status503     = faultCase{name: "503", fault: testregistry.Fault{Status: http.StatusServiceUnavailable}, kc: true, want: KindServerError}
	status429     = faultCase{name: "429", fault: testregistry.Fault{Status: http.StatusTooManyRequests}, kc: true, want: KindRateLimited}
	hang          = faultCase{name: "a timeout", fault: testregistry.Fault{Hang: true}, kc: true, want: KindTimeout}
)

// keys is kc when the case carries credentials, else none.
func (c faultCase) keys(kc authn.Keychain) authn.Keychain {
	if !c.kc {
		return nil
	}
	return kc
}
