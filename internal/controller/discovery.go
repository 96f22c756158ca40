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

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/discovery"
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
	// watch adds the controller's watches on a new cache.
	watch func(c cache.Cache) error

	mu     sync.Mutex
	ctx    context.Context
	caches map[string]*namespaceCache
}

type namespaceCache struct {
	cache  cache.Cache
	cancel context.CancelFunc
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

func (n *namespaceCaches) NeedLeaderElection() bool { return true }

// sync starts a cache for each labelled namespace not covered yet, waits
// for it to sync, and stops the caches of namespaces no longer labelled.
func (n *namespaceCaches) sync(ctx context.Context, labelled map[string]bool) error {
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
		if err := n.watch(c); err != nil {
			cancel()
			return fmt.Errorf("watch namespace %s: %w", ns, err)
		}
		if !c.WaitForCacheSync(ctx) {
			cancel()
			return fmt.Errorf("cache of namespace %s did not sync", ns)
		}
		n.caches[ns] = &namespaceCache{cache: c, cancel: cancel}
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
// new and changed groups are reconciled, groups gone are let go.
func (c *Controller) discoverPass(ctx context.Context) error {
	d := c.discovery
	prefix := c.Runner.Config.AnnotationPrefix
	// The namespaces first, from the manager's cache (label-selected).
	in, err := discovery.List(ctx, d.caches.main, prefix, d.scope)
	if err != nil {
		return err
	}
	if err := d.caches.sync(ctx, in.Namespaces); err != nil {
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
	if c.OnGroups != nil {
		slices.SortFunc(all, func(a, b config.Group) int { return strings.Compare(a.Name, b.Name) })
		c.OnGroups(all)
	}
	managed := map[config.Workload]bool{}
	for _, g := range all {
		for _, w := range g.Workloads() {
			managed[w] = true
		}
	}
	for name, g := range old {
		if _, still := c.discovered[name]; still {
			continue
		}
		for _, w := range g.Workloads() {
			if !managed[w] {
				c.letGo(ctx, name, w)
			}
		}
	}
	return nil
}

// letGo removes the state annotations of a workload that is no longer
// managed: its label or its namespace's was removed. Its pin stays, so it
// keeps running what it runs (D1).
func (c *Controller) letGo(ctx context.Context, group string, w config.Workload) {
	log := c.Runner.Log.With("group", group, "workload", w.String())
	obj, err := c.Runner.Workloads.Get(ctx, ref(w))
	if apierrors.IsNotFound(err) {
		log.Info("let go: the workload is gone")
		return
	}
	if err != nil {
		log.Warn("let go: cannot read the workload to remove its state annotations; remove them by hand", "error", err)
		return
	}
	keys := discovery.Keys{Prefix: c.Runner.Config.AnnotationPrefix}
	expect, set := map[string]*string{}, map[string]*string{}
	var removed []string
	for k, v := range obj.Annotations {
		if !strings.HasPrefix(k, c.Runner.Config.AnnotationPrefix+"/") || k == keys.Group() || k == keys.IgnoreContainers() || k == keys.Enabled() {
			continue
		}
		expect[k], set[k] = &v, nil
		removed = append(removed, k)
	}
	if len(set) == 0 {
		log.Info("let go: no longer labelled; its pin stays, it had no state annotations")
		return
	}
	if _, err := c.Runner.Workloads.UpdateAnnotations(ctx, ref(w), expect, set); err != nil {
		log.Warn("let go: could not remove the state annotations; remove them by hand", "annotations", strings.Join(removed, ","), "error", err)
		return
	}
	slices.Sort(removed)
	log.Info("let go: no longer labelled; its pin stays and its state annotations were removed", "annotations", strings.Join(removed, ","))
}

func ref(w config.Workload) workload.Ref {
	return workload.Ref{Kind: w.Kind, Namespace: w.Namespace, Name: w.Name}
}

// discoveryChanged is the predicate of the watches as seen by discovery: a
// change of what makes a workload managed, or of its containers.
func (c *Controller) discoveryChanged(oldObj, newObj client.Object) bool {
	keys := discovery.Keys{Prefix: c.Runner.Config.AnnotationPrefix}
	for _, k := range []string{keys.Enabled(), keys.Group(), keys.IgnoreContainers()} {
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
