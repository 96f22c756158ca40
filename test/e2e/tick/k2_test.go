package tick

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// k2Group: a PodSet (a kind the config declares) whose migration runs as
// an init container from the app's repo:prod; the PodSet is the anchor.
var k2Group = testenv.PodSetKindYAML + e2e.Groups(e2e.GroupOf("shop", "PodSet", "shop",
	e2e.ImageOf("app", "app", "prod", e2e.Target("PodSet", "shop", "app"), e2e.Target("PodSet", "shop", "migrate"))))

// podSetImages reads the PodSet's container and init container images.
func podSetImages(t *testing.T, dyn dynamic.Interface, ns, name string) (app, migrate string, obj *unstructured.Unstructured) {
	t.Helper()
	u, err := dyn.Resource(testenv.PodSetResource).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctrs, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
	inits, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "initContainers")
	return ctrs[0].(map[string]any)["image"].(string), inits[0].(map[string]any)["image"].(string), u
}

// TestTick_K2_ADeclaredKindIsATargetAndAnAnchorUnderEveryRule: a PodSet,
// declared under kinds:, is recorded (R5), pinned (R9, container and init
// container in one write), re-pinned after another writer put the bare
// tag back (R7), held while its status reports a stall (R4, read from its
// conditions as kstatus reads them), and moved to a new build once its
// controller reports it current again (R6); the anchor's annotations hold
// the group's state, and status lists its rows.
func TestTick_K2_ADeclaredKindIsATargetAndAnAnchorUnderEveryRule(t *testing.T) {
	e := newEnv(t)
	dyn := testenv.InstallPodSet(t, e.C.Config)
	first := e.Push("app", "prod")
	tag := e.Repo("app") + ":prod"
	testenv.CreatePodSet(t, dyn, e.NS, "shop", testenv.WithContainer("app", tag), testenv.WithInitContainer("migrate", tag))
	driver := testenv.DrivePodSet(t, dyn, e.NS, "shop")
	driver.WaitObserved(t, 1)
	cfg := e.Config(k2Group)

	// Record, then pin both images in one write.
	for i, what := range []string{"recording", "pinning"} {
		if code, logs := e.Tick(cfg); code != 0 {
			t.Fatalf("%s tick (%d) exit %d\n%s", what, i+1, code, logs)
		}
	}
	app, migrate, u := podSetImages(t, dyn, e.NS, "shop")
	if app != tag+"@"+first || migrate != tag+"@"+first {
		t.Fatalf("after the pin: app %s, migrate %s; want both %s@%s", app, migrate, tag, first)
	}
	if got := u.GetAnnotations()[e.Key("last-refreshed-app-digest")]; got != first {
		t.Errorf("the anchor PodSet records %q, want %s", got, first)
	}
	if gen := u.GetGeneration(); gen != 2 {
		t.Errorf("the PodSet's generation is %d after the pin, want 2: one write for both images (R9)", gen)
	}
	rows := e.Status(cfg)
	if r := e2e.Row(rows, "shop", "migrate"); r == nil || r["state"] != "pinned" || r["slot"] != "init container" {
		t.Errorf("status row of the PodSet's init container: %v, want pinned, init container", r)
	}

	// Another writer puts the bare tag back on the migration: re-pinned.
	driver.WaitObserved(t, 2)
	patch := `[{"op":"replace","path":"/spec/template/spec/initContainers/0/image","value":"` + tag + `"}]`
	if _, err := dyn.Resource(testenv.PodSetResource).Namespace(e.NS).Patch(context.Background(), "shop", types.JSONPatchType, []byte(patch), metav1.PatchOptions{FieldManager: "helm"}); err != nil {
		t.Fatal(err)
	}
	driver.WaitObserved(t, 3)
	if code, logs := e.Tick(cfg); code != 0 {
		t.Fatalf("tick after the revert exit %d\n%s", code, logs)
	}
	if _, migrate, _ = podSetImages(t, dyn, e.NS, "shop"); migrate != tag+"@"+first {
		t.Errorf("the reverted init container is on %s, want %s@%s (R7)", migrate, tag, first)
	}

	// A new build while the PodSet's controller reports a stall: held,
	// and the log says why in the controller's words.
	driver.WaitObserved(t, 4)
	driver.Stall("2 pods cannot be scheduled")
	next := e.Push("app", "prod")
	_, logs := e.Tick(cfg)
	if app, _, _ = podSetImages(t, dyn, e.NS, "shop"); app != tag+"@"+first {
		t.Errorf("a stalled PodSet was moved to %s (R4)", app)
	}
	if !strings.Contains(logs, "2 pods cannot be scheduled") {
		t.Errorf("the held tick's log does not give the PodSet's own reason\n%s", logs)
	}

	// Current again: the new build moves both images and the record.
	driver.Stall("")
	if code, logs := e.Tick(cfg); code != 0 {
		t.Fatalf("digest-change tick exit %d\n%s", code, logs)
	}
	app, migrate, u = podSetImages(t, dyn, e.NS, "shop")
	if app != tag+"@"+next || migrate != tag+"@"+next {
		t.Errorf("after the new build: app %s, migrate %s; want both %s@%s (R6)", app, migrate, tag, next)
	}
	if got := u.GetAnnotations()[e.Key("last-refreshed-app-digest")]; got != next {
		t.Errorf("recorded %q after the settled change, want %s", got, next)
	}
}

// K2, R19: a declared kind the API server does not serve as declared
// (its CRD not installed; another resource name) stops tick at start with
// the exit code of an invalid config and a message that names the kinds:
// entry and the fix, before any target is read.
func TestTick_K2_R19_AKindTheAPIServerDoesNotServeAsDeclaredIsNamedAtStart(t *testing.T) {
	e := newEnv(t)
	// A kind of its own: declared here with another resource, which no
	// other test of this process may declare otherwise.
	testenv.InstallPodSetLike(t, e.C.Config, "PodFleet")
	for _, tc := range []struct{ kinds, want string }{
		// A group no test installs (Argo Rollouts' is, by another test).
		{"kinds:\n  - {group: never.image-refresh.io, version: v1, kind: Widget, podTemplate: spec.template}\n",
			"kinds[0]: Widget (never.image-refresh.io/v1): not served by the API server: no API never.image-refresh.io/v1 (is its CRD installed?"},
		{"kinds:\n  - {group: e2e.image-refresh.io, version: v1, kind: PodFleet, podTemplate: spec.template, resource: pods}\n",
			"the API server serves it as podfleets; set resource: podfleets"},
	} {
		group := strings.ReplaceAll(k2Group, testenv.PodSetKindYAML, tc.kinds)
		for _, k := range []string{"Widget", "PodFleet"} {
			if strings.Contains(tc.kinds, k) {
				group = strings.ReplaceAll(group, "PodSet", k)
			}
		}
		code, logs := e.Tick(e.Config(group))
		if code != 2 || !strings.Contains(logs, tc.want) {
			t.Errorf("%s: exit %d, want 2 and a message with %q\n%s", tc.kinds, code, tc.want, logs)
		}
		if strings.Contains(logs, "first observation") {
			t.Errorf("a tick with an unserved kind went on to a pass:\n%s", logs)
		}
	}
}
