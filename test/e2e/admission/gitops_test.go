package admission

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/test/support/e2e"
)

// TestAdmission_O2_AServerSideDryRunApplyOfTheTagSeesThePin: Flux's
// kustomize-controller and helm-controller, and Argo CD's server-side diff,
// decide whether a workload drifted from Git with a server-side dry-run
// apply of Git's manifest (conflicts forced, their own field manager) and
// compare what comes back with the live object. With image-refresh's
// webhook on, that dry run of the bare tag comes back pinned, so the pod
// template equals the live one: no drift, nothing to sync, no fight; and
// being a dry run it stores nothing. A Deployment image-refresh does not
// manage, pinned by hand, comes back on the tag: there the tool sees drift.
func TestAdmission_O2_AServerSideDryRunApplyOfTheTagSeesThePin(t *testing.T) {
	e := newEnv(t)
	e.Push("api", "prod")
	tag := e.Repo("api") + ":prod"
	label := map[string]string{e2e.ManagedLabel: "true"} // the webhook's objectSelector
	with := func(extra map[string]string) map[string]string {
		out := map[string]string{}
		for _, m := range []map[string]string{label, extra} {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}
	tools := []struct {
		deploy string
		writer e2e.GitOpsWriter
	}{
		{"kustomized", e2e.GitOpsWriter{Manager: "kustomize-controller", Labels: with(map[string]string{"kustomize.toolkit.fluxcd.io/name": "apps", "kustomize.toolkit.fluxcd.io/namespace": "flux-system"})}},
		{"released", e2e.GitOpsWriter{Manager: "helm-controller", Labels: with(map[string]string{"helm.toolkit.fluxcd.io/name": "api", "helm.toolkit.fluxcd.io/namespace": "shop"})}},
		{"argo", e2e.GitOpsWriter{Manager: "argocd-controller", Labels: label, Annotations: map[string]string{"argocd.argoproj.io/tracking-id": "shop:apps/Deployment:" + e.NS + "/argo"}}},
	}
	// other is applied by kustomize-controller too, labelled for the
	// webhook, but is no target of image-refresh.
	other := e2e.GitOpsWriter{Manager: "kustomize-controller", Labels: tools[0].writer.Labels}
	for _, tl := range tools {
		if _, err := e.GitOpsApply(tl.writer, tl.deploy, [][2]string{{"app", tag}}, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.GitOpsApply(other, "other", [][2]string{{"app", tag}}, false); err != nil {
		t.Fatal(err)
	}
	cfg := e.Config(e2e.Groups(e2e.GroupOf("o2", "Deployment", "kustomized", e2e.ImageOf("api", "api", "prod", e2e.Target("Deployment", "kustomized", "app"), e2e.Target("Deployment", "released", "app"), e2e.Target("Deployment", "argo", "app")))))
	e.Tick(cfg) // first observation: recorded
	e.Tick(cfg) // pinned
	pinned := e.Image("kustomized", "app")
	if !strings.HasPrefix(pinned, tag+"@sha256:") {
		t.Fatalf("setup: kustomized not pinned: %s", pinned)
	}
	// other is pinned by hand, as kubectl set image does.
	if _, err := e.C.Client.AppsV1().Deployments(e.NS).Patch(context.Background(), "other", types.JSONPatchType,
		[]byte(`[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":"`+pinned+`"}]`), metav1.PatchOptions{FieldManager: "kubectl-set"}); err != nil {
		t.Fatal(err)
	}
	e.WhStartProbed(cfg, "kustomized", map[string]string{"app": tag}, "--poll-interval", "1h")

	dryRun := func(t *testing.T, w e2e.GitOpsWriter, deploy, want string, drift bool) {
		t.Helper()
		live := e.Deployment(deploy)
		if got := e2e.WhImages(live)["app"]; got != pinned {
			t.Fatalf("setup: %s runs %s, want %s", deploy, got, pinned)
		}
		got, err := e.GitOpsApply(w, deploy, [][2]string{{"app", tag}}, true)
		if err != nil {
			t.Fatalf("%s's server-side dry-run apply of %s: %v", w.Manager, deploy, err)
		}
		if img := e2e.WhImages(got)["app"]; img != want {
			t.Errorf("%s's dry-run apply of %s returned %s, want %s", w.Manager, tag, img, want)
		}
		// Flux's drift check (fluxcd/pkg/ssa/jsondiff) compares everything
		// but metadata and status of the dry run with the live object.
		if d := !equality.Semantic.DeepEqual(got.Spec, live.Spec); d != drift {
			t.Errorf("the dry run's spec differs from the live one: %v, want %v (the tool's drift)", d, drift)
		}
		// A dry run: nothing stored, not even the field manager's claim.
		after := e.Deployment(deploy)
		if after.ResourceVersion != live.ResourceVersion || e2e.WhImages(after)["app"] != pinned {
			t.Errorf("the dry run wrote %s: resourceVersion %s -> %s, image %s", deploy, live.ResourceVersion, after.ResourceVersion, e2e.WhImages(after)["app"])
		}
	}
	for _, tl := range tools {
		t.Run(tl.writer.Manager, func(t *testing.T) { dryRun(t, tl.writer, tl.deploy, pinned, false) })
	}
	t.Run("a Deployment image-refresh does not manage", func(t *testing.T) { dryRun(t, other, "other", tag, true) })
}
