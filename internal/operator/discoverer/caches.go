package discoverer

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/image-refresh/image-refresh/internal/workload"
)

// Caches holds an informer cache per labelled namespace that the
// manager's cache does not cover whole, and routes the reads of the
// workloads between them (a client.Reader): the manager's cache is
// configured once, at start, and holds only the labelled workloads (a
// label selector) and the configured namespaces; a namespace labelled
// later needs every workload of it, which its own cache, started when the
// label is seen and stopped when it goes, provides.
type Caches struct {
	rc         *rest.Config
	scheme     *runtime.Scheme
	mapper     meta.RESTMapper
	httpClient *http.Client
	main       cache.Cache
	api        client.Reader
	covered    map[string]bool // namespaces the manager's cache holds whole (configured)
	strip      func(any) (any, error)
	// watch adds the group controller's watches on a new cache; trigger
	// adds the handlers that start a discovery pass (the Discoverer's).
	watch   func(c cache.Cache) error
	trigger func(ctx context.Context, c cache.Cache) error

	mu     sync.Mutex
	ctx    context.Context
	caches map[string]*namespaceCache
}

type namespaceCache struct {
	cache  cache.Cache
	cancel context.CancelFunc
	// watched: the group controller's watches are on it (added once this
	// replica leads; a standby's discovery reads it without them).
	watched bool
}

// NewCaches builds the router of mgr's workload reads (rc: mgr's REST
// config). prefix is the config's annotation prefix, whose keys the
// caches keep of the workloads' labels and annotations
// (workload.StripWorkload); covered are the namespaces the manager's cache
// holds whole (the configured ones); watch adds the group controller's watches on the
// cache of a labelled namespace, once this replica leads.
func NewCaches(rc *rest.Config, mgr manager.Manager, prefix string, covered []string, watch func(cache.Cache) error) *Caches {
	n := &Caches{
		strip: workload.StripWorkload(prefix),
		rc:    rc, scheme: mgr.GetScheme(), mapper: mgr.GetRESTMapper(), httpClient: mgr.GetHTTPClient(),
		main: mgr.GetCache(), api: mgr.GetAPIReader(), covered: map[string]bool{},
		watch: watch, caches: map[string]*namespaceCache{},
	}
	for _, ns := range covered {
		n.covered[ns] = true
	}
	return n
}

// start keeps the context the namespace caches run in; the returned stop
// ends them (when the manager stops).
func (n *Caches) start(ctx context.Context) (stop func()) {
	n.mu.Lock()
	n.ctx = ctx
	n.mu.Unlock()
	return func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		for ns, c := range n.caches {
			c.cancel()
			delete(n.caches, ns)
		}
	}
}

// sync starts a cache for each labelled namespace not covered yet, waits
// for it to sync, and stops the caches of namespaces no longer labelled.
// The group controller's watches go on a cache only once this replica
// leads. One pass calls it at a time (the Discoverer's loop); n.mu guards
// the map against the reads (reader), and is not held while a cache
// starts or syncs, so that a read never waits for a namespace's list.
func (n *Caches) sync(ctx context.Context, labelled map[string]bool, leading bool) error {
	n.mu.Lock()
	base := n.ctx
	for ns, c := range n.caches {
		if !labelled[ns] {
			c.cancel()
			delete(n.caches, ns)
		}
	}
	n.mu.Unlock()
	if base == nil {
		return fmt.Errorf("namespace caches not started")
	}
	for _, ns := range slices.Sorted(maps.Keys(labelled)) {
		n.mu.Lock()
		nc := n.caches[ns]
		n.mu.Unlock()
		if nc != nil && leading && !nc.watched {
			if err := n.watch(nc.cache); err != nil {
				return fmt.Errorf("watch namespace %s: %w", ns, err)
			}
			n.mu.Lock()
			nc.watched = true
			n.mu.Unlock()
		}
		if n.covered[ns] || nc != nil {
			continue
		}
		c, err := cache.New(n.rc, cache.Options{
			Scheme: n.scheme, Mapper: n.mapper, HTTPClient: n.httpClient,
			DefaultNamespaces: map[string]cache.Config{ns: {}},
			ByObject:          map[client.Object]cache.ByObject{&corev1.Pod{}: {Transform: workload.StripPod}},
			DefaultTransform:  n.strip, // the workloads: what the rules read
		})
		if err != nil {
			return fmt.Errorf("cache of namespace %s: %w", ns, err)
		}
		cctx, cancel := context.WithCancel(base)
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
		// A cache added after stop ran is stopped already: its context is
		// base's.
		n.mu.Lock()
		n.caches[ns] = &namespaceCache{cache: c, cancel: cancel, watched: leading}
		n.mu.Unlock()
	}
	return nil
}

// reader routes a read by namespace: to the cache of a labelled namespace,
// to the manager's cache for the configured namespaces and the labelled
// workloads, and pods outside both to the API (one LIST per workload per
// pass, as in a tick).
func (n *Caches) reader(namespace string, obj runtime.Object) client.Reader {
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
func (n *Caches) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return n.reader(key.Namespace, obj).Get(ctx, key, obj, opts...)
}

// List implements client.Reader.
func (n *Caches) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	o := (&client.ListOptions{}).ApplyOptions(opts)
	return n.reader(o.Namespace, list).List(ctx, list, opts...)
}
