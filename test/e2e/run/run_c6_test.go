package run

import (
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// C6: a revert of a workload that was settled on its pin is re-pinned in
// the same pass, without waiting for the rollout the revert started. Here
// that rollout can never finish (its pods on the bare tag never become
// available), so under R4 alone the revert would never be re-pinned.
// Afterwards the re-pin's own rollout settles and a later pass, not a
// waiting worker, confirms it: the attempt counter is cleared.
func TestRun_C6_ARevertOfASettledPinIsRepinnedWithoutWaitingForItsRollout(t *testing.T) {
	e := newEnv(t)
	first := e.Push("web", "prod")
	tag := e.Repo("web") + ":prod"
	lb := e.Gated("web", tag, 2)
	cfg := e.Config("groups:\n" + e2e.OneGroup("c6-revert", "web", "web", "web"))
	e.PinAll(cfg)
	pinned := tag + "@" + first
	if got := e.Image("web", "web"); got != pinned {
		t.Fatalf("setup: web runs %s, want %s", got, pinned)
	}
	lb.FailOnTag()

	ctl := e.StartRun(cfg, "--poll-interval", "1h")
	ctl.WaitReady(t)
	ctl.WaitPasses(t, "c6-revert", 0, 1)
	e.WriteImageAs("helm", "Deployment", "web", "web", tag)
	took := e.UntilDeployments(60*time.Second, "revert re-pinned", func() bool { return e.Image("web", "web") == pinned })
	t.Logf("revert re-pinned %s after the reverting write, its own rollout unfinished", took.Round(time.Millisecond))
	// The pass logs after its writes: wait for the line, do not race it.
	ctl.UntilLogged(t, "the C6 line in the logs", func(logs string) bool {
		return strings.Contains(logs, "taken off its pin while settled on it") && strings.Contains(logs, "re-pinning now instead of waiting for the rollout that write started")
	})
	e.Settle("Deployment", "web")
	e.UntilDeployments(60*time.Second, "the attempt confirmed and cleared by a later pass", func() bool {
		_, has := e.Annotations("web")[e.Key("refresh-attempt")]
		return !has
	})
	if got := e.Annotations("web")[e.Key("last-refreshed-web-digest")]; got != first {
		t.Errorf("record = %q, want %s", got, first)
	}
	if logs := ctl.Logs(); strings.Contains(logs, "never confirmed settling") || strings.Contains(logs, "is not settled") {
		t.Errorf("the revert's rollout was reported as a wait or a skip:\n%s", logs)
	}
}

// C6: a worker never waits for a rollout. With one worker, a group whose
// rollout is stuck (its new pods never become available; rolloutTimeout is
// the default 10 minutes) does not delay another group's re-pin, and its
// attempt in flight is not counted again by the passes that see it rolling.
func TestRun_C6_AGroupStuckRollingNeverDelaysAnotherGroup(t *testing.T) {
	e := newEnv(t)
	first := e.Push("web", "prod")
	apiDigest := e.Push("api", "prod")
	webTag, apiTag := e.Repo("web")+":prod", e.Repo("api")+":prod"
	lb := e.Gated("stuck", webTag, 1)
	testenv.Deployment(t, e.C.Client, e.NS, "other", testenv.WithContainer("api", apiTag), testenv.WithReplicas(1))
	e.Settle("Deployment", "other")
	cfg := e.Config("groups:\n" + e2e.OneGroup("c6-stuck", "web", "stuck", "web") + e2e.OneGroup("c6-other", "api", "other", "api"))
	e.PinAll(cfg)
	if got := e.Image("stuck", "web"); got != webTag+"@"+first {
		t.Fatalf("setup: stuck runs %s", got)
	}

	ctl := e.StartRun(cfg, "--poll-interval", "1s", "--poll-jitter", "0", "--workers", "1")
	ctl.WaitReady(t)
	next := e.Push("web", "prod")
	lb.Fail(next)
	e.UntilDeployments(60*time.Second, "stuck re-imaged to the new digest", func() bool { return e.Image("stuck", "web") == webTag+"@"+next })
	from := ctl.Passes(t, "c6-stuck")

	e.WriteImageAs("helm", "Deployment", "other", "api", apiTag)
	took := e.UntilDeployments(60*time.Second, "other's revert re-pinned", func() bool { return e.Image("other", "api") == apiTag+"@"+apiDigest })
	t.Logf("other re-pinned %s after its revert while stuck was rolling", took.Round(time.Millisecond))

	ctl.WaitPasses(t, "c6-stuck", from, 3)
	a := e.Annotations("stuck")
	if got := a[e.Key("refresh-attempt")]; got != "1" {
		t.Errorf("stuck's attempt = %q after passes that saw it rolling, want 1 (in flight, not counted again)", got)
	}
	if got := a[e.Key("last-refreshed-web-digest")]; got != first {
		t.Errorf("stuck's record = %q, want the old %s until its rollout settles (R6)", got, first)
	}
}

// Steady state with nothing to change: passes run (the resync, each poll)
// and make no API request at all: reads come from the informer cache.
func TestRun_C6_SteadyStateMakesNoAPIRequest(t *testing.T) {
	e := newEnv(t)
	_, cfg := e.Pinned()
	var mu sync.Mutex
	var requests []string
	_, kubeconfig := e.StartAPIProxy("kubeconfig-count", make(chan struct{}), func(w http.ResponseWriter, r *http.Request, rp *httputil.ReverseProxy) {
		if r.URL.Query().Get("watch") != "true" {
			mu.Lock()
			requests = append(requests, r.Method+" "+r.URL.Path)
			mu.Unlock()
		}
		rp.ServeHTTP(w, r)
	})
	ctl := e.StartRun(cfg, "--kubeconfig", kubeconfig, "--poll-interval", "1s", "--poll-jitter", "0")
	ctl.WaitReady(t)
	from := ctl.WaitPasses(t, "control-plane", 0, 2)
	mu.Lock()
	startup := len(requests)
	requests = nil
	mu.Unlock()
	ctl.WaitPasses(t, "control-plane", from, 3)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d API requests at start (lists, discovery), %d over 3 steady passes", startup, len(requests))
	if startup == 0 {
		t.Fatal("the proxy saw no request at all: the controller does not go through it")
	}
	if len(requests) > 0 {
		t.Errorf("steady state made %d API requests, want 0:\n%s", len(requests), strings.Join(requests, "\n"))
	}
}
