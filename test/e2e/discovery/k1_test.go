package discovery

import (
	"testing"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// K1 with D1: a labelled Deployment's init container (a migration from the
// app's repo:prod), its native sidecar and its image volume are adopted and
// pinned with their tags kept; an init container and an image volume named
// in ignore-containers are left alone.
func TestTick_K1_D1_InitContainersSidecarsAndImageVolumesAreAdoptedAndIgnoreContainersNamesThem(t *testing.T) {
	e := &env{e2e.DiscoveryEnv(t)}
	api := e.Push("api", "prod")
	logs := e.Push("log", "1")
	models := e.Push("models", "v1")
	seed := "example.invalid/seed:v1"       // unresolvable: a tick that touched it would fail
	scratch := "example.invalid/scratch:v1" // likewise
	testenv.Deployment(t, e.C.Client, e.NS, "api",
		testenv.WithContainer("api", e.Repo("api")+":prod"),
		testenv.WithInitContainer("migrate", e.Repo("api")+":prod"),
		testenv.WithInitContainer("seed", seed),
		testenv.WithSidecar("shipper", e.Repo("log")+":1"),
		testenv.WithImageVolume("models", e.Repo("models")+":v1"),
		testenv.WithImageVolume("scratch", scratch),
		testenv.WithAnnotations(map[string]string{e.Key("ignore-containers"): "seed,volume:scratch"}))
	e.Settle("Deployment", "api")
	e.Enable("Deployment", "api")
	cfg := e.settings()
	for i := range 2 { // record, then pin
		if code, out := e.DiscoveryTick(cfg); code != 0 {
			t.Fatalf("tick %d exit %d\n%s", i+1, code, out)
		}
	}
	want := map[string]string{
		"api":                       e.Repo("api") + ":prod@" + api,
		"migrate":                   e.Repo("api") + ":prod@" + api,
		"shipper":                   e.Repo("log") + ":1@" + logs,
		config.VolumeKey("models"):  e.Repo("models") + ":v1@" + models,
		"seed":                      seed,
		config.VolumeKey("scratch"): scratch,
	}
	for key, img := range want {
		if got := e.imageOf("Deployment", "api", key); got != img {
			t.Errorf("%s runs %s, want %s", key, got, img)
		}
	}
	rows := e.Status(cfg)
	for _, n := range []string{"api", "migrate", "shipper", "models"} {
		if r := e2e.Row(rows, "api", n); r == nil || r["state"] != "pinned" {
			t.Errorf("status row of %s: %v, want pinned", n, r)
		}
	}
	for _, n := range []string{"seed", "scratch"} {
		if r := e2e.Row(rows, "api", n); r != nil {
			t.Errorf("the ignored %s has a status row: %v", n, r)
		}
	}
}
