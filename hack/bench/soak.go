package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// The soak (issue 14): `run` over -workloads Deployments for -soak-for
// under a seeded random schedule of events, then every target must be on
// its repo:tag's latest digest, every anchor's record must match, no
// workload may have rolled out more often than the events caused, and the
// bench process's heap and goroutines must not have grown.
//
// Workloads: groups of 10–50 Deployments in one namespace, each group on
// one of several repo:tags (several groups share a repo:tag); every fifth
// Deployment, the anchor among them, has one replica (a kwok pod), the
// others zero. All start pinned to the tag's digest.
//
// Events, drawn from math/rand/v2 seeded with -seed, every 0.5–4.5 s:
//   - revert: a random target is patched back to its bare repo:tag by field
//     manager "helm", as a Helm re-render does;
//   - push: a new random image is pushed to a random repo:tag;
//   - fault: for 5–30 s every registry manifest request is answered 503,
//     or 429 with Retry-After: 2 (test/support/testregistry's Fault); at most
//     one at a time, 10 s apart;
//   - restart: exactly one kube-apiserver SIGKILL and restart
//     (localcluster.RestartAPIServer), half-way through.
//
// Events run one after the other, each bounded by its own timeout; a late
// event runs late (the lateness is reported), it is never skipped.
//
// What the controller should have caused, per workload: at most one re-pin
// per revert that reached its stored spec, plus one per digest pushed to
// its repo:tag. A watch on the Deployments (RetryWatcher: it resumes
// across the apiserver restart from the last resourceVersion) counts every
// change of the stored pod template's image: to a bare tag is a revert,
// to a digest is the controller's. A Deployment has at most one
// ReplicaSet per distinct pod template it has had, so ReplicaSets per
// workload are checked against the distinct images the watch saw.
//
// The controller runs with --poll-interval 10s, jitter 0.1; the guards
// that would rightly stop re-pinning under this schedule are lifted, as
// in the latency and propagate phases: maxDigestChanges 1000 (default 3
// an hour) and --fight-max-repins unbounded (default 3 in 10 min). Every
// other setting is run's default.
type soakOptions struct {
	duration  time.Duration
	workloads int
	seed      uint64
}

const (
	soakNS           = "bench-soak"
	soakPoll         = 10 * time.Second
	soakConverge     = 15 * time.Minute // after the schedule ends
	soakSampleEvery  = time.Minute
	soakBaselineAt   = 2 * time.Minute
	soakHeapFactor   = 1.5
	soakHeapSlack    = 16 << 20 // bytes
	soakGoroutSlack  = 50
	soakEventTimeout = 2 * time.Minute
)

type soakEventKind int

const (
	evRevert soakEventKind = iota
	evPush
	evFaultOn
	evFaultOff
	evRestart
)

func (k soakEventKind) String() string {
	return [...]string{"revert", "push", "fault on", "fault off", "apiserver restart"}[k]
}

type soakEvent struct {
	at     time.Duration // from the start of the schedule
	kind   soakEventKind
	target int // revert: index into the workloads
	repo   int // push: index into the repos
	fault  testregistry.Fault
	length time.Duration // fault on: how long
}

// soakSchedule draws the events of d from rng.
func soakSchedule(rng *rand.Rand, d time.Duration, workloads, repos int) []soakEvent {
	var evs []soakEvent
	faultFreeAt := time.Duration(0)
	for t := time.Duration(0); ; {
		t += 500*time.Millisecond + time.Duration(rng.IntN(4000))*time.Millisecond
		if t >= d {
			break
		}
		switch r := rng.Float64(); {
		case r < 0.06:
			evs = append(evs, soakEvent{at: t, kind: evPush, repo: rng.IntN(repos)})
		case r < 0.10 && t >= faultFreeAt:
			length := 5*time.Second + time.Duration(rng.IntN(26))*time.Second
			f := testregistry.Fault{Status: http.StatusServiceUnavailable}
			if rng.IntN(2) == 0 {
				f = testregistry.Fault{Status: http.StatusTooManyRequests, RetryAfter: "2"}
			}
			evs = append(evs, soakEvent{at: t, kind: evFaultOn, fault: f, length: length},
				soakEvent{at: t + length, kind: evFaultOff})
			faultFreeAt = t + length + 10*time.Second
		default:
			evs = append(evs, soakEvent{at: t, kind: evRevert, target: rng.IntN(workloads)})
		}
	}
	evs = append(evs, soakEvent{at: d / 2, kind: evRestart})
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at < evs[j].at })
	return evs
}

// soakTarget is one workload of the soak.
type soakTarget struct {
	name string
	g    int // index into groups
}

// soakTrack is what the watch saw of every Deployment.
type soakTrack struct {
	mu       sync.Mutex
	image    map[string]string
	record   map[string]string              // anchor → its record annotation
	repins   map[string]int                 // changes to a pinned image
	reverts  map[string]int                 // changes to a bare tag
	distinct map[string]map[string]struct{} // images seen
	events   int
	// relists: the watch could not resume (410 Gone: a restarted
	// kube-apiserver's watch cache starts at etcd's current revision) and
	// re-listed; a template changed more than once in the gap counts once.
	relists int
	// maxStreak is the highest resolve-failure streak (R1) an anchor's
	// annotation held, and where.
	maxStreak   int
	maxStreakAt string
	gapRVs      int64         // resourceVersions skipped by those relists, in all
	changed     chan struct{} // a value after every event (buffered 1)
	err         error         // the watch ended
}

func (s *soakTrack) observe(d *appsv1.Deployment, recordKey, streakKey func(name string) string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events++
	img := d.Spec.Template.Spec.Containers[0].Image
	if old, ok := s.image[d.Name]; ok && old != img {
		if strings.Contains(img, "@sha256:") {
			s.repins[d.Name]++
		} else {
			s.reverts[d.Name]++
		}
	}
	s.image[d.Name] = img
	if s.distinct[d.Name] == nil {
		s.distinct[d.Name] = map[string]struct{}{}
	}
	s.distinct[d.Name][img] = struct{}{}
	if k := recordKey(d.Name); k != "" {
		s.record[d.Name] = d.Annotations[k]
	}
	if k := streakKey(d.Name); k != "" {
		if n, err := strconv.Atoi(d.Annotations[k]); err == nil && n > s.maxStreak {
			s.maxStreak, s.maxStreakAt = n, d.Name
		}
	}
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

type soakSample struct {
	at         time.Duration
	heap, rss  uint64
	goroutines int
}

func measureSoak(ctx context.Context, w *world, o soakOptions) ([]row, error) {
	if o.workloads < 10 {
		return nil, fmt.Errorf("soak: -workloads %d: want at least 10", o.workloads)
	}
	rng := rand.New(rand.NewPCG(o.seed, o.seed^0x5eed50a4))
	keys := state.Keys{Prefix: prefix}

	// Repositories and groups.
	nrepos := max(2, min(8, o.workloads/60))
	repos := make([]string, nrepos)
	current := map[string]string{} // repo → digest last pushed
	for i := range repos {
		repos[i] = fmt.Sprintf("soak%d", i)
		d, err := w.push(repos[i])
		if err != nil {
			return nil, err
		}
		current[repos[i]] = d
	}
	var groups []group
	var targets []soakTarget
	for left := o.workloads; left > 0; {
		n := min(left, 10+rng.IntN(41))
		if left-n < 10 { // no group under 10, none over 50
			n = left
			if left > 50 {
				n = left - 10
			}
		}
		i := len(groups)
		g := group{name: fmt.Sprintf("soak-g%02d", i), ns: soakNS, image: repos[i%nrepos], targets: names(fmt.Sprintf("g%02d", i), n)}
		groups = append(groups, g)
		for _, t := range g.targets {
			targets = append(targets, soakTarget{name: t, g: i})
		}
		left -= n
	}
	groupOf := map[string]int{} // target name → group
	for _, t := range targets {
		groupOf[t.name] = t.g
	}
	anchorOf := map[string]int{} // anchor name → group
	for i, g := range groups {
		anchorOf[g.targets[0]] = i
	}
	recordKey := func(name string) string {
		if i, ok := anchorOf[name]; ok {
			return keys.Record(groups[i].image)
		}
		return ""
	}
	streakKey := func(name string) string {
		if i, ok := anchorOf[name]; ok {
			return keys.ResolveFailures(groups[i].image)
		}
		return ""
	}

	// The Deployments, pinned, every fifth with one replica.
	if err := w.namespace(ctx, soakNS); err != nil {
		return nil, err
	}
	var ds []*appsv1.Deployment
	onePod := 0
	for _, g := range groups {
		for j, t := range g.targets {
			replicas := int32(0)
			if j%5 == 0 {
				replicas = 1
				onePod++
			}
			ds = append(ds, deploymentN(soakNS, t, w.repo(g.image)+":prod@"+current[g.image], replicas))
		}
	}
	start := time.Now()
	progress("soak: creating %d Deployments (%d with one replica) in %d groups over %d repo:tags, 16 at a time", len(ds), onePod, len(groups), nrepos)
	if err := w.createDeployments(ctx, ds, 16); err != nil {
		return nil, err
	}
	if err := w.waitSettled(ctx, []string{soakNS}, nil, 20*time.Minute); err != nil {
		return nil, err
	}
	progress("soak: created and settled in %s", since(start))

	b, err := w.newController(groups, ctlOptions{pollInterval: soakPoll, pollJitter: 0.1, fightMaxRounds: 1 << 30, config: "maxDigestChanges: 1000\n"})
	if err != nil {
		return nil, err
	}
	if err := b.start(ctx); err != nil {
		return nil, err
	}
	defer b.stop()
	if err := b.waitPasses(ctx, int64(len(groups)), 10*time.Minute); err != nil {
		return nil, err
	}
	b.waitQuiet(ctx, 2*time.Second, time.Minute)
	progress("soak: controller started (caches synced in %s), first passes over %d groups done", b.synced.Round(time.Millisecond), len(groups))

	// The watch: from a list's resourceVersion, resumed across the restart.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	tr := &soakTrack{image: map[string]string{}, record: map[string]string{}, repins: map[string]int{}, reverts: map[string]int{},
		distinct: map[string]map[string]struct{}{}, changed: make(chan struct{}, 1)}
	list, err := w.kube.AppsV1().Deployments(soakNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		tr.observe(&list.Items[i], recordKey, streakKey)
	}
	for _, g := range groups {
		if got := tr.record[g.targets[0]]; got != current[g.image] {
			return nil, fmt.Errorf("soak: after the first passes the anchor %s records %q, want %s", g.targets[0], got, current[g.image])
		}
	}
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		err := soakWatch(wctx, w, tr, list.ResourceVersion, recordKey, streakKey)
		if wctx.Err() != nil {
			return
		}
		tr.mu.Lock()
		tr.err = fmt.Errorf("the bench's watch of the Deployments failed: %w", err)
		tr.mu.Unlock()
		select {
		case tr.changed <- struct{}{}:
		default:
		}
	}()
	defer func() { wcancel(); <-watchDone }()

	// Memory and goroutines, sampled every minute from here.
	t0 := time.Now()
	var samplesMu sync.Mutex
	var samples []soakSample
	var regReqs, regFaulted int
	takeSample := func() soakSample {
		// The registry's own request log grows with every request: read and
		// drop it, so it is not counted as the process's growth.
		for _, r := range w.reg.Requests() {
			regReqs++
			if r.Status == http.StatusServiceUnavailable || r.Status == http.StatusTooManyRequests {
				regFaulted++
			}
		}
		w.reg.ResetRequests()
		m := readMemory()
		s := soakSample{at: time.Since(t0), heap: m.heap, rss: m.rss, goroutines: runtime.NumGoroutine()}
		samplesMu.Lock()
		samples = append(samples, s)
		samplesMu.Unlock()
		return s
	}
	takeSample()
	_, apiBefore := b.api.snapshot()
	sctx, scancel := context.WithCancel(ctx)
	samplerDone := make(chan struct{})
	counts := map[soakEventKind]int{}
	var countsMu sync.Mutex
	go func() {
		defer close(samplerDone)
		tick := time.NewTicker(soakSampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
				s := takeSample()
				countsMu.Lock()
				c := fmt.Sprintf("%d reverts, %d pushes, %d faults", counts[evRevert], counts[evPush], counts[evFaultOn])
				countsMu.Unlock()
				progress("soak: %s: %s so far; heap %s, RSS %s, %d goroutines; API requests since the start: %s",
					s.at.Round(time.Second), c, fmtMiB(float64(s.heap)), fmtMiB(float64(s.rss)), s.goroutines, fmtVerbs(b.api.byVerb(apiBefore), 1))
			}
		}
	}()
	stopSampler := func() {
		scancel()
		<-samplerDone
	}

	// The schedule.
	evs := soakSchedule(rng, o.duration, len(targets), nrepos)
	pushes := map[string]int{} // repo → digests pushed during the soak
	var faultFor time.Duration
	var restartDown time.Duration
	var late sample
	progress("soak: %d events over %s (seed %d)", len(evs), o.duration, o.seed)
	for _, ev := range evs {
		select {
		case <-ctx.Done():
			stopSampler()
			return nil, ctx.Err()
		case <-time.After(time.Until(t0.Add(ev.at))):
		}
		late = append(late, time.Since(t0.Add(ev.at)).Seconds())
		if err := runSoakEvent(ctx, w, ev, groups, targets, repos, current, pushes, &restartDown); err != nil {
			w.reg.ClearFault()
			stopSampler()
			return nil, fmt.Errorf("soak: event %s at %s: %w", ev.kind, ev.at, err)
		}
		if ev.kind == evFaultOn {
			faultFor += ev.length
		}
		countsMu.Lock()
		counts[ev.kind]++
		countsMu.Unlock()
	}
	w.reg.ClearFault()
	scheduleEnd := time.Now()
	progress("soak: schedule over (%s, events up to %s late); waiting for every target on its latest digest and every record to match", since(t0), fmtSeconds(late.max()))

	// Convergence: a signal from the watch, bounded.
	want := func(name string) string {
		g := groups[groupOf[name]]
		return w.repo(g.image) + ":prod@" + current[g.image]
	}
	converged := func() (bool, string, error) {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if tr.err != nil {
			return false, "", tr.err
		}
		pending, why := 0, ""
		for _, t := range targets {
			if got := tr.image[t.name]; got != want(t.name) {
				pending++
				why = fmt.Sprintf("%s runs %s", t.name, got)
			}
		}
		for _, g := range groups {
			if got := tr.record[g.targets[0]]; got != current[g.image] {
				pending++
				why = fmt.Sprintf("anchor %s records %q, want %s", g.targets[0], got, current[g.image])
			}
		}
		return pending == 0, fmt.Sprintf("%d pending (e.g. %s)", pending, why), nil
	}
	cctx, ccancel := context.WithTimeout(ctx, soakConverge)
	defer ccancel()
	var convergedIn time.Duration
	for {
		ok, why, err := converged()
		if err != nil {
			stopSampler()
			return nil, err
		}
		if ok {
			// Confirm with a fresh list: the watch is the signal, the list the proof.
			if why, err := soakVerify(cctx, w, groups, keys, want, current); err != nil {
				stopSampler()
				return nil, err
			} else if why == "" {
				convergedIn = time.Since(scheduleEnd)
				break
			} else {
				progress("soak: the watch says converged, a list says not yet: %s", why)
			}
		}
		select {
		case <-tr.changed:
		case <-time.After(5 * time.Second): // the list above may have raced the watch
		case <-cctx.Done():
			stopSampler()
			return nil, fmt.Errorf("soak: FINDING: not converged %s after the schedule ended (seed %d): %s; pushes per repo %v", soakConverge, o.seed, why, pushes)
		}
	}
	progress("soak: converged %s after the schedule ended", fmtSeconds(convergedIn.Seconds()))
	apiByVerb := b.api.byVerb(apiBefore)
	soakMinutes := time.Since(t0).Minutes()
	if err := w.waitSettled(ctx, []string{soakNS}, nil, 10*time.Minute); err != nil {
		stopSampler()
		return nil, fmt.Errorf("soak: after converging: %w", err)
	}
	stopSampler()
	last := takeSample()

	// Rollouts and ReplicaSets per workload.
	rsList, err := w.kube.AppsV1().ReplicaSets(soakNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	rsOf := map[string]int{}
	for _, rs := range rsList.Items {
		for _, ow := range rs.OwnerReferences {
			if ow.Kind == "Deployment" {
				rsOf[ow.Name]++
			}
		}
	}
	var problems []string
	tr.mu.Lock()
	totalRepins, totalBound, totalReverts, maxRS, maxRSBound, maxRepins := 0, 0, 0, 0, 0, 0
	for _, t := range targets {
		g := groups[t.g]
		bound := tr.reverts[t.name] + pushes[g.image]
		totalRepins += tr.repins[t.name]
		totalReverts += tr.reverts[t.name]
		totalBound += bound
		maxRepins = max(maxRepins, tr.repins[t.name])
		if tr.repins[t.name] > bound {
			problems = append(problems, fmt.Sprintf("%s rolled out to a digest %d times, bound %d (%d reverts seen + %d digests pushed to %s)",
				t.name, tr.repins[t.name], bound, tr.reverts[t.name], pushes[g.image], g.image))
		}
		if rsOf[t.name] > maxRS {
			maxRS, maxRSBound = rsOf[t.name], len(tr.distinct[t.name])
		}
		if rsOf[t.name] > len(tr.distinct[t.name]) {
			problems = append(problems, fmt.Sprintf("%s has %d ReplicaSets, bound %d (distinct pod templates seen)", t.name, rsOf[t.name], len(tr.distinct[t.name])))
		}
	}
	watchEvents, relists, gapRVs, maxStreak, maxStreakAt := tr.events, tr.relists, tr.gapRVs, tr.maxStreak, tr.maxStreakAt
	tr.mu.Unlock()

	// Heap and goroutines: flat is last ≤ factor × the sample at the
	// baseline mark (the first at or after 2 min) + slack.
	samplesMu.Lock()
	all := append([]soakSample(nil), samples...)
	samplesMu.Unlock()
	base := all[0]
	for _, s := range all {
		if s.at >= soakBaselineAt {
			base = s
			break
		}
	}
	var heaps, gors sample
	for _, s := range all {
		heaps, gors = append(heaps, float64(s.heap)), append(gors, float64(s.goroutines))
	}
	heapBound := soakHeapFactor*float64(base.heap) + soakHeapSlack
	gorBound := soakHeapFactor*float64(base.goroutines) + soakGoroutSlack
	if float64(last.heap) > heapBound {
		problems = append(problems, fmt.Sprintf("heap grew: %s at the end, bound %s (%.1f × %s at %s + %s)",
			fmtMiB(float64(last.heap)), fmtMiB(heapBound), soakHeapFactor, fmtMiB(float64(base.heap)), base.at.Round(time.Second), fmtMiB(soakHeapSlack)))
	}
	if float64(last.goroutines) > gorBound {
		problems = append(problems, fmt.Sprintf("goroutines grew: %d at the end, bound %.0f (%.1f × %d at %s + %d)",
			last.goroutines, gorBound, soakHeapFactor, base.goroutines, base.at.Round(time.Second), soakGoroutSlack))
	}

	mix := fmt.Sprintf("%d reverts, %d pushes (%s), %d registry fault bursts (%s in all; %d of %d registry requests answered 503/429), 1 apiserver restart (API down %s)",
		counts[evRevert], counts[evPush], fmtPushes(pushes, repos), counts[evFaultOn], faultFor.Round(time.Second), regFaulted, regReqs, restartDown.Round(100*time.Millisecond))
	what := fmt.Sprintf("%d Deployments (%d one-replica incl. every anchor, the rest zero-replica) in %d groups of 10–50 over %d repo:tags; seed %d, %s of events",
		len(targets), onePod, len(groups), nrepos, o.seed, o.duration)
	rows := []row{
		{"soak: schedule end → all targets on the latest digest, all records match", fmtSeconds(convergedIn.Seconds()), "single run", "1",
			fmt.Sprintf("%s; %s; events up to %s late on this machine; converge bound %s", what, mix, fmtSeconds(late.max()), soakConverge)},
		{"soak: rollouts to a digest vs bound", fmt.Sprintf("%d ≤ %d", totalRepins, totalBound), fmt.Sprintf("max %d per workload", maxRepins), fmt.Sprint(len(targets)),
			fmt.Sprintf("stored pod-template image changes seen by a watch, summed over workloads; bound per workload = reverts that reached it (%d in all) + digests pushed to its repo:tag; checked per workload; the watch re-listed %d times (410 after the restart), skipping %d resourceVersions (a workload that changed twice in such a gap counts once)", totalReverts, relists, gapRVs)},
		{"soak: ReplicaSets per workload, max", fmt.Sprint(maxRS), fmt.Sprintf("bound %d there", maxRSBound), fmt.Sprint(len(targets)),
			"checked per workload: ReplicaSets owned ≤ distinct pod templates the watch saw it have (incl. the first)"},
		{"soak: Go heap in use after GC, first / last / max", fmt.Sprintf("%s / %s / %s", fmtMiB(heaps[0]), fmtMiB(float64(last.heap)), fmtMiB(heaps.max())),
			fmt.Sprintf("bound %s", fmtMiB(heapBound)), fmt.Sprintf("%d samples", len(all)),
			fmt.Sprintf("whole bench process (controller, its caches, the bench's watch, the in-memory registry), every %s; flat = last ≤ %.1f × the %s sample + %s; RSS %s → %s",
				soakSampleEvery, soakHeapFactor, base.at.Round(time.Second), fmtMiB(soakHeapSlack), fmtMiB(float64(all[0].rss)), fmtMiB(float64(last.rss)))},
		{"soak: goroutines, first / last / max", fmt.Sprintf("%.0f / %d / %.0f", gors[0], last.goroutines, gors.max()),
			fmt.Sprintf("bound %.0f", gorBound), fmt.Sprintf("%d samples", len(all)),
			fmt.Sprintf("flat = last ≤ %.1f × the %s sample + %d", soakHeapFactor, base.at.Round(time.Second), soakGoroutSlack)},
		{"soak: highest resolve-failure streak on an anchor", fmt.Sprint(maxStreak), "maxReadFailures 8", fmt.Sprint(len(groups)),
			fmt.Sprintf("the anchors' resolve-failure-streak-<image> annotation (R1) as the watch saw it (highest on %s); not a check: in run every pass of a group during a registry fault counts the poller's cached failure again", maxStreakAt)},
		{"soak: controller API requests", fmt.Sprintf("%s per min", fmtNum(float64(sum(apiByVerb))/soakMinutes)), "–", fmt.Sprintf("%.1f min", soakMinutes),
			fmt.Sprintf("by verb, in all: %s; from the schedule's start to converged; the bench's watch saw %d Deployment events", fmtVerbs(apiByVerb, 1), watchEvents)},
	}
	for _, r := range rows {
		progress("soak: %s: %s (%s)", r.Figure, r.Value, r.Spread)
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		for _, p := range problems {
			progress("soak: FINDING (seed %d): %s", o.seed, p)
		}
		return rows, fmt.Errorf("soak: %d checks failed (seed %d), first: %s", len(problems), o.seed, problems[0])
	}
	return rows, nil
}

// soakWatch feeds tr from a watch of the soak's Deployments from rv until
// ctx ends. A RetryWatcher resumes from the last resourceVersion across
// dropped connections; when the resourceVersion is gone (410, as after
// the kube-apiserver restart) it re-lists, diffs, and watches on.
func soakWatch(ctx context.Context, w *world, tr *soakTrack, rv string, recordKey, streakKey func(string) string) error {
	for {
		rw, err := watchtools.NewRetryWatcherWithContext(ctx, rv, &cache.ListWatch{
			WatchFuncWithContext: func(ctx context.Context, lo metav1.ListOptions) (watch.Interface, error) {
				return w.kube.AppsV1().Deployments(soakNS).Watch(ctx, lo)
			},
		})
		if err != nil {
			return err
		}
		var gone error
		for ev := range rw.ResultChan() {
			if ev.Type == watch.Error {
				gone = apierrors.FromObject(ev.Object)
				break
			}
			if d, ok := ev.Object.(*appsv1.Deployment); ok {
				if ev.Type != watch.Bookmark {
					tr.observe(d, recordKey, streakKey)
				}
				rv = d.ResourceVersion
			}
		}
		rw.Stop()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if gone == nil {
			return fmt.Errorf("the watch ended")
		}
		if !apierrors.IsResourceExpired(gone) && !apierrors.IsGone(gone) {
			return gone
		}
		var list *appsv1.DeploymentList
		for {
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			list, err = w.kube.AppsV1().Deployments(soakNS).List(lctx, metav1.ListOptions{})
			cancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			time.Sleep(time.Second)
		}
		var from, to int64
		_, _ = fmt.Sscan(rv, &from)
		_, _ = fmt.Sscan(list.ResourceVersion, &to)
		progress("soak: the bench's watch at resourceVersion %s: %v; re-listed at %s", rv, gone, list.ResourceVersion)
		tr.mu.Lock()
		tr.relists++
		tr.gapRVs += max(0, to-from)
		tr.mu.Unlock()
		for i := range list.Items {
			tr.observe(&list.Items[i], recordKey, streakKey)
		}
		rv = list.ResourceVersion
	}
}

// runSoakEvent runs one event, bounded by soakEventTimeout.
func runSoakEvent(ctx context.Context, w *world, ev soakEvent, groups []group, targets []soakTarget, repos []string,
	current map[string]string, pushes map[string]int, restartDown *time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, soakEventTimeout)
	defer cancel()
	switch ev.kind {
	case evRevert:
		t := targets[ev.target]
		tag := w.repo(groups[t.g].image) + ":prod"
		patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":"app","image":%q}]}}}}`, tag)
		// Retried until it is stored: the watch, not this call, counts it.
		for {
			_, err := w.kube.AppsV1().Deployments(soakNS).Patch(ctx, t.name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "helm"})
			if err == nil {
				return nil
			}
			select {
			case <-ctx.Done():
				return errors.Join(err, ctx.Err())
			case <-time.After(time.Second):
			}
		}
	case evPush:
		repo := repos[ev.repo]
		d, err := w.push(repo)
		if err != nil {
			return err
		}
		current[repo] = d
		pushes[repo]++
	case evFaultOn:
		w.reg.SetFault(ev.fault)
		progress("soak: registry answers every manifest request %d for %s", ev.fault.Status, ev.length)
	case evFaultOff:
		w.reg.ClearFault()
	case evRestart:
		progress("soak: restarting kube-apiserver (SIGKILL)")
		down, err := w.cluster.RestartAPIServer(ctx)
		if err != nil {
			return err
		}
		*restartDown = down
		progress("soak: kube-apiserver back after %s", down.Round(100*time.Millisecond))
	}
	return nil
}

// soakVerify lists the Deployments and returns what is not converged yet
// ("" if nothing).
func soakVerify(ctx context.Context, w *world, groups []group, keys state.Keys, want func(string) string, current map[string]string) (string, error) {
	list, err := w.kube.AppsV1().Deployments(soakNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	byName := map[string]*appsv1.Deployment{}
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}
	for _, g := range groups {
		for _, t := range g.targets {
			d := byName[t]
			if d == nil {
				return t + " is gone", nil
			}
			if got := d.Spec.Template.Spec.Containers[0].Image; got != want(t) {
				return t + " runs " + got, nil
			}
		}
		if got := byName[g.targets[0]].Annotations[keys.Record(g.image)]; got != current[g.image] {
			return fmt.Sprintf("anchor %s records %q", g.targets[0], got), nil
		}
	}
	return "", nil
}

func fmtPushes(pushes map[string]int, repos []string) string {
	var out []string
	for _, r := range repos {
		out = append(out, fmt.Sprintf("%s ×%d", r, pushes[r]))
	}
	return strings.Join(out, ", ")
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
