// Package operator is `image-refresh run`: a controller-runtime manager
// that watches the managed workloads and re-pins a revert within seconds
// (C1), polls the registry once per repository:tag per interval (C2), acts
// only as the elected leader (C3), serves probes and metrics (C4) and stops
// fighting a writer that keeps rewriting a target (C5). Every decision goes
// through the same engine as `tick` (internal/pass, internal/refresh).
package operator

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/discovery"
	"github.com/image-refresh/image-refresh/internal/pass"
	"github.com/image-refresh/image-refresh/internal/poller"
	"github.com/image-refresh/image-refresh/internal/refresh"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// Controller reconciles one group per request (the request's Name is the
// group name).
type Controller struct {
	Runner *pass.Runner
	Poller *poller.Poller
	// Resync re-runs every group at least this often, as a tick would.
	Resync time.Duration
	Fights fights

	// OnGroups, if set, is told every group after each discovery pass (the
	// webhook pins the targets of discovered groups too).
	OnGroups func([]config.Group)
	// discovery is nil when discovery is off; api lists what it discovers
	// from the API server (readRolling).
	discovery *Discovery
	api       client.Reader
	ctrl      controller.Controller

	mu         sync.Mutex
	configured []config.Group
	discovered map[string]config.Group           // by name (D1, SetDiscovered)
	groups     map[string]config.Group           // configured and discovered
	byObject   map[types.NamespacedName][]string // workload → group names
	queue      workqueue.TypedRateLimitingInterface[reconcile.Request]
	reverted   map[config.Workload]revert // the last write that changed a workload's images
	skipped    map[string]time.Time       // when a group's skip streak last counted
	passes     atomic.Int64
	passLocks  sync.Map // group name → *sync.Mutex held during its pass (lockPass)

	// R24 maxConcurrentRollouts: passes run one at a time when it is set,
	// so that two workers cannot both take the last slot; rolling holds
	// the groups with a rollout in flight (read from the anchors of the
	// configured and the discovered groups once, then from each group's own
	// pass), queued those waiting for a slot.
	slots       sync.Mutex
	rollingOnce sync.Once
	rolling     map[string]bool
	queued      map[string]bool
}

// revert is a write that changed a workload's images, as the watch saw it.
type revert struct {
	seen time.Time // for image_refresh_revert_repin_seconds
	refresh.Revert
}

// New builds a Controller for a validated config.
func New(r *pass.Runner, p *poller.Poller, resync time.Duration, maxRounds int, window time.Duration) *Controller {
	c := &Controller{
		Runner: r, Poller: p, Resync: resync,
		Fights:     fights{MaxRounds: maxRounds, Window: window},
		configured: r.Config.Groups,
		discovered: map[string]config.Group{},
		reverted:   map[config.Workload]revert{},
		skipped:    map[string]time.Time{},
		rolling:    map[string]bool{},
		queued:     map[string]bool{},
	}
	c.rebuildLocked()
	for _, g := range r.Config.Groups {
		p.Add(g.Images...)
	}
	p.OnChange = c.registryChanged
	r.OnRepin = c.repinned
	return c
}

// rebuildLocked recomputes groups and byObject from the configured and the
// discovered groups; c.mu is held (or c not shared yet).
func (c *Controller) rebuildLocked() {
	c.groups = map[string]config.Group{}
	c.byObject = map[types.NamespacedName][]string{}
	add := func(g config.Group) {
		c.groups[g.Name] = g
		for _, w := range g.Workloads() {
			key := types.NamespacedName{Namespace: w.Namespace, Name: string(w.Kind) + "/" + w.Name}
			c.byObject[key] = appendOnce(c.byObject[key], g.Name)
		}
	}
	for _, g := range c.configured {
		add(g)
	}
	for _, name := range slices.Sorted(maps.Keys(c.discovered)) {
		add(c.discovered[name])
	}
}

// allGroups returns every group, configured and discovered.
func (c *Controller) allGroups() []config.Group {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Collect(maps.Values(c.groups))
}

func (c *Controller) group(name string) (config.Group, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g, ok := c.groups[name]
	return g, ok
}

// Kinds lists the workload kinds the config names, in the table's order:
// the only ones watched, so RBAC for the others is not needed. Discovery
// watches every kind.
func Kinds(cfg *config.Config, d *Discovery) []*workload.Kind {
	if d != nil {
		return workload.Kinds()
	}
	used := map[string]bool{}
	for _, g := range cfg.Groups {
		for _, w := range g.Workloads() {
			used[w.Kind] = true
		}
	}
	var out []*workload.Kind
	for _, k := range workload.Kinds() {
		if used[k.Name] {
			out = append(out, k)
		}
	}
	return out
}

// Namespaces lists the namespaces the config names: the only ones watched.
func Namespaces(cfg *config.Config) []string {
	seen := map[string]bool{}
	var out []string
	for _, g := range cfg.Groups {
		for _, w := range g.Workloads() {
			if !seen[w.Namespace] {
				seen[w.Namespace] = true
				out = append(out, w.Namespace)
			}
		}
	}
	return out
}

// SetupWithManager registers the watches: the workload kinds the config
// names (in the configured namespaces only, see the manager's cache
// options), filtered to the named workloads, plus the poller's changes.
// With discovery every kind is watched; discovery's own passes run beside
// the controller (internal/operator/discoverer) and tell it the groups
// (SetDiscovered).
func (c *Controller) SetupWithManager(mgr ctrl.Manager, maxConcurrent int) error {
	preds := builder.WithPredicates(c.groupPredicates())
	b := ctrl.NewControllerManagedBy(mgr).Named("image-refresh").
		// Several managers in one process (tests) register the same name.
		WithOptions(controller.Options{
			MaxConcurrentReconciles: maxConcurrent, SkipNameValidation: ptrBool(true),
			// A pass ends within the tick deadline, as a tick does (R14):
			// another process waits no longer than that for an attempt
			// this one holds (C3).
			ReconciliationTimeout: c.Runner.Config.EffectiveTickTimeout(),
			RateLimiter:           failureBackoff[reconcile.Request](c.Resync),
		})
	for _, k := range Kinds(c.Runner.Config, c.discovery) {
		b = b.Watches(k.New(), c.groupHandler(), preds)
	}
	b = b.WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		c.mu.Lock()
		c.queue = q
		c.mu.Unlock()
		for _, g := range c.allGroups() {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: g.Name}})
		}
		return nil
	}))
	built, err := b.Build(c)
	if err != nil {
		return err
	}
	c.ctrl = built
	// The poller asks the registry only while this replica leads (C3).
	return mgr.Add(leaderRunnable(c.Poller.Run))
}

// failureBackoff is the workqueue's rate limiter: a group whose pass
// failed is retried after 0.5 s, doubling up to the resync interval (at
// most 5 minutes), and all groups together at no more than 10 passes a
// second after failures.
// Discovery's passes back off the same way (internal/operator/discoverer).
func failureBackoff[T comparable](resync time.Duration) workqueue.TypedRateLimiter[T] {
	ceiling := min(max(resync, time.Second), 5*time.Minute)
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[T](500*time.Millisecond, ceiling),
		&workqueue.TypedBucketRateLimiter[T]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
	)
}

// kindOf names an object's kind; "" for a type that is not a workload.
func kindOf(obj client.Object) string {
	if k, ok := workload.KindOf(obj); ok {
		return k.Name
	}
	return ""
}

// groupPredicates filter the events that start a group's pass.
func (c *Controller) groupPredicates() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return true },
		DeleteFunc:  func(e event.DeleteEvent) bool { return true },
		UpdateFunc:  c.interesting,
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// groupHandler maps a workload's event to the groups it belongs to.
func (c *Controller) groupHandler() handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return c.requestsFor(kindOf(o), o)
	})
}

func (c *Controller) requestsFor(kind string, o client.Object) []reconcile.Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	var reqs []reconcile.Request
	for _, g := range c.byObject[types.NamespacedName{Namespace: o.GetNamespace(), Name: kind + "/" + o.GetName()}] {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: g}})
	}
	return reqs
}

// Reconcile runs one pass over one group through the same engine as a
// tick, but never waits for a rollout (C6): it writes and returns, and the
// rollout's completion arrives as a watch event. A pass that failed returns
// its error, so the workqueue's rate limiter backs off; otherwise the group
// is run again at the resync interval, or when its attempt in flight
// reaches its deadline, whichever is first.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	// The group's pass lock, taken before the group is looked up: a
	// discovery pass that drops the group waits for this pass before it
	// lets the workloads go (D1), and a later pass finds the group gone.
	unlock := c.lockPass(req.Name)
	defer unlock()
	g, ok := c.group(req.Name)
	if !ok {
		return reconcile.Result{}, nil
	}
	defer c.passes.Add(1)
	// R4's skip streak counts intervals, not watch events.
	c.mu.Lock()
	last, counted := c.skipped[g.Name]
	c.mu.Unlock()
	uncounted := counted && time.Since(last) < c.Resync*9/10
	var elsewhere []string
	if c.Runner.Config.MaxConcurrentRollouts > 0 {
		c.slots.Lock()
		defer c.slots.Unlock()
		c.rollingOnce.Do(func() { c.readRolling(ctx) })
		c.mu.Lock()
		elsewhere = pass.Elsewhere(c.rolling, g.Name)
		c.mu.Unlock()
	}
	plan := c.Runner.Group(ctx, g, c.Poller, pass.GroupOptions{
		Fights: c.Fights.active(time.Now()), SkipUncounted: uncounted, NoWait: true, Reverted: c.reverts(g),
		RollingElsewhere: elsewhere,
	})
	if c.Runner.Config.MaxConcurrentRollouts > 0 {
		c.track(g.Name, plan)
	}
	if plan.SkipCounted {
		c.mu.Lock()
		c.skipped[g.Name] = time.Now()
		c.mu.Unlock()
	}
	for _, f := range plan.Findings {
		if f.Reason == refresh.ReasonRewriteFight && c.Runner.Metrics != nil && f.Target != nil {
			c.Runner.Metrics.Fights.WithLabelValues(g.Name, f.Image, orUnknown(f.Writer)).Inc()
		}
	}
	if plan.Failed != nil {
		return reconcile.Result{}, fmt.Errorf("group %s: %w", g.Name, plan.Failed)
	}
	c.wakeFollowers(g.Name, plan)
	after := c.Resync
	if !plan.WaitUntil.IsZero() {
		after = min(after, max(time.Until(plan.WaitUntil), 0)+time.Second)
	}
	if plan.Repin != nil && len(plan.Repin.Changes) == 0 && (len(c.Runner.Config.Followers(g.Name)) > 0 || (g.Promotion != nil && g.Promotion.Publish != nil)) {
		// P1: the pass confirmed a settled rollout (no event follows its
		// writes); the next one starts the soak clock the followers read.
		after = min(after, 100*time.Millisecond)
	}
	if plan.SoakPending {
		after = min(after, soakRecheck)
	}
	if !plan.WakeAt.IsZero() {
		// P1, R22: a hold that ends by itself (a soak, a digest's minimum
		// age) acts at its end, on the engine's clock.
		now := time.Now
		if c.Runner.Now != nil {
			now = c.Runner.Now
		}
		after = min(after, max(plan.WakeAt.Sub(now()), 0)+100*time.Millisecond)
	}
	if s := plan.Suspended; s != nil {
		// O1: a suspension's end acts at once, not at the next resync, and
		// one without an end becomes a finding on time. Both are on the
		// engine's clock.
		now := time.Now
		if c.Runner.Now != nil {
			now = c.Runner.Now
		}
		at := s.Until
		if at.IsZero() {
			at = s.Since.Add(refresh.SuspendedWithoutEndAfter)
		}
		if at.After(now()) {
			after = min(after, at.Sub(now())+100*time.Millisecond)
		}
	}
	return reconcile.Result{RequeueAfter: after}, nil
}

// readRolling reads, once after start, which groups have a rollout in
// flight from their anchors (R24), so that a restarted leader counts the
// rollouts a previous one left: the configured groups' anchors and, with
// discovery, those of the groups discovered by label. These are listed
// here from the API, as a tick lists them: this runs in the first pass,
// which may come before the first discovery pass. From then on each
// group's own pass keeps its entry (track). A list that fails is logged;
// the discovered groups are then counted from their own passes only.
func (c *Controller) readRolling(ctx context.Context) {
	rolling := c.Runner.RollingGroups(ctx)
	if d := c.discovery; d != nil {
		prefix := c.Runner.Config.AnnotationPrefix
		in, err := discovery.List(ctx, c.api, prefix, d.Namespaces)
		if err != nil {
			c.Runner.Log.Warn("maxConcurrentRollouts: cannot list the groups discovered by label to count their rollouts in flight; they count from their own passes",
				"error", err)
		} else {
			in.Configured = c.Runner.Config.Groups
			anchors := map[config.Workload]*workload.Object{}
			for _, obj := range in.Workloads {
				w := config.Workload{Kind: kindOf(obj), Namespace: obj.GetNamespace(), Name: obj.GetName()}
				anchors[w] = &workload.Object{Ref: w, UID: obj.GetUID(), Annotations: obj.GetAnnotations()}
			}
			for _, g := range discovery.Discover(in).Groups {
				a, ok := anchors[g.Anchor]
				if !ok {
					continue
				}
				// The current state: the copy's when a rollback rewound
				// the anchor's (R25).
				if v, err := c.Runner.States().Read(ctx, a); err == nil && c.Runner.Rolling(v.State) {
					rolling[g.Name] = true
				}
			}
		}
	}
	c.mu.Lock()
	maps.Copy(c.rolling, rolling)
	c.mu.Unlock()
}

// track keeps whether group has a rollout in flight after its pass (R24):
// the plan says so (Plan.InFlight) and the executor carried it out. When a
// rollout ends, every queued group is run again to take the free slot.
func (c *Controller) track(group string, plan *refresh.Plan) {
	inFlight := plan.Failed == nil && plan.InFlight
	c.mu.Lock()
	was := c.rolling[group]
	c.rolling[group] = inFlight
	c.queued[group] = plan.Queued
	var wake []string
	if was && !inFlight {
		for name, q := range c.queued {
			if q {
				wake = append(wake, name)
			}
		}
	}
	q := c.queue
	c.mu.Unlock()
	for _, name := range wake {
		if q != nil {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
		}
	}
}

// soakRecheck is how soon a leader whose pods do not all report its
// digest Ready yet is passed again (P1, Plan.SoakPending): pod events do not
// start a pass.
const soakRecheck = 2 * time.Second

// wakeFollowers runs the groups that follow group (P1) again when its pass
// changed its state (a soak clock started, stopped or moved; a rollback, a
// quarantine, a suspension) or re-imaged it: they read that state.
func (c *Controller) wakeFollowers(group string, plan *refresh.Plan) {
	if len(plan.Bookkeeping.Set) == 0 && plan.Repin == nil {
		return
	}
	followers := c.Runner.Config.Followers(group)
	c.mu.Lock()
	q := c.queue
	c.mu.Unlock()
	for _, name := range followers {
		if q != nil {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
		}
	}
}

// Passes counts the reconcile passes that completed, for tests and
// benchmarks that must know a pass ran before they check what it did not do.
func (c *Controller) Passes() int64 { return c.passes.Load() }

// reverts returns the writes seen on g's workloads (C6).
func (c *Controller) reverts(g config.Group) map[config.Workload]refresh.Revert {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out map[config.Workload]refresh.Revert
	for _, w := range g.Workloads() {
		if rv, ok := c.reverted[w]; ok && rv.BeforeSettled {
			if out == nil {
				out = map[config.Workload]refresh.Revert{}
			}
			out[w] = rv.Revert
		}
	}
	return out
}

// registryChanged enqueues every group that uses repository:tag key.
func (c *Controller) registryChanged(key string) {
	c.mu.Lock()
	q := c.queue
	c.mu.Unlock()
	if q == nil {
		return
	}
	for _, g := range c.allGroups() {
		for _, img := range g.Images {
			if poller.Key(img) == key {
				q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: g.Name}})
				break
			}
		}
	}
}

// observedRevert keeps a write that changed a workload's images: when it
// was seen, for image_refresh_revert_repin_seconds, and the object before
// and after it, for C6. image-refresh's own writes are not reverts.
func (c *Controller) observedRevert(oldObj, newObj client.Object) {
	w := config.Workload{Kind: kindOf(newObj), Namespace: newObj.GetNamespace(), Name: newObj.GetName()}
	rv := revert{seen: time.Now(), Revert: refresh.Revert{Before: workload.Images(oldObj), After: workload.Images(newObj)}}
	rv.BeforeSettled = settled(oldObj) && !ownWrite(oldObj, newObj)
	c.mu.Lock()
	c.reverted[w] = rv
	c.mu.Unlock()
}

// repinned is called right after a re-pin write landed.
func (c *Controller) repinned(group string, wc refresh.WorkloadChange) {
	now := time.Now()
	c.mu.Lock()
	rv, ok := c.reverted[wc.Workload]
	delete(c.reverted, wc.Workload)
	c.mu.Unlock()
	for _, ic := range wc.Images {
		if ic.Cause != refresh.CauseRevert {
			continue
		}
		t := config.Target{Kind: wc.Workload.Kind, Namespace: wc.Workload.Namespace, Name: wc.Workload.Name, Container: ic.Container}
		// The field manager, not its display name: the engine tells a
		// GitOps tool's fight by it (O2), and it labels the fight metric.
		c.Fights.repinned(t, ic.Writer, now)
		if ok && c.Runner.Metrics != nil {
			c.Runner.Metrics.RevertRepin.Observe(now.Sub(rv.seen).Seconds())
		}
	}
}

func (c *Controller) keys() state.Keys { return state.Keys{Prefix: c.Runner.Config.AnnotationPrefix} }

func (c *Controller) isStateKey(k string) bool {
	return strings.HasPrefix(k, c.Runner.Config.AnnotationPrefix+"/")
}

func orUnknown(writer string) string {
	if writer == "" {
		return "unknown"
	}
	return writer
}

func appendOnce(list []string, s string) []string {
	for _, v := range list {
		if v == s {
			return list
		}
	}
	return append(list, s)
}

// leaderRunnable runs fn only on the elected leader.
type leaderRunnable func(context.Context)

func (f leaderRunnable) Start(ctx context.Context) error { f(ctx); return nil }
func (leaderRunnable) NeedLeaderElection() bool          { return true }

func ptrBool(b bool) *bool { return &b }
