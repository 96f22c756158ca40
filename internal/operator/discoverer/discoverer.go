// Package discoverer is `run`'s watcher of the discovery label (D1): a runnable
// of its own, on every replica, that lists the labelled workloads from the
// informer caches, runs internal/discovery's pure Discover over them and
// tells the group controller which groups there are; the caches of the
// labelled namespaces (Caches) live beside it. The group controller only
// sees groups come and go (Groups). Only the leader writes: it marks the
// anchors of discovered groups and lets go of the marked workloads no
// longer labelled, with the same code as `tick` (discovery.Adoption).
package discoverer

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/discovery"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/statestore"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// Groups is the group controller as discovery sees it.
type Groups interface {
	// SetDiscovered replaces the groups discovered by label, sorted by
	// name (D1), and returns the ones it replaced, by name, and every
	// group, configured and discovered, sorted by name. It returns once
	// the groups dropped are no longer passed (their pass in flight
	// ended), so that a let-go is not written back.
	SetDiscovered(groups []config.Group) (old map[string]config.Group, all []config.Group)
}

// Options configure a Discoverer.
type Options struct {
	// Prefix is the config's annotationPrefix; Configured its groups,
	// which win for the workloads they name (D2).
	Prefix     string
	Configured []config.Group
	// Scope limits discovery to these namespaces; empty: the cluster.
	Scope []string
	// Workloads writes the leader's marks and let-gos (D1).
	Workloads *workload.Client
	// State writes the marks as state and deletes a let-go workload's
	// copy of its state (R25).
	State *statestore.Store
	Log   *slog.Logger
	// Elected is closed once this replica leads (nil: it always does).
	Elected <-chan struct{}
	// Resync re-runs the leader's discovery at least this often; Timeout
	// bounds a pass, as the tick deadline bounds a group's (R14).
	Resync, Timeout time.Duration
	// Backoff spaces the leader's passes after a failed one.
	Backoff workqueue.TypedRateLimiter[struct{}]
}

// standbyRetry is how soon a standby's failed pass is run again.
const standbyRetry = 5 * time.Second

// Discoverer runs the discovery passes of `run`. It runs on every
// replica, so that a standby's webhook knows the discovered groups too
// (B1, C3); its passes write nothing while this replica does not lead.
type Discoverer struct {
	o      Options
	caches *Caches
	groups Groups
	// queue holds the one pending pass: a wake while a pass runs runs
	// another after it.
	queue workqueue.TypedRateLimitingInterface[struct{}]
	noted map[string]bool // notes logged once
	// swept: this replica, leading, has listed every workload in scope
	// once to let go of those unlabelled while no leader watched (D1);
	// from then on it lets go of the workloads of the groups it drops,
	// which costs no API request in a steady state (C6).
	swept bool
}

// New builds the Discoverer of the workloads caches reads; its passes
// tell groups. It adds its wake-up handlers to the caches it starts.
func New(caches *Caches, groups Groups, o Options) *Discoverer {
	if o.Backoff == nil {
		o.Backoff = workqueue.DefaultTypedControllerRateLimiter[struct{}]()
	}
	d := &Discoverer{
		o: o, caches: caches, groups: groups, noted: map[string]bool{},
		queue: workqueue.NewTypedRateLimitingQueue(o.Backoff),
	}
	caches.trigger = func(ctx context.Context, cc cache.Cache) error { return d.trigger(ctx, cc) }
	return d
}

// NeedLeaderElection is false: every replica's discovery reads the
// labelled namespaces, so that a standby's webhook knows the discovered
// groups too (B1).
func (*Discoverer) NeedLeaderElection() bool { return false }

// Start adds the handlers that wake it to the manager cache's informers,
// runs a pass once they synced, then one after each wake, one more when
// this replica starts to lead, and, leading, at least every Resync. The
// caches of the labelled namespaces run until it returns.
func (d *Discoverer) Start(ctx context.Context) error {
	stop := d.caches.start(ctx)
	defer stop()
	go func() {
		<-ctx.Done()
		d.queue.ShutDown()
	}()
	if err := d.trigger(ctx, d.caches.main, &corev1.Namespace{}); err != nil {
		return err
	}
	if !d.caches.main.WaitForCacheSync(ctx) {
		return nil // stopping
	}
	d.wake()
	if d.o.Elected != nil {
		go func() {
			select {
			case <-d.o.Elected:
				d.wake() // the first pass as the leader: it sweeps (D1)
			case <-ctx.Done():
			}
		}()
	}
	for {
		key, shutdown := d.queue.Get()
		if shutdown {
			return nil
		}
		d.run(ctx, key)
		d.queue.Done(key)
	}
}

// run runs one pass and schedules the next: the leader's failed pass is
// retried with backoff and a passed one after Resync; a standby's failed
// pass is retried after standbyRetry.
func (d *Discoverer) run(ctx context.Context, key struct{}) {
	leading := d.leading()
	pctx, cancel := ctx, context.CancelFunc(func() {})
	if d.o.Timeout > 0 {
		pctx, cancel = context.WithTimeout(ctx, d.o.Timeout)
	}
	err := d.pass(pctx, leading)
	cancel()
	switch {
	case ctx.Err() != nil:
		return // stopping
	case err == nil:
		d.queue.Forget(key)
		if leading && d.o.Resync > 0 {
			d.queue.AddAfter(key, d.o.Resync)
		}
	case leading:
		d.o.Log.Error("discovery failed; it runs again after a backoff", "error", err)
		d.queue.AddRateLimited(key)
	default:
		d.o.Log.Warn("discovery on a standby failed; its webhook may miss a discovered group until the next pass", "error", err)
		d.queue.AddAfter(key, standbyRetry)
	}
}

// pass lists the labelled objects from the caches, starts or stops the
// caches of labelled namespaces, and replaces the discovered groups (the
// group controller reconciles new and changed groups, stops polling the
// images no group uses any more and tells the webhook every group). Only
// the leader writes: it marks the anchors of discovered groups and lets go
// of the marked workloads no longer labelled (D1).
func (d *Discoverer) pass(ctx context.Context, leading bool) error {
	// The namespaces first, from the manager's cache (label-selected).
	in, err := discovery.List(ctx, d.caches.main, d.o.Prefix, d.o.Scope)
	if err != nil {
		return err
	}
	if err := d.caches.sync(ctx, in.Namespaces, leading); err != nil {
		return err
	}
	// Then every workload, through the namespace caches as well.
	in, err = discovery.List(ctx, d.caches, d.o.Prefix, d.o.Scope)
	if err != nil {
		return err
	}
	in.Configured = d.o.Configured
	res := discovery.Discover(in)
	for _, n := range res.Notes {
		if !d.noted[n.String()] {
			d.noted[n.String()] = true
			d.o.Log.Info("discovery: "+n.Msg, "workload", n.Workload.String(), "container", n.Container)
		}
	}
	old, all := d.groups.SetDiscovered(res.Groups)
	if !leading {
		// Groups dropped while this replica does not lead are not let go
		// here: it sweeps again once it leads.
		d.swept = false
		return nil
	}
	a := discovery.Adoption{Prefix: d.o.Prefix, Workloads: d.o.Workloads, State: d.o.State, API: d.caches.api, Scope: d.o.Scope, Log: d.o.Log}
	a.Mark(ctx, in, res)
	if !d.swept {
		if _, err := a.LetGoUnlabelled(ctx, res.Managed, all); err != nil {
			return err
		}
		d.swept = true
		return nil
	}
	for _, w := range dropped(old, res.Managed, all) {
		a.LetGo(ctx, w)
	}
	return nil
}

// dropped returns the workloads of the old discovered groups that are no
// longer labelled in (managed) and that no group of all names (the
// configured groups win, D2): the workloads to let go (D1). Sorted.
func dropped(old map[string]config.Group, managed map[config.Workload]bool, all []config.Group) []config.Workload {
	named := map[config.Workload]bool{}
	for _, g := range all {
		for _, w := range g.Workloads() {
			named[w] = true
		}
	}
	var out []config.Workload
	for _, name := range slices.Sorted(maps.Keys(old)) {
		for _, w := range old[name].Workloads() {
			if !managed[w] && !named[w] && !slices.Contains(out, w) {
				out = append(out, w)
			}
		}
	}
	slices.SortFunc(out, func(a, b config.Workload) int { return strings.Compare(a.String(), b.String()) })
	return out
}

// leading reports whether this replica is the elected leader (always, with
// leader election off).
func (d *Discoverer) leading() bool {
	if d.o.Elected == nil {
		return true
	}
	select {
	case <-d.o.Elected:
		return true
	default:
		return false
	}
}

// wake asks for a pass; one pending is enough.
func (d *Discoverer) wake() { d.queue.Add(struct{}{}) }

// trigger wakes the Discoverer on the events of cc's informers (the
// workload kinds, and extra) that can change what is managed.
func (d *Discoverer) trigger(ctx context.Context, cc cache.Cache, extra ...client.Object) error {
	objs := extra
	for _, k := range workload.Kinds() {
		objs = append(objs, k.New())
	}
	h := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { d.wake() },
		DeleteFunc: func(any) { d.wake() },
		UpdateFunc: func(o, n any) {
			oo, ok1 := o.(client.Object)
			no, ok2 := n.(client.Object)
			if !ok1 || !ok2 || changed(d.o.Prefix, oo, no) {
				d.wake()
			}
		},
	}
	for _, obj := range objs {
		inf, err := cc.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("watch %T for discovery: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			return fmt.Errorf("watch %T for discovery: %w", obj, err)
		}
	}
	return nil
}

// changed is the predicate of the watches as seen by discovery: a change
// of what makes a workload managed (the operator's keys under prefix), or
// of its containers.
func changed(prefix string, oldObj, newObj client.Object) bool {
	for _, k := range (state.Keys{Prefix: prefix}).Operator() {
		if oldObj.GetLabels()[k] != newObj.GetLabels()[k] || oldObj.GetAnnotations()[k] != newObj.GetAnnotations()[k] {
			return true
		}
	}
	if _, ns := newObj.(*corev1.Namespace); ns {
		return false
	}
	o, n := workload.Images(oldObj), workload.Images(newObj)
	if len(o) != len(n) {
		return true
	}
	for name, img := range n {
		before, ok := o[name]
		if !ok {
			return true
		}
		// A pin of the same repository:tag is not a change of what is
		// discovered (the tag survives the pin, D1).
		if strings.SplitN(before, "@", 2)[0] != strings.SplitN(img, "@", 2)[0] {
			return true
		}
	}
	return false
}
