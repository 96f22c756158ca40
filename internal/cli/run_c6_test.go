package cli

import (
	"fmt"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/image-refresh/image-refresh/internal/testenv"
)

// passes reads image_refresh_passes_total of group from /metrics, less what
// it was when c started: the signal that a pass completed, which every
// negative check waits for. Every controller of this process serves the
// one registry controller-runtime keeps (metrics.NewOn), so the total also
// holds the passes of controllers that ran before c (earlier tests reuse
// group names), subtracted here, and of any controller running beside c
// under the same group name, which are not: controllers that run at once
// and must be told apart are given different group names.
func (c *runningController) passes(t *testing.T, group string) int {
	t.Helper()
	_, body := get("http://" + c.metrics + "/metrics")
	v, ok := metricValue(body, "image_refresh_passes_total", map[string]string{"group": group})
	if !ok {
		return 0
	}
	n, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("image_refresh_passes_total = %q", v)
	}
	return int(n) - c.base[group]
}

// processPasses reads image_refresh_passes_total by group from the
// process-wide registry, before a controller serves it.
func processPasses(t *testing.T) map[string]int {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	out := map[string]int{}
	for _, f := range families {
		if f.GetName() != "image_refresh_passes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "group" {
					out[l.GetValue()] = int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return out
}

// waitPasses waits until group completed n more passes than it had at from.
func (c *runningController) waitPasses(t *testing.T, group string, from, n int) int {
	t.Helper()
	eventually(t, 2*time.Minute, fmt.Sprintf("%d more passes of group %s", n, group), func() bool {
		return c.passes(t, group) >= from+n
	})
	return c.passes(t, group)
}

// kick makes the groups of Deployment deploy run a pass and changes
// nothing a pass reads: it adds an annotation under the state prefix and
// removes it again (a removed state key starts a pass, as a rearm does;
// no pass reads this key). The removal reaches the controller's cache
// after every earlier write to the namespace's Deployments, so the pass it
// starts reads them. For a controller whose resync is an hour away, which
// nothing else may make run a pass.
func (e *env) kick(deploy string) {
	e.t.Helper()
	k := e.key("test-kick")
	e.annotate(deploy, map[string]*string{k: ptr("1")})
	e.annotate(deploy, map[string]*string{k: nil})
}

// kickedPasses waits for two more passes of group, kicking deploy for
// each so that they come: the first may be a pass that was in flight when
// it was called, reading a cache from before the writes under test; the
// second began after the first ended, so after the call.
func (c *runningController) kickedPasses(t *testing.T, e *env, group, deploy string) int {
	t.Helper()
	from := c.passes(t, group)
	e.kick(deploy)
	c.waitPasses(t, group, from, 1)
	e.kick(deploy)
	return c.waitPasses(t, group, from, 2)
}

func (c *runningController) waitReady(t *testing.T) {
	t.Helper()
	eventually(t, 60*time.Second, "controller ready", func() bool {
		code, _ := get("http://" + c.health + "/readyz")
		return code == 200
	})
}

const c6Gate = "lb.acme.example/target-healthy"

// gated creates Deployment name on tag whose new pods become available
// only while the gate owner says they are healthy (and 4 s after that, so
// the moment kwok reports them Ready cannot move a rollout on).
func (e *env) gated(name, tag string, replicas int32) {
	e.t.Helper()
	testenv.Deployment(e.t, e.c.Client, e.ns, name, testenv.WithContainer("web", tag), testenv.WithReplicas(replicas),
		testenv.WithReadinessGate(c6Gate), testenv.WithMinReadySeconds(4))
	e.settle("Deployment", name)
}

func oneGroup(group, image, deploy, container string) string {
	return fmt.Sprintf(`  - name: %s
    anchor: {kind: Deployment, namespace: {{ns}}, name: %s}
    images:
      - name: %s
        repository: {{reg}}/acme/%s
        tag: prod
        targets:
          - {kind: Deployment, namespace: {{ns}}, name: %s, container: %s}
`, group, deploy, image, image, deploy, container)
}

// C6: a revert of a workload that was settled on its pin is re-pinned in
// the same pass, without waiting for the rollout the revert started. Here
// that rollout can never finish (its pods on the bare tag never become
// available), so under R4 alone the revert would never be re-pinned.
// Afterwards the re-pin's own rollout settles and a later pass, not a
// waiting worker, confirms it: the attempt counter is cleared.
func TestRun_C6_ARevertOfASettledPinIsRepinnedWithoutWaitingForItsRollout(t *testing.T) {
	e := newEnv(t)
	first := e.push("web", "prod")
	tag := e.repo("web") + ":prod"
	e.gated("web", tag, 2)
	cfg := e.config("groups:\n" + oneGroup("c6-revert", "web", "web", "web"))
	e.pinAll(cfg)
	pinned := tag + "@" + first
	if got := e.image("web", "web"); got != pinned {
		t.Fatalf("setup: web runs %s, want %s", got, pinned)
	}
	lb := e.startGateOwner("web", c6Gate)
	lb.failOnTag()

	ctl := e.startRun(cfg, "--poll-interval", "1h")
	ctl.waitReady(t)
	ctl.waitPasses(t, "c6-revert", 0, 1)
	e.writeImageAs("helm", "Deployment", "web", "web", tag)
	took := eventually(t, 60*time.Second, "revert re-pinned", func() bool { return e.image("web", "web") == pinned })
	t.Logf("revert re-pinned %s after the reverting write, its own rollout unfinished", took.Round(time.Millisecond))
	// The pass logs after its writes: wait for the line, do not race it.
	eventually(t, 30*time.Second, "the C6 line in the logs", func() bool {
		logs := ctl.Logs()
		return strings.Contains(logs, "taken off its pin while settled on it") && strings.Contains(logs, "(C6)")
	})
	e.settle("Deployment", "web")
	eventually(t, 60*time.Second, "the attempt confirmed and cleared by a later pass", func() bool {
		_, has := e.annotations("web")[e.key("refresh-attempt")]
		return !has
	})
	if got := e.annotations("web")[e.key("last-refreshed-web-digest")]; got != first {
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
	first := e.push("web", "prod")
	apiDigest := e.push("api", "prod")
	webTag, apiTag := e.repo("web")+":prod", e.repo("api")+":prod"
	e.gated("stuck", webTag, 1)
	testenv.Deployment(t, e.c.Client, e.ns, "other", testenv.WithContainer("api", apiTag), testenv.WithReplicas(1))
	e.settle("Deployment", "other")
	cfg := e.config("groups:\n" + oneGroup("c6-stuck", "web", "stuck", "web") + oneGroup("c6-other", "api", "other", "api"))
	e.pinAll(cfg)
	if got := e.image("stuck", "web"); got != webTag+"@"+first {
		t.Fatalf("setup: stuck runs %s", got)
	}
	lb := e.startGateOwner("stuck", c6Gate)

	ctl := e.startRun(cfg, "--poll-interval", "1s", "--poll-jitter", "0", "--workers", "1")
	ctl.waitReady(t)
	next := e.push("web", "prod")
	lb.fail(next)
	eventually(t, 60*time.Second, "stuck re-imaged to the new digest", func() bool { return e.image("stuck", "web") == webTag+"@"+next })
	from := ctl.passes(t, "c6-stuck")

	e.writeImageAs("helm", "Deployment", "other", "api", apiTag)
	took := eventually(t, 60*time.Second, "other's revert re-pinned", func() bool { return e.image("other", "api") == apiTag+"@"+apiDigest })
	t.Logf("other re-pinned %s after its revert while stuck was rolling", took.Round(time.Millisecond))

	ctl.waitPasses(t, "c6-stuck", from, 3)
	a := e.annotations("stuck")
	if got := a[e.key("refresh-attempt")]; got != "1" {
		t.Errorf("stuck's attempt = %q after passes that saw it rolling, want 1 (in flight, not counted again)", got)
	}
	if got := a[e.key("last-refreshed-web-digest")]; got != first {
		t.Errorf("stuck's record = %q, want the old %s until its rollout settles (R6)", got, first)
	}
}

// Steady state with nothing to change: passes run (the resync, each poll)
// and make no API request at all: reads come from the informer cache.
func TestRun_C6_SteadyStateMakesNoAPIRequest(t *testing.T) {
	e := newEnv(t)
	_, cfg := e.pinned()
	var mu sync.Mutex
	var requests []string
	_, kubeconfig := e.startAPIProxy("kubeconfig-count", make(chan struct{}), func(w http.ResponseWriter, r *http.Request, rp *httputil.ReverseProxy) {
		if r.URL.Query().Get("watch") != "true" {
			mu.Lock()
			requests = append(requests, r.Method+" "+r.URL.Path)
			mu.Unlock()
		}
		rp.ServeHTTP(w, r)
	})
	ctl := e.startRun(cfg, "--kubeconfig", kubeconfig, "--poll-interval", "1s", "--poll-jitter", "0")
	ctl.waitReady(t)
	from := ctl.waitPasses(t, "control-plane", 0, 2)
	mu.Lock()
	startup := len(requests)
	requests = nil
	mu.Unlock()
	ctl.waitPasses(t, "control-plane", from, 3)
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
