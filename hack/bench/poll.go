package main

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
)

// fleet is a namespace of Deployments already pinned to their image's
// digest: one group per size, each group running its own repo:tag.
type fleet struct {
	ns     string
	groups map[int]group
}

var fleetSizes = []int{1, 20, 200}

// setupFleet creates, once, groups of 1, 20 and 200 targets (plus their
// anchor, which is the first target) running repo:tag@digest.
func (w *world) setupFleet(ctx context.Context) (*fleet, error) {
	if w.fleet != nil {
		return w.fleet, nil
	}
	f := &fleet{ns: "bench-poll", groups: map[int]group{}}
	if err := w.namespace(ctx, f.ns); err != nil {
		return nil, err
	}
	var ds []*appsv1.Deployment
	for _, n := range fleetSizes {
		image := fmt.Sprintf("poll%d", n)
		digest, err := w.push(image)
		if err != nil {
			return nil, err
		}
		g := group{name: image, ns: f.ns, image: image, targets: names(fmt.Sprintf("p%d", n), n)}
		for _, t := range g.targets {
			ds = append(ds, deployment(f.ns, t, w.repo(image)+":prod@"+digest))
		}
		f.groups[n] = g
	}
	start := time.Now()
	if err := w.createDeployments(ctx, ds, 8); err != nil {
		return nil, err
	}
	if err := w.waitSettled(ctx, []string{f.ns}, nil, 5*time.Minute); err != nil {
		return nil, err
	}
	progress("fleet: %d pinned Deployments settled in %s", len(ds), since(start))
	w.fleet = f
	return f, nil
}

// measureRegistry: registry requests per poll interval for 1, 20 and 200
// targets of one repo:tag (C2: one manifest HEAD per interval however many
// targets use it), counted by the registry itself over several intervals.
func measureRegistry(ctx context.Context, w *world, interval time.Duration, intervals int) ([]row, error) {
	f, err := w.setupFleet(ctx)
	if err != nil {
		return nil, err
	}
	var rows []row
	for _, n := range fleetSizes {
		g := f.groups[n]
		b, err := w.newController([]group{g}, ctlOptions{pollInterval: interval, pollJitter: 0})
		if err != nil {
			return nil, err
		}
		if err := b.start(ctx); err != nil {
			return nil, err
		}
		time.Sleep(2 * interval) // first pass and first polls
		path := "/acme/" + g.image + "/manifests/prod"
		var heads, reads sample
		lastHeads := w.reg.Count("HEAD", path)
		lastAPI, _ := b.api.snapshot()
		for range intervals {
			select {
			case <-ctx.Done():
				b.stop()
				return nil, ctx.Err()
			case <-time.After(interval):
			}
			h := w.reg.Count("HEAD", path)
			a, _ := b.api.snapshot()
			heads = append(heads, float64(h-lastHeads))
			reads = append(reads, float64(a.sub(lastAPI).Reads))
			lastHeads, lastAPI = h, a
		}
		b.stop()
		total := 0.0
		for _, h := range heads {
			total += h
		}
		progress("registry: %d targets: %v HEADs in %d intervals", n, heads, intervals)
		rows = append(rows, row{
			Figure: fmt.Sprintf("registry HEADs per poll interval, %d target(s)", n),
			Value:  fmtNum(heads.median()),
			Spread: rangeOf(heads.min(), heads.max(), fmtNum) + " (min–max)",
			N:      fmt.Sprintf("%d intervals", intervals),
			Note: fmt.Sprintf("one repo:tag, --poll-interval %s, jitter 0; mean %.2f/interval (one HEAD every %s); API reads per interval: median %s (%s)",
				interval, total/float64(intervals), effective(interval, intervals, total), fmtNum(reads.median()), rangeOf(reads.min(), reads.max(), fmtNum)),
		})
	}
	return rows, nil
}

// effective is the observed time between two HEADs.
func effective(interval time.Duration, intervals int, heads float64) string {
	if heads == 0 {
		return "never"
	}
	return (time.Duration(float64(interval) * float64(intervals) / heads)).Round(100 * time.Millisecond).String()
}
