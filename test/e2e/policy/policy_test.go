package policy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/running"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

// The rollout policy of R22 and R23 through `tick` on the local
// cluster and registry; R21's is flap_test.go.

// agentsGroup is the setup of the R23 and R25 lockout tests: group agents,
// anchored on Deployment anchor (created with anchorOpts, its container
// not managed), whose one target is DaemonSet agent (on every node), with
// rolloutTimeout 2s and maxRefreshAttempts 2; two ticks record and pin a,
// the digest pushed first. pin names an image of agent on a digest;
// dsImage is agent's live image.
func agentsGroup(t *testing.T, e *env, anchorOpts ...testenv.Option) (a, cfg string, pin func(string) string, dsImage func() string) {
	t.Helper()
	a = e.Push("agent", "prod")
	testenv.Deployment(t, e.C.Client, e.NS, "anchor", append(anchorOpts, testenv.WithContainer("app", "registry.invalid/not-managed:1"))...)
	testenv.DaemonSet(t, e.C.Client, e.NS, "agent", testenv.WithTolerateAll(), testenv.WithContainer("agent", e.Repo("agent")+":prod"))
	e.Settle("Deployment", "anchor")
	e.Settle("DaemonSet", "agent")
	cfg = e.Config("rolloutTimeout: 2s\nmaxRefreshAttempts: 2\n" + e2e.Groups(e2e.GroupOf("agents", "Deployment", "anchor", e2e.ImageOf("agent", "agent", "prod", e2e.Target("DaemonSet", "agent", "agent")))))
	for range 2 { // first observation, then the pin
		if code, _ := e.Tick(cfg); code != 0 {
			t.Fatalf("setup tick exit %d", code)
		}
	}
	pin = func(d string) string { return e.Repo("agent") + ":prod@" + d }
	dsImage = func() string { return e.DaemonSet("agent").Spec.Template.Spec.Containers[0].Image }
	if got := dsImage(); got != pin(a) {
		t.Fatalf("setup: agent on %s, want %s", got, pin(a))
	}
	return a, cfg, pin, dsImage
}

// R23: a DaemonSet rollout that cannot finish (a node's agent died) locks
// the group out on digest B. The registry publishes C: the next tick
// re-arms the group by itself (RearmedByNewDigest Event and metric) and,
// the node back, rolls C. The tag pushed back to B: B is quarantined, not
// tried (exit 1, status row quarantined naming B, DigestQuarantined Event).
func TestTick_R23_ANewDigestRearmsALockoutAndTheLockedOnDigestIsQuarantined(t *testing.T) {
	e := newEnv(t)
	_, cfg, pin, dsImage := agentsGroup(t, e)
	lockedOnKey := e.Key("locked-on-agent")

	// node-2's agent dies: the pod a re-image sends it never runs.
	if err := e.C.StopNodeAgent("node-2"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.C.NodeUp(context.Background(), "node-2") })
	b := e.Push("agent", "prod")
	for i := range 2 {
		if code, _ := e.Tick(cfg); code != 1 {
			t.Fatalf("tick %d with a rollout that cannot finish: exit %d, want 1", i+1, code)
		}
	}
	code, logs := e.Tick(cfg)
	if code != 1 || len(e2e.LogLines(logs, "WARN", "LOCKED OUT", "publishes a digest it did not lock on")) != 1 {
		t.Fatalf("locked-out tick: exit %d, want 1 with LOCKED OUT naming R23's way out:\n%s", code, logs)
	}
	if got := e.Annotations("anchor")[lockedOnKey]; got != b {
		t.Fatalf("%s = %q after the lockout, want the digest it locked on %s", lockedOnKey, got, b)
	}
	// Negative check: still locked on b, another tick stays locked.
	if code, logs := e.Tick(cfg); code != 1 || !strings.Contains(logs, "LOCKED OUT") || strings.Contains(logs, "RearmedByNewDigest") {
		t.Fatalf("tick while the registry still serves the locked-on digest: exit %d, want 1, locked out, not re-armed:\n%s", code, logs)
	}

	// The registry publishes c; the node comes back.
	c := e.Push("agent", "prod")
	if err := e.C.NodeUp(context.Background(), "node-2"); err != nil {
		t.Fatal(err)
	}
	e.Settle("DaemonSet", "agent")
	metricsFile := filepath.Join(t.TempDir(), "metrics.prom")
	code, logs = e.Tick(cfg, "--metrics-file", metricsFile)
	if code != 0 {
		t.Fatalf("tick after a new digest: exit %d, want 0 (re-armed by itself, rolled):\n%s", code, logs)
	}
	if len(e2e.LogLines(logs, "WARN", "re-armed once by itself", c)) != 1 {
		t.Errorf("no WARN saying the group re-armed by itself for %s:\n%s", c, logs)
	}
	if got := dsImage(); got != pin(c) {
		t.Errorf("after the re-arm agent on %s, want %s", got, pin(c))
	}
	an := e.Annotations("anchor")
	if an[e.Key("last-refreshed-agent-digest")] != c || an[e.Key("refresh-attempt")] != "" || an[e.Key("refresh-flap-detected")] != "" || an[lockedOnKey] != b {
		t.Errorf("after the re-arm: record %q attempt %q flap %q locked-on %q, want %s, none, none, %s",
			an[e.Key("last-refreshed-agent-digest")], an[e.Key("refresh-attempt")], an[e.Key("refresh-flap-detected")], an[lockedOnKey], c, b)
	}
	if !e2e.HasEvent(e.Events("anchor"), "RearmedByNewDigest", c) {
		t.Errorf("no RearmedByNewDigest Event naming %s on the anchor: %q", c, e.Events("anchor"))
	}
	if m, err := os.ReadFile(metricsFile); err != nil || !strings.Contains(string(m), `image_refresh_rearmed_by_new_digest_total{group="agents"} 1`) {
		t.Errorf("metrics file lacks the re-arm count (%v):\n%s", err, m)
	}

	// The tag back on b: quarantined, not tried.
	e.Reg.MustTag(t, "acme/agent", "prod", b)
	gen := e.DaemonSet("agent").Generation
	code, logs = e.Tick(cfg)
	if code != 1 || len(e2e.LogLines(logs, "WARN", "quarantined", b, "rearm --config")) != 1 {
		t.Errorf("tick with the tag on the quarantined digest: exit %d, want 1 with a WARN naming it and rearm:\n%s", code, logs)
	}
	if got, g := dsImage(), e.DaemonSet("agent").Generation; got != pin(c) || g != gen {
		t.Errorf("the quarantined digest was tried: agent on %s (generation %d -> %d), want %s untouched", got, gen, g, pin(c))
	}
	if r := e2e.Row(e.Status(cfg), "agent", "agent"); r["state"] != "quarantined" || r["latest"] != b || !strings.Contains(r["message"].(string), b) {
		t.Errorf("status row = %v, want state quarantined naming %s", r, b)
	}
	if !e2e.HasEvent(e.Events("anchor"), "DigestQuarantined", b) {
		t.Errorf("no DigestQuarantined Event naming %s: %q", b, e.Events("anchor"))
	}
	// rearm takes it out of quarantine: the next tick tries b.
	if code, out, errOut := e.Run("rearm", "--config", cfg, "--kubeconfig", e.Kubeconfig, "--group", "agents"); code != 0 || !strings.Contains(out, lockedOnKey) {
		t.Fatalf("rearm exit %d, want 0 naming %s:\n%s%s", code, lockedOnKey, out, errOut)
	}
	if code, _ := e.Tick(cfg); code != 0 || dsImage() != pin(b) {
		t.Errorf("tick after rearm: exit %d, agent on %s, want 0 and %s", code, dsImage(), pin(b))
	}
}

// R22: with minDigestAge 10m a new digest waits (status "waiting" with the
// time left, nothing written to the targets) and rolls once the injected
// clock has moved 10 minutes past its first sighting.
func TestTick_R22_ANewDigestWaitsForMinDigestAgeThenRolls(t *testing.T) {
	e := newEnv(t)
	e.Clock = e2e.NewClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	a := e.Seed()
	cfg := e.Config("minDigestAge: 10m\n" + e2e.SeedShape)
	for range 2 {
		if code, _ := e.Tick(cfg); code != 0 {
			t.Fatalf("setup tick exit %d", code)
		}
	}
	pinA := e.Repo("api") + ":prod@" + a
	b := e.Push("api", "prod")
	pinB := e.Repo("api") + ":prod@" + b
	proxy := e.WatchDeployment("requests-proxy")

	for i, left := range []string{"in 10m0s", "in 5m0s", "in 1s"} {
		code, logs := e.Tick(cfg)
		if code != 0 {
			t.Fatalf("tick %d while waiting: exit %d, want 0", i+1, code)
		}
		// The tick ran: it keeps the first sighting on the anchor.
		if got := e.Annotations("jobs-manager")[e.Key("first-seen-api")]; got != b+" 2026-12-02T12:00:00Z" {
			t.Fatalf("tick %d: first-seen %q, want %s at 12:00", i+1, got, b)
		}
		if len(e2e.LogLines(logs, "INFO", "waiting", left)) != 1 {
			t.Errorf("tick %d: no INFO saying it waits %s:\n%s", i+1, left, logs)
		}
		if r := e2e.Row(e.Status(cfg), "requests-proxy", "proxy"); r["state"] != "waiting" || !strings.Contains(r["message"].(string), left) {
			t.Errorf("tick %d: status row %v, want waiting %s", i+1, r, left)
		}
		if got := e.Image("requests-proxy", "proxy"); got != pinA {
			t.Fatalf("tick %d: requests-proxy on %s while waiting, want %s", i+1, got, pinA)
		}
		e.Clock.Add([]time.Duration{5 * time.Minute, 5*time.Minute - time.Second, time.Second}[i])
	}
	if moves, seen := imageMoves(proxy.Take(), "proxy", pinA); moves != 0 {
		t.Fatalf("requests-proxy moved %d times while waiting, want 0: %v", moves, seen)
	}
	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("tick at minDigestAge: exit %d, want 0", code)
	}
	if got := e.Image("requests-proxy", "proxy"); got != pinB {
		t.Errorf("at minDigestAge requests-proxy on %s, want %s", got, pinB)
	}
	if an := e.Annotations("jobs-manager"); an[e.Key("last-refreshed-api-digest")] != b || an[e.Key("first-seen-api")] != "" {
		t.Errorf("after the roll: record %q first-seen %q, want %s and none", an[e.Key("last-refreshed-api-digest")], an[e.Key("first-seen-api")], b)
	}
	if moves, _ := imageMoves(proxy.Take(), "proxy", pinA); moves != 1 {
		t.Errorf("requests-proxy moved %d times, want 1", moves)
	}
}

// R24: outside every rolloutWindows window a digest change waits (status
// "window-closed" naming the next opening, exit 0), a helm revert is still
// re-pinned to the recorded digest, and the first tick inside the window
// (the injected clock moved there) rolls the new digest.
func TestTick_R24_AClosedWindowHoldsADigestChangeButNotARevert(t *testing.T) {
	e := newEnv(t)
	e.Clock = e2e.NewClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)) // a Wednesday
	a := e.Seed()
	cfg := e.Config("rolloutWindows:\n  - days: [Wed]\n    start: \"22:00\"\n    end: \"23:00\"\n" + e2e.SeedShape)
	for range 2 { // first observation, then the first pin: not a digest change
		if code, _ := e.Tick(cfg); code != 0 {
			t.Fatalf("setup tick exit %d", code)
		}
	}
	pinA := e.Repo("api") + ":prod@" + a
	if got := e.Image("requests-proxy", "proxy"); got != pinA {
		t.Fatalf("setup: requests-proxy on %s, want %s", got, pinA)
	}
	b := e.Push("api", "prod")
	pinB := e.Repo("api") + ":prod@" + b
	proxy := e.WatchDeployment("requests-proxy")

	code, logs := e.Tick(cfg)
	if code != 0 || len(e2e.LogLines(logs, "INFO", "outside rolloutWindows", "opening 2026-12-02T22:00:00Z")) != 1 {
		t.Fatalf("tick outside the window: exit %d, want 0 with an INFO naming the next opening:\n%s", code, logs)
	}
	if got := e.Image("requests-proxy", "proxy"); got != pinA {
		t.Errorf("outside the window requests-proxy on %s, want %s", got, pinA)
	}
	if r := e2e.Row(e.Status(cfg), "requests-proxy", "proxy"); r["state"] != "window-closed" || r["latest"] != b {
		t.Errorf("status row %v, want window-closed with latest %s", r, b)
	}

	// A revert outside the window is re-pinned to the recorded digest.
	e.SetImageAs("helm", "Deployment", "requests-proxy", "proxy", e.Repo("api")+":prod")
	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("tick after a revert outside the window: exit %d, want 0", code)
	}
	if got := e.Image("requests-proxy", "proxy"); got != pinA {
		t.Errorf("the revert outside the window left requests-proxy on %s, want %s", got, pinA)
	}
	if moves, seen := imageMoves(proxy.Take(), "proxy", pinA); moves != 2 {
		t.Errorf("requests-proxy moved %d times outside the window, want 2 (the revert and its re-pin): %v", moves, seen)
	}

	// The window opens: the digest change rolls.
	e.Clock.Add(10 * time.Hour)
	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("tick inside the window: exit %d, want 0", code)
	}
	if got := e.Image("requests-proxy", "proxy"); got != pinB {
		t.Errorf("inside the window requests-proxy on %s, want %s", got, pinB)
	}
	if r := e2e.Row(e.Status(cfg), "requests-proxy", "proxy"); r["state"] != "pinned" {
		t.Errorf("status row inside the window %v, want pinned", r)
	}
}

// rolloutTimes watches Deployments and notes, per name, when its image
// first changed to one ending in suffix and when it then first read
// settled on it (all replicas updated and available, generation observed).
type rolloutTimes struct {
	mu              sync.Mutex
	wrote, finished map[string]time.Time
	changed         chan struct{} // closed and replaced on each event
}

// Changed is closed at the next event of the watch (testwait.Until).
func (rt *rolloutTimes) Changed() <-chan struct{} {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.changed
}

func (e *env) watchRollouts(suffix string, names ...string) *rolloutTimes {
	e.T.Helper()
	rt := &rolloutTimes{wrote: map[string]time.Time{}, finished: map[string]time.Time{}, changed: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	e.T.Cleanup(cancel)
	w, err := e.C.Client.AppsV1().Deployments(e.NS).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			d, ok := ev.Object.(*appsv1.Deployment)
			if !ok || !want[d.Name] || !strings.HasSuffix(d.Spec.Template.Spec.Containers[0].Image, suffix) {
				continue
			}
			now := time.Now()
			rt.mu.Lock()
			if _, ok := rt.wrote[d.Name]; !ok {
				rt.wrote[d.Name] = now
			}
			s := d.Status
			if _, ok := rt.finished[d.Name]; !ok && s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == *d.Spec.Replicas &&
				s.AvailableReplicas == *d.Spec.Replicas && s.Replicas == *d.Spec.Replicas {
				rt.finished[d.Name] = now
			}
			close(rt.changed)
			rt.changed = make(chan struct{})
			rt.mu.Unlock()
		}
	}()
	return rt
}

// R24: maxConcurrentRollouts 1 in `run`, three groups whose images change
// at once (one push): they roll out one after the other (each image write
// comes after the previous group's rollout finished), and each waiting
// group says queued meanwhile.
func TestRun_R24_MaxConcurrentRolloutsRollsGroupsOneAfterTheOther(t *testing.T) {
	e := newEnv(t)
	first := e.Push("api", "prod")
	tag := e.Repo("api") + ":prod"
	names := []string{"d1", "d2", "d3"}
	var groups strings.Builder
	for _, n := range names {
		// minReadySeconds: each rollout lasts 2 s, long enough to overlap
		// if nothing held the others back.
		testenv.Deployment(t, e.C.Client, e.NS, n, testenv.WithContainer("app", tag), testenv.WithReplicas(1), testenv.WithMinReadySeconds(2))
		e.Settle("Deployment", n)
		fmt.Fprintf(&groups, `  - name: g-%s
    anchor: {kind: Deployment, namespace: {{ns}}, name: %s}
    images:
      - name: api
        repository: {{reg}}/acme/api
        tag: prod
        targets:
          - {kind: Deployment, namespace: {{ns}}, name: %s, container: app}
`, n, n, n)
	}
	cfg := e.Config("maxConcurrentRollouts: 1\ngroups:\n" + groups.String())
	e.PinAll(cfg)
	for _, n := range names {
		if got := e.Image(n, "app"); got != tag+"@"+first {
			t.Fatalf("setup: %s on %s", n, got)
		}
	}
	ctl := e.StartRun(cfg, "--poll-interval", "1s", "--poll-jitter", "0")
	ctl.WaitReady(t)
	for _, n := range names {
		ctl.WaitPasses(t, "g-"+n, 0, 1)
	}
	next := e.Push("api", "prod")
	rt := e.watchRollouts("@"+next, names...)
	testwait.Until(t, "every group rolled out to the new digest", rt.Changed, func() bool {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		return len(rt.finished) == len(names)
	})
	rt.mu.Lock()
	order := slices.Clone(names)
	slices.SortFunc(order, func(a, b string) int { return rt.wrote[a].Compare(rt.wrote[b]) })
	for i := 1; i < len(order); i++ {
		prev, cur := order[i-1], order[i]
		if rt.wrote[cur].Before(rt.finished[prev]) {
			t.Errorf("%s was re-imaged %s before %s's rollout finished: two rollouts at once with maxConcurrentRollouts 1",
				cur, rt.finished[prev].Sub(rt.wrote[cur]).Round(time.Millisecond), prev)
		}
		t.Logf("%s re-imaged %s after %s finished", cur, rt.wrote[cur].Sub(rt.finished[prev]).Round(time.Millisecond), prev)
	}
	rt.mu.Unlock()
	for _, n := range order[1:] {
		if len(e2e.LogLines(ctl.Logs(), "INFO", "queued:", "group=g-"+n)) == 0 {
			t.Errorf("group g-%s never said queued while another rolled out", n)
		}
	}
}

// R22 and R24 windows through `run`: the poller sees a new digest; the
// controller holds it as waiting (minDigestAge) and window-closed
// (rolloutWindows), re-pins a revert meanwhile, and rolls once the
// injected clock is past the age and inside the window.
func TestRun_R22_R24_AWaitingDigestRollsWhenOldEnoughAndTheWindowOpens(t *testing.T) {
	e := newEnv(t)
	e.Clock = e2e.NewClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)) // a Wednesday
	a := e.Seed()
	cfg := e.Config("minDigestAge: 10m\nrolloutWindows:\n  - days: [Wed]\n    start: \"12:30\"\n    end: \"13:00\"\n" + e2e.SeedShape)
	e.PinAll(cfg)
	pinA := e.Repo("api") + ":prod@" + a
	ctl := e.StartRun(cfg, "--poll-interval", "300ms", "--poll-jitter", "0")
	ctl.WaitReady(t)
	ctl.WaitPasses(t, "control-plane", 0, 1)
	b := e.Push("api", "prod")
	pinB := e.Repo("api") + ":prod@" + b
	proxy := e.WatchDeployment("requests-proxy")

	e.UntilDeployments(30*time.Second, "the new digest first seen", func() bool {
		return e.Annotations("jobs-manager")[e.Key("first-seen-api")] == b+" 2026-12-02T12:00:00Z"
	})
	if r := e2e.Row(e.Status(cfg), "requests-proxy", "proxy"); r["state"] != "waiting" {
		t.Errorf("status row %v, want waiting", r)
	}
	// Old enough, but the window is still closed.
	e.Clock.Add(10 * time.Minute)
	ctl.UntilLogged(t, "window-closed said", func(logs string) bool {
		return len(e2e.LogLines(logs, "INFO", "outside rolloutWindows", "opening 2026-12-02T12:30:00Z")) > 0
	})
	e.SetImageAs("helm", "Deployment", "requests-proxy", "proxy", e.Repo("api")+":prod")
	e.UntilDeployments(30*time.Second, "the revert re-pinned to the recorded digest", func() bool { return e.Image("requests-proxy", "proxy") == pinA })
	ctl.KickedPasses(t, e.Env, "control-plane", "jobs-manager")
	if r := e2e.Row(e.Status(cfg), "requests-proxy", "proxy"); r["state"] != "window-closed" || e.Image("requests-proxy", "proxy") != pinA {
		t.Errorf("status row %v on %s, want window-closed on %s", r, e.Image("requests-proxy", "proxy"), pinA)
	}
	// The window opens. The clock is the engine's, also for an attempt's
	// deadline: move it only with no attempt in flight (the re-pin's
	// confirmed), or that attempt would read as overdue.
	e.UntilDeployments(30*time.Second, "the re-pin confirmed", func() bool { return e.Annotations("jobs-manager")[e.Key("refresh-attempt")] == "" })
	e.Clock.Add(20 * time.Minute)
	e.UntilDeployments(30*time.Second, "rolled inside the window", func() bool { return e.Image("requests-proxy", "proxy") == pinB })
	if moves, seen := imageMoves(proxy.Take(), "proxy", pinA); moves != 3 {
		t.Errorf("requests-proxy moved %d times, want 3 (revert, re-pin, roll): %v", moves, seen)
	}
}

// R23 through `run`: a rollout whose pods never become Ready locks the
// group out on digest B (rolloutTimeout 4s, maxRefreshAttempts 2). The
// registry publishes C: the controller's next pass re-arms the group by
// itself (RearmedByNewDigest Event and metric) and rolls C, although the
// group is still unsettled by its stuck rollout of B (R23 replaces it; R4
// alone would skip the group until it froze). The tag pushed back to B: B
// is quarantined, logged and never written to the Deployment.
func TestRun_R23_ANewDigestRearmsALockedOutGroupAndTheLockedOnDigestIsNeverTried(t *testing.T) {
	const gate = "lb.acme.example/target-healthy"
	e := newEnv(t)
	e.Push("web", "prod")
	tag := e.Repo("web") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "web", testenv.WithContainer("web", tag), testenv.WithReplicas(1),
		testenv.WithReadinessGate(gate), testenv.WithMinReadySeconds(4))
	lb := e.StartGateOwner("web", gate)
	e.Settle("Deployment", "web")
	groups := "groups:\n" + e2e.OneGroup("fixes", "web", "web", "web")
	e.PinAll(e.Config(groups))
	cfg := e.Config("rolloutTimeout: 4s\nmaxRefreshAttempts: 2\n" + groups)
	ctl := e.StartRun(cfg, "--poll-interval", "1s", "--poll-jitter", "0")
	ctl.WaitReady(t)
	rearms := func() int {
		_, body := running.Get("http://" + ctl.Metrics + "/metrics")
		v, _ := running.MetricValue(body, "image_refresh_rearmed_by_new_digest_total", map[string]string{"group": "fixes"})
		n, _ := strconv.Atoi(v)
		return n
	}
	rearmsBefore := rearms() // the registry is process-wide

	hist := e.WatchDeployment("web")
	b := e.Push("web", "prod")
	lb.Fail(b) // its pods run but never become Ready
	flapKey, attemptKey, lockedOnKey, recordKey := e.Key("refresh-flap-detected"), e.Key("refresh-attempt"), e.Key("locked-on-web"), e.Key("last-refreshed-web-digest")
	e.UntilDeployments(2*time.Minute, "locked out on B after 2 attempts", func() bool {
		st := e.StateOf("web")
		return st[flapKey] == "2" && st[lockedOnKey] == b
	})
	if got := e.Image("web", "web"); got != tag+"@"+b {
		t.Fatalf("locked out with web on %s, want the stuck %s", got, tag+"@"+b)
	}

	// The registry publishes a fixed build C while web is still stuck on B.
	c := e.Push("web", "prod")
	e.UntilEvents(60*time.Second, "the RearmedByNewDigest Event naming C", func() bool {
		return e2e.HasEvent(e.Events("web"), "RearmedByNewDigest", c)
	})
	e.UntilDeployments(60*time.Second, "C rolled, settled and recorded, attempt and lockout cleared", func() bool {
		st := e.StateOf("web")
		return e.Image("web", "web") == tag+"@"+c && st[recordKey] == c && st[flapKey] == "" && st[attemptKey] == ""
	})
	if n := rearms() - rearmsBefore; n != 1 {
		t.Errorf("image_refresh_rearmed_by_new_digest_total{group=\"fixes\"} rose by %d, want 1", n)
	}
	if got := e.StateOf("web")[lockedOnKey]; got != b {
		t.Errorf("%s = %q after the re-arm, want %s still quarantined", lockedOnKey, got, b)
	}
	rolledC, _ := hist.First(func(v e2e.DeployVersion) bool { return v.Images["web"] == tag+"@"+c })

	// The tag back on B: quarantined, never tried. The WARN is the pass
	// that saw it; a kicked pass after it must not try B either.
	e.Reg.MustTag(t, "acme/web", "prod", b)
	ctl.UntilLogged(t, "the quarantine WARN naming B", func(logs string) bool {
		return len(e2e.LogLines(logs, "WARN", "quarantined", b)) > 0
	})
	ctl.KickedPasses(t, e.Env, "fixes", "web")
	for _, v := range hist.Take() {
		if v.Images["web"] == tag+"@"+b && v.At.After(rolledC.At) {
			t.Errorf("the quarantined digest B was written to web after C rolled: %s", v)
		}
	}
	if got := e.Image("web", "web"); got != tag+"@"+c {
		t.Errorf("web on %s with the tag on the quarantined B, want %s", got, tag+"@"+c)
	}
	if !e2e.HasEvent(e.Events("web"), "DigestQuarantined", b) {
		t.Errorf("no DigestQuarantined Event naming B %s: %q", b, e.Events("web"))
	}
	if r := e2e.Row(e.Status(cfg), "web", "web"); r["state"] != "quarantined" || !strings.Contains(r["message"].(string), b) {
		t.Errorf("status row %v, want quarantined naming %s", r, b)
	}
}

// R24 after a restart, with discovery (D1): a group discovered by label
// whose rollout a previous leader left in flight (attempt 1 and its holder
// on the anchor, the rollout not settled) takes the one slot of
// maxConcurrentRollouts 1, so a configured group whose digest changed is
// queued until that rollout settled. With one worker the configured
// group's first pass runs before the first discovery pass: the slots must
// be counted from the discovered groups' anchors too, not from the
// configured ones alone.
func TestRun_R24_D1_ARestartedLeaderCountsTheRolloutsInFlightOfDiscoveredGroups(t *testing.T) {
	e := &env{e2e.DiscoveryEnv(t)}
	first := e.Push("api", "prod")
	e.Push("agent", "prod")
	apiTag, agentTag := e.Repo("api")+":prod", e.Repo("agent")+":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "conf", testenv.WithContainer("app", apiTag))
	e.Settle("Deployment", "conf")
	lb := e.Gated("disc", agentTag, 1)
	e.Enable("Deployment", "disc")
	cfg := e.Config("maxConcurrentRollouts: 1\ngroups:\n" + e2e.OneGroup("conf", "api", "conf", "app"))
	for range 2 { // first observation, then the pins
		if code, logs := e.DiscoveryTick(cfg); code != 0 {
			t.Fatalf("setup tick exit %d:\n%s", code, logs)
		}
	}
	if got := e.Image("conf", "app"); got != apiTag+"@"+first {
		t.Fatalf("setup: conf on %s", got)
	}
	discGroup := e.NS + "/deployment/disc"

	// A previous leader re-imaged disc to a new digest under attempt 1 and
	// died; that rollout has not settled (its pods are not Ready yet).
	newAgent := e.Push("agent", "prod")
	lb.Fail(newAgent)
	e.Annotate("disc", map[string]*string{
		e.Key("refresh-attempt"):        e2e.Ptr("1"),
		e.Key("refresh-attempt-holder"): e2e.Ptr(state.Holder{Instance: "previous-leader", Since: time.Now()}.String()),
	})
	e.WriteImageAs("image-refresh", "Deployment", "disc", "web", agentTag+"@"+newAgent)
	next := e.Push("api", "prod") // conf's digest changes while the leader is away

	ctl := e.StartRun(cfg, "--workers", "1", "--watch-namespaces", e.NS, "--poll-interval", "1s", "--poll-jitter", "0")
	ctl.WaitReady(t)
	ctl.UntilLogged(t, "conf queued behind the discovered group's rollout", func(logs string) bool {
		return len(e2e.LogLines(logs, "INFO", "queued:", discGroup, "group=conf")) > 0
	})
	// Two more passes of conf while disc is still rolling: still queued.
	ctl.KickedPasses(t, e.Env, "conf", "conf")
	if got := e.Image("conf", "app"); got != apiTag+"@"+first {
		t.Fatalf("conf re-imaged to %s while the discovered group's rollout was in flight, with maxConcurrentRollouts 1", got)
	}
	if r := e2e.Row(e.Status(cfg), "conf", "app"); r["state"] != "queued" {
		t.Errorf("status row of conf %v, want queued", r)
	}

	// disc's rollout settles: its pass confirms it and conf takes the slot.
	lb.Fail("")
	e.UntilDeployments(60*time.Second, "conf rolled once the discovered group's rollout settled", func() bool {
		return e.Image("conf", "app") == apiTag+"@"+next
	})
	if got := e.Annotations("disc")[e.Key("refresh-attempt")]; got != "" {
		t.Errorf("disc's attempt %q after conf rolled, want it confirmed and cleared first", got)
	}
}

// R24 through `run` and `status`: maxConcurrentRollouts 1, two groups whose
// image changes at once. The rollout of the group that took the slot is
// held unfinished (its new pods are not Ready) so that the other group
// waits for as long as the test looks: `status`, a separate process that
// reads the anchors, shows it `queued` naming the group that rolls, and
// its Deployment is untouched. Once the first rollout settles, the queued
// group rolls.
func TestRun_R24_StatusSaysQueuedForAGroupWaitingForARolloutSlot(t *testing.T) {
	e := newEnv(t)
	first := e.Push("api", "prod")
	tag := e.Repo("api") + ":prod"
	names := []string{"q1", "q2"}
	gates := map[string]*e2e.GateOwner{}
	groups := "groups:\n"
	for _, n := range names {
		gates[n] = e.Gated(n, tag, 1)
		groups += e2e.OneGroup("g-"+n, "api", n, "web")
	}
	cfg := e.Config("maxConcurrentRollouts: 1\n" + groups)
	e.PinAll(cfg)
	ctl := e.StartRun(cfg, "--poll-interval", "1s", "--poll-jitter", "0")
	ctl.WaitReady(t)
	for _, n := range names {
		ctl.WaitPasses(t, "g-"+n, 0, 1)
	}
	next := e.Push("api", "prod")
	for _, n := range names {
		gates[n].Fail(next) // the new pods stay unready until healed
	}
	var rolling, waiting string
	// One group rolls (it stays on next: its new pods are not Ready), then
	// the other says queued.
	e.UntilDeployments(60*time.Second, "one group rolling", func() bool {
		for i, n := range names {
			if e.Image(n, "web") == tag+"@"+next {
				rolling, waiting = n, names[1-i]
				return true
			}
		}
		return false
	})
	ctl.UntilLogged(t, "the other group queued", func(logs string) bool {
		return len(e2e.LogLines(logs, "INFO", "queued:", "group=g-"+waiting)) > 0
	})
	r := e2e.Row(e.Status(cfg), waiting, "web")
	if r["state"] != "queued" || !strings.Contains(r["message"].(string), "g-"+rolling) {
		t.Errorf("status row of %s = %v, want queued naming g-%s", waiting, r, rolling)
	}
	if got := e.Image(waiting, "web"); got != tag+"@"+first {
		t.Errorf("%s on %s while queued, want %s", waiting, got, tag+"@"+first)
	}

	// The first rollout settles: the queued group takes the slot.
	gates[rolling].Fail("")
	gates[waiting].Fail("")
	e.UntilDeployments(60*time.Second, "the queued group rolled once the slot was free", func() bool {
		return e.Image(waiting, "web") == tag+"@"+next && e.Annotations(waiting)[e.Key("last-refreshed-api-digest")] == next
	})
	if r := e2e.Row(e.Status(cfg), waiting, "web"); r["state"] != "pinned" {
		t.Errorf("status row of %s after its rollout %v, want pinned", waiting, r)
	}
}
