package run

import (
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/running"
)

// V3 in `run`: the nodes come from its informer cache (metadata only), and
// what a new digest serves is looked up once, however many polls and
// passes see it; a digest that lacks a platform the nodes need is held,
// platform-missing, on every pass.
func TestRun_V3_AnIndexWithoutTheNodesPlatformIsHeldAndLookedUpOnce(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	amd64 := v1.Platform{OS: "linux", Architecture: "amd64"}
	arm64 := v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}
	index := e.Reg.MustPushIndexFor(t, "acme/api", "prod", amd64, arm64)
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg)

	ctl := e.StartRun(cfg, "--poll-interval", "300ms", "--poll-jitter", "0")
	ctl.WaitReady(t)
	ctl.WaitPasses(t, "control-plane", 0, 1)
	next := e.Reg.MustPushIndexFor(t, "acme/api", "prod", arm64)
	lookups := func() int { return e.Reg.Count(http.MethodGet, "/v2/acme/api/manifests/"+next) }
	ctl.Eventually(t, 30*time.Second, "the PlatformMissing Event and metric", func() bool {
		_, body := running.Get("http://" + ctl.Metrics + "/metrics")
		v, _ := running.MetricValue(body, "image_refresh_group_needs_attention", map[string]string{"group": "control-plane", "reason": "PlatformMissing"})
		return v == "1" && e2e.HasEvent(e.Events("jobs-manager"), "PlatformMissing", next)
	})
	if n := lookups(); n != 1 {
		t.Errorf("%d GETs of %s by digest, want 1: one lookup per new digest", n, next)
	}
	// More polls and passes ask nothing more, and still hold it.
	polls := e.Reg.Count(http.MethodHead, "/v2/acme/api/manifests/prod")
	e.Reg.Await(t, "three more polls", func() bool { return e.Reg.Count(http.MethodHead, "/v2/acme/api/manifests/prod") >= polls+3 })
	ctl.KickedPasses(t, e.Env, "control-plane", "jobs-manager")
	if n := lookups(); n != 1 {
		t.Errorf("%d GETs of %s by digest after more polls and passes, want still 1: never per poll", n, next)
	}
	if got, want := e.Image("jobs-manager", "api"), e.Repo("api")+":prod@"+index; got != want {
		t.Errorf("jobs-manager runs %s, want it held on %s", got, want)
	}
	if len(e2e.LogLines(ctl.Logs(), "ERROR", "at "+next, "linux/amd64 (node node-")) == 0 {
		t.Errorf("no ERROR line naming %s, linux/amd64 and a node:\n%s", next, ctl.Logs())
	}
	if strings.Contains(ctl.Logs(), "list the nodes") {
		t.Errorf("the node list failed:\n%s", ctl.Logs())
	}
}
