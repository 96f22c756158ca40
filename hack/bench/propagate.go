package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// measurePropagate: a new digest → every target of its repo:tag changed.
// Two groups, of 20 and of 100 one-replica Deployments (kwok pods), each
// in its own namespace with its own repo:tag, run pinned under one
// controller with --poll-interval 1s --poll-jitter 0. pushes times per
// group, the bench pushes a new image to the tag and takes from a watch
// the moment the last target's stored spec is on the new digest. That is
// timed (a) from the moment the poller reported the change (its OnChange,
// wrapped) and (b) from the push returning. maxDigestChanges is lifted,
// as pushing 5 digests an hour is what it guards against. Between pushes the group's
// rollouts settle and the controller confirms them.
func measurePropagate(ctx context.Context, w *world, pushes int) ([]row, error) {
	sizes := []int{20, 100}
	var gs []group
	digests := map[string]string{}
	for _, n := range sizes {
		g, _, d, err := w.pinnedGroup(ctx, fmt.Sprintf("bench-push-%d", n), fmt.Sprintf("push%d", n), fmt.Sprintf("t%d", n), n)
		if err != nil {
			return nil, err
		}
		gs, digests[g.name] = append(gs, g), d
	}
	// The flap guard (maxDigestChanges, default 3 an hour) would rightly
	// hold the tag after the third push: lift it for this run.
	b, err := w.startIdle(ctx, gs, ctlOptions{pollInterval: time.Second, pollJitter: 0, config: "maxDigestChanges: 1000\n"},
		func(g group) string { return digests[g.name] })
	if err != nil {
		return nil, err
	}
	defer b.stop()
	var rows []row
	for _, g := range gs {
		var fromPoll, fromPush, pollLag sample
		for i := range pushes {
			list, err := w.kube.AppsV1().Deployments(g.ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, err
			}
			digest, err := w.push(g.image)
			if err != nil {
				return nil, err
			}
			pushed := time.Now()
			all, err := waitAllOn(ctx, w, g, list, "@"+digest)
			if err != nil {
				return nil, fmt.Errorf("push %d to %s: %w", i+1, g.image, err)
			}
			seen := b.changedAt(w.repo(g.image) + ":prod")
			if seen.Before(pushed) {
				return nil, fmt.Errorf("push %d to %s: the poller reported no change after the push", i+1, g.image)
			}
			fromPoll = append(fromPoll, all.Sub(seen).Seconds())
			fromPush = append(fromPush, all.Sub(pushed).Seconds())
			pollLag = append(pollLag, seen.Sub(pushed).Seconds())
			progress("propagate: %d targets: push %d: poll saw it %s after the push, all changed %s after that",
				len(g.targets), i+1, fmtSeconds(seen.Sub(pushed).Seconds()), fmtSeconds(all.Sub(seen).Seconds()))
			if err := w.waitSettled(ctx, []string{g.ns}, onDigest(digest), 5*time.Minute); err != nil {
				return nil, err
			}
			if err := waitIdle(ctx, w, g.ns, g, "@"+digest); err != nil {
				return nil, err
			}
		}
		n := len(g.targets)
		sp := func(s sample) string { return rangeOf(s.min(), s.max(), fmtSeconds) + " (min–max)" }
		goal := map[int]string{20: "goal < 200 ms", 100: "goal < 1 s"}[n]
		rows = append(rows,
			row{fmt.Sprintf("new digest → all %d targets changed, from the poll", n), fmtSeconds(fromPoll.median()), sp(fromPoll), fmt.Sprint(len(fromPoll)),
				fmt.Sprintf("poller's OnChange for the repo:tag → last target's stored spec on the new digest (watch); %d one-replica Deployments, one group, --workers 4; %s", n, goal)},
			row{fmt.Sprintf("new digest → all %d targets changed, from the push", n), fmtSeconds(fromPush.median()), sp(fromPush), fmt.Sprint(len(fromPush)),
				fmt.Sprintf("push returned → same end; --poll-interval 1s, jitter 0: the poll came %s after the push (median; %s)", fmtSeconds(pollLag.median()), rangeOf(pollLag.min(), pollLag.max(), fmtSeconds))},
		)
	}
	return rows, nil
}

// waitAllOn watches g's namespace from list's resourceVersion and returns
// the moment every target's stored spec runs an image ending in suffix.
func waitAllOn(ctx context.Context, w *world, g group, list *appsv1.DeploymentList, suffix string) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	image := map[string]string{}
	for i := range list.Items {
		image[list.Items[i].Name] = list.Items[i].Spec.Template.Spec.Containers[0].Image
	}
	done := func() bool {
		for _, t := range g.targets {
			if !strings.HasSuffix(image[t], suffix) {
				return false
			}
		}
		return true
	}
	watch, err := w.kube.AppsV1().Deployments(g.ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		return time.Time{}, err
	}
	defer watch.Stop()
	for ev := range watch.ResultChan() {
		d, ok := ev.Object.(*appsv1.Deployment)
		if !ok {
			if ctx.Err() != nil {
				break
			}
			return time.Time{}, fmt.Errorf("watch: %v", ev.Object)
		}
		image[d.Name] = d.Spec.Template.Spec.Containers[0].Image
		if done() {
			return time.Now(), nil
		}
	}
	changed := 0
	for _, t := range g.targets {
		if strings.HasSuffix(image[t], suffix) {
			changed++
		}
	}
	return time.Time{}, fmt.Errorf("%d of %d targets changed within 2 minutes (%v)", changed, len(g.targets), ctx.Err())
}
