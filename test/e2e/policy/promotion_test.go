package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/e2e"
)

// P1 on the local cluster: group prod follows group staging. A build
// reaches prod only once staging ran it settled and healthy for the soak
// (the injected clock moves it); a build that crashes in staging is rolled
// back there (V2) and never reaches prod.

// promotionConfig is staging (rolled back on a failed rollout) and prod,
// which follows it with soak, both on Deployments of their own name
// running {{reg}}/acme/web:prod.
func promotionConfig(e *env, soak string) string {
	staging := strings.Replace(e2e.OneGroup("staging", "web", "staging", "web"),
		"    anchor:", "    onFailedRollout: rollback\n    anchor:", 1)
	prod := e2e.OneGroup("prod", "web", "prod", "web") + "    promotion: {after: staging, soak: " + soak + "}\n"
	return e.Config("rolloutTimeout: 3m\ngroups:\n" + prod + staging)
}

func TestTick_P1_AGoodBuildReachesTheFollowerAfterTheSoakAndACrashingOneNever(t *testing.T) {
	e := newEnv(t)
	e.Clock = e2e.NewClock(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	first := e.Push("web", "prod")
	tag := e.Repo("web") + ":prod"
	staging := e.Gated("staging", tag, 1)
	e.Gated("prod", tag, 1)
	cfg := promotionConfig(e, "30m")
	e.PinAll(cfg)
	for _, d := range []string{"staging", "prod"} {
		if got := e.Image(d, "web"); got != tag+"@"+first {
			t.Fatalf("setup: %s on %s, want %s", d, got, first)
		}
	}

	good := e.Push("web", "prod")
	prodRow := func() map[string]any { return e2e.Row(e.Status(cfg), "prod", "web") }
	// The tick moves staging (the leader passes first, though prod is
	// listed first); prod waits, as staging was not yet found settled and
	// healthy on the build.
	code, logs := e.Tick(cfg)
	if code != 0 || e.Image("staging", "web") != tag+"@"+good || e.Image("prod", "web") != tag+"@"+first {
		t.Fatalf("first tick after the push: exit %d, staging %s, prod %s; want 0, staging on %s, prod on %s:\n%s",
			code, e.Image("staging", "web"), e.Image("prod", "web"), good, first, logs)
	}
	if len(e2e.LogLines(logs, "INFO", "group staging, which group prod follows, runs "+good+" but has not yet been found settled and healthy on it")) == 0 {
		t.Errorf("no INFO saying prod waits for staging to be found healthy on %s:\n%s", good, logs)
	}
	// The next tick finds staging settled and healthy on it: its soak
	// starts now, and prod waits the whole soak.
	if code, logs := e.Tick(cfg); code != 0 {
		t.Fatalf("second tick: exit %d:\n%s", code, logs)
	}
	if got, want := e.Annotations("staging")[e.Key("soak-web")], good+" 2026-12-07T12:00:00Z 0"; got != want {
		t.Fatalf("staging's soak clock %q, want %q", got, want)
	}
	for i, left := range []string{"in 30m0s", "in 1s"} {
		r := prodRow()
		if r["state"] != "waiting" || !strings.Contains(r["message"].(string), left) || !strings.Contains(r["message"].(string), "group staging") {
			t.Errorf("status %d: prod's row %v, want waiting for staging, %s", i, r, left)
		}
		if code, logs := e.Tick(cfg); code != 0 || e.Image("prod", "web") != tag+"@"+first {
			t.Fatalf("tick during the soak: exit %d, prod on %s, want 0 and %s:\n%s", code, e.Image("prod", "web"), first, logs)
		}
		e.Clock.Add([]time.Duration{30*time.Minute - time.Second, time.Second}[i])
	}
	if code, logs := e.Tick(cfg); code != 0 || e.Image("prod", "web") != tag+"@"+good {
		t.Fatalf("tick at the soak's end: exit %d, prod on %s, want 0 and %s:\n%s", code, e.Image("prod", "web"), good, logs)
	}

	// A build that crashes in staging: rolled back there, never in prod.
	bad := e.Push("web", "prod")
	staging.Fail(bad)
	e.StartCrashLoop("staging", bad, 1)
	code, logs = e.Tick(cfg)
	if got := e.Image("staging", "web"); got != tag+"@"+good {
		t.Fatalf("after the crashing rollout staging runs %s, want it rolled back to %s (exit %d):\n%s", got, good, code, logs)
	}
	if rb := e.Annotations("staging")[e.Key("rolled-back-web")]; !strings.HasPrefix(rb, bad+" ") {
		t.Fatalf("staging's rolled-back note %q, want %s: the crash was not what the tick saw:\n%s", rb, bad, logs)
	}
	for range 2 {
		e.Clock.Add(time.Hour)
		e.Tick(cfg)
		if got := e.Image("prod", "web"); got != tag+"@"+good {
			t.Fatalf("prod moved to %s, want it held on %s: staging rolled %s back", got, good, bad)
		}
	}
	if r := prodRow(); r["state"] != "quarantined" || !strings.Contains(r["message"].(string), "group staging, which group prod follows, rolled "+bad+" back") {
		t.Errorf("prod's row %v, want quarantined, naming staging's rollback", r)
	}
}

// P1 in `run`: the follower moves when the soak ends, on a timer of its
// own, with no event, no poll and no resync to start the pass.
func TestRun_P1_TheFollowerMovesWhenTheSoakEnds(t *testing.T) {
	e := newEnv(t)
	e.Clock = e2e.NewClock(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	first := e.Push("web", "prod")
	tag := e.Repo("web") + ":prod"
	e.Gated("staging", tag, 1)
	e.Gated("prod", tag, 1)
	cfg := promotionConfig(e, "2s")
	e.PinAll(cfg)
	good := e.Push("web", "prod")

	ctl := e.StartRun(cfg, "--poll-interval", "1h")
	ctl.WaitReady(t)
	e.UntilDeployments(60*time.Second, "staging soaked the new build", func() bool {
		return strings.HasPrefix(e.Annotations("staging")[e.Key("soak-web")], good+" 2026-12-07T12:00:00Z")
	})
	ctl.UntilLogged(t, "prod waiting for the soak's end", func(logs string) bool {
		return len(e2e.LogLines(logs, "INFO", "group staging, which group prod follows, has run "+good, "in 2s")) > 0
	})
	if got := e.Image("prod", "web"); got != tag+"@"+first {
		t.Fatalf("prod on %s during the soak, want %s", got, first)
	}
	e.Clock.Add(3 * time.Second)
	e.UntilDeployments(60*time.Second, "prod moved at the soak's end", func() bool { return e.Image("prod", "web") == tag+"@"+good })
}
