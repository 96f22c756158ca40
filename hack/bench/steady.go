package main

import (
	"context"
	"fmt"
	"time"
)

// measureSteady: API requests per minute while nothing changes. A
// controller watches the 20-target group of the fleet (20 Deployments,
// all pinned) with a realistic poll interval, so that resyncs
// and polls happen; reads, watches and writes are counted by its own
// transport in windows of one interval.
func measureSteady(ctx context.Context, w *world, interval, duration time.Duration) ([]row, error) {
	f, err := w.setupFleet(ctx)
	if err != nil {
		return nil, err
	}
	g := f.groups[20]
	b, err := w.newController([]group{g}, ctlOptions{pollInterval: interval, pollJitter: 0.1})
	if err != nil {
		return nil, err
	}
	if err := b.start(ctx); err != nil {
		return nil, err
	}
	defer b.stop()
	b.waitQuiet(ctx, time.Second, time.Minute) // the first pass (records, if not yet)
	progress("steady: counting API requests for %s (poll interval %s)", duration, interval)

	windows := int(duration / interval)
	perMinute := float64(time.Minute) / float64(interval)
	var reads, watches, writes sample
	first, before := b.api.snapshot()
	last := first
	for range windows {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(interval):
		}
		now, _ := b.api.snapshot()
		d := now.sub(last)
		reads = append(reads, float64(d.Reads)*perMinute)
		watches = append(watches, float64(d.Watches)*perMinute)
		writes = append(writes, float64(d.Writes)*perMinute)
		last = now
	}
	all := last.sub(first)
	minutes := float64(windows) * interval.Minutes()
	which := b.api.writesSince(before)
	if which == "" {
		which = "none"
	}
	perWorkload := float64(all.Reads) / float64(len(g.targets)) / (minutes * perMinute)
	note := fmt.Sprintf("1 group of %d Deployments (the anchor is one of them), --poll-interval %s, jitter 0.1; %.1f reads per Deployment per interval; %.1f min counted in %s windows",
		len(g.targets), interval, perWorkload, minutes, interval)
	spread := func(s sample) string { return rangeOf(s.min(), s.max(), fmtNum) + " (per-window rate, min–max)" }
	mean := func(n int) string { return fmt.Sprintf("mean %s/min", fmtNum(float64(n)/minutes)) }
	nw := fmt.Sprintf("%d windows", windows)
	return []row{
		{"API reads/min, steady state (get+list)", fmtNum(reads.median()), spread(reads), nw, mean(all.Reads) + "; " + note},
		{"API watch requests/min, steady state", fmtNum(watches.median()), spread(watches), nw, mean(all.Watches) + "; informer watches (re)opened"},
		{"API writes/min, steady state", fmtNum(writes.median()), spread(writes), nw, mean(all.Writes) + "; target 0; writes seen: " + which},
	}, nil
}
