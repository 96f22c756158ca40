package workload_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

func TestWaitSettled_R4_SettledAfterARollout(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithContainer("app", appTag))
	ref := workload.Ref{Kind: "Deployment", Namespace: ns, Name: "api"}
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
	_, err := wc.WaitSettled(context.Background(), workload.Ref{Kind: "DaemonSet", Namespace: ns, Name: "gone"}, time.Minute)
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
	ref := workload.Ref{Kind: "DaemonSet", Namespace: ns, Name: "agent"}
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
