package admission

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

var k1WebhookGroup = e2e.Groups(e2e.GroupOf("web", "Deployment", "api",
	e2e.ImageOf("api", "api", "prod", e2e.Target("Deployment", "api", "api"), e2e.Target("Deployment", "api", "migrate")),
	e2e.ImageOf("models", "models", "v1", e2e.VolumeTarget("Deployment", "api", "models"))))

// K1 through fix B and fix A in `run`: render pins the init container
// and the image volume of helm's manifest; helm re-rendering the migration
// (an init container) or the image volume back to its tag is stored pinned
// by the webhook; without the webhook, the controller re-pins a revert of
// the init container from its watch event (C1).
func TestWebhook_K1_B1_B2_C1_InitContainersAndImageVolumesArePinnedAtRenderAtAdmissionAndOnTheWatch(t *testing.T) {
	e := newEnv(t)
	api, models := e.Push("api", "prod"), e.Push("models", "v1")
	tag, modelsTag := e.Repo("api")+":prod", e.Repo("models")+":v1"
	testenv.Deployment(t, e.C.Client, e.NS, "api", testenv.WithContainer("api", tag), testenv.WithInitContainer("migrate", tag),
		testenv.WithImageVolume("models", modelsTag), testenv.WithReplicas(1))
	e.Settle("Deployment", "api")
	cfg := e.Config(k1WebhookGroup)
	e.PinAll(cfg)
	pinned, modelsPinned := tag+"@"+api, modelsTag+"@"+models

	// render (B2): helm's manifest of the init container and the image
	// volume comes out pinned from the records on the cluster.
	manifest := "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: api\nspec:\n  template:\n    spec:\n" +
		"      initContainers:\n        - name: migrate\n          image: " + tag + "\n" +
		"      containers:\n        - name: api\n          image: " + tag + "\n" +
		"      volumes:\n        - name: models\n          image:\n            reference: " + modelsTag + "\n"
	code, out, logs, _ := e.Render(manifest, "--config", cfg, "--kubeconfig", e.Kubeconfig, "--namespace", e.NS)
	if want := strings.NewReplacer(tag+"\n", pinned+"\n", modelsTag+"\n", modelsPinned+"\n").Replace(manifest); code != 0 || out != want {
		t.Errorf("render exit %d:\n%s\nwant:\n%s\nlogs:\n%s", code, out, want, logs)
	}

	e.WhLabel("api")
	ctl := e.WhStartProbed(cfg, "api", map[string]string{"api": tag}, "--poll-interval", "1h")

	write := func(manager, patch string) {
		t.Helper()
		if _, err := e.C.Client.AppsV1().Deployments(e.NS).Patch(context.Background(), "api", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: manager}); err != nil {
			t.Fatal(err)
		}
	}
	before := e.Deployment("api")
	write("helm", `{"spec":{"template":{"spec":{"initContainers":[{"name":"migrate","image":"`+tag+`"}],"volumes":[{"name":"models","image":{"reference":"`+modelsTag+`"}}]}}}}`)
	stored := e.Deployment("api")
	if got := stored.Spec.Template.Spec.InitContainers[0].Image; got != pinned {
		t.Errorf("helm's re-render of the init container was stored as %s, want %s", got, pinned)
	}
	if got := stored.Spec.Template.Spec.Volumes[0].Image.Reference; got != modelsPinned {
		t.Errorf("helm's re-render of the image volume was stored as %s, want %s", got, modelsPinned)
	}
	if stored.Generation != before.Generation {
		t.Errorf("the pod template changed (generation %d -> %d): a rollout for nothing", before.Generation, stored.Generation)
	}

	// Without the webhook's label, the re-render lands on the tag; the
	// controller re-pins it from the watch event (C1).
	e.Label("Deployment", "api", map[string]*string{e2e.ManagedLabel: nil})
	e.WriteInitImageAs("helm", "Deployment", "api", "migrate", tag)
	e.UntilDeployments(60*time.Second, "the controller re-pinned the init container", func() bool {
		return e.Deployment("api").Spec.Template.Spec.InitContainers[0].Image == pinned
	})
	e.UntilEvents(60*time.Second, "a Repinned Event naming helm", func() bool {
		return e2e.HasEvent(e.Events("api"), "Repinned", "helm")
	})
	if logs := ctl.Logs(); !strings.Contains(logs, "migrate") {
		t.Errorf("the controller's log does not name the init container it re-pinned:\n%s", logs)
	}
}
