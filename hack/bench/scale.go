package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/image-refresh/image-refresh/internal/operator"
)

// scaleGroupSize is the number of targets per group in the scale phase;
// a namespace holds 10 groups (1,000 workloads).
const scaleGroupSize = 100

// measureScale: n zero-replica Deployments (no pods: the cluster's cost of
// a workload is then its Deployment and ReplicaSet) created already
// pinned, in groups of 100, one repo:tag per group, 10 groups per
// namespace. First the steady-state API requests over the first 1,000
// (one namespace, its own controller); then, over all n, runs times: a
// controller is built and started (time to the caches synced), its first
// passes over every group end, the process memory is read, and one full
// resync pass (Controller.Reconcile of every group, 4 at a time, as the
// workqueue does on a resync) is timed with its API requests counted.
// With profile set, the last run's resync pass is CPU-profiled into that
// file; with heapProfile set, the last run's heap after its first passes.
// Last, scaleLive: steady state and reverts with one controller over all n.
func measureScale(ctx context.Context, w *world, o scaleOptions) ([]row, error) {
	n, runs, steadyInterval, steadyFor, profile, heapProfile := o.workloads, o.runs, o.steadyInterval, o.steadyFor, o.profile, o.heapProfile
	ngroups := max(1, n/scaleGroupSize)
	per := min(n, scaleGroupSize)
	n = per * ngroups
	var gs []group
	var namespaces []string
	digests := map[string]string{} // group → digest
	for i := range ngroups {
		ns := fmt.Sprintf("bench-scale-%02d", i/10)
		if i%10 == 0 {
			if err := w.namespace(ctx, ns); err != nil {
				return nil, err
			}
			namespaces = append(namespaces, ns)
		}
		image := fmt.Sprintf("scale%03d", i)
		digest, err := w.push(image)
		if err != nil {
			return nil, err
		}
		g := group{name: image, ns: ns, image: image, targets: names(fmt.Sprintf("s%03d", i), per)}
		gs = append(gs, g)
		digests[g.name] = digest
	}
	deployments := func(groups []group) ([]*appsv1.Deployment, error) {
		var ds []*appsv1.Deployment
		for _, g := range groups {
			digest := digests[g.name]
			for _, t := range g.targets {
				ds = append(ds, deploymentN(g.ns, t, w.repo(g.image)+":prod@"+digest, 0))
			}
		}
		return ds, nil
	}

	// The first 1,000 (the first namespace): steady state.
	first := min(10, ngroups)
	start := time.Now()
	ds, err := deployments(gs[:first])
	if err != nil {
		return nil, err
	}
	progress("scale: creating %d Deployments (replicas 0), %d at a time", len(ds), o.createWorkers)
	if err := w.createDeployments(ctx, ds, o.createWorkers); err != nil {
		return nil, err
	}
	if err := w.waitSettled(ctx, namespaces[:1], nil, 10*time.Minute); err != nil {
		return nil, err
	}
	progress("scale: %d Deployments created and settled in %s", len(ds), since(start))
	rows, err := steadyOn(ctx, w, gs[:first], fmt.Sprintf("%d groups of %d zero-replica Deployments", first, per), steadyInterval, steadyFor)
	if err != nil {
		return nil, err
	}

	// The rest.
	created := time.Now()
	var createOnly time.Duration
	if ngroups > first {
		ds, err := deployments(gs[first:])
		if err != nil {
			return nil, err
		}
		progress("scale: creating %d more Deployments (replicas 0), %d at a time", len(ds), o.createWorkers)
		if err := w.createDeployments(ctx, ds, o.createWorkers); err != nil {
			return nil, err
		}
		createOnly = time.Since(created)
		progress("scale: created in %s; waiting until all %d settled", since(created), n)
		if err := w.waitSettled(ctx, namespaces, nil, 30*time.Minute); err != nil {
			return nil, err
		}
	}
	createdIn := time.Since(created)
	progress("scale: %d Deployments settled (%s for the last %d)", n, createdIn.Round(time.Second), n-first*per)

	var prof *os.File
	if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		prof = f
	}
	base := readMemory()
	var synced, firstPasses, resync, heap, rss sample
	var resyncReqs, firstWrites []string
	for r := range runs {
		b, err := w.newController(gs, ctlOptions{pollInterval: 5 * time.Minute, pollJitter: 0.1})
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		_, before := b.api.snapshot()
		if err := b.start(ctx); err != nil {
			return nil, err
		}
		if err := b.waitPasses(ctx, int64(len(gs)), 10*time.Minute); err != nil {
			b.stop()
			return nil, err
		}
		fp := time.Since(t0)
		b.waitQuiet(ctx, 2*time.Second, time.Minute)
		w := b.api.writesSince(before)
		if w == "" {
			w = "none"
		}
		firstWrites = append(firstWrites, w)
		m := readMemory()
		heap, rss = append(heap, float64(m.heap)), append(rss, float64(m.rss))
		if heapProfile != "" && r == runs-1 {
			if err := writeHeapProfile(heapProfile); err != nil {
				b.stop()
				return nil, err
			}
		}
		_, mark := b.api.snapshot()
		for _, p := range b.api.patchSamples() {
			progress("scale: run %d: a patch of the first passes: %s", r+1, p)
		}
		profiling := prof != nil && r == runs-1
		if profiling {
			if err := pprof.StartCPUProfile(prof); err != nil {
				b.stop()
				return nil, err
			}
		}
		d := b.pass(ctx, 4)
		if profiling {
			pprof.StopCPUProfile()
		}
		reqs := b.api.byVerb(mark)
		b.stop()
		synced, firstPasses, resync = append(synced, b.synced.Seconds()), append(firstPasses, fp.Seconds()), append(resync, d.Seconds())
		resyncReqs = append(resyncReqs, b.api.requestsSince(mark))
		for _, p := range b.api.patchSamples() {
			progress("scale: run %d: a patch of the resync pass: %s", r+1, p)
		}
		progress("scale: run %d: caches synced in %s, first passes over %d groups done %s after Start, resync pass %s (%s), heap %s, RSS %s; writes of the first passes: %s",
			r+1, b.synced.Round(time.Millisecond), len(gs), fp.Round(time.Millisecond), d.Round(time.Millisecond), fmtVerbs(reqs, 1), fmtMiB(float64(m.heap)), fmtMiB(float64(m.rss)), w)
	}

	settler := "kube-controller-manager making a ReplicaSet for each and reporting its status"
	if w.writeStatus {
		settler = "the bench writing each one's status (startObserver)"
	}
	wl := fmt.Sprintf("%d zero-replica Deployments, %d groups of %d, %d namespaces", n, len(gs), per, len(namespaces))
	nr := fmt.Sprint(runs)
	sp := func(s sample) string { return rangeOf(s.min(), s.max(), fmtSeconds) + " (min–max)" }
	mib := func(s sample) string { return rangeOf(s.min(), s.max(), fmtMiB) + " (min–max)" }
	rows = append(rows,
		row{fmt.Sprintf("resync pass, %d workloads, nothing to change", n), fmtSeconds(resync.median()), sp(resync), nr,
			fmt.Sprintf("%s; Controller.Reconcile of every group, 4 workers, after the first passes; API requests during it, per run: %s; goal < 1 s, 0 requests", wl, strings.Join(resyncReqs, " | "))},
		row{fmt.Sprintf("manager start → caches synced, %d workloads", n), fmtSeconds(synced.median()), sp(synced), nr,
			fmt.Sprintf("mgr.Start → Manager.Synced() (/readyz): the Deployment informer over the %d namespaces listed and synced", len(namespaces))},
		row{fmt.Sprintf("manager start → first pass of every group done, %d workloads", n), fmtSeconds(firstPasses.median()), sp(firstPasses), nr,
			fmt.Sprintf("Controller.Passes() reached %d; writes of those passes, per run: %s", len(gs), strings.Join(firstWrites, " | "))},
		row{fmt.Sprintf("Go heap in use after GC, %d workloads", n), fmtMiB(heap.median()), mib(heap), nr,
			fmt.Sprintf("whole bench process, manager + caches running; %s before the first controller was built", fmtMiB(float64(base.heap)))},
		row{fmt.Sprintf("process RSS, %d workloads", n), fmtMiB(rss.median()), mib(rss), nr,
			fmt.Sprintf("VmRSS after GC + FreeOSMemory, whole bench process (its own clients, the in-memory registry); %s before the first controller was built; goal < 150 MiB", fmtMiB(float64(base.rss)))},
		row{fmt.Sprintf("creating the last %d Deployments until settled", n-first*per), fmtSeconds(createdIn.Seconds()), "single run", "1",
			fmt.Sprintf("setup cost of this cluster, not image-refresh: %s to create them (%d at a time), the rest %s; %s",
				fmtSeconds(createOnly.Seconds()), o.createWorkers, settler, w.budget)},
	)
	live, err := scaleLive(ctx, w, gs, digests, n, o.reverts, steadyInterval, steadyFor)
	rows = append(rows, live...)
	return rows, err
}

// scaleOptions are the scale phase's settings (flags of main).
type scaleOptions struct {
	workloads, runs int
	// reverts is how many reverts scaleLive times over all the workloads.
	reverts                   int
	steadyInterval, steadyFor time.Duration
	profile, heapProfile      string
	// createWorkers is how many Deployments the bench creates at a time.
	createWorkers int
}

// writeHeapProfile writes the heap profile as of the last GC (readMemory
// ran one): what the running controller and its caches hold.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("heap profile %s: %w", path, err)
	}
	return f.Close()
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

// scaleLive runs one controller over all the scale phase's groups with the
// steady phase's poll interval and, after its first passes, counts its API
// requests while nothing changes (steady state over all n); then reverts
// reverts targets spread over the groups (a non-anchor target each, written
// back to the bare repo:tag by field manager "helm", as a Helm upgrade
// does) and times each revert → re-pin from a watch, counting the
// controller's API requests and passes per revert.
func scaleLive(ctx context.Context, w *world, gs []group, digests map[string]string, n, reverts int, steadyInterval, steadyFor time.Duration) ([]row, error) {
	b, err := w.newController(gs, ctlOptions{pollInterval: steadyInterval, pollJitter: 0.1, fightMaxRounds: 1 << 30})
	if err != nil {
		return nil, err
	}
	if err := b.start(ctx); err != nil {
		return nil, err
	}
	defer b.stop()
	if err := b.waitPasses(ctx, int64(len(gs)), 10*time.Minute); err != nil {
		return nil, err
	}
	b.waitQuiet(ctx, 2*time.Second, time.Minute)
	what := fmt.Sprintf("%d groups of %d zero-replica Deployments", len(gs), len(gs[0].targets))
	steady, err := countSteady(ctx, b, n, what, steadyInterval, steadyFor)
	if err != nil {
		return nil, err
	}
	rows := []row{steady}
	if reverts <= 0 {
		return rows, nil
	}

	progress("scale: %d reverts over %d workloads", reverts, n)
	var total sample
	_, before := b.api.snapshot()
	passes0 := b.ctl.Passes()
	start := time.Now()
	for i := range reverts {
		g := gs[(i*37)%len(gs)]
		name := g.targets[0]
		if len(g.targets) > 1 {
			name = g.targets[1+(i*13)%(len(g.targets)-1)]
		}
		digest := "@" + digests[g.name]
		t, _, err := revert(ctx, w, g.ns, name, w.repo(g.image)+":prod", digest)
		if err != nil {
			return rows, fmt.Errorf("revert %d of %s/%s: %w", i+1, g.ns, name, err)
		}
		total = append(total, t.Seconds())
		// The reverted target and the anchor (its bookkeeping) idle again.
		idle := group{ns: g.ns, targets: []string{g.targets[0], name}}
		if name == g.targets[0] {
			idle.targets = idle.targets[:1]
		}
		if err := waitIdle(ctx, w, g.ns, idle, digest); err != nil {
			return rows, fmt.Errorf("after revert %d of %s/%s: %w", i+1, g.ns, name, err)
		}
		// The passes the revert's own rollout events start end too.
		b.waitQuiet(ctx, time.Second, 30*time.Second)
		if (i+1)%10 == 0 {
			progress("scale: %d/%d reverts, p50 so far %s", i+1, reverts, fmtSeconds(total.median()))
		}
	}
	requests, writes := b.api.perEach(before, len(total))
	passes := float64(b.ctl.Passes()-passes0) / float64(len(total))
	progress("scale: %d reverts in %s; API requests per revert: %s; passes per revert %s", len(total), since(start), requests, fmtNum(passes))
	nr := fmt.Sprint(len(total))
	rows = append(rows,
		row{fmt.Sprintf("revert → re-pin, p50 / p99, %d workloads", n), pairP(total), span(total), nr,
			fmt.Sprintf("revert write returned → stored spec back on the digest (watch); one non-anchor target of a different group each time, the controller running over all %s, --workers %d", what, operator.DefaultWorkers)},
		row{fmt.Sprintf("  API requests per revert, %d workloads", n), requests, "–", nr,
			fmt.Sprintf("the controller's requests by verb and resource over the series (the re-pin and the passes the revert's rollout events start), divided by the reverts; writes per revert %s; passes per revert %s (every pass of the controller during the series, its polls of all groups every %s included)", writes, fmtNum(passes), steadyInterval)},
	)
	return rows, nil
}
