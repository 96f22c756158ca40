package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/metrics"
	"github.com/image-refresh/image-refresh/internal/operator"
	"github.com/image-refresh/image-refresh/internal/pass"
	"github.com/image-refresh/image-refresh/internal/verify"
)

// apiCounter counts the API requests of one controller, by kind of verb.
// It wraps the controller's rest.Config transport, so it sees the engine's
// reads and writes, the informers' lists and watches, and nothing of the
// bench's own client.
type apiCounter struct {
	mu    sync.Mutex
	total apiCounts
	byKey map[string]int // "verb resource" → requests
	// patches keeps the path and body of the first maxPatchSamples
	// patches, so that a write where none was expected can be read.
	patches []string
}

// maxPatchSamples bounds apiCounter.patches.
const maxPatchSamples = 20

// apiCounts are counts of requests by kind: reads are get and list; a watch
// is one long-lived request; writes are create, update, patch and delete.
type apiCounts struct{ Reads, Watches, Writes int }

func (a apiCounts) sub(b apiCounts) apiCounts {
	return apiCounts{a.Reads - b.Reads, a.Watches - b.Watches, a.Writes - b.Writes}
}

func (c *apiCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		verb, resource := classify(req)
		c.mu.Lock()
		switch verb {
		case "get", "list":
			c.total.Reads++
		case "watch":
			c.total.Watches++
		default:
			c.total.Writes++
		}
		c.byKey[verb+" "+resource]++
		sample := verb == "patch" && len(c.patches) < maxPatchSamples && req.GetBody != nil
		c.mu.Unlock()
		if sample {
			if body, err := req.GetBody(); err == nil {
				b, _ := io.ReadAll(io.LimitReader(body, 600))
				_ = body.Close()
				c.mu.Lock()
				c.patches = append(c.patches, req.URL.Path+" "+string(b))
				c.mu.Unlock()
			}
		}
		return rt.RoundTrip(req)
	})
}

// patchSamples returns the sampled patches and starts sampling anew.
func (c *apiCounter) patchSamples() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.patches
	c.patches = nil
	return out
}

func (c *apiCounter) snapshot() (apiCounts, map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]int, len(c.byKey))
	for k, v := range c.byKey {
		m[k] = v
	}
	return c.total, m
}

// writesSince lists the writes by "verb resource" since an earlier
// snapshot, most frequent first.
func (c *apiCounter) writesSince(before map[string]int) string {
	return c.since(before, false)
}

// requestsSince lists every request by "verb resource" since an earlier
// snapshot, most frequent first ("none" if there was none).
func (c *apiCounter) requestsSince(before map[string]int) string {
	if s := c.since(before, true); s != "" {
		return s
	}
	return "none"
}

func (c *apiCounter) since(before map[string]int, reads bool) string {
	_, now := c.snapshot()
	type kv struct {
		k string
		n int
	}
	var list []kv
	for k, v := range now {
		if d := v - before[k]; d > 0 && (reads || !strings.HasPrefix(k, "get ") && !strings.HasPrefix(k, "list ") && !strings.HasPrefix(k, "watch ")) {
			list = append(list, kv{k, d})
		}
	}
	sort.Slice(list, func(i, j int) bool { return list[i].n > list[j].n || list[i].n == list[j].n && list[i].k < list[j].k })
	out := make([]string, len(list))
	for i, e := range list {
		out[i] = fmt.Sprintf("%s ×%d", e.k, e.n)
	}
	return strings.Join(out, ", ")
}

// perEach lists every request by "verb resource" since an earlier
// snapshot, divided by n (requests per revert, say), most frequent first,
// and the writes among them per n.
func (c *apiCounter) perEach(before map[string]int, n int) (all, writes string) {
	if n == 0 {
		return "none", "0"
	}
	_, now := c.snapshot()
	type kv struct {
		k string
		d int
	}
	var list []kv
	w := 0
	for k, v := range now {
		if d := v - before[k]; d > 0 {
			list = append(list, kv{k, d})
			switch verb, _, _ := strings.Cut(k, " "); verb {
			case "create", "update", "patch":
				w += d
			}
		}
	}
	if len(list) == 0 {
		return "none", "0"
	}
	sort.Slice(list, func(i, j int) bool { return list[i].d > list[j].d || list[i].d == list[j].d && list[i].k < list[j].k })
	out := make([]string, len(list))
	for i, e := range list {
		out[i] = fmt.Sprintf("%s %s", e.k, fmtNum(float64(e.d)/float64(n)))
	}
	return strings.Join(out, ", "), fmtNum(float64(w) / float64(n))
}

// verbs are the verbs the steady-state and scale figures report.
var verbs = []string{"get", "list", "watch", "create", "update", "patch", "delete"}

// byVerb sums the requests since an earlier snapshot by verb.
func (c *apiCounter) byVerb(before map[string]int) map[string]int {
	_, now := c.snapshot()
	out := map[string]int{}
	for k, v := range now {
		verb, _, _ := strings.Cut(k, " ")
		out[verb] += v - before[k]
	}
	return out
}

// fmtVerbs prints counts by verb as "get 0, list 0, …" (rates: per is the
// divisor, e.g. minutes).
func fmtVerbs(m map[string]int, per float64) string {
	var out []string
	for _, v := range verbs {
		out = append(out, fmt.Sprintf("%s %s", v, fmtNum(float64(m[v])/per)))
	}
	for k, n := range m { // anything else (e.g. deletecollection)
		if n != 0 && !contains(verbs, k) {
			out = append(out, fmt.Sprintf("%s %s", k, fmtNum(float64(n)/per)))
		}
	}
	return strings.Join(out, ", ")
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// classify names a request's verb (get, list, watch, create, update,
// patch, delete) and resource from its method and path, e.g.
// /apis/apps/v1/namespaces/ns/deployments/name → get deployments.
func classify(req *http.Request) (verb, resource string) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:] // api/v1
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:] // apis/group/version
	default:
		parts = nil // discovery, /healthz, …
	}
	named := false
	switch {
	case len(parts) >= 3 && parts[0] == "namespaces":
		resource, named = parts[2], len(parts) >= 4
	case len(parts) >= 1:
		resource, named = parts[0], len(parts) >= 2
	default:
		resource = "discovery"
	}
	switch req.Method {
	case http.MethodGet:
		switch {
		case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
	default:
		verb = strings.ToLower(req.Method)
	}
	return verb, resource
}

// ctlOptions are the `run` flags a measurement sets.
type ctlOptions struct {
	pollInterval time.Duration
	pollJitter   float64
	workers      int
	// fightMaxRounds: the latency run reverts the same target a hundred
	// times on purpose; C5 would rightly stop re-pinning after a few.
	fightMaxRounds int
	// config: more top-level config settings (YAML lines).
	config string
}

// bench is one image-refresh controller built as internal/cli/run.go
// builds it, with its API requests counted.
type bench struct {
	ctl    *operator.Controller
	runner *pass.Runner
	cfg    *config.Config
	api    *apiCounter
	mgr    *operator.Manager

	// changed is when the poller last reported a change of each
	// repository:tag (its OnChange, wrapped).
	changedMu sync.Mutex
	changed   map[string]time.Time

	cancel context.CancelFunc
	done   chan error
	// synced is how long start took: Start called → caches synced.
	synced time.Duration
}

// configs numbers the config files the bench writes.
var configs atomic.Int64

// newController builds (does not start) a controller for the groups.
func (w *world) newController(groups []group, o ctlOptions) (*bench, error) {
	// The config is loaded from a file, as `run` loads it: trust and
	// signing keys are read beside it.
	path := filepath.Join(w.runDir, fmt.Sprintf("bench-%d.yaml", configs.Add(1)))
	if err := os.WriteFile(path, w.configYAML(groups, o.config), 0o600); err != nil {
		return nil, err
	}
	cfg, err := config.Load(path, verify.CheckTrust)
	if err != nil {
		return nil, err
	}
	if o.workers == 0 {
		o.workers = operator.DefaultWorkers
	}
	if o.fightMaxRounds == 0 {
		o.fightMaxRounds = operator.DefaultFightMaxRounds
	}
	api := &apiCounter{byKey: map[string]int{}}
	rc := rest.CopyConfig(w.cluster.Config)
	rc.UserAgent = "image-refresh/bench"
	rc.WrapTransport = api.wrap

	// The runner and the manager, built by the constructors `run` uses.
	m := metrics.New()
	r, err := pass.NewRunner(rc, cfg, pass.RunnerOptions{
		ConfigPath: path, UserAgent: "image-refresh/bench",
		Metrics: m, Log: slog.New(slog.NewTextHandler(w.log, nil)),
	})
	if err != nil {
		return nil, err
	}
	mgr, err := operator.NewManager(rc, r, operator.Options{
		PollInterval: o.pollInterval, PollJitter: o.pollJitter, Workers: o.workers,
		FightMaxRounds: o.fightMaxRounds, FightWindow: operator.DefaultFightWindow,
		MetricsAddr: "0", HealthAddr: "0",
	})
	if err != nil {
		return nil, fmt.Errorf("controller manager: %w", err)
	}
	b := &bench{ctl: mgr.Controller, runner: r, cfg: cfg, api: api, mgr: mgr, changed: map[string]time.Time{}}
	// The moment the poller reports a new answer: wrap the controller's
	// OnChange (set by operator.New) before the poller runs.
	onChange := mgr.Controller.Poller.OnChange
	mgr.Controller.Poller.OnChange = func(key string) {
		now := time.Now()
		b.changedMu.Lock()
		b.changed[key] = now
		b.changedMu.Unlock()
		onChange(key)
	}
	return b, nil
}

// startIdle builds and starts a controller for gs and waits until it
// passed every group once and each group is idle on the digest digestOf
// names for it. The caller stops it.
func (w *world) startIdle(ctx context.Context, gs []group, o ctlOptions, digestOf func(group) string) (*bench, error) {
	b, err := w.newController(gs, o)
	if err != nil {
		return nil, err
	}
	if err := b.start(ctx); err != nil {
		return nil, err
	}
	if err := b.waitPasses(ctx, int64(len(gs)), time.Minute); err != nil {
		b.stop()
		return nil, err
	}
	for _, g := range gs {
		if err := waitIdle(ctx, w, g.ns, g, "@"+digestOf(g)); err != nil {
			b.stop()
			return nil, fmt.Errorf("setup: %w", err)
		}
	}
	return b, nil
}

// changedAt is when the poller last reported a change of key.
func (b *bench) changedAt(key string) time.Time {
	b.changedMu.Lock()
	defer b.changedMu.Unlock()
	return b.changed[key]
}

// waitPasses waits until the controller completed at least n passes.
func (b *bench) waitPasses(ctx context.Context, n int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for b.ctl.Passes() < n {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%d of %d passes after %s", b.ctl.Passes(), n, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// start runs the manager until stop; it returns once the caches synced.
func (b *bench) start(ctx context.Context) error {
	ctx, b.cancel = context.WithCancel(ctx)
	b.done = make(chan error, 1)
	t0 := time.Now()
	go func() { b.done <- b.mgr.Start(ctx) }()
	// Manager.Synced (what /readyz reports): the informers of the watched
	// kinds exist and synced. The cache's WaitForCacheSync alone can return
	// before any informer was created.
	deadline := t0.Add(2 * time.Minute)
	for !b.mgr.Synced() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			b.stop()
			return fmt.Errorf("the controller's caches did not sync")
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.synced = time.Since(t0)
	return nil
}

// stop cancels the manager, as SIGTERM does, and waits for it.
func (b *bench) stop() {
	if b.cancel == nil {
		return
	}
	b.cancel()
	select {
	case err := <-b.done:
		if err != nil {
			progress("controller stopped: %v", err)
		}
	case <-time.After(30 * time.Second):
		progress("controller did not stop within 30 s")
	}
	b.cancel = nil
}

// pass runs one reconcile of every group through the controller's own
// Reconcile, with the manager's concurrency (--workers), and returns how
// long the whole pass took. This is what the workqueue does on a resync,
// without the queue.
func (b *bench) pass(ctx context.Context, workers int) time.Duration {
	start := time.Now()
	jobs := make(chan string)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for name := range jobs {
				_, _ = b.ctl.Reconcile(ctx, reconcile.Request{NamespacedName: typesName(name)})
			}
		})
	}
	for _, g := range b.cfg.Groups {
		jobs <- g.Name
	}
	close(jobs)
	wg.Wait()
	return time.Since(start)
}

// waitQuiet waits until the controller sent no API request for quiet (its
// pass is over), or timeout.
func (b *bench) waitQuiet(ctx context.Context, quiet, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	last, _ := b.api.snapshot()
	lastChange := time.Now()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(200 * time.Millisecond)
		now, _ := b.api.snapshot()
		if now != last {
			last, lastChange = now, time.Now()
		} else if time.Since(lastChange) >= quiet {
			return
		}
	}
}

func typesName(name string) types.NamespacedName { return types.NamespacedName{Name: name} }
