package e2e

import (
	"context"
	"encoding/json"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// DiscoveryEnv is an env whose annotation prefix, and so whose discovery
// label, is its own: the ticks and controllers of other tests (which use
// the default prefix cluster-wide) never see its labelled objects.
func DiscoveryEnv(t *testing.T) *Env {
	e := New(t)
	e.Prefix = e.NS + ".test"
	return e
}

// Label sets (value) or removes (nil) labels on a workload, as
// `kubectl label` does.
func (e *Env) Label(kind, name string, kv map[string]*string) {
	e.T.Helper()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": kv}})
	if err != nil {
		e.T.Fatal(err)
	}
	ctx := context.Background()
	switch kind {
	case "Deployment":
		_, err = e.C.Client.AppsV1().Deployments(e.NS).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	case "StatefulSet":
		_, err = e.C.Client.AppsV1().StatefulSets(e.NS).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	case "DaemonSet":
		_, err = e.C.Client.AppsV1().DaemonSets(e.NS).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	case "CronJob":
		_, err = e.C.Client.BatchV1().CronJobs(e.NS).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	case "Namespace":
		_, err = e.C.Client.CoreV1().Namespaces().Patch(ctx, e.NS, types.MergePatchType, patch, metav1.PatchOptions{})
	default:
		e.T.Fatalf("label: unknown kind %s", kind)
	}
	if err != nil {
		e.T.Fatalf("label %s %s: %v", kind, name, err)
	}
}

// Enable labels a workload (or, for kind Namespace, the env's namespace)
// <prefix>/enabled=true, for discovery (D1).
func (e *Env) Enable(kind, name string) {
	e.Label(kind, name, map[string]*string{e.Key("enabled"): Ptr("true")})
}

// DiscoveryTick runs a tick on the settings-only config, scoped to the
// env's namespace.
func (e *Env) DiscoveryTick(cfg string) (int, string) {
	e.T.Helper()
	return e.Tick(cfg, "--watch-namespaces", e.NS)
}
