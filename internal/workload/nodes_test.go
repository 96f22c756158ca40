package workload_test

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/metadata"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// V3: the nodes a workload's pods can run on are those whose labels match
// its pod template's nodeSelector and required node affinity; the nodes
// are read as metadata, with one LIST (tick) or from a metadata-only
// informer (run).
func TestRunsOn_V3_TheTemplatesNodeSelectorAndRequiredAffinityPickTheNodes(t *testing.T) {
	c := testenv.Cluster(t)
	ns := testenv.Namespace(t, c.Client)
	ctx := context.Background()
	arm := "v3-arm64-" + ns[len(ns)-6:]
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: arm, Labels: map[string]string{
		"kubernetes.io/hostname": arm, "kubernetes.io/os": "linux", "kubernetes.io/arch": "arm64"}},
		Spec: corev1.NodeSpec{Unschedulable: true}}
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Client.CoreV1().Nodes().Delete(context.Background(), arm, metav1.DeleteOptions{}) })

	selector := func(kv map[string]string) testenv.Option { return func(s *testenv.Spec) { s.NodeSelector = kv } }
	testenv.Deployment(t, c.Client, ns, "anywhere", testenv.WithReplicas(0))
	testenv.Deployment(t, c.Client, ns, "arm", testenv.WithReplicas(0), selector(map[string]string{"kubernetes.io/arch": "arm64"}))
	testenv.Deployment(t, c.Client, ns, "amd", testenv.WithReplicas(0))
	affinity := `{"spec":{"template":{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"kubernetes.io/arch","operator":"In","values":["amd64"]}]}]}}}}}}}`
	if _, err := c.Client.AppsV1().Deployments(ns).Patch(ctx, "amd", types.StrategicMergePatchType, []byte(affinity), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	md, err := metadata.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	fromAPI, err := workload.NodesFromAPI(md, time.Minute).Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inf, err := cache.New(c.Config, cache.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = inf.Start(cctx) }()
	if !inf.WaitForCacheSync(cctx) {
		t.Fatal("the cache did not start")
	}
	fromCache, err := workload.NodesFromCache(inf, time.Minute).Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	names := func(ns []workload.Node) []string {
		var out []string
		for _, n := range ns {
			out = append(out, n.Name)
		}
		return out
	}
	if !slices.Contains(names(fromAPI), arm) || !slices.Contains(names(fromAPI), c.NodeNames[0]) {
		t.Fatalf("nodes from the API %v, want %s and %s among them", names(fromAPI), arm, c.NodeNames[0])
	}
	if !slices.Equal(names(fromAPI), names(fromCache)) {
		t.Errorf("nodes from the cache %v, from the API %v: want the same", names(fromCache), names(fromAPI))
	}

	kube, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	wc := workload.New(kube, time.Minute)
	for _, tc := range []struct {
		deploy string
		arm64  bool // runs on the arm64 node
		amd64  bool // runs on the local cluster's amd64 nodes
	}{
		{"anywhere", true, true},
		{"arm", true, false},
		{"amd", false, true},
	} {
		obj, err := wc.Get(ctx, config.Workload{Kind: workload.KindDeployment, Namespace: ns, Name: tc.deploy})
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range fromAPI {
			os, arch, ok := n.Platform()
			if !ok || os != "linux" {
				t.Errorf("node %s: platform %q/%q (%v), want linux and its architecture", n.Name, os, arch, ok)
				continue
			}
			want := map[string]bool{"arm64": tc.arm64, "amd64": tc.amd64}[arch]
			if got := obj.RunsOn(n); got != want {
				t.Errorf("%s runs on %s (%s): %v, want %v", tc.deploy, n.Name, arch, got, want)
			}
		}
	}
}
