package policy

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/running"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

// R21, the flapping state lasts its window: a tag flipped six times between
// two digests (a minute apart on the injected clock) with maxDigestChanges
// 2 per 1h. From the third flip on, every tick says tag-flapping (exit 1,
// status row, the TagFlapping gauge 1), also the ticks that find the tag
// back on the held digest: the alert on the gauge does not resolve and
// fire again with each flip. A minute before the window ends it still
// does; once the window has passed the next tick clears it with one INFO
// line (not repeated by the tick after), status says pinned and the marker
// is gone.
func TestTick_R21_TheFlappingStateLastsItsWindowAlsoOnTheHeldDigest(t *testing.T) {
	e, a, cfg := tickFlapEnv(t)
	b := e.Push("api", "prod")
	pinA := e.Repo("api") + ":prod@" + a
	marker := e.Key("tag-flapping-api")
	flapping := func(step string, wantCode int) {
		t.Helper()
		path := filepath.Join(t.TempDir(), "m.prom")
		code, logs := e.Tick(cfg, "--metrics-file", path)
		if code != wantCode {
			t.Fatalf("%s: tick exit %d, want %d", step, code, wantCode)
		}
		gauge, _ := running.MetricValue(e2e.ReadFile(t, path), "image_refresh_group_needs_attention", map[string]string{"group": "control-plane", "reason": "TagFlapping"})
		r := e2e.Row(e.Status(cfg), "requests-proxy", "proxy")
		if wantCode == 1 {
			if gauge != "1" || r["state"] != "tag-flapping" || len(e2e.LogLines(logs, "WARN", "is flapping", "until 2026-12-02T13:01:00Z", "rearm --config")) == 0 {
				t.Errorf("%s: TagFlapping gauge %q, status row %v, want 1 and tag-flapping with a WARN naming the end and rearm:\n%s", step, gauge, r, logs)
			}
			if got := e.Image("requests-proxy", "proxy"); got != pinA {
				t.Errorf("%s: requests-proxy on %s while tag-flapping, want %s", step, got, pinA)
			}
			if v := e.Annotations("jobs-manager")[marker]; v != "2026-12-02T13:01:00Z" {
				t.Errorf("%s: %s = %q, want the hold's end", step, marker, v)
			}
		} else if gauge != "0" || r["state"] != "pinned" {
			t.Errorf("%s: TagFlapping gauge %q, status row %v, want 0 and pinned", step, gauge, r)
		}
	}
	for i, d := range []string{b, a, b, a, b, a} {
		e.Clock.Add(time.Minute)
		e.Reg.MustTag(t, "acme/api", "prod", d)
		want := 0
		if i >= 2 { // flips 1 and 2 roll; the budget is spent from the third on
			want = 1
		}
		flapping(fmt.Sprintf("flip %d", i+1), want)
	}
	// The tag stays on the held digest; the window (from the first counted
	// move, 12:01) has not passed at 13:00.
	e.Clock.Add(54 * time.Minute)
	flapping("13:00, the tag on the held digest", 1)

	e.Clock.Add(time.Minute)
	code, logs := e.Tick(cfg)
	if code != 0 || len(e2e.LogLines(logs, "INFO", "no longer held as flapping", "has passed")) != 1 {
		t.Fatalf("tick after the window: exit %d, want 0 with one INFO line saying the hold ended:\n%s", code, logs)
	}
	if r := e2e.Row(e.Status(cfg), "requests-proxy", "proxy"); r["state"] != "pinned" {
		t.Errorf("after the window status row %v, want pinned", r)
	}
	if v, ok := e.Annotations("jobs-manager")[marker]; ok {
		t.Errorf("after the window %s = %q, want deleted", marker, v)
	}
	code, logs = e.Tick(cfg)
	if code != 0 || strings.Contains(logs, "no longer held as flapping") {
		t.Errorf("the tick after: exit %d, want 0 and the INFO line not repeated:\n%s", code, logs)
	}
}

// R21 through `run`: once the hold began, the TagFlapping gauge (what the
// chart's ImageRefreshTagFlapping alert reads) stays 1 over passes that
// find the tag back on the held digest, so the alert does not resolve and
// fire again with each flip; once the injected clock passed the window it
// goes to 0 with one INFO line, not one per pass.
func TestRun_R21_TheTagFlappingAlertDoesNotResolveWithEachFlip(t *testing.T) {
	f := startRunFlap(t)
	e, ctl := f.env, f.ctl
	gauge := func() string {
		_, body := running.Get("http://" + ctl.Metrics + "/metrics")
		v, _ := running.MetricValue(body, "image_refresh_group_needs_attention", map[string]string{"group": "control-plane", "reason": "TagFlapping"})
		return v
	}
	f.noAttempt()
	for i := range 3 {
		e.Clock.Add(10 * time.Second)
		e.Reg.MustTag(t, "acme/api", "prod", f.b)
		testwait.Eventually(t, 30*time.Second, fmt.Sprintf("flip %d to b held", i+1), func() bool { return gauge() == "1" })
		e.Reg.MustTag(t, "acme/api", "prod", f.a)
		// Wait for the poller to see a again: a WARN saying the tag is back.
		before := len(e2e.LogLines(ctl.Logs(), "WARN", "back on the held digest"))
		ctl.UntilLogged(t, fmt.Sprintf("flip %d back to a seen", i+1), func(logs string) bool {
			return len(e2e.LogLines(logs, "WARN", "back on the held digest")) > before
		})
		ctl.KickedPasses(t, e.Env, "control-plane", "jobs-manager")
		if g := gauge(); g != "1" {
			t.Fatalf("flip %d: the tag back on the held digest, TagFlapping gauge %q, want 1 (the alert would resolve)", i+1, g)
		}
		if r := e2e.Row(e.Status(f.cfg), "requests-proxy", "proxy"); r["state"] != "tag-flapping" {
			t.Fatalf("flip %d: the tag back on the held digest, status row %v, want tag-flapping", i+1, r)
		}
	}
	e.Clock.Add(time.Hour)
	testwait.Eventually(t, 30*time.Second, "the hold ends once the window passed", func() bool { return gauge() == "0" })
	ctl.KickedPasses(t, e.Env, "control-plane", "jobs-manager")
	if n := len(e2e.LogLines(ctl.Logs(), "INFO", "no longer held as flapping")); n != 1 {
		t.Errorf("%d INFO lines saying the hold ended, want 1 (once, not per pass):\n%s", n, ctl.Logs())
	}
	if _, ok := e.Annotations("jobs-manager")[e.Key("tag-flapping-api")]; ok {
		t.Errorf("the marker is still on the anchor after the window")
	}
}
