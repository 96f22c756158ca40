// Package gitops recognises the GitOps controller that wrote a workload
// (O2): Argo CD, Flux's kustomize-controller and helm-controller, by the
// field manager of the write and the tracking labels and annotations they
// put on what they apply. A revert such a tool writes is a fight only that
// tool's own setting ends, so the messages name the tool, its application
// and that setting. Pure: it reads strings and maps.
package gitops

import (
	"fmt"
	"strings"
)

// Tool is a GitOps controller image-refresh knows.
type Tool string

const (
	ArgoCD    Tool = "Argo CD"
	FluxKusto Tool = "Flux kustomize-controller"
	FluxHelm  Tool = "Flux helm-controller"
)

// Well-known field managers, labels and annotations of those tools.
const (
	// argoManager is the field manager of Argo CD's server-side apply;
	// its client-side apply writes as "argocd-application-controller".
	argoManager      = "argocd-controller"
	argoCSAManager   = "argocd-application-controller"
	ArgoTrackingID   = "argocd.argoproj.io/tracking-id"
	ArgoInstance     = "app.kubernetes.io/instance" // Argo CD's label tracking (its default before 3.0's annotation tracking)
	KustomizeManager = "kustomize-controller"
	KustomizeName    = "kustomize.toolkit.fluxcd.io/name"
	KustomizeNS      = "kustomize.toolkit.fluxcd.io/namespace"
	HelmManager      = "helm-controller"
	HelmName         = "helm.toolkit.fluxcd.io/name"
	HelmNS           = "helm.toolkit.fluxcd.io/namespace"
)

// TrackingKeys are the labels and annotations Identify reads: a cache that
// keeps of a workload's metadata only what the rules read keeps these
// (workload.StripWorkload).
var TrackingKeys = []string{ArgoTrackingID, ArgoInstance, KustomizeName, KustomizeNS, HelmName, HelmNS}

// Writer is a GitOps controller that wrote a workload, and what to change
// in it so that it stops putting the bare tag back.
type Writer struct {
	Tool Tool
	// App names the tool's object that applied the workload: the Argo CD
	// Application, the Flux Kustomization or HelmRelease ("" when the
	// tracking labels are missing).
	App string
	// Manager is the field manager the write carried.
	Manager string
}

// String names the writer for a log line or an Event: "Argo CD
// (Application shop)".
func (w Writer) String() string {
	if w.App == "" {
		return string(w.Tool)
	}
	return fmt.Sprintf("%s (%s)", w.Tool, w.App)
}

// Remediation is the tool's own setting that ends the fight, checked
// against how that tool diffs (docs/gitops.md).
func (w Writer) Remediation() string {
	switch w.Tool {
	case ArgoCD:
		return fmt.Sprintf("in %s: add spec.ignoreDifferences for the container image (jqPathExpressions: .spec.template.spec.containers[].image) with syncOptions RespectIgnoreDifferences=true, or, with image-refresh's webhook on for the workload, the annotation argocd.argoproj.io/compare-options: ServerSideDiff=true,IncludeMutationWebhook=true (docs/gitops.md)", w.orApp("the Application"))
	case FluxKusto:
		return fmt.Sprintf("turn on image-refresh's admission webhook for the workload (chart webhook.enabled, and its objectSelector label on the workload in Git): %s applies with a server-side dry run first, which runs the webhook, so it sees the pinned image as no drift (docs/gitops.md)", w.orApp("the Kustomization"))
	case FluxHelm:
		return fmt.Sprintf("turn on image-refresh's admission webhook for the workload (chart webhook.enabled, and its objectSelector label on the workload in the chart): its drift detection runs a server-side dry run, which runs the webhook; or in %s add spec.driftDetection.ignore with the JSON pointer of each pinned image (/spec/template/spec/containers/N/image, target kind Deployment) so that drift correction leaves the pin (docs/gitops.md)", w.orApp("the HelmRelease"))
	}
	return ""
}

func (w Writer) orApp(generic string) string {
	if w.App == "" {
		return generic
	}
	return w.App
}

// Identify names the GitOps controller behind a write of manager to a
// workload with these labels and annotations; ok is false for any other
// writer (helm, kubectl, a person). The field manager decides; the tracking
// metadata only names the application.
func Identify(manager string, labels, annotations map[string]string) (w Writer, ok bool) {
	w.Manager = manager
	switch {
	case manager == argoManager || manager == argoCSAManager || strings.HasPrefix(manager, "argocd-"):
		w.Tool = ArgoCD
		if id := annotations[ArgoTrackingID]; id != "" {
			app, _, _ := strings.Cut(id, ":")
			w.App = argoApp(app)
		} else if inst := labels[ArgoInstance]; inst != "" {
			w.App = argoApp(inst)
		}
	case manager == KustomizeManager:
		w.Tool = FluxKusto
		w.App = namespaced("Kustomization", meta(labels, annotations, KustomizeNS), meta(labels, annotations, KustomizeName))
	case manager == HelmManager:
		w.Tool = FluxHelm
		w.App = namespaced("HelmRelease", meta(labels, annotations, HelmNS), meta(labels, annotations, HelmName))
	default:
		return Writer{}, false
	}
	return w, true
}

// argoApp names the Argo CD Application of a tracking value: its name, or
// "<namespace>_<name>" for an Application outside Argo CD's own namespace
// (applications in any namespace); a Kubernetes name has no "_".
func argoApp(instance string) string {
	if ns, name, ok := strings.Cut(instance, "_"); ok {
		return "Application " + ns + "/" + name
	}
	return "Application " + instance
}

func meta(labels, annotations map[string]string, key string) string {
	if v := labels[key]; v != "" {
		return v
	}
	return annotations[key]
}

func namespaced(kind, ns, name string) string {
	switch {
	case name == "":
		return ""
	case ns == "":
		return kind + " " + name
	}
	return kind + " " + ns + "/" + name
}
