package testenv

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/test/support/freeport"
	"github.com/image-refresh/image-refresh/test/support/localcluster"
)

// Rollout is Argo Rollouts' Rollout as a config declares it (K2).
var Rollout = config.DeclaredKind{Group: "argoproj.io", Version: "v1alpha1", Kind: "Rollout", PodTemplate: "spec.template"}

// RolloutResource is the Rollout's resource.
var RolloutResource = schema.GroupVersionResource{Group: "argoproj.io", Version: "v1alpha1", Resource: "rollouts"}

// RolloutKindYAML is Rollout as a config's kinds: entry.
const RolloutKindYAML = "kinds:\n  - {group: argoproj.io, version: v1alpha1, kind: Rollout, podTemplate: spec.template}\n"

// CreateRollout creates a Rollout of the Spec the options build, with a
// canary strategy of two steps (half the pods, a pause of a second), as
// Argo Rollouts' own examples do.
func CreateRollout(t testing.TB, dyn dynamic.Interface, ns, name string, opts ...Option) *unstructured.Unstructured {
	t.Helper()
	spec, meta := unstructuredSpec(t, name, opts)
	spec["strategy"] = map[string]any{"canary": map[string]any{"steps": []any{
		map[string]any{"setWeight": int64(50)},
		map[string]any{"pause": map[string]any{"duration": "1s"}},
	}}}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
		"metadata": map[string]any{"name": meta.Name, "namespace": ns},
		"spec":     spec,
	}}
	out, err := dyn.Resource(RolloutResource).Namespace(ns).Create(context.Background(), u, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Rollout %s/%s: %v", ns, name, err)
	}
	return out
}

// RolloutHealthy reports whether Argo Rollouts finished the Rollout's
// current generation: status.phase Healthy and observedGeneration (a
// string) the generation.
func RolloutHealthy(u *unstructured.Unstructured) bool {
	phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
	observed, _, _ := unstructured.NestedString(u.Object, "status", "observedGeneration")
	return phase == "Healthy" && observed == fmt.Sprint(u.GetGeneration())
}

// ArgoRollouts is the real Argo Rollouts controller
// (hack/build-argo-rollouts.sh builds it from its released module, its
// servers on loopback) running against a local cluster.
type ArgoRollouts struct {
	cmd  *exec.Cmd
	logs *bytes.Buffer
	mu   *sync.Mutex
}

// Logs is what the controller wrote so far.
func (a *ArgoRollouts) Logs() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.logs.String()
}

// StartArgoRollouts applies Argo Rollouts' CRDs (server-side: the Rollout
// CRD is larger than client-side apply's annotation can hold) and starts
// its controller for the cluster of kubeconfig, without leader election;
// it waits until the controller's health endpoint answers, and stops it
// when the test ends. The controller watches every namespace: one at a
// time per cluster.
func StartArgoRollouts(t testing.TB, c *localcluster.Cluster, kubeconfig string) *ArgoRollouts {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(root, "hack", "build-argo-rollouts.sh")).Output()
	if err != nil {
		t.Fatalf("hack/build-argo-rollouts.sh: %v", err)
	}
	bin := strings.TrimSpace(string(out))
	binDir, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	crds := filepath.Join(filepath.Dir(bin), "argo-rollouts-crds")
	apply := exec.Command(filepath.Join(binDir, "kubectl"), "--kubeconfig", kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", crds)
	if out, err := apply.CombinedOutput(); err != nil {
		t.Fatalf("apply Argo Rollouts' CRDs: %v\n%s", err, out)
	}
	// Served once Established: the controller's informers and the test's
	// first Rollout need every kind.
	established := exec.Command(filepath.Join(binDir, "kubectl"), "--kubeconfig", kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", "-f", crds)
	if out, err := established.CombinedOutput(); err != nil {
		t.Fatalf("Argo Rollouts' CRDs are not Established: %v\n%s", err, out)
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := dyn.Resource(RolloutResource).Namespace("default").List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("Rollouts are not served: %v", err)
	}
	health := freeport.MustAddr(t)
	metrics := freeport.MustAddr(t)
	_, healthPort, _ := net.SplitHostPort(health)
	_, metricsPort, _ := net.SplitHostPort(metrics)
	a := &ArgoRollouts{logs: &bytes.Buffer{}, mu: &sync.Mutex{}}
	a.cmd = exec.Command(bin, "--kubeconfig", kubeconfig, "--leader-elect=false", "--healthzPort", healthPort, "--metricsPort", metricsPort, "--loglevel", "info")
	w := &lockedWriter{mu: a.mu, w: a.logs}
	a.cmd.Stdout, a.cmd.Stderr = w, w
	a.cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	if err := a.cmd.Start(); err != nil {
		t.Fatalf("start rollouts-controller: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = a.cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = a.cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = a.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("rollouts-controller logs:\n%s", a.Logs())
		}
	})
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case <-done:
			return false, fmt.Errorf("rollouts-controller exited")
		default:
		}
		resp, err := http.Get("http://127.0.0.1:" + healthPort + "/healthz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("rollouts-controller did not become healthy: %v\n%s", err, a.Logs())
	}
	return a
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
