package tick

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/running"
)

// O1 on the local cluster: suspend, resume, and the annotation P/suspend
// on the anchor (true or an RFC 3339 end), through tick and run; through
// the webhook and render in test/e2e/admission, for a discovered workload
// in test/e2e/discovery.

// O1 through tick: bad input exits 2 naming it with nothing written;
// `suspend` holds a new digest and a helm revert (status: suspended, by
// image-refresh-suspend, the reason, until resumed); `resume` lets the next
// tick roll and re-pin.
func TestTick_O1_SuspendHoldsNewDigestsAndRevertsUntilResume(t *testing.T) {
	e := newEnv(t)
	e.Clock = e2e.NewClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	a := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg)
	tag, pinA := e.Repo("api")+":prod", e.Repo("api")+":prod@"+a
	rv := e.Deployment("jobs-manager").ResourceVersion

	for _, bad := range []struct {
		args []string
		name string
	}{
		{[]string{"suspend", "--group", "no-such-group"}, `"no-such-group"`},
		{[]string{"resume", "--group", "no-such-group"}, `"no-such-group"`},
		{[]string{"suspend", "--group", "control-plane", "--for", "a while"}, `--for: "a while"`},
		{[]string{"suspend", "--group", "control-plane", "--for", "-1h"}, `--for: "-1h"`},
		{[]string{"suspend", "--group", "control-plane", "--until", "tomorrow"}, `--until: "tomorrow"`},
		{[]string{"suspend", "--group", "control-plane", "--until", "2026-12-01T00:00:00Z"}, "has passed"},
		{[]string{"suspend", "--group", "control-plane", "--for", "1h", "--until", "2027-01-01T00:00:00Z"}, "--for and --until"},
		{[]string{"suspend"}, "--group is required"},
	} {
		code, _, stderr := e.SuspendCmd(cfg, bad.args...)
		if code != 2 || !strings.Contains(stderr, bad.name) {
			t.Errorf("%v: exit %d, want 2 naming %s:\n%s", bad.args, code, bad.name, stderr)
		}
	}
	if got := e.Deployment("jobs-manager").ResourceVersion; got != rv {
		t.Fatalf("the anchor changed (resourceVersion %s -> %s) though every command was refused", rv, got)
	}

	code, out, stderr := e.SuspendCmd(cfg, "suspend", "--group", "control-plane", "--reason", "INC-42: rolled back by hand")
	if code != 0 || !strings.Contains(out, "suspended group control-plane until resumed") {
		t.Fatalf("suspend: exit %d:\n%s\n%s", code, out, stderr)
	}
	if v := e.Annotations("jobs-manager")[e.Key("suspend")]; v != "true" {
		t.Fatalf("%s = %q, want true", e.Key("suspend"), v)
	}
	if !e2e.HasEvent(e.Events("jobs-manager"), "Suspended", "INC-42") {
		t.Errorf("no Suspended Event naming the reason: %q", e.Events("jobs-manager"))
	}

	e.SetImageAs("helm", "Deployment", "requests-proxy", "proxy", tag) // a revert, as helm rollback writes it
	// Its pods run the tag on A before B is pushed: pods started after the
	// push would run B, another build than the record (running-stale),
	// which a status row says before the suspension.
	e.Settle("Deployment", "requests-proxy")
	b := e.Push("api", "prod")
	code, logs := e.Tick(cfg)
	if code != 0 || len(e2e.LogLines(logs, "INFO", "group control-plane is suspended by image-refresh-suspend until resumed: INC-42", "held back")) != 1 {
		t.Fatalf("suspended tick: exit %d, want 0 with one INFO line saying what is held back:\n%s", code, logs)
	}
	if got := e.Image("jobs-manager", "api"); got != pinA {
		t.Errorf("jobs-manager on %s while suspended, want %s (no new digest)", got, pinA)
	}
	if got := e.Image("requests-proxy", "proxy"); got != tag {
		t.Errorf("requests-proxy on %s while suspended, want the reverted %s (no re-pin)", got, tag)
	}
	if _, ok := e.Annotations("jobs-manager")[e.Key("suspended-since")]; !ok {
		t.Errorf("no %s on the anchor: the bookkeeping did not run", e.Key("suspended-since"))
	}
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		r := e2e.Row(e.Status(cfg), w[0], w[1])
		msg, _ := r["message"].(string)
		if r["state"] != "suspended" || !strings.Contains(msg, "by image-refresh-suspend until resumed: INC-42: rolled back by hand") ||
			!strings.Contains(r["remediation"].(string), "resume --config "+cfg+" --group control-plane") {
			t.Errorf("status row of %s = %v, want suspended naming who, why, until when and resume", w[0], r)
		}
	}

	code, out, stderr = e.SuspendCmd(cfg, "resume", "--group", "control-plane")
	if code != 0 || !strings.Contains(out, "resumed group control-plane") {
		t.Fatalf("resume: exit %d:\n%s\n%s", code, out, stderr)
	}
	code, logs = e.Tick(cfg)
	if code != 0 || len(e2e.LogLines(logs, "INFO", "no longer suspended")) != 1 {
		t.Fatalf("tick after resume: exit %d, want 0 with one INFO line saying so:\n%s", code, logs)
	}
	pinB := e.Repo("api") + ":prod@" + b
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := e.Image(w[0], w[1]); got != pinB {
			t.Errorf("after resume %s on %s, want %s", w[0], got, pinB)
		}
	}
	if code, out, _ := e.SuspendCmd(cfg, "resume", "--group", "control-plane"); code != 0 || !strings.Contains(out, "not suspended") {
		t.Errorf("resume of a group not suspended: exit %d, %q", code, out)
	}
}

// O1, declaratively: P/suspend written by another field manager (as
// `kubectl annotate` or a GitOps controller writes it) with an RFC 3339 end
// holds a new digest until the end; status names that writer and the end;
// the first tick past the end rolls. A suspension without an end is a
// finding after 24 hours: WARN, Event, exit 1 and the metric.
func TestTick_O1_TheAnnotationSuspendsUntilItsEndAndWithoutOneIsAFindingAfter24h(t *testing.T) {
	e := newEnv(t)
	e.Clock = e2e.NewClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg)
	e.AnnotateAs("kubectl-annotate", "jobs-manager", map[string]*string{e.Key("suspend"): e2e.Ptr("2026-12-02T13:00:00Z"), e.Key("suspend-reason"): e2e.Ptr("freeze for the sale")})
	b := e.Push("api", "prod")
	if code, logs := e.Tick(cfg); code != 0 || !strings.Contains(logs, "held back") {
		t.Fatalf("tick before the end: exit %d, want 0 holding the new digest back:\n%s", code, logs)
	}
	r := e2e.Row(e.Status(cfg), "requests-proxy", "proxy")
	if msg, _ := r["message"].(string); r["state"] != "suspended" || !strings.Contains(msg, "suspended by kubectl-annotate until 2026-12-02T13:00:00Z: freeze for the sale") {
		t.Errorf("status row %v, want suspended by kubectl-annotate until 13:00 with the reason", r)
	}
	e.Clock.Add(time.Hour)
	if code, logs := e.Tick(cfg); code != 0 || len(e2e.LogLines(logs, "INFO", "no longer suspended")) != 1 {
		t.Fatalf("tick at the end: exit %d, want 0 saying the suspension ended:\n%s", code, logs)
	}
	if got, want := e.Image("requests-proxy", "proxy"), e.Repo("api")+":prod@"+b; got != want {
		t.Errorf("after the end requests-proxy on %s, want %s", got, want)
	}

	// Without an end: benign for 24 hours, then a finding.
	e.AnnotateAs("kubectl-annotate", "jobs-manager", map[string]*string{e.Key("suspend"): e2e.Ptr("true")})
	if code, logs := e.Tick(cfg); code != 0 || strings.Contains(logs, "SuspendedWithoutEnd") {
		t.Fatalf("tick of a fresh suspension: exit %d, want 0 and no finding:\n%s", code, logs)
	}
	e.Clock.Add(24 * time.Hour)
	path := filepath.Join(t.TempDir(), "m.prom")
	code, logs := e.Tick(cfg, "--metrics-file", path)
	if code != 1 || len(e2e.LogLines(logs, "WARN", "suspended without an end since 2026-12-02T13:00:00Z", "resume --config")) != 1 {
		t.Fatalf("tick 24 h later: exit %d, want 1 with a WARN naming since when and resume:\n%s", code, logs)
	}
	if v, _ := running.MetricValue(e2e.ReadFile(t, path), "image_refresh_group_needs_attention", map[string]string{"group": "control-plane", "reason": "SuspendedWithoutEnd"}); v != "1" {
		t.Errorf("needs_attention{SuspendedWithoutEnd} = %q, want 1", v)
	}
	if !e2e.HasEvent(e.Events("jobs-manager"), "SuspendedWithoutEnd", "resume") {
		t.Errorf("no SuspendedWithoutEnd Event naming resume: %q", e.Events("jobs-manager"))
	}
}

// O1 through run: a suspension holds a new digest and a revert over
// passes the test proves ran; `resume` acts at once (its removal starts a
// pass, the poll interval is an hour); a suspension's end acts at once
// too: the controller requeues the group for it, with nothing else to
// start a pass.
func TestRun_O1_SuspendHoldsAndResumeAndTheEndActAtOnce(t *testing.T) {
	e := newEnv(t)
	e.Clock = e2e.NewClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	a := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg)
	tag, pinA := e.Repo("api")+":prod", e.Repo("api")+":prod@"+a
	if code, out, stderr := e.SuspendCmd(cfg, "suspend", "--group", "control-plane", "--reason", "INC-7"); code != 0 {
		t.Fatalf("suspend: exit %d\n%s\n%s", code, out, stderr)
	}
	b := e.Push("api", "prod")
	pinB := e.Repo("api") + ":prod@" + b
	ctl := e.StartRun(cfg, "--poll-interval", "1h", "--poll-jitter", "0")
	ctl.WaitReady(t)
	heldBack := func(what string) int {
		return len(e2e.LogLines(ctl.Logs(), "INFO", "is suspended by image-refresh-suspend", what))
	}
	ctl.UntilLogged(t, "the new digest held back", func(string) bool { return heldBack(pinB) > 0 })
	e.WriteImageAs("helm", "Deployment", "requests-proxy", "proxy", tag)
	ctl.KickedPasses(t, e.Env, "control-plane", "requests-proxy")
	if got := e.Image("requests-proxy", "proxy"); got != tag {
		t.Errorf("requests-proxy on %s after passes while suspended, want the reverted %s", got, tag)
	}
	if got := e.Image("jobs-manager", "api"); got != pinA {
		t.Errorf("jobs-manager on %s while suspended, want %s", got, pinA)
	}
	if n := heldBack(pinB); n != 1 {
		t.Errorf("%d INFO lines saying the group is suspended, want 1 (once, not per pass)", n)
	}
	if r := e2e.Row(e.Status(cfg), "requests-proxy", "proxy"); r["state"] != "suspended" {
		t.Errorf("status row %v, want suspended", r)
	}

	if code, _, stderr := e.SuspendCmd(cfg, "resume", "--group", "control-plane"); code != 0 {
		t.Fatalf("resume: exit %d\n%s", code, stderr)
	}
	e.UntilDeployments(60*time.Second, "resume acted at once", func() bool {
		return e.Image("requests-proxy", "proxy") == pinB && e.Image("jobs-manager", "api") == pinB
	})
	e.UntilDeployments(60*time.Second, "the rollout confirmed", func() bool {
		return e.Annotations("jobs-manager")[e.Key("refresh-attempt")] == "" && e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")] == b
	})

	// An end: 2 s ahead on the engine's clock. The controller requeues the
	// group for it; the test moves the clock past it, and the requeued
	// pass re-pins the revert below without any event to start it.
	if code, _, stderr := e.SuspendCmd(cfg, "suspend", "--group", "control-plane", "--for", "2s"); code != 0 {
		t.Fatalf("suspend --for 2s: exit %d\n%s", code, stderr)
	}
	e.WriteImageAs("helm", "Deployment", "requests-proxy", "proxy", tag)
	ctl.UntilLogged(t, "the revert held back", func(string) bool {
		return heldBack("until 2026-12-02T12:00:02Z") > 0 && strings.Contains(ctl.Logs(), "requests-proxy container proxy "+tag)
	})
	// Every event the revert starts has had its pass: its rollout settled
	// and two kicked passes later nothing else is on its way.
	e.Settle("Deployment", "requests-proxy")
	ctl.KickedPasses(t, e.Env, "control-plane", "jobs-manager")
	if got := e.Image("requests-proxy", "proxy"); got != tag {
		t.Fatalf("requests-proxy on %s before the end, want the reverted %s", got, tag)
	}
	e.Clock.Add(3 * time.Second)
	e.UntilDeployments(60*time.Second, "the end acted without an event or a resync", func() bool { return e.Image("requests-proxy", "proxy") == pinB })
}
