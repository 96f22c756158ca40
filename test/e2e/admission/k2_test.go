package admission

import (
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// k2WebhookGroup: the Deployment api (the webhook's probe and the anchor)
// and the PodSet shop, a declared kind, run one image.
var k2WebhookGroup = testenv.PodSetKindYAML + e2e.Groups(e2e.GroupOf("web", "Deployment", "api",
	e2e.ImageOf("api", "api", "prod", e2e.Target("Deployment", "api", "api"), e2e.Target("PodSet", "shop", "api"), e2e.Target("PodSet", "shop", "migrate"))))

// K2 through fix B: render pins a declared kind's manifest (its pod
// template at the declared path) from the records on the cluster, and the
// webhook pins helm's re-render of a PodSet's init container before it is
// stored, so its pod template does not change at all.
func TestWebhook_K2_B1_B2_ADeclaredKindIsPinnedAtRenderAndAtAdmission(t *testing.T) {
	e := newEnv(t)
	dyn := testenv.InstallPodSet(t, e.C.Config)
	api := e.Push("api", "prod")
	tag := e.Repo("api") + ":prod"
	pinned := tag + "@" + api
	testenv.Deployment(t, e.C.Client, e.NS, "api", testenv.WithContainer("api", tag), testenv.WithReplicas(1))
	testenv.CreatePodSet(t, dyn, e.NS, "shop", testenv.WithContainer("api", tag), testenv.WithInitContainer("migrate", tag))
	driver := testenv.DrivePodSet(t, dyn, e.NS, "shop")
	driver.WaitObserved(t, 1)
	e.Settle("Deployment", "api")
	cfg := e.Config(k2WebhookGroup)
	e.PinAll(cfg)
	if got := testenv.PodSetImage(testenv.GetPodSet(t, dyn, e.NS, "shop"), "migrate"); got != pinned {
		t.Fatalf("setup: the PodSet's init container is on %s after the pinning ticks, want %s", got, pinned)
	}
	driver.WaitObserved(t, testenv.GetPodSet(t, dyn, e.NS, "shop").GetGeneration())

	// render (B2): helm's PodSet manifest comes out pinned, init container
	// included; a kind of the same name in another group is left alone.
	manifest := "apiVersion: e2e.image-refresh.io/v1\nkind: PodSet\nmetadata:\n  name: shop\nspec:\n  template:\n    spec:\n" +
		"      initContainers:\n        - name: migrate\n          image: " + tag + "\n" +
		"      containers:\n        - name: api\n          image: " + tag + "\n"
	other := "---\napiVersion: other.example/v1\nkind: PodSet\nmetadata:\n  name: shop\nspec:\n  template:\n    spec:\n      containers:\n        - name: api\n          image: " + tag + "\n"
	code, out, logs, _ := e.Render(manifest+other, "--config", cfg, "--kubeconfig", e.Kubeconfig, "--namespace", e.NS)
	if want := strings.ReplaceAll(manifest, tag+"\n", pinned+"\n") + other; code != 0 || out != want {
		t.Errorf("render exit %d:\n%s\nwant:\n%s\nlogs:\n%s", code, out, want, logs)
	}

	// The webhook (B1), its rules naming the declared kind's resource.
	e.WhRules = []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{testenv.PodSet.Group}, APIVersions: []string{testenv.PodSet.Version}, Resources: []string{"podsets"}},
	}}
	testenv.PatchPodSet(t, dyn, e.NS, "shop", "kubectl-label", `{"metadata":{"labels":{"`+e2e.ManagedLabel+`":"true"}}}`)
	e.WhLabel("api")
	ctl := e.WhStartProbed(cfg, "api", map[string]string{"api": tag}, "--poll-interval", "1h")
	before := testenv.GetPodSet(t, dyn, e.NS, "shop")
	stored := testenv.PatchPodSet(t, dyn, e.NS, "shop", "helm", `[{"op":"replace","path":"/spec/template/spec/initContainers/0/image","value":"`+tag+`"}]`)
	if got := testenv.PodSetImage(stored, "migrate"); got != pinned {
		t.Errorf("helm's re-render of the PodSet's init container was stored as %s, want %s", got, pinned)
	}
	if stored.GetGeneration() != before.GetGeneration() {
		t.Errorf("the PodSet's pod template changed (generation %d -> %d): a rollout for nothing", before.GetGeneration(), stored.GetGeneration())
	}
	for _, line := range strings.Split(ctl.Logs(), "\n") {
		if strings.Contains(line, "allowed a request unchanged after an internal error") && strings.Contains(line, "kind=PodSet") {
			t.Errorf("the webhook failed open on the PodSet: %s", line)
		}
	}
}
