package policy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/e2e"
)

// imageMoves counts the image changes of one container, starting on from,
// across a watched Deployment's stored versions: the rollouts image-refresh
// (or anyone) caused.
func imageMoves(versions []e2e.DeployVersion, container, from string) (moves int, seen []string) {
	last := from
	for _, v := range versions {
		if img := v.Images[container]; img != last {
			moves++
			seen = append(seen, img)
			last = img
		}
	}
	return moves, seen
}

// flapEnv is the setup of the R21 tests: the seed group (e2e.SeedShape,
// recorded on a) with maxDigestChanges 2 per 1h, on a clock injected at
// 12:00.
func flapEnv(t *testing.T) (e *env, a, cfg string) {
	e = newEnv(t)
	e.Clock = e2e.NewClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	a = e.Seed()
	cfg = e.Config("maxDigestChanges: 2\ndigestChangeWindow: 1h\n" + e2e.SeedShape)
	return e, a, cfg
}

// tickFlapEnv is flapEnv with the group recorded and pinned on a by two
// ticks.
func tickFlapEnv(t *testing.T) (e *env, a, cfg string) {
	e, a, cfg = flapEnv(t)
	for range 2 {
		if code, _ := e.Tick(cfg); code != 0 {
			t.Fatalf("setup tick exit %d", code)
		}
	}
	return e, a, cfg
}

// runFlap is the R21 setup through `run`: a controller polling every
// 300 ms that has spent the budget, moving a → b → a (10 s apart on the
// clock), each move rolled and recorded.
type runFlap struct {
	*env
	cfg, a, b, pinA, pinB string
	ctl                   *e2e.RunningController
	proxy                 *e2e.DeployHistory // requests-proxy's versions since before the controller started
}

func startRunFlap(t *testing.T) *runFlap {
	e, a, cfg := flapEnv(t)
	e.PinAll(cfg)
	b := e.Push("api", "prod")
	e.Reg.MustTag(t, "acme/api", "prod", a)
	f := &runFlap{env: e, cfg: cfg, a: a, b: b, pinA: e.Repo("api") + ":prod@" + a, pinB: e.Repo("api") + ":prod@" + b}
	f.proxy = e.WatchDeployment("requests-proxy")
	f.ctl = e.StartRun(cfg, "--poll-interval", "300ms", "--poll-jitter", "0")
	f.ctl.WaitReady(t)
	f.ctl.WaitPasses(t, "control-plane", 0, 1)
	e.Clock.Add(10 * time.Second)
	e.Reg.MustTag(t, "acme/api", "prod", b)
	e.UntilDeployments(30*time.Second, "move 1 rolled", f.on(f.pinB))
	e.Clock.Add(10 * time.Second)
	e.Reg.MustTag(t, "acme/api", "prod", a)
	e.UntilDeployments(30*time.Second, "move 2 rolled", f.on(f.pinA))
	return f
}

// on: both targets on want and the record on its digest (rolled and
// confirmed, so the move counts).
func (f *runFlap) on(want string) func() bool {
	return func() bool {
		return f.Image("requests-proxy", "proxy") == want && f.Image("jobs-manager", "api") == want &&
			strings.HasSuffix(want, "@"+f.Annotations("jobs-manager")[f.Key("last-refreshed-api-digest")])
	}
}

// noAttempt waits until no attempt is in flight.
func (f *runFlap) noAttempt() {
	f.T.Helper()
	f.UntilDeployments(30*time.Second, "no attempt in flight", func() bool { return f.Annotations("jobs-manager")[f.Key("refresh-attempt")] == "" })
}

// R21: a registry whose tag flips between two digests before each of 10
// ticks (a minute apart on the injected clock): with maxDigestChanges 2 per
// 1h the targets roll twice, then the image is held on its recorded digest
// as tag-flapping, loudly (exit 1, TagFlapping Event naming rearm, status
// row "tag-flapping"), also on the ticks that find the tag back on the
// recorded digest; a revert while held is re-pinned to the recorded
// digest (R7). An hour later on the clock the hold ends by itself: the next
// tick rolls to the tag's digest. rearm also ends a hold at once.
func TestTick_R21_AFlippingTagRollsAtMostMaxDigestChangesTimes(t *testing.T) {
	e, a, cfg := tickFlapEnv(t)
	b := e.Push("api", "prod") // the tag now on b
	proxy := e.WatchDeployment("requests-proxy")
	pinA, pinB := e.Repo("api")+":prod@"+a, e.Repo("api")+":prod@"+b

	flipTo := func(d string) { e.Reg.MustTag(t, "acme/api", "prod", d) }
	type step struct {
		tag       string // where the tag points before the tick
		revert    bool   // a helm re-render reverts requests-proxy first
		wantCode  int
		wantImage string
	}
	steps := []step{
		{b, false, 0, pinB}, // move 1: rolled
		{a, false, 0, pinA}, // move 2: rolled
		{b, false, 1, pinA}, // budget spent: held on a
		{a, false, 1, pinA}, // the tag is back on the record: still tag-flapping (R21)
		{b, true, 1, pinA},  // held, and a revert is re-pinned to the record
		{a, false, 1, pinA},
		{b, false, 1, pinA}, // held
		{a, false, 1, pinA},
		{b, false, 1, pinA},
		{a, false, 1, pinA},
	}
	for i, s := range steps {
		e.Clock.Add(time.Minute)
		flipTo(s.tag)
		if s.revert {
			e.SetImageAs("helm", "Deployment", "requests-proxy", "proxy", e.Repo("api")+":prod")
		}
		code, logs := e.Tick(cfg)
		if code != s.wantCode {
			t.Fatalf("tick %d (tag on %s): exit %d, want %d", i+1, s.tag, code, s.wantCode)
		}
		for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
			if got := e.Image(w[0], w[1]); got != s.wantImage {
				t.Fatalf("tick %d: %s on %s, want %s", i+1, w[0], got, s.wantImage)
			}
		}
		if s.wantCode == 1 {
			if len(e2e.LogLines(logs, "WARN", "is flapping", "moved 2 times", "until 2026-12-02T13:01:00Z", "rearm --config")) == 0 {
				t.Errorf("tick %d: no WARN naming the flap, its end and the rearm command:\n%s", i+1, logs)
			}
			if rec := e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")]; rec != a {
				t.Errorf("tick %d: record %s while held, want %s", i+1, rec, a)
			}
			if r := e2e.Row(e.Status(cfg), "requests-proxy", "proxy"); r["state"] != "tag-flapping" || !strings.Contains(r["remediation"].(string), "rearm") {
				t.Errorf("tick %d: status row of requests-proxy = %v, want state tag-flapping with the rearm remediation", i+1, r)
			}
		}
	}
	if !e2e.HasEvent(e.Events("jobs-manager"), "TagFlapping", "rearm") {
		t.Errorf("no TagFlapping event naming rearm on the anchor: %q", e.Events("jobs-manager"))
	}
	// The bound: 2 digest moves, plus the revert and its re-pin.
	moves, seen := imageMoves(proxy.Take(), "proxy", pinA)
	if moves != 4 {
		t.Errorf("requests-proxy's image moved %d times over 10 flips, want 4 (2 rolls, 1 revert, 1 re-pin): %v", moves, seen)
	}

	// The window passes on the clock (the first counted move was at 12:01): the
	// hold ends by itself, and the next tick rolls once.
	e.Clock.Add(time.Hour)
	flipTo(b)
	if code, logs := e.Tick(cfg); code != 0 {
		t.Fatalf("tick after the window: exit %d, want 0\n%s", code, logs)
	}
	if got := e.Image("requests-proxy", "proxy"); got != pinB {
		t.Errorf("after the window requests-proxy on %s, want %s", got, pinB)
	}
	if r := e2e.Row(e.Status(cfg), "requests-proxy", "proxy"); r["state"] != "pinned" {
		t.Errorf("after the window status row of requests-proxy = %v, want pinned", r)
	}
	if moves, seen := imageMoves(proxy.Take(), "proxy", pinA); moves != 1 {
		t.Errorf("after the window requests-proxy moved %d times, want 1: %v", moves, seen)
	}

	// Two more moves spend the budget again; rearm ends the hold at once.
	for _, d := range []string{a, b} {
		e.Clock.Add(time.Minute)
		flipTo(d)
		e.Tick(cfg)
	}
	if code, _ := e.Tick(cfg); code != 1 {
		t.Fatalf("tick with the budget spent again: exit %d, want 1", code)
	}
	if code, out, logs := e.Run("rearm", "--config", cfg, "--kubeconfig", e.Kubeconfig, "--group", "control-plane"); code != 0 || !strings.Contains(out, e.Key("digest-changes-api")) {
		t.Fatalf("rearm exit %d, want 0 naming the cleared digest-changes key:\n%s\n%s", code, out, logs)
	}
	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("tick after rearm exit %d, want 0", code)
	}
	if got := e.Image("requests-proxy", "proxy"); got != pinB {
		t.Errorf("after rearm requests-proxy on %s, want %s", got, pinB)
	}
}

// R21 through `run`: the poller sees the tag flip between two digests;
// the controller rolls twice, then holds the image as tag-flapping (WARN,
// status row) while the flips go on, and rolls by itself once the injected
// clock has passed the window.
func TestRun_R21_AFlippingTagRollsAtMostMaxDigestChangesTimes(t *testing.T) {
	f := startRunFlap(t)
	e, ctl, b, pinA, pinB := f.env, f.ctl, f.b, f.pinA, f.pinB
	held := func(logs string) int {
		return len(e2e.LogLines(logs, "WARN", "is flapping", "instead of rolling to "+b))
	}

	for i := range 4 { // the budget is spent: each flip to b is held
		e.Clock.Add(10 * time.Second)
		before := held(ctl.Logs())
		e.Reg.MustTag(t, "acme/api", "prod", b)
		ctl.UntilLogged(t, fmt.Sprintf("flip %d to b held, loudly", i+1), func(logs string) bool { return held(logs) > before })
		if got := e.Image("requests-proxy", "proxy"); got != pinA {
			t.Fatalf("flip %d: requests-proxy on %s while tag-flapping, want %s", i+1, got, pinA)
		}
		e.Reg.MustTag(t, "acme/api", "prod", f.a)
		ctl.KickedPasses(t, e.Env, "control-plane", "jobs-manager")
	}
	if moves, seen := imageMoves(f.proxy.Take(), "proxy", pinA); moves != 2 {
		t.Errorf("requests-proxy moved %d times over 6 flips to b in run, want 2: %v", moves, seen)
	}
	e.Reg.MustTag(t, "acme/api", "prod", b)
	ctl.UntilLogged(t, "held again", func(logs string) bool { return held(logs) > 4 })
	if r := e2e.Row(e.Status(f.cfg), "requests-proxy", "proxy"); r["state"] != "tag-flapping" {
		t.Errorf("status row %v, want tag-flapping", r)
	}
	// The window passes on the clock: the controller rolls by itself. (The
	// clock is the engine's: steps above stay below rolloutTimeout, or an
	// attempt in flight would read as overdue.)
	f.noAttempt()
	e.Clock.Add(time.Hour)
	e.UntilDeployments(30*time.Second, "rolled after the window", f.on(pinB))
	if moves, seen := imageMoves(f.proxy.Take(), "proxy", pinA); moves != 1 {
		t.Errorf("after the window requests-proxy moved %d times, want 1: %v", moves, seen)
	}
}
