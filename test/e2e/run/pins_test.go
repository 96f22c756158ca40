package run

import (
	"net/http"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/running"
)

// V4 in `run`: the pinned digest is checked with one HEAD by digest at
// start, then at most once per pinCheckInterval however many passes and
// polls come between; a digest found gone is pin-missing on every pass
// until the next check.
func TestRun_V4_ThePinIsCheckedAtStartThenOncePerPinCheckInterval(t *testing.T) {
	e := newEnv(t)
	e.Clock = e2e.NewClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	pinned := e.Seed()
	cfg := e.Config("pinCheckInterval: 1h\n" + e2e.SeedShape)
	e.PinAll(cfg)
	heads := func() int { return e.Reg.Count(http.MethodHead, "/v2/acme/api/manifests/"+pinned) }
	e.Reg.ResetRequests()

	ctl := e.StartRun(cfg, "--poll-interval", "300ms", "--poll-jitter", "0")
	ctl.WaitReady(t)
	ctl.WaitPasses(t, "control-plane", 0, 1)
	if n := heads(); n != 1 {
		t.Fatalf("%d HEADs of the pinned digest after the first pass, want 1 (checked at start)", n)
	}
	// Passes and polls within the interval ask nothing more.
	polls := e.Reg.Count(http.MethodHead, "/v2/acme/api/manifests/prod")
	e.Reg.Await(t, "three more polls", func() bool { return e.Reg.Count(http.MethodHead, "/v2/acme/api/manifests/prod") >= polls+3 })
	ctl.KickedPasses(t, e.Env, "control-plane", "jobs-manager")
	e.Clock.Add(59 * time.Minute)
	ctl.KickedPasses(t, e.Env, "control-plane", "jobs-manager")
	if n := heads(); n != 1 {
		t.Errorf("%d HEADs of the pinned digest within the interval, want 1: never per pass or poll", n)
	}

	// The interval has passed: the next pass checks again, once; the
	// registry has lost the digest meanwhile.
	e.Reg.MustDeleteManifest(t, "acme/api", pinned)
	e.Clock.Add(2 * time.Minute)
	ctl.KickedPasses(t, e.Env, "control-plane", "jobs-manager")
	if n := heads(); n != 2 {
		t.Errorf("%d HEADs of the pinned digest after the interval, want 2", n)
	}
	ctl.Eventually(t, 30*time.Second, "the PinMissing Event and metric", func() bool {
		_, body := running.Get("http://" + ctl.Metrics + "/metrics")
		v, _ := running.MetricValue(body, "image_refresh_group_needs_attention", map[string]string{"group": "control-plane", "reason": "PinMissing"})
		return v == "1" && e2e.HasEvent(e.Events("jobs-manager"), "PinMissing", pinned)
	})
	// Every pass of the interval says what the check found, asking nothing.
	ctl.KickedPasses(t, e.Env, "control-plane", "jobs-manager")
	if n := heads(); n != 2 {
		t.Errorf("%d HEADs of the pinned digest, want still 2", n)
	}
	if len(e2e.LogLines(ctl.Logs(), "ERROR", "the registry no longer holds "+e.Repo("api")+"@"+pinned)) == 0 {
		t.Error("no ERROR line naming the lost digest")
	}
}
