package run

import (
	"strings"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/e2e"
)

// O1 with R25 on the local cluster: the operator suspends a group and rolls
// its anchor back with the real `kubectl rollout undo`. The undo puts the
// annotations of a ReplicaSet made before the suspension back on the
// anchor, which takes P/suspend off it; the suspension is in the copy of
// the state, so it holds, and the undo stays where the operator put it.

// rolledToB pins the seed's group on A, starts run and has it roll a new
// digest B to every target.
func rolledToB(t *testing.T, e *env) (cfg, tag, pinA, b, pinB string, ctl *e2e.RunningController) {
	t.Helper()
	e.Clock = e2e.NewClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	a := e.Seed()
	cfg = e.Config(e2e.SeedShape)
	e.PinAll(cfg)
	tag = e.Repo("api") + ":prod"
	pinA = tag + "@" + a
	ctl = e.StartRun(cfg, "--poll-interval", "300ms", "--poll-jitter", "0")
	ctl.WaitReady(t)
	ctl.WaitPasses(t, "control-plane", 0, 1)
	e.Clock.Add(time.Minute)
	b = e.Push("api", "prod")
	pinB = tag + "@" + b
	e.UntilDeployments(60*time.Second, "rolled to B and recorded", func() bool {
		an := e.Annotations("jobs-manager")
		return e.Image("jobs-manager", "api") == pinB && e.Image("requests-proxy", "proxy") == pinB &&
			an[e.Key("last-refreshed-api-digest")] == b && an[e.Key("refresh-attempt")] == ""
	})
	return cfg, tag, pinA, b, pinB, ctl
}

// In `run`: suspended, then undone; the undo's A stays over passes the test
// proves ran, the suspension is back on the anchor with who and why, and
// status says suspended. Then the operator takes P/suspend off by hand (a
// hand edit of a current anchor stands): the group resumes, B comes back.
func TestRun_O1_R25_ASuspensionOutlivesTheRolloutUndoItWasSetFor(t *testing.T) {
	e := newEnv(t)
	cfg, _, pinA, b, pinB, ctl := rolledToB(t, e)
	suspend, reason, record := e.Key("suspend"), e.Key("suspend-reason"), e.Key("last-refreshed-api-digest")
	if code, _, stderr := e.SuspendCmd(cfg, "suspend", "--group", "control-plane", "--reason", "INC-77: B breaks checkout"); code != 0 {
		t.Fatalf("suspend: exit %d\n%s", code, stderr)
	}
	if cp := e.StateCopy("jobs-manager"); cp["suspend"] != "true" || cp["suspend-reason"] != "INC-77: B breaks checkout" {
		t.Fatalf("the copy of the state does not hold the suspension: %v", cp)
	}

	e.RolloutUndo("jobs-manager")
	// The undo's watch event starts a pass; it decides on the copy and
	// puts the suspension and the record B back on the anchor.
	e.UntilDeployments(60*time.Second, "the suspension back on the anchor after the undo", func() bool {
		an := e.Annotations("jobs-manager")
		return an[suspend] == "true" && an[reason] == "INC-77: B breaks checkout" && an[record] == b
	})
	e.Settle("Deployment", "jobs-manager")
	ctl.KickedPasses(t, e.Env, "control-plane", "jobs-manager")
	if got := e.Image("jobs-manager", "api"); got != pinA {
		t.Fatalf("jobs-manager on %s after the undo and passes while suspended, want the undo's %s", got, pinA)
	}
	logs := ctl.Logs()
	if len(e2e.LogLines(logs, "INFO", "older than their copy", "rollout undo")) == 0 {
		t.Errorf("no INFO naming the rollback:\n%s", logs)
	}
	if len(e2e.LogLines(logs, "INFO", "no longer suspended")) != 0 {
		t.Errorf("the undo was taken for a resume:\n%s", logs)
	}
	r := e2e.Row(e.Status(cfg), "jobs-manager", "api")
	if msg, _ := r["message"].(string); r["state"] != "suspended" || !strings.Contains(msg, "by image-refresh-suspend") || !strings.Contains(msg, "INC-77") {
		t.Errorf("status row %v, want suspended by image-refresh-suspend naming the reason (who survives the undo)", r)
	}

	// A hand edit: the operator removes P/suspend with kubectl annotate.
	// The anchor is current (the pass restored it), so the removal stands.
	e.AnnotateAs("kubectl-annotate", "jobs-manager", map[string]*string{suspend: nil, reason: nil})
	e.UntilDeployments(60*time.Second, "resumed by the hand edit: the undo's image re-pinned to B", func() bool {
		return e.Image("jobs-manager", "api") == pinB
	})
	if cp := e.StateCopy("jobs-manager"); cp["suspend"] != "" || cp["suspended-since"] != "" || cp["suspended-by"] != "" {
		t.Errorf("the copy still holds the suspension after the hand edit resumed the group: %v", cp)
	}
}

// In `tick`: the same, one tick at a time; `resume` lets the next tick
// re-pin the undo to B.
func TestTick_O1_R25_ASuspensionOutlivesTheRolloutUndoItWasSetFor(t *testing.T) {
	e := newEnv(t)
	e.Clock = e2e.NewClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	a := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg)
	pinA := e.Repo("api") + ":prod@" + a
	e.Clock.Add(time.Minute)
	b := e.Push("api", "prod")
	pinB := e.Repo("api") + ":prod@" + b
	if code, _ := e.Tick(cfg); code != 0 || e.Image("jobs-manager", "api") != pinB {
		t.Fatalf("setup: tick exit %d, jobs-manager on %s, want 0 and %s", code, e.Image("jobs-manager", "api"), pinB)
	}
	if code, _, stderr := e.SuspendCmd(cfg, "suspend", "--group", "control-plane", "--for", "2h", "--reason", "INC-78"); code != 0 {
		t.Fatalf("suspend: exit %d\n%s", code, stderr)
	}
	e.RolloutUndo("jobs-manager")
	if an := e.Annotations("jobs-manager"); an[e.Key("suspend")] != "" || e.Image("jobs-manager", "api") != pinA {
		t.Fatalf("setup: the undo left the suspension on the anchor (%v) or did not go back to A, so this test proves nothing", an)
	}
	// Settled, so that the tick would re-pin the undo were it not
	// suspended (an unsettled group is skipped, R4).
	e.Settle("Deployment", "jobs-manager")
	code, logs := e.Tick(cfg)
	if code != 0 {
		t.Errorf("tick after the undo: exit %d, want 0", code)
	}
	if len(e2e.LogLines(logs, "INFO", "is suspended by image-refresh-suspend until 2026-12-02T14:01:00Z: INC-78")) == 0 {
		t.Errorf("the tick did not say the group is suspended:\n%s", logs)
	}
	if got := e.Image("jobs-manager", "api"); got != pinA {
		t.Errorf("jobs-manager on %s after a tick while suspended, want the undo's %s", got, pinA)
	}
	if v := e.Annotations("jobs-manager")[e.Key("suspend")]; v != "2026-12-02T14:01:00Z" {
		t.Errorf("the tick did not put the suspension back on the anchor: %s = %q", e.Key("suspend"), v)
	}
	if r := e2e.Row(e.Status(cfg), "jobs-manager", "api"); r["state"] != "suspended" {
		t.Errorf("status row %v, want suspended", r)
	}

	if code, _, stderr := e.SuspendCmd(cfg, "resume", "--group", "control-plane"); code != 0 {
		t.Fatalf("resume: exit %d\n%s", code, stderr)
	}
	if code, _ := e.Tick(cfg); code != 0 || e.Image("jobs-manager", "api") != pinB {
		t.Errorf("tick after resume: exit %d, jobs-manager on %s, want 0 and %s", code, e.Image("jobs-manager", "api"), pinB)
	}
}
