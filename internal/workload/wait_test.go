package workload_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/localcluster"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

func TestWaitSettled_R4_SettledAfterARollout(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithContainer("app", appTag))
	ref := config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"}
	settle(t, c, ref)
	if _, err := wc.SetImages(context.Background(), mustGet(t, wc, ref), []workload.ImageChange{{Container: "app", From: appTag, To: "registry.test/acme/app@" + digestA}}); err != nil {
		t.Fatal(err)
	}
	s, err := wc.WaitSettled(context.Background(), ref, 90*time.Second)
	if err != nil || !s.Settled {
		t.Fatalf("WaitSettled = %+v, %v", s, err)
	}
	obj := mustGet(t, wc, ref)
	if !obj.Settled.Settled || obj.Generation != 2 {
		t.Errorf("after the wait: generation %d, settled %+v", obj.Generation, obj.Settled)
	}
}

func TestWaitSettled_R4_MissingWorkloadFailsAtOnce(t *testing.T) {
	t.Parallel()
	_, wc, ns := setup(t)
	start := time.Now()
	_, err := wc.WaitSettled(context.Background(), config.Workload{Kind: "DaemonSet", Namespace: ns, Name: "gone"}, time.Minute)
	if !apierrors.IsNotFound(err) {
		t.Errorf("error %v, want NotFound", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("took %s: a missing workload is not a rollout to wait for", time.Since(start))
	}
}

// Not parallel: node-3 down would stall every other test's rollouts. The
// parallel tests run after it, once node-3 is back.
func TestWaitSettled_R14_GivesUpWithAReasonWhileANodeIsDown(t *testing.T) {
	c, wc, ns := setup(t)
	ctx := context.Background()
	testenv.DaemonSet(t, c.Client, ns, "agent", testenv.WithTolerateAll(), testenv.WithContainer("app", appTag))
	ref := config.Workload{Kind: "DaemonSet", Namespace: ns, Name: "agent"}
	settle(t, c, ref)
	t.Cleanup(func() {
		if err := c.NodeUp(context.Background(), "node-3"); err != nil {
			t.Errorf("node-3 up: %v", err)
		}
	})
	if err := c.NodeDown(ctx, "node-3"); err != nil {
		t.Fatal(err)
	}
	if _, err := wc.SetImages(ctx, mustGet(t, wc, ref), []workload.ImageChange{{Container: "app", From: appTag, To: "registry.test/acme/app@" + digestA}}); err != nil {
		t.Fatal(err)
	}

	const timeout = 5 * time.Second
	start := time.Now()
	s, err := wc.WaitSettled(ctx, ref, timeout)
	took := time.Since(start)
	if s.Settled || err == nil {
		t.Fatalf("settled with node-3 NotReady: %+v, %v", s, err)
	}
	if !errors.Is(err, context.DeadlineExceeded) || s.Reason == "" || !strings.Contains(err.Error(), s.Reason) {
		t.Errorf("error %v, reason %q: want a deadline error that carries the reason", err, s.Reason)
	}
	if took < timeout || took > timeout+2*time.Second {
		t.Errorf("gave up after %s, want about %s", took, timeout)
	}
	t.Logf("not settled, as expected: %v", err)
}

// V2 on R4's wait: WaitRollout ends at the first container of the new
// template that cannot run, long before its timeout, and returns that pod
// with the kubelet's reason. The new pod is never Ready (a readiness gate
// nobody sets), so only the failure can end the wait.
func TestWaitRollout_V2_R4_EndsAtTheFirstContainerThatCannotRun(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	ctx := context.Background()
	const gate = "lb.acme.example/healthy"
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithContainer("app", appTag), testenv.WithReplicas(1), testenv.WithReadinessGate(gate))
	ref := config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"}
	pods := c.Client.CoreV1().Pods(ns)
	setStatus := func(name, patch string) {
		t.Helper()
		if _, err := pods.Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
	}
	first := waitForPod(t, c, ns, "api", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	setStatus(first.Name, `{"status":{"conditions":[{"type":"`+gate+`","status":"True"}]}}`)
	settle(t, c, ref)

	bad := "registry.test/acme/app@" + digestB
	if _, err := wc.SetImages(ctx, mustGet(t, wc, ref), []workload.ImageChange{{Container: "app", From: appTag, To: bad}}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		st      workload.Settledness
		failing []workload.Pod
		err     error
	}
	done := make(chan result, 1)
	go func() {
		st, failing, err := wc.WaitRollout(ctx, ref, 5*time.Minute)
		done <- result{st, failing, err}
	}()
	next := waitForPod(t, c, ns, "api", func(p *corev1.Pod) bool {
		return p.Spec.Containers[0].Image == bad && p.Status.Phase == corev1.PodRunning
	})
	select {
	case r := <-done:
		t.Fatalf("the wait ended before the new pod failed: %+v, %v", r.st, r.err)
	default:
	}
	setStatus(next.Name, `{"status":{"containerStatuses":[{"name":"app","ready":false,"state":{"running":null,"waiting":{"reason":"ImagePullBackOff","message":"Back-off pulling image"}}}]}}`)

	r := <-done
	if !errors.Is(r.err, workload.ErrRolloutFailed) || errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("WaitRollout = %+v, %v; want ErrRolloutFailed before its timeout", r.st, r.err)
	}
	if r.st.Settled || len(r.failing) != 1 || r.failing[0].Name != next.Name || r.failing[0].Failing["app"] != "ImagePullBackOff: Back-off pulling image" {
		t.Errorf("failing pods %+v (settled %v), want %s with container app in ImagePullBackOff", r.failing, r.st.Settled, next.Name)
	}
}

// waitForPod watches the pods of app until one satisfies cond.
func waitForPod(t *testing.T, c *localcluster.Cluster, ns, app string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pods := c.Client.CoreV1().Pods(ns)
	lw := &cache.ListWatch{
		ListFunc: func(o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = "app=" + app
			return pods.List(ctx, o)
		},
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = "app=" + app
			return pods.Watch(ctx, o)
		},
	}
	var found *corev1.Pod
	if _, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Deleted && cond(p) {
			found = p
			return true, nil
		}
		return false, nil
	}); err != nil {
		t.Fatalf("wait for a pod of %s: %v", app, err)
	}
	return found
}
