package tick

import (
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// k1Group: a DaemonSet whose migration runs as an init container from the
// app's own repo:prod, with an image volume of models.
var k1Group = e2e.Groups(e2e.GroupOf("fleet", "DaemonSet", "agent",
	e2e.ImageOf("app", "app", "prod", e2e.Target("DaemonSet", "agent", "app"), e2e.Target("DaemonSet", "agent", "migrate")),
	e2e.ImageOf("models", "models", "v1", e2e.VolumeTarget("DaemonSet", "agent", "models"))))

// TestTick_K1_InitContainersAndImageVolumesArePinnedRepinnedAndChecked is
// the seed's incident where it hurts most: node-2 cached an old :prod, so
// its pod ran the old migration before the app. The init container and the
// image volume are targets like the container: the old migration is
// reported running-stale (N1, from initContainerStatuses), the pin moves
// all three, a helm re-render of the init container is re-pinned (R7), a
// new digest moves the container and the init container together (R6),
// and status says which target is an init container or an image volume.
func TestTick_K1_InitContainersAndImageVolumesArePinnedRepinnedAndChecked(t *testing.T) {
	e := newEnv(t)
	old := e.Push("app", "prod")
	latest := e.Push("app", "prod")
	models := e.Push("models", "v1")
	tag, modelsTag := e.Repo("app")+":prod", e.Repo("models")+":v1"
	if err := e.C.SetNodeImageCache("node-2", tag, old); err != nil {
		t.Fatal(err)
	}
	testenv.DaemonSet(t, e.C.Client, e.NS, "agent", testenv.WithContainer("app", tag), testenv.WithInitContainer("migrate", tag),
		testenv.WithImageVolume("models", modelsTag), testenv.WithTolerateAll())
	e.Settle("DaemonSet", "agent")
	cfg := e.Config(k1Group)

	// First tick: records (R5); the init container on node-2 ran the old
	// build, and status says so, naming it an init container.
	if code, logs := e.Tick(cfg); code != 0 {
		t.Fatalf("first tick exit %d\n%s", code, logs)
	}
	rows := e.Status(cfg)
	mig := e2e.Row(rows, "agent", "migrate")
	// The cause first: the init container is not on its pin yet
	// (drifted); its pods on the old build are beside it (O2).
	if !e2e.StatesAre(mig, "drifted", "running-stale") || mig["running"] != "2/3 (node-2: "+old+")" || mig["slot"] != "init container" {
		t.Errorf("init container row %v; want drifted (+running-stale), running 2/3 (node-2: %s), slot init container", mig, old)
	}
	if !strings.Contains(mig["target"].(string), "init container migrate") {
		t.Errorf("the row's target %q does not say init container", mig["target"])
	}
	_, table, _ := e.Run("status", "--config", cfg, "--kubeconfig", e.Kubeconfig)
	if !strings.Contains(table, "agent/migrate (init container)") || !strings.Contains(table, "agent/models (image volume)") {
		t.Errorf("status table does not name the init container and the image volume:\n%s", table)
	}

	// Second tick pins all three; every node then runs the recorded build,
	// the migration included.
	if code, logs := e.Tick(cfg); code != 0 {
		t.Fatalf("pinning tick exit %d\n%s", code, logs)
	}
	e.Settle("DaemonSet", "agent")
	spec := e.DaemonSet("agent").Spec.Template.Spec
	if spec.Containers[0].Image != tag+"@"+latest || spec.InitContainers[0].Image != tag+"@"+latest || spec.Volumes[0].Image.Reference != modelsTag+"@"+models {
		t.Fatalf("after the pin: app %s, migrate %s, models %s", spec.Containers[0].Image, spec.InitContainers[0].Image, spec.Volumes[0].Image.Reference)
	}
	if spec.InitContainers[0].ImagePullPolicy != "IfNotPresent" {
		t.Errorf("the pin changed the init container's pull policy to %s (R16)", spec.InitContainers[0].ImagePullPolicy)
	}
	rows = e.Status(cfg)
	if r := e2e.Row(rows, "agent", "migrate"); r["state"] != "pinned" || r["running"] != "3/3" {
		t.Errorf("after the pin, the init container's row: %v; want pinned, 3/3", r)
	}
	if r := e2e.Row(rows, "agent", "models"); r == nil || r["state"] != "pinned" || r["slot"] != "image volume" {
		t.Errorf("after the pin, the image volume's row: %v; want pinned", r)
	}

	// helm re-renders the migration to the bare tag: re-pinned (R7), and
	// the Event names helm.
	e.WriteInitImageAs("helm", "DaemonSet", "agent", "migrate", tag)
	e.Settle("DaemonSet", "agent")
	code, logs := e.Tick(cfg)
	if code != 0 {
		t.Fatalf("tick after the revert exit %d\n%s", code, logs)
	}
	if got := e.DaemonSet("agent").Spec.Template.Spec.InitContainers[0].Image; got != tag+"@"+latest {
		t.Errorf("the reverted init container is on %s, want %s", got, tag+"@"+latest)
	}
	if !e2e.HasEvent(e.Events("agent"), "Repinned", "helm") || !strings.Contains(logs, "init container migrate") && !strings.Contains(logs, "container migrate") {
		t.Errorf("the re-pin of the init container is not told (Event naming helm, log naming migrate): %q\n%s", e.Events("agent"), logs)
	}

	// A new build: the container and the init container move together
	// (R6, one write per workload); the models stay.
	e.Settle("DaemonSet", "agent")
	next := e.Push("app", "prod")
	if code, logs := e.Tick(cfg); code != 0 {
		t.Fatalf("digest-change tick exit %d\n%s", code, logs)
	}
	spec = e.DaemonSet("agent").Spec.Template.Spec
	if spec.Containers[0].Image != tag+"@"+next || spec.InitContainers[0].Image != tag+"@"+next || spec.Volumes[0].Image.Reference != modelsTag+"@"+models {
		t.Errorf("after the new build: app %s, migrate %s, models %s", spec.Containers[0].Image, spec.InitContainers[0].Image, spec.Volumes[0].Image.Reference)
	}
	if got := e.DaemonSet("agent").Annotations[e.Key("last-refreshed-app-digest")]; got != next {
		t.Errorf("recorded %q after the settled change, want %s", got, next)
	}
}
