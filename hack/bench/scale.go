package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
)

// measureScale: n one-replica Deployments (kwok pods) in 10 groups of n/10,
// one namespace and one repo:tag per group. It times the controller's
// passes over all of them — the first observation (records only, R5), the
// first pass that pins every one (and waits for every rollout), then
// resync passes with nothing to change — and the process memory with the
// manager and its caches running.
func measureScale(ctx context.Context, w *world, n, resyncRuns int) ([]row, error) {
	groups := min(10, n)
	per := n / groups
	n = per * groups
	var gs []group
	var namespaces []string
	var ds []*appsv1.Deployment
	for i := range groups {
		ns := fmt.Sprintf("bench-scale-%02d", i)
		image := fmt.Sprintf("scale%02d", i)
		if err := w.namespace(ctx, ns); err != nil {
			return nil, err
		}
		if _, err := w.push(image); err != nil {
			return nil, err
		}
		g := group{name: image, ns: ns, image: image, targets: names("s", per)}
		for _, t := range g.targets {
			ds = append(ds, deployment(ns, t, w.repo(image)+":prod"))
		}
		gs, namespaces = append(gs, g), append(namespaces, ns)
	}
	start := time.Now()
	progress("scale: creating %d Deployments (%d groups of %d), 16 at a time", n, groups, per)
	if err := w.createDeployments(ctx, ds, 16); err != nil {
		return nil, err
	}
	progress("scale: created in %s; waiting for every rollout", since(start))
	if err := w.waitSettled(ctx, namespaces, nil, 10*time.Minute); err != nil {
		return nil, err
	}
	progress("scale: %d Deployments settled %s after the first create", n, since(start))
	ds = nil

	base := readMemory()
	b, err := w.newController(gs, ctlOptions{pollInterval: 5 * time.Minute, pollJitter: 0.1})
	if err != nil {
		return nil, err
	}
	const workers = 4 // run's --workers default
	record := b.pass(ctx, workers)
	progress("scale: first-observation pass (records only) %s", record.Round(time.Millisecond))
	// The record write bumped each anchor's generation: let them settle, or
	// the next pass would only count a skip (R4).
	if err := w.waitSettled(ctx, namespaces, nil, 2*time.Minute); err != nil {
		return nil, err
	}
	before, beforeByKey := b.api.snapshot()
	pin := b.pass(ctx, workers)
	pinAPI, _ := b.api.snapshot()
	pinWrites := b.api.writesSince(beforeByKey)
	progress("scale: pin pass %s", pin.Round(time.Millisecond))
	if err := w.waitSettled(ctx, namespaces, pinned, 2*time.Minute); err != nil {
		return nil, fmt.Errorf("after the pin pass: %w", err)
	}
	var resync sample
	var resyncWrites int
	for range resyncRuns {
		a, _ := b.api.snapshot()
		d := b.pass(ctx, workers)
		z, _ := b.api.snapshot()
		resync = append(resync, d.Seconds())
		resyncWrites += z.sub(a).Writes
		progress("scale: resync pass %s (%d reads, %d writes)", d.Round(time.Millisecond), z.sub(a).Reads, z.sub(a).Writes)
	}

	if err := b.start(ctx); err != nil {
		return nil, err
	}
	b.waitQuiet(ctx, 3*time.Second, 3*time.Minute) // the manager's own first pass
	var heap, rss sample
	for range 5 {
		m := readMemory()
		heap, rss = append(heap, float64(m.heap)), append(rss, float64(m.rss))
		time.Sleep(time.Second)
	}
	b.stop()

	pinReads := pinAPI.sub(before)
	wl := fmt.Sprintf("%d Deployments, %d groups", n, groups)
	spreadS := rangeOf(resync.min(), resync.max(), fmtSeconds) + " (min–max)"
	return []row{
		{"full pass, nothing to change (resync)", fmtSeconds(resync.median()), spreadS, fmt.Sprint(len(resync)),
			fmt.Sprintf("%s; Controller.Reconcile per group, 4 workers; %d writes in all runs; client QPS 50", wl, resyncWrites)},
		{"first pass that pins every workload", fmtSeconds(pin.Seconds()), "single run", "1",
			fmt.Sprintf("%s; includes waiting for every rollout (kwok); %d reads, %d writes (%s)", wl, pinReads.Reads, pinReads.Writes, pinWrites)},
		{"first-observation pass (records only, R5)", fmtSeconds(record.Seconds()), "single run", "1", wl},
		{"Go heap in use after GC", fmtMiB(heap.median()), rangeOf(heap.min(), heap.max(), fmtMiB) + " (min–max)", fmt.Sprint(len(heap)),
			fmt.Sprintf("whole bench process, manager + caches running over %s; %s before the controller was built", wl, fmtMiB(float64(base.heap)))},
		{"process RSS", fmtMiB(rss.median()), rangeOf(rss.min(), rss.max(), fmtMiB) + " (min–max)", fmt.Sprint(len(rss)),
			fmt.Sprintf("VmRSS after GC + FreeOSMemory; includes the bench's own clients and the in-memory registry; %s before the controller was built", fmtMiB(float64(base.rss)))},
	}, nil
}

type memory struct{ heap, rss uint64 }

// readMemory collects garbage, returns freed memory to the OS, and reads
// the Go heap in use and the process RSS (/proc/self/status VmRSS).
func readMemory() memory {
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m := memory{heap: ms.HeapInuse}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseUint(f[1], 10, 64)
				m.rss = kb << 10
			}
		}
	}
	return m
}
