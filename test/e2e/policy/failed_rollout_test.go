package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/e2e"
)

// V2 on the local cluster: a digest whose pods never become Ready (a
// readiness gate the test holds False for it) is rolled back to the
// recorded digest and quarantined; the next good digest rolls.

// rollbackConfig is one group on Deployment web with onFailedRollout:
// rollback and rolloutTimeout timeout.
func rollbackConfig(e *env, group, timeout string) string {
	return e.Config("rolloutTimeout: " + timeout + "\ngroups:\n" + strings.Replace(e2e.OneGroup(group, "web", "web", "web"),
		"    anchor:", "    onFailedRollout: rollback\n    anchor:", 1))
}

func TestTick_V2_ADigestWhosePodsNeverBecomeReadyIsRolledBackAndQuarantined(t *testing.T) {
	e := newEnv(t)
	first := e.Push("web", "prod")
	tag := e.Repo("web") + ":prod"
	lb := e.Gated("web", tag, 2)
	// The tick waits rolloutTimeout for the bad rollout: a short one for
	// that tick (it is meant to fail), a long one for every other.
	cfg, short := rollbackConfig(e, "v2-tick", "2m"), rollbackConfig(e, "v2-tick", "3s")
	e.PinAll(cfg)

	bad := e.Push("web", "prod")
	lb.Fail(bad)
	code, logs := e.Tick(short)
	if code != 1 {
		t.Errorf("tick over a failed rollout: exit %d, want 1", code)
	}
	if got := e.Image("web", "web"); got != tag+"@"+first {
		t.Fatalf("after the failed rollout web runs %s, want it rolled back to %s:\n%s", got, first, logs)
	}
	a := e.Annotations("web")
	if got := a[e.Key("locked-on-web")]; got != bad {
		t.Errorf("quarantine %q, want %s", got, bad)
	}
	if got := a[e.Key("last-refreshed-web-digest")]; got != first {
		t.Errorf("record %q, want %s", got, first)
	}
	if len(e2e.LogLines(logs, "ERROR", "rolled back to the recorded digest "+first, bad, "not settled within rolloutTimeout 3s")) == 0 {
		t.Errorf("no ERROR line naming the rollback, both digests and why:\n%s", logs)
	}
	if ev := e.Events("web"); !e2e.HasEvent(ev, "RolledBack", bad) {
		t.Errorf("no RolledBack Event naming %s: %v", bad, ev)
	}

	// The registry still serves the failed digest: held, loudly, untouched.
	rollouts := e.Rollouts("web")
	code, logs = e.Tick(cfg)
	if code != 1 || e.Image("web", "web") != tag+"@"+first || e.Rollouts("web") != rollouts {
		t.Errorf("tick with the failed digest still served: exit %d, web %s, %d rollouts (want 1, %s, %d):\n%s",
			code, e.Image("web", "web"), e.Rollouts("web"), first, rollouts, logs)
	}
	if r := e2e.Row(e.Status(cfg), "web", "web"); r == nil || r["state"] != "rolled-back" || !strings.Contains(r["message"].(string), "rolloutTimeout") {
		t.Errorf("status row %v, want rolled-back with the reason", r)
	}

	// The next good digest is tried by itself and rolls.
	good := e.Push("web", "prod")
	if code, logs := e.Tick(cfg); code != 0 {
		t.Fatalf("tick over a good new digest: exit %d:\n%s", code, logs)
	}
	if got := e.Image("web", "web"); got != tag+"@"+good {
		t.Errorf("web on %s, want the good digest %s", got, good)
	}
	if _, ok := e.Annotations("web")[e.Key("rolled-back-web")]; ok {
		t.Errorf("the rolled-back note stayed after a new digest rolled")
	}
}

// V2, R14: a tick's wait for a digest change ends at the first failure
// the pods report, as `run` reads it (a container in CrashLoopBackOff with
// its last exit code), not at rolloutTimeout, names it, and the same tick
// rolls back for it. The new pods never become Ready (their gate's owner
// never sets it True), so nothing but the crash can end the wait early; a
// rolloutTimeout far above anything else the tick waits for is its bound.
func TestTick_V2_R14_ACrashingContainerEndsTheWaitAtOnceAndIsRolledBackForIt(t *testing.T) {
	e := newEnv(t)
	first := e.Push("web", "prod")
	tag := e.Repo("web") + ":prod"
	lb := e.Gated("web", tag, 2)
	cfg := rollbackConfig(e, "v2-crash", "3m")
	e.PinAll(cfg)

	bad := e.Push("web", "prod")
	lb.Fail(bad)
	e.StartCrashLoop("web", bad, 1)
	code, logs := e.Tick(cfg)
	if code != 1 {
		t.Errorf("tick over a crashing build: exit %d, want 1", code)
	}
	if got := e.Image("web", "web"); got != tag+"@"+first {
		t.Fatalf("after the crashing rollout web runs %s, want it rolled back to %s:\n%s", got, first, logs)
	}
	a := e.Annotations("web")
	if got := a[e.Key("locked-on-web")]; got != bad {
		t.Errorf("quarantine %q, want %s", got, bad)
	}
	crash := "container web: CrashLoopBackOff (last exit code 1, Error)"
	if len(e2e.LogLines(logs, "ERROR", "rollout not settled", "Deployment "+e.NS+"/web will not settle", crash)) != 1 {
		t.Errorf("no ERROR line of the wait naming the crash that ended it:\n%s", logs)
	}
	if note := a[e.Key("rolled-back-web")]; !strings.HasPrefix(note, bad+" ") || !strings.Contains(note, crash) {
		t.Errorf("rolled-back note %q, want %s with the pod's CrashLoopBackOff and exit code", note, bad)
	}
	if len(e2e.LogLines(logs, "ERROR", "rolled back to the recorded digest "+first, bad, crash)) == 0 {
		t.Errorf("no ERROR line naming the rollback, both digests and the crash:\n%s", logs)
	}
	// The rollback above proves the wait ran and ended: it did not end at
	// its timeout.
	if lines := e2e.LogLines(logs, "ERROR", "rolloutTimeout"); len(lines) != 0 {
		t.Errorf("the wait is reported as timed out:\n%s", strings.Join(lines, "\n"))
	}
	if lines := e2e.LogLines(logs, "ERROR", "did not settle within"); len(lines) != 0 {
		t.Errorf("the wait is reported as timed out:\n%s", strings.Join(lines, "\n"))
	}
}

func TestRun_V2_AFailedRolloutIsRolledBackFromWatchEvents(t *testing.T) {
	e := newEnv(t)
	first := e.Push("web", "prod")
	tag := e.Repo("web") + ":prod"
	lb := e.Gated("web", tag, 2)
	// The attempt's deadline is counted on the injected clock: the test
	// moves it past rolloutTimeout once the bad digest is rolling.
	e.Clock = e2e.NewClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	cfg := rollbackConfig(e, "v2-run", "1m")
	e.PinAll(cfg)

	ctl := e.StartRun(cfg, "--poll-interval", "1s", "--poll-jitter", "0", "--workers", "1")
	ctl.WaitReady(t)
	bad := e.Push("web", "prod")
	lb.Fail(bad)
	e.UntilDeployments(60*time.Second, "web re-imaged to the new digest", func() bool { return e.Image("web", "web") == tag+"@"+bad })
	ctl.KickedPasses(t, e.Env, "v2-run", "web")
	if got := e.Image("web", "web"); got != tag+"@"+bad {
		t.Fatalf("rolled back to %s before its deadline, with nothing failing", got)
	}
	e.Clock.Add(2 * time.Minute)
	e.Kick("web")
	e.UntilDeployments(60*time.Second, "web rolled back and the digest quarantined", func() bool {
		return e.Image("web", "web") == tag+"@"+first && e.Annotations("web")[e.Key("locked-on-web")] == bad
	})
	e.Settle("Deployment", "web")
	e.UntilDeployments(60*time.Second, "the rollback's attempt confirmed", func() bool {
		_, has := e.Annotations("web")[e.Key("refresh-attempt")]
		return !has
	})
	if lines := e2e.LogLines(ctl.Logs(), "ERROR", "rolled back to the recorded digest "+first); len(lines) == 0 {
		t.Errorf("no ERROR line naming the rollback:\n%s", ctl.Logs())
	}
	// Held on the record while the registry serves the failed digest.
	ctl.KickedPasses(t, e.Env, "v2-run", "web")
	if got := e.Image("web", "web"); got != tag+"@"+first {
		t.Errorf("web moved to %s after the rollback, want it held on %s", got, first)
	}
}
