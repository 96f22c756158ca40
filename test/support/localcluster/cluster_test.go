package localcluster_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/image-refresh/image-refresh/test/support/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

const digestA = "sha256:1111111111111111111111111111111111111111111111111111111111111111"

// setImage patches the pod template's container image the way a re-pin
// does, and returns the new generation.
func setImage(t *testing.T, client kubernetes.Interface, kind, ns, name, container, image string) {
	t.Helper()
	patch := []byte(fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":%q,"image":%q}]}}}}`, container, image))
	var err error
	ctx := context.Background()
	switch kind {
	case "Deployment":
		_, err = client.AppsV1().Deployments(ns).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	case "DaemonSet":
		_, err = client.AppsV1().DaemonSets(ns).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	}
	if err != nil {
		t.Fatalf("patch %s %s/%s: %v", kind, ns, name, err)
	}
}

func TestCluster_ServesVersionAndNodes(t *testing.T) {
	c := testenv.Cluster(t)
	v, err := c.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != "v1.37.2" {
		t.Errorf("apiserver reports version %q, want v1.37.2 (ldflags stamp missing?)", v.GitVersion)
	}
	nodes, err := c.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != 3 {
		t.Errorf("cluster has %d nodes, want 3", len(nodes.Items))
	}
}

func TestCluster_AddNodeJoinsTheDaemonSet(t *testing.T) {
	c := testenv.Cluster(t)
	ctx := context.Background()
	ns := testenv.Namespace(t, c.Client)
	testenv.DaemonSet(t, c.Client, ns, "agent", testenv.WithTolerateAll())
	// A name no earlier run of this test used (-count=N): the cluster
	// keeps the names of the nodes it was given.
	node := fmt.Sprintf("node-%d", len(c.NodeNames)+1)
	if err := c.AddNode(ctx, node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.StopNodeAgent(node)
		_ = c.Client.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{})
	})
	if err := testenv.WaitSettled(ctx, c.Client, "DaemonSet", ns, "agent", 60*time.Second); err != nil {
		t.Fatal(err)
	}
	ds, err := c.Client.AppsV1().DaemonSets(ns).Get(ctx, "agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ds.Status.NumberAvailable != 4 {
		t.Errorf("DaemonSet runs %d pods with %s added, want 4", ds.Status.NumberAvailable, node)
	}
}

func TestCluster_RollsOutAfterImageChangeToDigest(t *testing.T) {
	c := testenv.Cluster(t)
	cases := []struct {
		name string
		kind string
		make func(ns string)
	}{
		{"a RollingUpdate Deployment", "Deployment", func(ns string) {
			testenv.Deployment(t, c.Client, ns, "web", testenv.WithContainer("app", "registry.test/acme/app:prod"))
		}},
		{"a Recreate Deployment", "Deployment", func(ns string) {
			testenv.Deployment(t, c.Client, ns, "web", testenv.WithRecreate(), testenv.WithContainer("app", "registry.test/acme/app:prod"))
		}},
		{"a DaemonSet on three nodes", "DaemonSet", func(ns string) {
			testenv.DaemonSet(t, c.Client, ns, "web", testenv.WithTolerateAll(), testenv.WithContainer("app", "registry.test/acme/app:prod"))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			ns := testenv.Namespace(t, c.Client)
			tc.make(ns)
			if err := testenv.WaitSettled(ctx, c.Client, tc.kind, ns, "web", 60*time.Second); err != nil {
				t.Fatalf("initial rollout: %v", err)
			}
			start := time.Now()
			setImage(t, c.Client, tc.kind, ns, "web", "app", "registry.test/acme/app@"+digestA)
			// Right after the write the controller has not caught up: the
			// rollout must not look settled before it actually ran.
			if err := testenv.WaitSettled(ctx, c.Client, tc.kind, ns, "web", 60*time.Second); err != nil {
				t.Fatalf("rollout to digest: %v", err)
			}
			t.Logf("rollout settled in %s", time.Since(start).Round(time.Millisecond))
			pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
			if err != nil {
				t.Fatal(err)
			}
			running := 0
			for _, p := range pods.Items {
				if p.DeletionTimestamp != nil {
					continue
				}
				running++
				if got := p.Spec.Containers[0].Image; got != "registry.test/acme/app@"+digestA {
					t.Errorf("pod %s runs %s after the rollout, want the digest", p.Name, got)
				}
			}
			if running == 0 {
				t.Errorf("no pods after the rollout")
			}
		})
	}
}

func TestCluster_DaemonSetRolloutWaitsForNotReadyNode(t *testing.T) {
	c := testenv.Cluster(t)
	ctx := context.Background()
	ns := testenv.Namespace(t, c.Client)
	testenv.DaemonSet(t, c.Client, ns, "agent", testenv.WithTolerateAll(), testenv.WithContainer("app", "registry.test/acme/agent:prod"))
	if err := testenv.WaitSettled(ctx, c.Client, "DaemonSet", ns, "agent", 60*time.Second); err != nil {
		t.Fatalf("initial rollout: %v", err)
	}
	start := time.Now()
	if err := c.NodeDown(ctx, "node-3"); err != nil {
		t.Fatal(err)
	}
	t.Logf("node-3 NotReady after %s", time.Since(start).Round(time.Second))
	t.Cleanup(func() { _ = c.NodeUp(context.Background(), "node-3") })

	setImage(t, c.Client, "DaemonSet", ns, "agent", "app", "registry.test/acme/agent@"+digestA)
	err := testenv.WaitSettled(ctx, c.Client, "DaemonSet", ns, "agent", 15*time.Second)
	if err == nil {
		t.Fatal("DaemonSet rollout settled while node-3 is NotReady; the harness does not model a dead node")
	}
	t.Logf("as expected, not settled with node-3 down: %v", err)

	if err := c.NodeUp(ctx, "node-3"); err != nil {
		t.Fatal(err)
	}
	if err := testenv.WaitSettled(ctx, c.Client, "DaemonSet", ns, "agent", 90*time.Second); err != nil {
		t.Fatalf("rollout after node-3 is back: %v", err)
	}
}
