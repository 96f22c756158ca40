package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// measureLatency: revert → re-pin. A group of two one-replica Deployments
// is pinned; then, reverts times, one of them is patched back to repo:tag
// by field manager "helm" (what `helm upgrade` does), and the time from
// that write returning to the stored spec being back on the digest is
// taken from a watch. The settled guard (R4) waits for the revert's own
// rollout first, so the figure is split into that wait and the
// controller's reaction after it.
func measureLatency(ctx context.Context, w *world, reverts int) ([]row, error) {
	const ns = "bench-latency"
	if err := w.namespace(ctx, ns); err != nil {
		return nil, err
	}
	digest, err := w.push("latency")
	if err != nil {
		return nil, err
	}
	tag := w.repo("latency") + ":prod"
	g := group{name: "latency", ns: ns, image: "latency", targets: names("lat", 2)}
	var ds []*appsv1.Deployment
	for _, n := range g.targets {
		ds = append(ds, deployment(ns, n, tag))
	}
	if err := w.createDeployments(ctx, ds, 2); err != nil {
		return nil, err
	}
	if err := w.waitSettled(ctx, []string{ns}, nil, 2*time.Minute); err != nil {
		return nil, err
	}
	b, err := w.newController([]group{g}, ctlOptions{pollInterval: 5 * time.Minute, pollJitter: 0.1, fightMaxRounds: 1 << 30})
	if err != nil {
		return nil, err
	}
	// Record (R5), then pin, as two ticks would; then start watching.
	b.pass(ctx, 4)
	// An annotation write bumps a Deployment's generation: let it settle.
	if err := w.waitSettled(ctx, []string{ns}, nil, time.Minute); err != nil {
		return nil, err
	}
	b.pass(ctx, 4)
	if err := w.waitSettled(ctx, []string{ns}, onDigest(digest), time.Minute); err != nil {
		return nil, fmt.Errorf("setup: the group was not pinned: %w", err)
	}
	if err := b.start(ctx); err != nil {
		return nil, err
	}
	defer b.stop()
	b.waitQuiet(ctx, time.Second, 30*time.Second)

	progress("latency: %d reverts of a 2-Deployment group", reverts)
	var total, guard, react []time.Duration
	start := time.Now()
	for i := range reverts {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		name := g.targets[i%len(g.targets)]
		t, s, err := revert(ctx, w, ns, name, tag, "@"+digest)
		if err != nil {
			return nil, fmt.Errorf("revert %d of %s: %w", i+1, name, err)
		}
		total, guard, react = append(total, t), append(guard, s), append(react, t-s)
		if err := waitIdle(ctx, w, ns, g, "@"+digest); err != nil {
			return nil, fmt.Errorf("after revert %d: %w", i+1, err)
		}
		if (i+1)%25 == 0 {
			progress("latency: %d/%d reverts, p50 so far %s", i+1, reverts, fmtSeconds(durations(total).median()))
		}
	}
	progress("latency: %d reverts timed in %s", len(total), since(start))

	n := fmt.Sprint(len(total))
	pair := func(s sample) string { return fmtSeconds(s.quantile(0.5)) + " / " + fmtSeconds(s.quantile(0.99)) }
	span := func(s sample) string { return rangeOf(s.min(), s.max(), fmtSeconds) + " (min–max)" }
	return []row{
		{"revert → re-pin, p50 / p99", pair(durations(total)), span(durations(total)), n,
			"revert write returned → stored spec back on the digest (watch); includes the R4 wait below"},
		{"  R4: revert's own rollout settles, p50 / p99", pair(durations(guard)), span(durations(guard)), n,
			"settled guard: image-refresh waits for the revert's rollout (kwok pods) before re-pinning"},
		{"  controller reaction, p50 / p99", pair(durations(react)), span(durations(react)), n,
			"revert's rollout settled (watch) → re-pin write stored"},
	}, nil
}

// revert patches name back to tag as "helm" and returns how long until the
// stored spec is on the digest again (total) and until the revert's own
// rollout settled (guard).
func revert(ctx context.Context, w *world, ns, name, tag, digestSuffix string) (total, guard time.Duration, err error) {
	patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":"app","image":%q}]}}}}`, tag)
	d, err := w.kube.AppsV1().Deployments(ns).Patch(ctx, name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "helm"})
	if err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	watch, err := w.kube.AppsV1().Deployments(ns).Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: d.ResourceVersion})
	if err != nil {
		return 0, 0, err
	}
	defer watch.Stop()
	for ev := range watch.ResultChan() {
		d, ok := ev.Object.(*appsv1.Deployment)
		if !ok {
			if ctx.Err() != nil {
				break
			}
			return 0, 0, fmt.Errorf("watch: %v", ev.Object)
		}
		img := d.Spec.Template.Spec.Containers[0].Image
		switch {
		case strings.HasSuffix(img, digestSuffix):
			total = time.Since(t0)
			if guard == 0 { // the re-pin came before any settled status was seen
				guard = total
			}
			return total, guard, nil
		case img == tag && guard == 0 && workload.DeploymentSettled(d).Settled:
			guard = time.Since(t0)
		}
	}
	return 0, 0, fmt.Errorf("not re-pinned within 2 minutes (%v)", ctx.Err())
}

// waitIdle waits until the group settled on the digest and the
// controller's bookkeeping is done (no attempt or skip streak left), so
// the next revert starts from a quiet group.
func waitIdle(ctx context.Context, w *world, ns string, g group, digestSuffix string) error {
	keys := state.Keys{Prefix: prefix}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		idle := true
		for i, name := range g.targets {
			d, err := w.kube.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !workload.DeploymentSettled(d).Settled || !strings.HasSuffix(d.Spec.Template.Spec.Containers[0].Image, digestSuffix) {
				idle = false
			}
			if i == 0 && (d.Annotations[keys.Attempt()] != "" || d.Annotations[keys.SkipStreak()] != "") {
				idle = false
			}
		}
		if idle {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the group did not become idle: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
