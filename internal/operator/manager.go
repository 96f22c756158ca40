package operator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/discovery"
	"github.com/image-refresh/image-refresh/internal/operator/discoverer"
	"github.com/image-refresh/image-refresh/internal/pass"
	"github.com/image-refresh/image-refresh/internal/poller"
	"github.com/image-refresh/image-refresh/internal/registry"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/statestore"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// The defaults of `run`'s flags that shape the controller; the benchmarks
// build their controller with the same.
const (
	DefaultPollInterval   = 5 * time.Minute
	DefaultPollJitter     = 0.1
	DefaultWorkers        = 4
	DefaultFightMaxRounds = 3
	DefaultFightWindow    = 10 * time.Minute
	DefaultLeaseDuration  = 15 * time.Second
)

// Options are the settings of `run` that shape the controller.
type Options struct {
	// PollInterval is how often each repository:tag is resolved, and the
	// resync period of every group.
	PollInterval time.Duration
	PollJitter   float64
	// Workers is the number of groups reconciled in parallel.
	Workers int
	// FightMaxRounds and FightWindow bound a fight with another writer (C5).
	FightMaxRounds int
	FightWindow    time.Duration
	// MetricsAddr and HealthAddr: "0" disables the endpoint.
	MetricsAddr, HealthAddr string
	// LeaderElect elects one active replica through a Lease (C3).
	LeaderElect             bool
	LeaderElectionNamespace string
	LeaseDuration           time.Duration // 0 means DefaultLeaseDuration
	// Discovery, when set, manages the labelled workloads too (SPEC D1),
	// and every image resolves with the imagePullSecrets of its pods'
	// ServiceAccounts too (pass.Runner.ServiceAccounts).
	Discovery *Discovery
}

// Manager is the controller-runtime manager of `run` with the controller
// registered: the one constructor used by `run`, the benchmarks and the
// tests, so that what is measured is what ships.
type Manager struct {
	ctrl.Manager
	Controller *Controller
	synced     atomic.Bool
	reader     client.Reader
}

// Reader reads the workloads as the controller does: from the manager's
// cache, and with discovery from the caches of the labelled namespaces.
func (m *Manager) Reader() client.Reader { return m.reader }

// Synced reports whether the informer caches of the watched kinds synced.
func (m *Manager) Synced() bool { return m.synced.Load() }

// NewManager builds (does not start) the manager of r's config on rc: the
// informer cache of the configured namespaces and kinds, which the
// runner's observation reads (no API request in a steady state), the
// manager's aggregating event recorder, the poller, the controller, leader
// election, /healthz and a /readyz that fails until the caches synced.
func NewManager(rc *rest.Config, r *pass.Runner, o Options) (*Manager, error) {
	rc = rest.CopyConfig(rc)
	rc.QPS, rc.Burst = pass.APIQPS, pass.APIBurst
	if o.Discovery != nil {
		r.ServiceAccounts = true
	}
	c := New(r, newPoller(r, o), o.PollInterval, o.FightMaxRounds, o.FightWindow)
	namespaces, byObject := cacheScope(r.Config, o.Discovery)
	mgr, err := ctrl.NewManager(rc, managerOptions(o, r.Config.AnnotationPrefix, namespaces, byObject))
	if err != nil {
		return nil, fmt.Errorf("start the controller manager: %w", err)
	}
	// Observation reads come from the informer cache; writes and the reads
	// of the write path stay direct.
	var reader client.Reader = mgr.GetCache()
	if o.Discovery != nil {
		if reader, err = addDiscovery(mgr, rc, c, namespaces, o.Discovery); err != nil {
			return nil, err
		}
	}
	r.Workloads.SetCache(reader)
	// The copies of the groups' state too (R25).
	r.States().SetCache(mgr.GetCache())
	// The ServiceAccounts' imagePullSecrets too (D1, R20): a steady state
	// makes no API request for them (C6).
	r.ServiceAccountSource = registry.ServiceAccountsFromCache(mgr.GetCache(), r.Config.APITimeout)
	// The nodes' metadata too, for the platforms a new digest must serve
	// (V3): the informer starts with the first new digest.
	r.Nodes = workload.NodesFromCache(mgr.GetCache(), r.Config.APITimeout)
	r.Events = workload.Aggregating{Sink: mgr.GetEventRecorder(workload.Component)}
	r.KeychainTTL = o.PollInterval
	workers := max(o.Workers, 1)
	if err := c.SetupWithManager(mgr, workers); err != nil {
		return nil, err
	}
	m := &Manager{Manager: mgr, Controller: c, reader: reader}
	if err := m.addProbes(Kinds(r.Config, o.Discovery), len(namespaces) > 0, o.Discovery != nil); err != nil {
		return nil, err
	}
	return m, nil
}

// newPoller builds the poller of r's images: one ask per repository:tag
// per interval, with the pull secrets of their targets (C2).
func newPoller(r *pass.Runner, o Options) *poller.Poller {
	return &poller.Poller{
		Interval: o.PollInterval, Jitter: o.PollJitter,
		Resolve: func(ctx context.Context, img config.Image) (string, error) {
			return r.Resolver.Latest(ctx, img.Repository, img.Tag, r.KeychainFor(ctx, img))
		},
		// A registry whose rate-limit budget would not last is polled less
		// often (C2).
		Pace: func(img config.Image, d time.Duration) time.Duration { return r.Resolver.Pace(img.Repository, d) },
	}
}

// cacheScope is what the manager's cache holds: the namespaces the config
// names, the pods of their workloads (N1), and with discovery what it reads
// (D1).
func cacheScope(cfg *config.Config, d *Discovery) (map[string]cache.Config, map[client.Object]cache.ByObject) {
	namespaces := map[string]cache.Config{}
	for _, ns := range Namespaces(cfg) {
		namespaces[ns] = cache.Config{}
	}
	byObject := map[client.Object]cache.ByObject{}
	if len(namespaces) > 0 || d == nil {
		// The pods of the managed namespaces, for what they run (N1),
		// kept with only the fields that check reads. With discovery and
		// no configured namespace, pods are read from a labelled
		// namespace's cache or from the API: an empty ByObject.Namespaces
		// would mean every namespace.
		byObject[&corev1.Pod{}] = cache.ByObject{Transform: workload.StripPod}
	}
	// The copies of the groups' state (R25), and nothing else of the
	// ConfigMaps: where the anchors are (the chart's RBAC grants list and
	// watch there), and where discovery looks.
	anchors := map[string]cache.Config{}
	for _, g := range cfg.Groups {
		anchors[g.Anchor.Namespace] = cache.Config{}
	}
	copies := cache.ByObject{Label: statestore.Selector(), Namespaces: anchors}
	if d != nil {
		addDiscoveryCache(byObject, namespaces, cfg.AnnotationPrefix, d)
		byObject[&corev1.ServiceAccount{}] = serviceAccountCache(namespaces, d)
		copies.Namespaces = serviceAccountCache(anchors, d).Namespaces
	}
	byObject[&corev1.ConfigMap{}] = copies
	return namespaces, byObject
}

// serviceAccountCache is where `run` with discovery reads the
// ServiceAccounts of every image's pods from (their imagePullSecrets, D1,
// R20): the namespaces discovery watches and the configured ones, as the
// chart's RBAC grants list and watch there; every namespace when
// discovery is cluster-wide. Only what the pull secrets need is kept
// (registry.StripServiceAccount). The informer starts with the first read.
func serviceAccountCache(configured map[string]cache.Config, d *Discovery) cache.ByObject {
	nss := map[string]cache.Config{}
	if len(d.Namespaces) == 0 {
		nss[cache.AllNamespaces] = cache.Config{}
	} else {
		for _, ns := range d.Namespaces {
			nss[ns] = cache.Config{}
		}
		for ns := range configured {
			nss[ns] = cache.Config{}
		}
	}
	return cache.ByObject{Namespaces: nss, Transform: registry.StripServiceAccount}
}

// managerOptions are the controller-runtime options of `run`: the cache
// scope, the endpoints ("" and "0" disable one), and leader election
// through a Lease (C3).
func managerOptions(o Options, prefix string, namespaces map[string]cache.Config, byObject map[client.Object]cache.ByObject) ctrl.Options {
	lease := o.LeaseDuration
	if lease <= 0 {
		lease = DefaultLeaseDuration
	}
	renew, retry := lease*2/3, lease/5
	metricsAddr, healthAddr := o.MetricsAddr, o.HealthAddr
	if metricsAddr == "" {
		metricsAddr = "0"
	}
	if healthAddr == "" {
		healthAddr = "0"
	}
	// The cache keeps the built-in kinds' workloads with only what the
	// rules read (workload.StripWorkload, issue 38), other objects whole.
	return ctrl.Options{
		Scheme:                        scheme.Scheme,
		MapperProvider:                rememberingMapperProvider,
		Cache:                         cache.Options{DefaultNamespaces: namespaces, ByObject: byObject, DefaultTransform: workload.StripWorkload(prefix)},
		Metrics:                       metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:        healthAddr,
		LeaderElection:                o.LeaderElect,
		LeaderElectionID:              "image-refresh",
		LeaderElectionNamespace:       o.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &lease,
		RenewDeadline:                 &renew,
		RetryPeriod:                   &retry,
		GracefulShutdownTimeout:       ptrDuration(10 * time.Second),
	}
}

// addDiscovery wires discovery into mgr (D1): its runnable, on every
// replica, and the caches of the labelled namespaces beside it, started as
// their label is seen (internal/operator/discoverer); the controller is told the
// groups (SetDiscovered) and watches the namespaces' caches once it leads.
// It returns the reader of the workloads: the manager's cache, and the
// labelled namespaces' caches.
func addDiscovery(mgr ctrl.Manager, rc *rest.Config, c *Controller, namespaces map[string]cache.Config, d *Discovery) (client.Reader, error) {
	nc := discoverer.NewCaches(rc, mgr, c.Runner.Config.AnnotationPrefix, slices.Collect(maps.Keys(namespaces)), c.watchNamespaceCache)
	c.discovery, c.api = d, mgr.GetAPIReader()
	r := c.Runner
	disc := discoverer.New(nc, c, discoverer.Options{
		Prefix: r.Config.AnnotationPrefix, Configured: r.Config.Groups, Scope: d.Namespaces,
		Workloads: r.Workloads, State: r.States(), Log: r.Log, Elected: mgr.Elected(),
		// As the workqueue ran its passes when they were the controller's.
		Resync: c.Resync, Timeout: r.Config.EffectiveTickTimeout(), Backoff: failureBackoff[struct{}](c.Resync),
	})
	if err := mgr.Add(disc); err != nil {
		return nil, err
	}
	return nc, nil
}

// addProbes adds /healthz, and a /readyz that fails until the informer
// caches of the watched kinds synced (cacheSynced).
func (m *Manager) addProbes(kinds []*workload.Kind, pods, withDiscovery bool) error {
	if err := m.Add(cacheSynced{m: m, kinds: kinds, pods: pods, discovery: withDiscovery}); err != nil {
		return err
	}
	if err := m.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	return m.AddReadyzCheck("cache-synced", func(*http.Request) error {
		if !m.Synced() {
			return errors.New("informer caches not synced yet")
		}
		return nil
	})
}

// cacheSynced flips Synced once the informer caches have synced (/readyz).
type cacheSynced struct {
	m     *Manager
	kinds []*workload.Kind
	// pods: the manager's cache holds pods (of the configured namespaces);
	// discovery: it holds the labelled namespaces.
	pods, discovery bool
}

// Start creates the informers of the watched kinds on every replica (the
// webhook reads anchors from them, and a standby takes over warm), so that
// /readyz fails while list/watch is denied instead of passing before any
// informer exists.
func (c cacheSynced) Start(ctx context.Context) error {
	objs := append(watched(c.kinds, c.pods), &corev1.ConfigMap{}) // the state's copies (R25)
	if c.discovery {
		objs = append(objs, &corev1.Namespace{})
	}
	for _, obj := range objs {
		if _, err := c.m.GetCache().GetInformer(ctx, obj); err != nil {
			return fmt.Errorf("watch %T: %w", obj, err)
		}
	}
	if c.m.GetCache().WaitForCacheSync(ctx) {
		c.m.synced.Store(true)
	}
	<-ctx.Done()
	return nil
}

func (cacheSynced) NeedLeaderElection() bool { return false }

// watched lists the objects `run` keeps informers for: the kinds the
// config names, and pods when one of them has pods (N1) and the cache holds
// pods at all.
func watched(kinds []*workload.Kind, withPods bool) []client.Object {
	var out []client.Object
	pods := false
	for _, k := range kinds {
		out = append(out, k.New())
		pods = pods || k.Pods
	}
	if pods && withPods {
		out = append(out, &corev1.Pod{})
	}
	return out
}

// addDiscoveryCache makes the manager's cache hold what discovery reads
// (D1): the namespaces labelled P/enabled=true, and of every workload kind
// the labelled ones (a label selector, so that the cache holds only
// managed objects) next to the whole configured namespaces. Workloads of a
// labelled namespace come from that namespace's own cache
// (discoverer.Caches), started when its label is seen.
func addDiscoveryCache(byObject map[client.Object]cache.ByObject, configured map[string]cache.Config, prefix string, d *Discovery) {
	sel := discovery.Selector(state.Keys{Prefix: prefix})
	byObject[&corev1.Namespace{}] = cache.ByObject{Label: sel}
	for _, k := range workload.Kinds() {
		nss := map[string]cache.Config{}
		if len(d.Namespaces) == 0 {
			nss[cache.AllNamespaces] = cache.Config{LabelSelector: sel}
		}
		for _, ns := range d.Namespaces {
			nss[ns] = cache.Config{LabelSelector: sel}
		}
		for ns := range configured {
			nss[ns] = cache.Config{LabelSelector: labels.Everything()}
		}
		byObject[k.New()] = cache.ByObject{Namespaces: nss}
	}
}

func ptrDuration(d time.Duration) *time.Duration { return &d }
