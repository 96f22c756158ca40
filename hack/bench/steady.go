package main

import (
	"context"
	"fmt"
	"time"
)

// measureSteady: API requests per minute while nothing changes, for the
// 20-target group of the fleet (20 one-replica Deployments, all pinned).
// The 1,000-workload figure is taken by the scale phase on its workloads.
func measureSteady(ctx context.Context, w *world, interval, duration time.Duration) ([]row, error) {
	f, err := w.setupFleet(ctx)
	if err != nil {
		return nil, err
	}
	g := f.groups[20]
	return steadyOn(ctx, w, []group{g}, fmt.Sprintf("1 group of %d one-replica Deployments", len(g.targets)), interval, duration)
}

// steadyOn runs a controller over groups (all pinned) with a realistic
// poll interval, so that resyncs and polls happen, and counts every API
// request it sends by verb, in windows of one interval, after its first
// passes. Goal: 0 of every verb.
func steadyOn(ctx context.Context, w *world, groups []group, what string, interval, duration time.Duration) ([]row, error) {
	workloads := 0
	for _, g := range groups {
		workloads += len(g.targets)
	}
	b, err := w.newController(groups, ctlOptions{pollInterval: interval, pollJitter: 0.1})
	if err != nil {
		return nil, err
	}
	if err := b.start(ctx); err != nil {
		return nil, err
	}
	defer b.stop()
	// The first pass of every group (it records the anchors' digests, R5).
	if err := b.waitPasses(ctx, int64(len(groups)), 3*time.Minute); err != nil {
		return nil, err
	}
	b.waitQuiet(ctx, 2*time.Second, time.Minute)
	r, err := countSteady(ctx, b, workloads, what, interval, duration)
	if err != nil {
		return nil, err
	}
	return []row{r}, nil
}

// countSteady counts the API requests of a running controller over
// workloads, past its first passes, in windows of one poll interval, for
// duration, and returns the row of their rate per minute.
func countSteady(ctx context.Context, b *bench, workloads int, what string, interval, duration time.Duration) (row, error) {
	progress("steady: %d workloads: counting API requests for %s (poll interval %s)", workloads, duration, interval)

	windows := int(duration / interval)
	perMinute := float64(time.Minute) / float64(interval)
	var rate sample
	passes0 := b.ctl.Passes()
	_, before := b.api.snapshot()
	last := before
	for range windows {
		select {
		case <-ctx.Done():
			return row{}, ctx.Err()
		case <-time.After(interval):
		}
		n := 0
		for _, c := range b.api.byVerb(last) {
			n += c
		}
		rate = append(rate, float64(n)*perMinute)
		_, last = b.api.snapshot()
	}
	minutes := float64(windows) * interval.Minutes()
	all := b.api.byVerb(before)
	passes := b.ctl.Passes() - passes0
	which := b.api.requestsSince(before)
	r := row{
		Figure: fmt.Sprintf("API requests/min, steady state, %d workloads", workloads),
		Value:  fmtNum(rate.median()),
		Spread: rangeOf(rate.min(), rate.max(), fmtNum) + " (per-window rate, min–max)",
		N:      fmt.Sprintf("%d windows", windows),
		Note: fmt.Sprintf("by verb, per min: %s; requests seen: %s; %s, --poll-interval %s, jitter 0.1; %d passes (resyncs, polls) in the %.1f min counted in %s windows; goal 0",
			fmtVerbs(all, minutes), which, what, interval, passes, minutes, interval),
	}
	progress("steady: %s: %s (%s); %s", r.Figure, r.Value, r.Spread, r.Note)
	return r, nil
}
