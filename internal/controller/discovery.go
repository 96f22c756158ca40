package controller

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/discovery"
	"github.com/image-refresh/image-refresh/internal/poller"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// Discovery configures `run`'s discovery of labelled workloads (SPEC D1).
type Discovery struct {
	// Namespaces limits discovery to these namespaces; empty: the cluster.
	Namespaces []string
}

// discoverRequest is the workqueue key of a discovery pass. A colon is in
// no group name, configured (a DNS-1123 label) or discovered.
var discoverRequest = reconcile.Request{NamespacedName: types.NamespacedName{Name: ":discover"}}

// namespaceCaches holds an informer cache per labelled namespace that the
// manager's cache does not cover whole: the manager's cache is configured
// once, at start, and holds only the labelled workloads (a label selector)
// and the configured namespaces; a namespace labelled later needs every
// workload of it, which this cache, started when the label is seen and
// stopped when it goes, provides.
type namespaceCaches struct {
	rc         *rest.Config
	scheme     *runtime.Scheme
	mapper     meta.RESTMapper
	httpClient *http.Client
	main       cache.Cache
	api        client.Reader
	covered    map[string]bool // namespaces the manager's cache holds whole (configured)
	// watch adds the controller's watches on a new cache; trigger adds
	// the handlers that start a standby's discovery pass.
	watch   func(c cache.Cache) error
	trigger func(ctx context.Context, c cache.Cache) error

	mu     sync.Mutex
	ctx    context.Context
	caches map[string]*namespaceCache
}

type namespaceCache struct {
	cache  cache.Cache
	cancel context.CancelFunc
	// watched: the controller's watches are on it (added once this
	// replica leads; a standby's discovery reads it without them).
	watched bool
}

// Start keeps the context the namespace caches run in; it ends them when
// the manager stops.
func (n *namespaceCaches) Start(ctx context.Context) error {
	n.mu.Lock()
	n.ctx = ctx
	n.mu.Unlock()
	<-ctx.Done()
	n.mu.Lock()
	defer n.mu.Unlock()
	for ns, c := range n.caches {
		c.cancel()
		delete(n.caches, ns)
	}
	return nil
}

// NeedLeaderElection is false: every replica's discovery reads the
// labelled namespaces, so that a standby's webhook knows the discovered
// groups too (B1).
func (n *namespaceCaches) NeedLeaderElection() bool { return false }

// sync starts a cache for each labelled namespace not covered yet, waits
// for it to sync, and stops the caches of namespaces no longer labelled.
// The controller's watches go on a cache only once this replica leads.
func (n *namespaceCaches) sync(ctx context.Context, labelled map[string]bool, leading bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ctx == nil {
		return fmt.Errorf("namespace caches not started")
	}
	for ns, c := range n.caches {
		if !labelled[ns] {
			c.cancel()
			delete(n.caches, ns)
		}
	}
	for _, ns := range slices.Sorted(maps.Keys(labelled)) {
		if nc := n.caches[ns]; nc != nil && leading && !nc.watched {
			if err := n.watch(nc.cache); err != nil {
				return fmt.Errorf("watch namespace %s: %w", ns, err)
			}
			nc.watched = true
		}
		if n.covered[ns] || n.caches[ns] != nil {
			continue
		}
		c, err := cache.New(n.rc, cache.Options{
			Scheme: n.scheme, Mapper: n.mapper, HTTPClient: n.httpClient,
			DefaultNamespaces: map[string]cache.Config{ns: {}},
			ByObject:          map[client.Object]cache.ByObject{&corev1.Pod{}: {Transform: workload.StripPod}},
		})
		if err != nil {
			return fmt.Errorf("cache of namespace %s: %w", ns, err)
		}
		cctx, cancel := context.WithCancel(n.ctx)
		go func() { _ = c.Start(cctx) }()
		if leading {
			if err := n.watch(c); err != nil {
				cancel()
				return fmt.Errorf("watch namespace %s: %w", ns, err)
			}
		}
		if n.trigger != nil {
			if err := n.trigger(ctx, c); err != nil {
				cancel()
				return fmt.Errorf("watch namespace %s for discovery: %w", ns, err)
			}
		}
		if !c.WaitForCacheSync(ctx) {
			cancel()
			return fmt.Errorf("cache of namespace %s did not sync", ns)
		}
		n.caches[ns] = &namespaceCache{cache: c, cancel: cancel, watched: leading}
	}
	return nil
}

// reader routes a read by namespace: to the cache of a labelled namespace,
// to the manager's cache for the configured namespaces and the labelled
// workloads, and pods outside both to the API (one LIST per workload per
// pass, as in a tick).
func (n *namespaceCaches) reader(namespace string, obj runtime.Object) client.Reader {
	n.mu.Lock()
	c := n.caches[namespace]
	n.mu.Unlock()
	switch {
	case c != nil:
		return c.cache
	case n.covered[namespace]:
		return n.main
	}
	if _, pod := obj.(*corev1.PodList); pod {
		return n.api
	}
	if _, pod := obj.(*corev1.Pod); pod {
		return n.api
	}
	return n.main
}

// Get implements client.Reader.
func (n *namespaceCaches) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return n.reader(key.Namespace, obj).Get(ctx, key, obj, opts...)
}

// List implements client.Reader.
func (n *namespaceCaches) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	o := (&client.ListOptions{}).ApplyOptions(opts)
	return n.reader(o.Namespace, list).List(ctx, list, opts...)
}

// discoverPass lists the labelled objects from the caches, starts or stops
// the caches of labelled namespaces, and replaces the discovered groups:
// new and changed groups are reconciled, images no group uses any more are
// no longer polled, and the webhook is told every group (OnGroups). It runs
// on every replica, so that a standby's webhook pins discovered targets
// too (B1); only the leader writes: it marks the anchors of discovered
// groups and lets go of the marked workloads no longer labelled (D1), with
// the same code as `tick` (discovery.Adoption).
func (c *Controller) discoverPass(ctx context.Context) error {
	d := c.discovery
	d.passMu.Lock()
	defer d.passMu.Unlock()
	prefix := c.Runner.Config.AnnotationPrefix
	leading := c.leading()
	// The namespaces first, from the manager's cache (label-selected).
	in, err := discovery.List(ctx, d.caches.main, prefix, d.scope)
	if err != nil {
		return err
	}
	if err := d.caches.sync(ctx, in.Namespaces, leading); err != nil {
		return err
	}
	// Then every workload, through the namespace caches as well.
	in, err = discovery.List(ctx, d.caches, prefix, d.scope)
	if err != nil {
		return err
	}
	in.Configured = c.Runner.Config.Groups
	res := discovery.Discover(in)
	c.mu.Lock()
	old := c.discovered
	c.discovered = map[string]config.Group{}
	for _, g := range res.Groups {
		c.discovered[g.Name] = g
	}
	c.rebuildLocked()
	q := c.queue
	c.mu.Unlock()
	for _, n := range res.Notes {
		if !d.noted[n.String()] {
			d.noted[n.String()] = true
			c.Runner.Log.Info("discovery: "+n.Msg, "workload", n.Workload.String(), "container", n.Container)
		}
	}
	for _, g := range res.Groups {
		c.Poller.Add(g.Images...)
		if prev, ok := old[g.Name]; !ok || !reflect.DeepEqual(prev, g) {
			if !ok {
				c.Runner.Log.Info("discovered a group", "group", g.Name, "anchor", g.Anchor.String(), "images", len(g.Images))
			}
			if q != nil {
				q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: g.Name}})
			}
		}
	}
	all := c.allGroups()
	slices.SortFunc(all, func(a, b config.Group) int { return strings.Compare(a.Name, b.Name) })
	c.Poller.Remove(unused(old, all)...)
	if c.OnGroups != nil {
		c.OnGroups(all)
	}
	kept := map[string]bool{}
	for _, g := range all {
		kept[g.Name] = true
	}
	if !leading {
		// Groups dropped while this replica does not lead are not let go
		// here: it sweeps again once it leads. It runs no pass, so their
		// gauges can go at once.
		d.swept = false
		for name := range old {
			if !kept[name] {
				c.forgetMetrics(name)
			}
		}
		return nil
	}
	// A pass of a group dropped here that is still running could write
	// the state back after the let-go, and its gauges: wait for it
	// (lockPass); a later pass finds the group gone.
	for name := range old {
		if !kept[name] {
			c.lockPass(name)()
			c.forgetMetrics(name)
		}
	}
	a := discovery.Adoption{Prefix: prefix, Workloads: c.Runner.Workloads, API: d.caches.api, Scope: d.scope, Log: c.Runner.Log}
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

// unused returns the images of the old discovered groups whose
// repository:tag no group of all uses any more: the poller stops asking
// for them (C2).
func unused(old map[string]config.Group, all []config.Group) []config.Image {
	used := map[string]bool{}
	for _, g := range all {
		for _, img := range g.Images {
			used[poller.Key(img)] = true
		}
	}
	var out []config.Image
	for _, name := range slices.Sorted(maps.Keys(old)) {
		for _, img := range old[name].Images {
			if k := poller.Key(img); !used[k] {
				used[k] = true // once
				out = append(out, img)
			}
		}
	}
	return out
}

// forgetMetrics deletes the gauges of a group no longer managed (D2).
func (c *Controller) forgetMetrics(group string) {
	if c.Runner.Metrics != nil {
		c.Runner.Metrics.ForgetGroup(group)
	}
}

// lockPass takes the pass lock of a group and returns its unlock.
func (c *Controller) lockPass(group string) func() {
	m, _ := c.passLocks.LoadOrStore(group, &sync.Mutex{})
	mu := m.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// leading reports whether this replica is the elected leader (always, with
// leader election off).
func (c *Controller) leading() bool {
	if c.elected == nil {
		return true
	}
	select {
	case <-c.elected:
		return true
	default:
		return false
	}
}

// discoveryChanged is the predicate of the watches as seen by discovery: a
// change of what makes a workload managed, or of its containers.
func (c *Controller) discoveryChanged(oldObj, newObj client.Object) bool {
	for _, k := range (state.Keys{Prefix: c.Runner.Config.AnnotationPrefix}).Operator() {
		if oldObj.GetLabels()[k] != newObj.GetLabels()[k] || oldObj.GetAnnotations()[k] != newObj.GetAnnotations()[k] {
			return true
		}
	}
	if _, ns := newObj.(*corev1.Namespace); ns {
		return false
	}
	o, n := images(oldObj), images(newObj)
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

// discoveryHandler enqueues a discovery pass for the events that can change
// what is managed.
func (c *Controller) discoveryHandler() handler.EventHandler {
	return handler.Funcs{
		CreateFunc: func(_ context.Context, _ event.CreateEvent, q workqueueT) { q.Add(discoverRequest) },
		DeleteFunc: func(_ context.Context, _ event.DeleteEvent, q workqueueT) { q.Add(discoverRequest) },
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueueT) {
			if c.discoveryChanged(e.ObjectOld, e.ObjectNew) {
				q.Add(discoverRequest)
			}
		},
	}
}

type workqueueT = workqueue.TypedRateLimitingInterface[reconcile.Request]

// discoveryState is the controller's part of discovery.
type discoveryState struct {
	scope  []string
	caches *namespaceCaches
	noted  map[string]bool // notes logged once
	// passMu orders the passes of the leader's workqueue and of the
	// standby loop around a change of leadership.
	passMu sync.Mutex
	// wake starts a standby's pass (standbyDiscovery).
	wake chan struct{}
	// swept: this replica, leading, has listed every workload in scope
	// once to let go of those unlabelled while no leader watched (D1);
	// from then on it lets go of the workloads of the groups it drops,
	// which costs no API request in a steady state (C6).
	swept bool
}

// standbyDiscovery runs the discovery passes of a replica that does not
// lead: the leader's come from the controller's workqueue, which runs only
// there. Without them a standby's webhook would know only the configured
// groups (B1, C3). It runs on every replica and passes only while this one
// does not lead; the passes write nothing.
type standbyDiscovery struct {
	c     *Controller
	cache cache.Cache
}

func (standbyDiscovery) NeedLeaderElection() bool { return false }

// Start adds the handlers that wake it to the manager cache's informers,
// then runs a pass after each wake while this replica is a standby.
func (s standbyDiscovery) Start(ctx context.Context) error {
	c := s.c
	if err := c.discoveryTrigger(ctx, s.cache, &corev1.Namespace{}); err != nil {
		return err
	}
	if !s.cache.WaitForCacheSync(ctx) {
		return nil // stopping
	}
	c.wakeDiscovery()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.discovery.wake:
		}
		if c.leading() {
			continue // the workqueue's passes
		}
		if err := c.discoverPass(ctx); err != nil {
			c.Runner.Log.Warn("discovery on a standby failed; its webhook may miss a discovered group until the next pass", "error", err)
			time.AfterFunc(5*time.Second, c.wakeDiscovery)
		}
	}
}

func (c *Controller) wakeDiscovery() {
	select {
	case c.discovery.wake <- struct{}{}:
	default: // a pass is pending already
	}
}

// discoveryTrigger wakes standbyDiscovery on the events of cc's informers
// (the workload kinds, and extra) that can change what is managed.
func (c *Controller) discoveryTrigger(ctx context.Context, cc cache.Cache, extra ...client.Object) error {
	objs := extra
	for _, k := range workload.Kinds() {
		objs = append(objs, k.New())
	}
	h := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.wakeDiscovery() },
		DeleteFunc: func(any) { c.wakeDiscovery() },
		UpdateFunc: func(o, n any) {
			oo, ok1 := o.(client.Object)
			no, ok2 := n.(client.Object)
			if !ok1 || !ok2 || c.discoveryChanged(oo, no) {
				c.wakeDiscovery()
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

// watchNamespaceCache adds the controller's watches on the cache of a
// labelled namespace: the same handlers as on the manager's cache.
func (c *Controller) watchNamespaceCache(nc cache.Cache) error {
	for _, k := range workload.Kinds() {
		if err := c.ctrl.Watch(source.Kind(nc, k.New(), c.groupHandler(), c.groupPredicates())); err != nil {
			return err
		}
		if err := c.ctrl.Watch(source.Kind(nc, k.New(), c.discoveryHandler())); err != nil {
			return err
		}
	}
	return nil
}
