package run

// API server faults (issue 7). A fault-injecting reverse proxy stands in
// front of the real kube-apiserver: the tick under test talks to the proxy
// (its own kubeconfig), the proxy forwards to the cluster with the admin
// client certificate, and answers chosen requests itself (500, 409) or holds
// them (a write that landed but whose answer never comes). The test itself
// reads and writes the cluster directly, past the proxy.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/running"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

// apiFault says which requests the proxy answers itself and how.
type apiFault struct {
	Method      string // e.g. "GET", "PATCH"; "" matches any
	PathSuffix  string // e.g. "/deployments/requests-proxy"
	ContentType string // prefix of the request's Content-Type; "" matches any
	Status      int    // answer with a Kubernetes Status of this code, without forwarding
	// HangAfterForward forwards the request (the write lands) and then
	// withholds the answer until the client gives up.
	HangAfterForward bool
	// Then, with neither Status nor HangAfterForward, forwards the request
	// normally and calls Then (in its own goroutine) once the answer is sent.
	Then  func()
	Skip  int // let this many matching requests through first
	Times int // fire this many times, then pass requests through; 0 = always
	fired int
	seen  int
}

// apiRequest is one request the proxy saw for a workload of the apps group.
type apiRequest struct {
	Method, Path, ContentType, Fault string
}

// apiProxy is a TLS reverse proxy to the cluster's kube-apiserver.
type apiProxy struct {
	srv        *httptest.Server
	kubeconfig string
	closing    chan struct{}

	mu       sync.Mutex
	faults   []*apiFault
	requests []apiRequest
}

// newAPIProxy starts the proxy on loopback and writes a kubeconfig that
// points at it; both go away when the test ends.
func (e *env) newAPIProxy() *apiProxy {
	e.T.Helper()
	p := &apiProxy{closing: make(chan struct{})}
	p.srv, p.kubeconfig = e.StartAPIProxy("kubeconfig-proxy", p.closing, p.serve)
	return p
}

// set replaces the faults.
func (p *apiProxy) set(faults ...*apiFault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = faults
}

// reset drops the faults and the request log.
func (p *apiProxy) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults, p.requests = nil, nil
}

// seen returns the apps-group requests so far, in order.
func (p *apiProxy) seen() []apiRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]apiRequest(nil), p.requests...)
}

// fired returns how often f answered instead of the API server.
func (p *apiProxy) fired(f *apiFault) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return f.fired
}

func (p *apiProxy) match(r *http.Request) *apiFault {
	p.mu.Lock()
	defer p.mu.Unlock()
	var hit *apiFault
	for _, f := range p.faults {
		if (f.Method == "" || f.Method == r.Method) &&
			strings.HasSuffix(r.URL.Path, f.PathSuffix) &&
			strings.HasPrefix(r.Header.Get("Content-Type"), f.ContentType) &&
			(f.Times == 0 || f.fired < f.Times) {
			if f.seen++; f.seen <= f.Skip {
				continue
			}
			f.fired++
			hit = f
			break
		}
	}
	if strings.HasPrefix(r.URL.Path, "/apis/apps/") {
		what := ""
		if hit != nil {
			what = fmt.Sprintf("status=%d hang=%v then=%v", hit.Status, hit.HangAfterForward, hit.Then != nil)
		}
		p.requests = append(p.requests, apiRequest{Method: r.Method, Path: r.URL.Path, ContentType: r.Header.Get("Content-Type"), Fault: what})
	}
	return hit
}

func (p *apiProxy) serve(w http.ResponseWriter, r *http.Request, rp *httputil.ReverseProxy) {
	f := p.match(r)
	switch {
	case f == nil:
		rp.ServeHTTP(w, r)
	case f.Then != nil:
		rp.ServeHTTP(w, r)
		go f.Then()
	case f.HangAfterForward:
		// The write reaches the API server; its answer is dropped and the
		// client is left waiting until it gives up.
		rec := httptest.NewRecorder()
		rp.ServeHTTP(rec, r.WithContext(context.WithoutCancel(r.Context())))
		select {
		case <-r.Context().Done():
		case <-p.closing:
		}
		panic(http.ErrAbortHandler)
	default:
		writeAPIStatus(w, f.Status, r)
	}
}

// writeAPIStatus answers like the API server does: a metav1.Status in JSON.
func writeAPIStatus(w http.ResponseWriter, code int, r *http.Request) {
	st := metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Code:     int32(code),
	}
	name := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
	switch code {
	case http.StatusConflict:
		st.Reason = metav1.StatusReasonConflict
		st.Message = fmt.Sprintf(`Operation cannot be fulfilled on deployments.apps %q: the object has been modified; please apply your changes to the latest version and try again (injected)`, name)
		st.Details = &metav1.StatusDetails{Name: name, Group: "apps", Kind: "deployments"}
	case http.StatusInternalServerError:
		st.Reason = metav1.StatusReasonInternalError
		st.Message = "Internal error occurred: injected fault: etcdserver: leader changed"
	default:
		st.Message = "injected fault"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(st)
}

// tickVia runs `tick` through the proxy's kubeconfig, then waits for the
// namespace's Deployments to settle as env.tick does.
func (e *env) tickVia(p *apiProxy, cfg string) (int, string, time.Duration) {
	e.T.Helper()
	start := time.Now()
	code, _, logs := e.Run("tick", "--config", cfg, "--kubeconfig", p.kubeconfig)
	took := time.Since(start)
	e.T.Logf("tick via the proxy exit %d in %s:\n%s", code, took.Round(time.Millisecond), logs)
	for _, n := range []string{"jobs-manager", "requests-proxy"} {
		e.Settle("Deployment", n)
	}
	return code, logs, took
}

// proxyPatches returns the PATCHes the proxy saw to a Deployment, as
// "name content-type[ fault]".
func proxyPatches(reqs []apiRequest) []string {
	var out []string
	for _, r := range reqs {
		if r.Method != http.MethodPatch || !strings.Contains(r.Path, "/deployments/") {
			continue
		}
		kind := "annotations"
		if strings.HasPrefix(r.ContentType, "application/json-patch+json") {
			kind = "image"
		}
		s := r.Path[strings.LastIndexByte(r.Path, '/')+1:] + " " + kind
		if r.Fault != "" {
			s += " (" + r.Fault + ")"
		}
		out = append(out, s)
	}
	return out
}

const (
	ctMergePatch = "application/merge-patch+json" // annotation writes (compare-and-swap)
	ctJSONPatch  = "application/json-patch+json"  // image writes (test + replace)
)

func TestFaults_R4_APIServer500OnReadingOneTargetFailsAndWritesNothingElse(t *testing.T) {
	e := newEnv(t)
	digest, cfg := e.Pinned()
	pinned := e.Repo("api") + ":prod@" + digest
	p := e.newAPIProxy()
	// helm re-renders jobs-manager: a tick would re-pin it, were the group
	// readable.
	e.SetImageAs("helm", "Deployment", "jobs-manager", "api", e.Repo("api")+":prod")
	rvs := e.ResourceVersions()
	f := &apiFault{Method: http.MethodGet, PathSuffix: "/deployments/requests-proxy", Status: 500}
	p.set(f)

	code, logs, _ := e.tickVia(p, cfg)
	if code != 1 {
		t.Fatalf("tick with requests-proxy unreadable (HTTP 500): exit %d, want 1", code)
	}
	if p.fired(f) == 0 {
		t.Fatal("the 500 fault never fired")
	}
	if lines := e2e.LogLines(logs, "ERROR", "requests-proxy", "Internal error occurred: injected fault"); len(lines) == 0 {
		t.Errorf("no ERROR line naming requests-proxy and the API server's error text:\n%s", logs)
	}
	// The only write is the anchor's bookkeeping (R7 read-failure streak,
	// R13): no image patch, and requests-proxy untouched.
	if ps := proxyPatches(p.seen()); len(ps) != 1 || ps[0] != "jobs-manager annotations" {
		t.Errorf("a tick that could not read the group wrote %q, want only the anchor's bookkeeping", ps)
	}
	if got := e.Deployment("requests-proxy").ResourceVersion; got != rvs["requests-proxy"] {
		t.Errorf("requests-proxy written (resourceVersion %s -> %s) although unreadable", rvs["requests-proxy"], got)
	}
	if got := e.Image("jobs-manager", "api"); got != e.Repo("api")+":prod" {
		t.Errorf("jobs-manager re-pinned to %s although its group could not be read", got)
	}
	if got := e.Annotations("jobs-manager")[e.Key("live-read-failure-streak-api")]; got != "1" {
		t.Errorf("read-failure streak %q, want \"1\"", got)
	}
	if !e2e.HasEvent(e.Events("jobs-manager"), "RefreshError", "requests-proxy") {
		t.Errorf("no RefreshError event on the anchor naming requests-proxy: %q", e.Events("jobs-manager"))
	}

	// The API server heals: one tick re-pins the reverted target.
	p.reset()
	if code, _, _ := e.tickVia(p, cfg); code != 0 {
		t.Fatalf("tick after the API healed: exit %d, want 0", code)
	}
	if got := e.Image("jobs-manager", "api"); got != pinned {
		t.Errorf("after the API healed jobs-manager runs %s, want %s", got, pinned)
	}
	if v, ok := e.Annotations("jobs-manager")[e.Key("live-read-failure-streak-api")]; ok {
		t.Errorf("read-failure streak %q not cleared once the target was read again", v)
	}
}

func TestFaults_R10_ConflictOnTheAnchorsAnnotationPatchIsRetriedWithFreshState(t *testing.T) {
	e := newEnv(t)
	_, cfg := e.Pinned()
	p := e.newAPIProxy()
	next := e.Push("api", "prod")
	before := map[string]int{"jobs-manager": e.Rollouts("jobs-manager"), "requests-proxy": e.Rollouts("requests-proxy")}
	f := &apiFault{Method: http.MethodPatch, PathSuffix: "/deployments/jobs-manager", ContentType: ctMergePatch, Status: 409, Times: 1}
	p.set(f)

	code, logs, _ := e.tickVia(p, cfg)
	if code != 0 {
		t.Fatalf("tick with one 409 on the anchor's annotation patch: exit %d, want 0 (retried)", code)
	}
	if p.fired(f) != 1 {
		t.Fatalf("the 409 fault fired %d times, want 1", p.fired(f))
	}
	ps := proxyPatches(p.seen())
	if len(ps) < 2 || !strings.HasPrefix(ps[0], "jobs-manager annotations (status=409") || ps[1] != "jobs-manager annotations" {
		t.Errorf("PATCHes %q: want the conflicting annotation patch retried at once", ps)
	}
	// The retry re-read the anchor: a GET of it between the 409 and the retry.
	reqs := p.seen()
	for i, r := range reqs {
		if r.Fault != "" {
			if i+1 >= len(reqs) || reqs[i+1].Method != http.MethodGet || !strings.HasSuffix(reqs[i+1].Path, "/deployments/jobs-manager") {
				t.Errorf("after the 409 the client did not re-read the anchor first: %v", reqs[i+1:])
			}
			break
		}
	}
	if strings.Contains(logs, "level=ERROR") {
		t.Errorf("a retried conflict was reported as an error:\n%s", logs)
	}
	e.convergedOn(t, next, before)
}

func TestFaults_R14_AHangingWriteIsBoundedByAPITimeoutAndNotRolledTwice(t *testing.T) {
	e := newEnv(t)
	old, _ := e.Pinned()
	cfg := e.Config("apiTimeout: 2s\n" + e2e.SeedShape)
	p := e.newAPIProxy()
	next := e.Push("api", "prod")
	before := map[string]int{"jobs-manager": e.Rollouts("jobs-manager"), "requests-proxy": e.Rollouts("requests-proxy")}
	// requests-proxy's image write lands in the cluster; its answer never
	// comes back.
	f := &apiFault{Method: http.MethodPatch, PathSuffix: "/deployments/requests-proxy", ContentType: ctJSONPatch, HangAfterForward: true, Times: 1}
	p.set(f)

	code, logs, took := e.tickVia(p, cfg)
	if code != 1 {
		t.Fatalf("tick whose write hung: exit %d, want 1", code)
	}
	if p.fired(f) != 1 {
		t.Fatalf("the hang fault fired %d times, want 1", p.fired(f))
	}
	if took > 15*time.Second {
		t.Errorf("tick took %s with apiTimeout 2s (R14: bounded)", took)
	}
	if lines := e2e.LogLines(logs, "ERROR", "requests-proxy", "context deadline exceeded"); len(lines) == 0 {
		t.Errorf("no ERROR line naming requests-proxy and the timeout:\n%s", logs)
	}
	a := e.Annotations("jobs-manager")
	if got := a[e.Key("last-refreshed-api-digest")]; got != old {
		t.Errorf("record moved to %q although the tick failed before the settle, want %q", got, old)
	}
	if got := a[e.Key("refresh-attempt")]; got != "1" {
		t.Errorf("attempt counter %q after the failed tick, want \"1\"", got)
	}

	// Next tick, no fault: both targets are on the new digest already (the
	// hung write landed), so it writes no image, waits and records.
	p.reset()
	if code, _, _ := e.tickVia(p, cfg); code != 0 {
		t.Fatalf("tick after the hang: exit %d, want 0", code)
	}
	if ps := proxyPatches(p.seen()); strings.Contains(strings.Join(ps, ","), " image") {
		t.Errorf("the converging tick re-imaged again: %v", ps)
	}
	e.convergedOn(t, next, before)
}

func TestFaults_R14_AHangingReadIsBoundedByAPITimeout(t *testing.T) {
	e := newEnv(t)
	digest, _ := e.Pinned()
	cfg := e.Config("apiTimeout: 2s\n" + e2e.SeedShape)
	p := e.newAPIProxy()
	e.SetImageAs("helm", "Deployment", "requests-proxy", "proxy", e.Repo("api")+":prod")
	f := &apiFault{Method: http.MethodGet, PathSuffix: "/deployments/requests-proxy", HangAfterForward: true}
	p.set(f)

	code, logs, took := e.tickVia(p, cfg)
	if code != 1 {
		t.Fatalf("tick whose read of requests-proxy hung: exit %d, want 1", code)
	}
	if p.fired(f) == 0 {
		t.Fatal("the hang fault never fired")
	}
	if took > 15*time.Second {
		t.Errorf("tick took %s with apiTimeout 2s (R14: bounded)", took)
	}
	if lines := e2e.LogLines(logs, "ERROR", "requests-proxy", "context deadline exceeded"); len(lines) == 0 {
		t.Errorf("no ERROR line naming requests-proxy and the timeout:\n%s", logs)
	}
	if ps := proxyPatches(p.seen()); strings.Contains(strings.Join(ps, ","), " image") {
		t.Errorf("a tick that could not read the group re-imaged: %v", ps)
	}
	if got := e.Image("requests-proxy", "proxy"); got != e.Repo("api")+":prod" {
		t.Errorf("requests-proxy re-pinned to %s although it could not be read", got)
	}

	p.reset()
	if code, _, _ := e.tickVia(p, cfg); code != 0 {
		t.Fatalf("tick after the API healed: exit %d, want 0", code)
	}
	if got, want := e.Image("requests-proxy", "proxy"), e.Repo("api")+":prod@"+digest; got != want {
		t.Errorf("after the API healed requests-proxy runs %s, want %s", got, want)
	}
}

func TestFaults_R10_APIServer500OnTheImagePatchKeepsTheAttemptAndRecord(t *testing.T) {
	e := newEnv(t)
	old, cfg := e.Pinned()
	oldRef := e.Repo("api") + ":prod@" + old
	p := e.newAPIProxy()
	next := e.Push("api", "prod")
	before := map[string]int{"jobs-manager": e.Rollouts("jobs-manager"), "requests-proxy": e.Rollouts("requests-proxy")}
	f := &apiFault{Method: http.MethodPatch, PathSuffix: "", ContentType: ctJSONPatch, Status: 500}
	p.set(f)

	code, logs, _ := e.tickVia(p, cfg)
	if code != 1 {
		t.Fatalf("tick whose image patch got HTTP 500: exit %d, want 1", code)
	}
	if p.fired(f) == 0 {
		t.Fatal("the 500 fault never fired")
	}
	if lines := e2e.LogLines(logs, "ERROR", "re-image", "Internal error occurred: injected fault"); len(lines) == 0 {
		t.Errorf("no ERROR line naming the failed re-image and the API's error:\n%s", logs)
	}
	// R10 order: the attempt counter was written before any image patch.
	ps := proxyPatches(p.seen())
	if len(ps) == 0 || ps[0] != "jobs-manager annotations" {
		t.Errorf("PATCHes %q: want the attempt write on the anchor first", ps)
	}
	a := e.Annotations("jobs-manager")
	if got := a[e.Key("refresh-attempt")]; got != "1" {
		t.Errorf("attempt counter %q, want \"1\" (persisted before re-imaging)", got)
	}
	if got := a[e.Key("last-refreshed-api-digest")]; got != old {
		t.Errorf("record moved to %q without a rollout, want %q", got, old)
	}
	for n, c := range map[string]string{"jobs-manager": "api", "requests-proxy": "proxy"} {
		if got := e.Image(n, c); got != oldRef {
			t.Errorf("%s runs %s after a refused image patch, want %s", n, got, oldRef)
		}
	}

	p.reset()
	if code, _, _ := e.tickVia(p, cfg); code != 0 {
		t.Fatalf("tick after the API healed: exit %d, want 0", code)
	}
	e.convergedOn(t, next, before)
}

func TestFaults_C1_APIServerRestartDuringRunReestablishesWatches(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg)
	pinned := e.Repo("api") + ":prod@" + digest
	ctl := e.StartRun(cfg, "--poll-interval", "1h")
	testwait.Eventually(t, 30*time.Second, "controller ready", func() bool {
		code, _ := running.Get("http://" + ctl.Health + "/readyz")
		return code == 200
	})
	ctl.WaitPasses(t, "control-plane", 0, 1) // the first pass
	before := map[string]int{"jobs-manager": e.Rollouts("jobs-manager"), "requests-proxy": e.Rollouts("requests-proxy")}
	rvAnchor := e.Deployment("jobs-manager").Spec.Template.Spec.Containers[0].Image

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	down, err := e.C.RestartAPIServer(ctx)
	if err != nil {
		t.Fatalf("restart kube-apiserver: %v", err)
	}
	t.Logf("kube-apiserver killed and back in %s", down.Round(time.Millisecond))
	// The rest of the cluster reconnects; wait until it acts again.
	for _, n := range e.C.NodeNames {
		if err := e.C.WaitNodeReady(ctx, n, true); err != nil {
			t.Fatal(err)
		}
	}

	reverted := time.Now()
	e.SetImageAs("helm", "Deployment", "requests-proxy", "proxy", e.Repo("api")+":prod")
	took := e.UntilDeployments(60*time.Second, "the revert after the restart re-pinned", func() bool {
		return e.Image("requests-proxy", "proxy") == pinned
	})
	t.Logf("revert made after the restart re-pinned %s after the reverting write settled (%s after the write)", took.Round(time.Millisecond), time.Since(reverted).Round(time.Millisecond))
	e.Settle("Deployment", "requests-proxy")
	// Room for a duplicate, were there one: passes after the re-pin and
	// its settle (the resync is an hour away, so kicked).
	ctl.KickedPasses(t, e.Env, "control-plane", "requests-proxy")

	logs := ctl.Logs()
	if n := strings.Count(logs, "requests-proxy container proxy is not on the pinned digest"); n != 1 {
		t.Errorf("%d re-pins of requests-proxy logged, want exactly 1", n)
	}
	if got := e.Image("jobs-manager", "api"); got != rvAnchor {
		t.Errorf("jobs-manager touched: %s -> %s", rvAnchor, got)
	}
	// The re-pin restores a template that already ran: no new ReplicaSet.
	for n, want := range before {
		if got := e.Rollouts(n); got != want {
			t.Errorf("%s has %d ReplicaSets after the restart and the re-pin, want %d (no extra rollout)", n, got, want)
		}
	}
	if v, ok := e.Annotations("jobs-manager")[e.Key("refresh-attempt")]; ok {
		t.Errorf("attempt counter %q left after the settled re-pin", v)
	}
	if code, _ := running.Get("http://" + ctl.Health + "/healthz"); code != 200 {
		t.Errorf("/healthz answered %d after the restart", code)
	}
}

func TestFaults_R14_APIServerRestartDuringATicksRolloutWaitConverges(t *testing.T) {
	e := newEnv(t)
	e.Pinned()
	cfg := e.Config("rolloutTimeout: 90s\n" + e2e.SeedShape)
	p := e.newAPIProxy()
	next := e.Push("api", "prod")
	before := map[string]int{"jobs-manager": e.Rollouts("jobs-manager"), "requests-proxy": e.Rollouts("requests-proxy")}

	// Right after the tick's second (last) image write is answered, the
	// kube-apiserver is killed and restarted: the tick is in its rollout
	// wait, and the Deployment controller loses its watches too.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	restarted := make(chan error, 1)
	var down time.Duration
	f := &apiFault{Method: http.MethodPatch, ContentType: ctJSONPatch, Skip: 1, Times: 1, Then: func() {
		var err error
		down, err = e.C.RestartAPIServer(ctx)
		restarted <- err
	}}
	p.set(f)

	code, logs, took := e.tickVia(p, cfg)
	select {
	case err := <-restarted:
		if err != nil {
			t.Fatalf("restart kube-apiserver: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the restart never happened: the tick did not write a second image")
	}
	t.Logf("kube-apiserver down %s during the rollout wait; the tick took %s", down.Round(time.Millisecond), took.Round(time.Millisecond))
	if code != 0 {
		t.Fatalf("tick whose rollout wait outlived an API server restart: exit %d, want 0\n%s", code, logs)
	}
	e.convergedOn(t, next, before)
	// The cluster is whole again for the tests that follow.
	for _, n := range e.C.NodeNames {
		if err := e.C.WaitNodeReady(ctx, n, true); err != nil {
			t.Fatal(err)
		}
	}
}

// convergedOn checks the seed shape's two targets after a fault healed:
// both on next, exactly one rollout each since before, the record on next
// and no attempt counter left (R10, R14).
func (e *env) convergedOn(t *testing.T, next string, before map[string]int) {
	t.Helper()
	want := e.Repo("api") + ":prod@" + next
	for n, c := range map[string]string{"jobs-manager": "api", "requests-proxy": "proxy"} {
		if got := e.Image(n, c); got != want {
			t.Errorf("%s runs %s, want %s", n, got, want)
		}
		if got := e.Rollouts(n); got != before[n]+1 {
			t.Errorf("%s has %d ReplicaSets, want %d (exactly one rollout, no duplicate)", n, got, before[n]+1)
		}
	}
	a := e.Annotations("jobs-manager")
	if got := a[e.Key("last-refreshed-api-digest")]; got != next {
		t.Errorf("record %q, want %q (recorded once the rollout settled)", got, next)
	}
	if v, ok := a[e.Key("refresh-attempt")]; ok {
		t.Errorf("attempt counter %q left after a settled rollout", v)
	}
}
