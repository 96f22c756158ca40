package pass

import (
	"log/slog"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/metrics"
	"github.com/image-refresh/image-refresh/internal/registry"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// APIQPS and APIBurst bound the API requests of the runner's client and of
// the controller's manager. client-go's default (5 QPS) would make a pass
// over a few dozen workloads take seconds, and a resync over a few hundred
// workloads' writes take minutes; these stay well under the API server's
// fairness.
const (
	APIQPS   = 50
	APIBurst = 100
)

// RunnerOptions are what NewRunner needs besides the cluster and the config.
type RunnerOptions struct {
	// ConfigPath names the config file in the plan's findings.
	ConfigPath string
	// UserAgent of the API client and of the registry client.
	UserAgent string
	// Metrics, if set, counts the registry's requests, rate limits and
	// paces (C2) and the passes' outcomes (R15).
	Metrics *metrics.Metrics
	Log     *slog.Logger
	// Now is the clock of the rollout policy (R21, R22); nil is time.Now.
	Now func() time.Time
}

// RegistriesError is NewRunner's error when the config's registries cannot
// be used (a host twice, a CA file that cannot be read): an invalid config,
// which retrying does not fix. Its message is the registry's.
type RegistriesError struct{ Err error }

func (e *RegistriesError) Error() string { return e.Err.Error() }
func (e *RegistriesError) Unwrap() error { return e.Err }

// NewRunner builds the Runner of every front end that talks to the cluster
// (tick, status, rearm, run, and the benchmarks): an API client on a copy of
// rc with the user agent and APIQPS/APIBurst, a registry resolver of the
// config's registries that reports to the metrics, and the ServiceAccounts
// read from the API (`run` reads them from its cache instead).
func NewRunner(rc *rest.Config, cfg *config.Config, o RunnerOptions) (*Runner, error) {
	rc = rest.CopyConfig(rc)
	rc.UserAgent = o.UserAgent
	rc.QPS, rc.Burst = APIQPS, APIBurst
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfigAndClient(rc, hc)
	if err != nil {
		return nil, err
	}
	// Declared kinds (K2) join the kind table, and are read and written
	// with the dynamic client.
	if err := workload.Declare(cfg.Kinds); err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfigAndClient(rc, hc)
	if err != nil {
		return nil, err
	}
	md, err := metadata.NewForConfigAndClient(rc, hc)
	if err != nil {
		return nil, err
	}
	wl := workload.New(kube, cfg.APITimeout)
	wl.SetDynamic(dyn)
	hosts := make([]registry.HostConfig, 0, len(cfg.Registries))
	for _, h := range cfg.Registries {
		hosts = append(hosts, registry.HostConfig{Host: h.Host, Insecure: h.Insecure, CAFile: h.CAFile})
	}
	opts := registry.Options{Hosts: hosts, Timeout: cfg.RegistryTimeout, UserAgent: o.UserAgent}
	if m := o.Metrics; m != nil {
		opts.OnRequest = m.RegistryRequest
		opts.OnRateLimit = func(host string, rl registry.RateLimit) { m.RegistryRateLimit(host, rl.Limit, rl.Remaining) }
		opts.OnPace = m.RegistryPace
	}
	opts.Log = o.Log
	res, err := registry.NewResolver(opts)
	if err != nil {
		return nil, &RegistriesError{Err: err}
	}
	return &Runner{
		Config: cfg, ConfigPath: o.ConfigPath, Kube: kube,
		Workloads: wl, Resolver: res, Metrics: o.Metrics, Log: o.Log,
		ServiceAccountSource: registry.ServiceAccountsFromAPI(kube, cfg.APITimeout),
		Nodes:                workload.NodesFromAPI(md, cfg.APITimeout),
		Instance:             InstanceName(), Now: o.Now,
	}, nil
}
