package gitops

import (
	"strings"
	"testing"
)

func TestIdentify_O2_TheToolAndItsApplicationFromTheManagerAndTrackingMetadata(t *testing.T) {
	for name, tc := range map[string]struct {
		manager     string
		labels, ann map[string]string
		want        string // Writer.String(); "" for no GitOps writer
		setting     string // a word of the remediation
	}{
		"Argo CD's server-side apply with annotation tracking": {
			manager: "argocd-controller", ann: map[string]string{ArgoTrackingID: "shop:apps/Deployment:shop/api"},
			want: "Argo CD (Application shop)", setting: "RespectIgnoreDifferences=true"},
		"Argo CD's client-side apply with label tracking": {
			manager: "argocd-application-controller", labels: map[string]string{ArgoInstance: "shop"},
			want: "Argo CD (Application shop)", setting: "IncludeMutationWebhook=true"},
		"an Argo CD Application outside Argo CD's namespace is <namespace>_<name> in its tracking": {
			manager: "argocd-controller", ann: map[string]string{ArgoTrackingID: "team-a_shop:apps/Deployment:shop/api"},
			want: "Argo CD (Application team-a/shop)", setting: "in Application team-a/shop:"},
		"Argo CD without tracking metadata still names the tool": {
			manager: "argocd-controller", want: "Argo CD", setting: "the Application"},
		"Flux kustomize-controller with its labels": {
			manager: "kustomize-controller", labels: map[string]string{KustomizeName: "apps", KustomizeNS: "flux-system"},
			want: "Flux kustomize-controller (Kustomization flux-system/apps)", setting: "server-side dry run"},
		"Flux helm-controller with its labels": {
			manager: "helm-controller", labels: map[string]string{HelmName: "api", HelmNS: "shop"},
			want: "Flux helm-controller (HelmRelease shop/api)", setting: "driftDetection.ignore"},
		"a tracking label written by another manager is not a GitOps write": {
			manager: "helm", labels: map[string]string{KustomizeName: "apps", ArgoInstance: "shop"}},
		"kubectl is not a GitOps writer": {manager: "kubectl-edit"},
		"no manager":                     {},
	} {
		t.Run(name, func(t *testing.T) {
			w, ok := Identify(tc.manager, tc.labels, tc.ann)
			if got := map[bool]string{true: w.String(), false: ""}[ok]; got != tc.want {
				t.Fatalf("Identify = %q (%v), want %q", got, ok, tc.want)
			}
			if ok && !strings.Contains(w.Remediation(), tc.setting) {
				t.Errorf("remediation %q lacks %q", w.Remediation(), tc.setting)
			}
			if ok && w.Manager != tc.manager {
				t.Errorf("Manager = %q, want %q", w.Manager, tc.manager)
			}
		})
	}
}
