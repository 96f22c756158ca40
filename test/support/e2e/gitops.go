package e2e

import (
	"context"
	"encoding/json"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// GitOpsWriter writes a Deployment as a GitOps controller does (O2): a
// server-side apply of the whole manifest from Git with the tool's field
// manager and conflicts forced, the manifest carrying the tool's tracking
// labels and annotations. Argo CD (ServerSideApply=true) applies as
// `kubectl apply --server-side --force-conflicts` with the manager
// "argocd-controller"; Flux's kustomize-controller and helm-controller (Helm
// 4's server-side apply) apply through fluxcd/pkg/ssa with ForceOwnership.
// Patch, when set, is how the tool writes a revert instead of that apply,
// with the same field manager: types.JSONPatchType for helm-controller's
// drift correction (a JSON patch of the fields that drifted),
// types.StrategicMergePatchType for Argo CD's client-side apply (kubectl's
// three-way merge patch, which gitops-engine runs with Argo CD's manager).
type GitOpsWriter struct {
	Manager     string
	Labels      map[string]string
	Annotations map[string]string
	Patch       types.PatchType
}

// GitOpsManifest is the apply configuration of Deployment name with one
// replica and these containers (name → image), as a GitOps tool keeps it
// in Git: only the fields it sets, the tracking metadata added.
func (e *Env) GitOpsManifest(w GitOpsWriter, name string, containers [][2]string) []byte {
	e.T.Helper()
	var cs []map[string]any
	for _, c := range containers {
		cs = append(cs, map[string]any{"name": c[0], "image": c[1], "imagePullPolicy": "IfNotPresent"})
	}
	labels := map[string]string{"app": name}
	for k, v := range w.Labels {
		labels[k] = v
	}
	meta := map[string]any{"name": name, "namespace": e.NS, "labels": labels}
	if len(w.Annotations) > 0 {
		meta["annotations"] = w.Annotations
	}
	m := map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
		"spec": map[string]any{
			"replicas": 1,
			"selector": map[string]any{"matchLabels": map[string]string{"app": name}},
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]string{"app": name}},
				"spec":     map[string]any{"containers": cs, "terminationGracePeriodSeconds": 0},
			},
		},
	}
	data, err := json.Marshal(m)
	if err != nil {
		e.T.Fatal(err)
	}
	return data
}

// GitOpsApply applies Deployment name with these containers as w (a
// server-side dry run if dryRun: nothing is stored) and returns the object
// the API server stored, or would store, after its admission webhooks.
func (e *Env) GitOpsApply(w GitOpsWriter, name string, containers [][2]string, dryRun bool) (*appsv1.Deployment, error) {
	force := true
	opts := metav1.PatchOptions{FieldManager: w.Manager, Force: &force}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return e.C.Client.AppsV1().Deployments(e.NS).Patch(context.Background(), name, types.ApplyPatchType, e.GitOpsManifest(w, name, containers), opts)
}

// GitOpsRevert puts the image of container (index i) of Deployment name
// back to image as w syncs it: w's apply of the whole manifest, or w's
// patch of the one field.
func (e *Env) GitOpsRevert(w GitOpsWriter, name string, i int, container, image string) error {
	var patch string
	switch w.Patch {
	case "":
		_, err := e.GitOpsApply(w, name, [][2]string{{container, image}}, false)
		return err
	case types.JSONPatchType:
		patch = fmt.Sprintf(`[{"op":"replace","path":"/spec/template/spec/containers/%d/image","value":%q}]`, i, image)
	case types.StrategicMergePatchType:
		patch = fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":%q,"image":%q}]}}}}`, container, image)
	default:
		return fmt.Errorf("GitOpsRevert: patch type %s", w.Patch)
	}
	_, err := e.C.Client.AppsV1().Deployments(e.NS).Patch(context.Background(), name, w.Patch, []byte(patch), metav1.PatchOptions{FieldManager: w.Manager})
	return err
}
