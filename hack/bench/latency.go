package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
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
// runs pinned; then, reverts times, one of them is patched back to repo:tag
// by field manager "helm" (what `helm upgrade` does), and the time from
// that write returning to the stored spec being back on the digest is
// taken from a watch. A revert of a settled pin is superseded at once
// (C6): the re-pin does not wait for the revert's own rollout, so the
// bench also counts how often that rollout had settled before the re-pin.
//
// The controller's API requests over the series (the confirming passes
// included, as waitIdle waits for them) are given per revert, by verb and
// resource; with cpuProfile set, the process's CPU over the series is
// written there.
func measureLatency(ctx context.Context, w *world, reverts int, cpuProfile string) ([]row, error) {
	const ns = "bench-latency"
	g, tag, digest, err := w.pinnedGroup(ctx, ns, "latency", "lat", 2)
	if err != nil {
		return nil, err
	}
	b, err := w.newController([]group{g}, ctlOptions{pollInterval: 5 * time.Minute, pollJitter: 0.1, fightMaxRounds: 1 << 30})
	if err != nil {
		return nil, err
	}
	if err := b.start(ctx); err != nil {
		return nil, err
	}
	defer b.stop()
	if err := b.waitPasses(ctx, 1, time.Minute); err != nil {
		return nil, err
	}
	if err := waitIdle(ctx, w, ns, g, "@"+digest); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}

	progress("latency: %d reverts of a 2-Deployment group", reverts)
	_, before := b.api.snapshot()
	stopProfile, err := startCPUProfile(cpuProfile)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	total, guard, err := revertSeries(ctx, w, g, tag, digest, reverts, "latency")
	stopProfile()
	if err != nil {
		return nil, err
	}
	requests, writes := b.api.perEach(before, len(total))
	progress("latency: API requests per revert: %s", requests)
	progress("latency: %d reverts timed in %s", len(total), since(start))
	settledFirst := 0
	for i := range total {
		if guard[i] < total[i] {
			settledFirst++
		}
	}
	n := fmt.Sprint(len(total))
	return []row{
		{"revert → re-pin, p50 / p99", pairP(durations(total)), span(durations(total)), n,
			"revert write returned → stored spec back on the digest (watch); 2 one-replica Deployments, kwok pods, --workers 4"},
		{"  revert's own rollout settled before the re-pin", fmt.Sprintf("%d of %d", settledFirst, len(total)), "–", n,
			"C6: the re-pin supersedes the revert's rollout without waiting for it; counted from the same watch (a settled status on the bare tag seen before the re-pin)"},
		{"  API requests per revert", requests, "–", n,
			"the controller's requests by verb and resource over the series (the re-pin and the pass that confirms it settled), divided by the reverts"},
		{"  writes per revert", writes, "–", n, "create, update and patch among them"},
	}, nil
}

// startCPUProfile writes the process's CPU profile to path until the
// returned func is called; no path, no profile.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }, nil
}

func pairP(s sample) string {
	return fmtSeconds(s.quantile(0.5)) + " / " + fmtSeconds(s.quantile(0.99))
}
func span(s sample) string { return rangeOf(s.min(), s.max(), fmtSeconds) + " (min–max)" }

// pinnedGroup creates, in a new namespace, a group of n one-replica
// Deployments already pinned to a fresh image's digest, and waits until
// they settled.
func (w *world) pinnedGroup(ctx context.Context, ns, image, pfx string, n int) (g group, tag, digest string, err error) {
	if err := w.namespace(ctx, ns); err != nil {
		return g, "", "", err
	}
	digest, err = w.push(image)
	if err != nil {
		return g, "", "", err
	}
	tag = w.repo(image) + ":prod"
	g = group{name: image, ns: ns, image: image, targets: names(pfx, n)}
	var ds []*appsv1.Deployment
	for _, t := range g.targets {
		ds = append(ds, deployment(ns, t, tag+"@"+digest))
	}
	if err := w.createDeployments(ctx, ds, 4); err != nil {
		return g, "", "", err
	}
	if err := w.waitSettled(ctx, []string{ns}, nil, 2*time.Minute); err != nil {
		return g, "", "", err
	}
	return g, tag, digest, nil
}

// revertSeries reverts the group's targets in turn, n times, and returns
// for each revert the time to the re-pin (total) and to the revert's own
// rollout settling, if that came first (guard; = total otherwise).
func revertSeries(ctx context.Context, w *world, g group, tag, digest string, n int, label string) (total, guard []time.Duration, err error) {
	for i := range n {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		name := g.targets[i%len(g.targets)]
		t, s, err := revert(ctx, w, g.ns, name, tag, "@"+digest)
		if err != nil {
			return nil, nil, fmt.Errorf("revert %d of %s: %w", i+1, name, err)
		}
		total, guard = append(total, t), append(guard, s)
		if err := waitIdle(ctx, w, g.ns, g, "@"+digest); err != nil {
			return nil, nil, fmt.Errorf("after revert %d: %w", i+1, err)
		}
		if (i+1)%25 == 0 {
			progress("%s: %d/%d reverts, p50 so far %s", label, i+1, n, fmtSeconds(durations(total).median()))
		}
	}
	return total, guard, nil
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
