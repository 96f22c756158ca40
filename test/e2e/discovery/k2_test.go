package discovery

import (
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// K2 with D1 and C1, in run: a config that only declares a kind makes
// run watch it; a PodSet labelled for discovery is adopted (recorded,
// then pinned, its init container too), and a writer that puts the bare
// tag back is answered from the controller's watch of the kind.
func TestRun_K2_D1_C1_ALabelledDeclaredKindIsAdoptedPinnedAndRepinnedOnItsWatch(t *testing.T) {
	e := &env{e2e.DiscoveryEnv(t)}
	dyn := testenv.InstallPodSet(t, e.C.Config)
	api := e.Push("api", "prod")
	tag := e.Repo("api") + ":prod"
	testenv.CreatePodSet(t, dyn, e.NS, "shop", testenv.WithContainer("api", tag), testenv.WithInitContainer("migrate", tag))
	driver := testenv.DrivePodSet(t, dyn, e.NS, "shop")
	driver.WaitObserved(t, 1)
	group := e.NS + "/podset/shop"
	cfg := e.Config(testenv.PodSetKindYAML)
	ctl := e.StartRun(cfg, "--poll-interval", "1h", "--watch-namespaces", e.NS)
	ctl.WaitReady(t)
	until := func(what string, cond func() bool) {
		t.Helper()
		e.UntilWatched(30*time.Second, what, testenv.WatchPodSet(dyn, e.NS, "shop"), cond)
	}
	shop := func() map[string]string {
		u := testenv.GetPodSet(t, dyn, e.NS, "shop")
		return map[string]string{"api": testenv.PodSetImage(u, "api"), "migrate": testenv.PodSetImage(u, "migrate"), "record": u.GetAnnotations()[e.Key("last-refreshed-api-digest")]}
	}

	// The label adopts it: the first pass records (R5) …
	testenv.PatchPodSet(t, dyn, e.NS, "shop", "kubectl-label", `{"metadata":{"labels":{"`+e.Key("enabled")+`":"true"}}}`)
	until("the labelled PodSet recorded", func() bool { return shop()["record"] == api })
	// … and the next pins both images, the tag kept (D1).
	pinned := tag + "@" + api
	from := ctl.Passes(t, group)
	testenv.PatchPodSet(t, dyn, e.NS, "shop", "test", `{"metadata":{"annotations":{"`+e.Key("test-kick")+`":"1"}}}`)
	testenv.PatchPodSet(t, dyn, e.NS, "shop", "test", `{"metadata":{"annotations":{"`+e.Key("test-kick")+`":null}}}`)
	ctl.WaitPasses(t, group, from, 1)
	until("the labelled PodSet pinned", func() bool { s := shop(); return s["api"] == pinned && s["migrate"] == pinned })
	driver.WaitObserved(t, testenv.GetPodSet(t, dyn, e.NS, "shop").GetGeneration())

	// C1: the bare tag written back over the migration's pin is re-pinned
	// from the watch, without a resync.
	testenv.PatchPodSet(t, dyn, e.NS, "shop", "helm", `[{"op":"replace","path":"/spec/template/spec/initContainers/0/image","value":"`+tag+`"}]`)
	until("the reverted init container re-pinned", func() bool { return shop()["migrate"] == pinned })
	if rows := e.statusRows("--config", cfg, "--watch-namespaces", e.NS); e2e.Row(rows, "shop", "migrate") == nil {
		t.Errorf("status lists no row of the PodSet's init container: %v", rows)
	}
}
