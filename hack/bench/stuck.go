package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/internal/workload"
)

const stuckGate = "lb.acme.example/target-healthy"

// measureStuck: a worker never waits for a rollout (C6). One controller
// with --workers 1 and --poll-interval 1s runs two groups: "stuck", one
// one-replica Deployment whose pods carry a readiness gate that a
// stand-in load balancer (the bench) reports healthy except for pods of
// one digest, and "other", two one-replica Deployments. The bench times
// reverts of other alone, then pushes to stuck's tag the digest whose pods
// never become healthy, waits until stuck is re-imaged to it (its rollout
// is then stuck for rolloutTimeout, 5m here), and times as many reverts
// of other again.
func measureStuck(ctx context.Context, w *world, reverts int) ([]row, error) {
	const ns = "bench-stuck"
	if err := w.namespace(ctx, ns); err != nil {
		return nil, err
	}
	first, err := w.push("stuck")
	if err != nil {
		return nil, err
	}
	stuckTag := w.repo("stuck") + ":prod"
	lb := &gateOwner{w: w, ns: ns, app: "stuck"}
	lbCtx, stopLB := context.WithCancel(ctx)
	defer stopLB()
	go lb.loop(lbCtx)
	d := deployment(ns, "stuck", stuckTag+"@"+first)
	d.Spec.MinReadySeconds = 4 // the moment kwok reports a new pod Ready cannot move the rollout on
	d.Spec.Template.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: stuckGate}}
	if _, err := w.kube.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if err := w.waitSettled(ctx, []string{ns}, nil, 2*time.Minute); err != nil {
		return nil, err
	}
	stuck := group{name: "stuck", ns: ns, image: "stuck", targets: []string{"stuck"}}
	other, tag, digest, err := w.pinnedGroup(ctx, "bench-stuck-other", "other", "oth", 2)
	if err != nil {
		return nil, err
	}
	b, err := w.newController([]group{stuck, other}, ctlOptions{pollInterval: time.Second, pollJitter: 0, workers: 1, fightMaxRounds: 1 << 30})
	if err != nil {
		return nil, err
	}
	if err := b.start(ctx); err != nil {
		return nil, err
	}
	defer b.stop()
	if err := b.waitPasses(ctx, 2, time.Minute); err != nil {
		return nil, err
	}
	if err := waitIdle(ctx, w, ns, stuck, "@"+first); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	if err := waitIdle(ctx, w, other.ns, other, "@"+digest); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}

	progress("stuck: %d reverts of other, alone", reverts)
	alone, _, err := revertSeries(ctx, w, other, tag, digest, reverts, "stuck (alone)")
	if err != nil {
		return nil, err
	}

	next, err := w.push("stuck")
	if err != nil {
		return nil, err
	}
	lb.fail(next)
	deadline := time.Now().Add(time.Minute)
	for {
		d, err := w.kube.AppsV1().Deployments(ns).Get(ctx, "stuck", metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		if strings.HasSuffix(d.Spec.Template.Spec.Containers[0].Image, "@"+next) {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("stuck not re-imaged to the new digest within a minute")
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(5 * time.Second) // past minReadySeconds: the rollout is stuck, not young
	passes0 := b.ctl.Passes()
	t0 := time.Now()
	progress("stuck: %d reverts of other while stuck's rollout is stuck", reverts)
	withStuck, _, err := revertSeries(ctx, w, other, tag, digest, reverts, "stuck (with a stuck group)")
	if err != nil {
		return nil, err
	}
	passes := b.ctl.Passes() - passes0
	took := time.Since(t0)
	d, err = w.kube.AppsV1().Deployments(ns).Get(ctx, "stuck", metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	still := workload.DeploymentSettled(d)
	if still.Settled {
		return nil, fmt.Errorf("stuck's rollout settled during the measurement: it was not stuck")
	}
	n := fmt.Sprint(reverts)
	return []row{
		{"revert → re-pin alone, p50 / p99 (--workers 1)", pairP(durations(alone)), span(durations(alone)), n,
			"group other (2 one-replica Deployments) next to group stuck settled; --poll-interval 1s, jitter 0"},
		{"revert → re-pin with another group stuck rolling, p50 / p99 (--workers 1)", pairP(durations(withStuck)), span(durations(withStuck)), n,
			fmt.Sprintf("same, while group stuck's re-pin rollout never becomes available (readiness gate false; still %q at the end); %d passes in %s", still.Reason, passes, took.Round(time.Second))},
	}, nil
}

// gateOwner is a stand-in load balancer: it sets the readiness gate of
// the app's pods true, except on pods of one digest, whose gate it leaves
// unset (false, had it set it true before). The node keeps a pod Ready
// only while its gates are true (the harness's pod stages).
type gateOwner struct {
	w       *world
	ns, app string
	mu      sync.Mutex
	bad     string
}

func (g *gateOwner) fail(digest string) {
	g.mu.Lock()
	g.bad = digest
	g.mu.Unlock()
}

func (g *gateOwner) loop(ctx context.Context) {
	pods := g.w.kube.CoreV1().Pods(g.ns)
	for ctx.Err() == nil {
		g.mu.Lock()
		bad := g.bad
		g.mu.Unlock()
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "app=" + g.app})
		for i := 0; err == nil && i < len(list.Items); i++ {
			p := &list.Items[i]
			if p.DeletionTimestamp != nil {
				continue
			}
			want, reason := corev1.ConditionTrue, "TargetHealthy"
			if bad != "" && strings.HasSuffix(p.Spec.Containers[0].Image, "@"+bad) {
				want, reason = corev1.ConditionFalse, "TargetUnhealthy"
			}
			if has := podCondition(p, stuckGate); has == want || (want == corev1.ConditionFalse && has != corev1.ConditionTrue) {
				continue
			}
			patch := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":%q,"reason":%q,"lastTransitionTime":%q}]}}`,
				stuckGate, want, reason, time.Now().UTC().Format(time.RFC3339))
			_, _ = pods.Patch(ctx, p.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "lb-controller"}, "status")
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func podCondition(p *corev1.Pod, t corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return corev1.ConditionUnknown
}
