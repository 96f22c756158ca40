package cli

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/metrics"
	"github.com/image-refresh/image-refresh/internal/operator"
	"github.com/image-refresh/image-refresh/internal/pass"
	"github.com/image-refresh/image-refresh/internal/pinwebhook"
)

// runOptions are the flags of `run`.
type runOptions struct {
	common
	pollInterval   time.Duration
	pollJitter     float64
	metricsAddr    string
	healthAddr     string
	leaderElect    bool
	leaderNS       string
	leaseDuration  time.Duration
	fightMaxRounds int
	fightWindow    time.Duration
	workers        int
	// promotionRecheck: --promotion-recheck (P2).
	promotionRecheck time.Duration
	webhook          webhookFlags
	notify           notifyFlags
}

// webhookFlags are the flags of the admission webhook (B1, docs/webhook.md).
type webhookFlags struct {
	port       int
	host       string
	certDir    string
	selfSigned bool
	configName string
	service    string
	namespace  string
}

func newRun(opts *options) *cobra.Command {
	o := runOptions{common: common{options: *opts}}
	cmd := &cobra.Command{
		Use:   "run [--config FILE] [--kubeconfig FILE] [--watch-namespaces NS,…] [--poll-interval 5m] [--poll-jitter 0.1] [--metrics-addr :8080] [--health-addr :8081] [--leader-elect] [--leader-election-namespace NS] [--webhook-port N] [--notify-port N --notify-token-file FILE] [--log-format text|json]",
		Short: "Run as a controller: re-pin a revert within seconds, poll the registry on an interval",
		Long: `run watches the configured workloads and those labelled for discovery
(docs/discovery.md) and re-pins a write that takes a target off its recorded
digest as soon as the API server reports it, under the same guards as tick
(settled guard, attempts and lockout, registry gate). It asks the registry
once per repository:tag per poll interval, with jitter and backoff. With
--leader-elect several replicas are safe: one acts (a Lease). /healthz and
/readyz are served on --health-addr, Prometheus /metrics on --metrics-addr.
A target another writer rewrites right after each re-pin is left alone after
a few rounds and reported. See docs/run.md. With --webhook-port every
replica also serves the mutating admission webhook: a re-render to
repo:tag is stored pinned to the recorded digest; it fails open, see
docs/webhook.md. With --notify-port a registry's push notification makes it
ask the registry for that repository:tag at once instead of at the next poll
(the secret from --notify-token-file or $IMAGE_REFRESH_NOTIFY_TOKEN, never a
flag value), see docs/notifications.md. SIGTERM stops it cleanly.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	o.bind(cmd)
	f := cmd.Flags()
	f.DurationVar(&o.pollInterval, "poll-interval", operator.DefaultPollInterval, "how often each repository:tag is resolved in the registry (also the resync period of every group)")
	f.Float64Var(&o.pollJitter, "poll-jitter", operator.DefaultPollJitter, "random spread of the poll interval, as a fraction of it (0..0.5)")
	f.StringVar(&o.metricsAddr, "metrics-addr", ":8080", "address of the Prometheus /metrics endpoint; 0 disables it")
	f.StringVar(&o.healthAddr, "health-addr", ":8081", "address of /healthz and /readyz; 0 disables them")
	f.BoolVar(&o.leaderElect, "leader-elect", false, "elect one active replica through a Lease (run several replicas safely)")
	f.StringVar(&o.leaderNS, "leader-election-namespace", "", "namespace of the Lease; default: the pod's namespace when in a cluster")
	f.DurationVar(&o.leaseDuration, "leader-election-lease-duration", operator.DefaultLeaseDuration, "how long a replica waits before taking over from a leader that stopped renewing")
	f.IntVar(&o.fightMaxRounds, "fight-max-repins", operator.DefaultFightMaxRounds, "re-pins of one target, each soon after the last, before image-refresh stops fighting another writer (docs/run.md#no-fights-c5)")
	f.DurationVar(&o.fightWindow, "fight-window", operator.DefaultFightWindow, "re-pins closer together than this count as one fight; a fought target is left alone for this long")
	f.IntVar(&o.workers, "workers", operator.DefaultWorkers, "groups reconciled in parallel")
	f.DurationVar(&o.promotionRecheck, "promotion-recheck", pass.DefaultPromotionRecheck, "how often a group that follows another installation's promotion attestations (promotion.attestedBy) looks again for one on a digest that had none; see docs/promotion.md")
	w := &o.webhook
	f.IntVar(&w.port, "webhook-port", 0, "serve the mutating admission webhook (docs/webhook.md) on this port, path "+pinwebhook.Path+"; 0 disables it")
	f.StringVar(&w.host, "webhook-host", "", "address the webhook listens on; default: every interface")
	f.BoolVar(&w.selfSigned, "webhook-self-signed", true, "generate and rotate the webhook's CA and certificate in the process and keep the CA in the caBundle of --webhook-config-name; false: serve tls.crt/tls.key from --webhook-cert-dir (e.g. cert-manager)")
	f.StringVar(&w.certDir, "webhook-cert-dir", "", "directory with tls.crt and tls.key, reloaded when they change (only with --webhook-self-signed=false)")
	f.StringVar(&w.configName, "webhook-config-name", "image-refresh", "MutatingWebhookConfiguration whose caBundle a self-signed webhook keeps")
	f.StringVar(&w.service, "webhook-service", "image-refresh", "Service in front of the webhook: the self-signed certificate is valid for its DNS names")
	f.StringVar(&w.namespace, "webhook-namespace", "", "namespace of --webhook-service; default: the pod's namespace, else default")
	o.notify.bind(f)
	return cmd
}

func (o *runOptions) validate() error {
	switch {
	case o.pollInterval <= 0:
		return invalid("--poll-interval must be positive, got %s", o.pollInterval)
	case o.pollJitter < 0 || o.pollJitter > 0.5:
		return invalid("--poll-jitter must be within 0..0.5, got %v", o.pollJitter)
	case o.fightMaxRounds < 1:
		return invalid("--fight-max-repins must be at least 1, got %d", o.fightMaxRounds)
	case o.fightWindow <= 0:
		return invalid("--fight-window must be positive, got %s", o.fightWindow)
	case o.workers < 1:
		return invalid("--workers must be at least 1, got %d", o.workers)
	case o.promotionRecheck <= 0:
		return invalid("--promotion-recheck must be positive, got %s", o.promotionRecheck)
	case o.leaseDuration < 2*time.Second:
		return invalid("--leader-election-lease-duration must be at least 2s, got %s", o.leaseDuration)
	}
	return o.webhook.validate()
}

func (w *webhookFlags) validate() error {
	switch {
	case w.port < 0 || w.port > 65535:
		return invalid("--webhook-port must be within 0..65535, got %d", w.port)
	case w.port == 0:
		return nil
	case !w.selfSigned && w.certDir == "":
		return invalid("--webhook-self-signed=false needs --webhook-cert-dir with tls.crt and tls.key")
	case w.selfSigned && w.certDir != "":
		return invalid("--webhook-cert-dir is read only with --webhook-self-signed=false (a self-signed webhook keeps its key in memory)")
	case w.selfSigned && w.configName == "":
		return invalid("--webhook-config-name must name the MutatingWebhookConfiguration whose caBundle to keep")
	}
	return nil
}

// setup serves the webhook on mgr; ready reports whether the cache synced.
func (w *webhookFlags) setup(mgr *operator.Manager, cfg *config.Config, kube kubernetes.Interface, m *metrics.Metrics, log *slog.Logger, ready func() bool) error {
	ns := w.namespace
	if ns == "" {
		ns = "default"
		if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil && len(b) > 0 {
			ns = strings.TrimSpace(string(b))
		}
	}
	h := pinwebhook.NewHandler(cfg, pinwebhook.CachedState(mgr.Reader(), mgr.Controller.Runner.States()), ready, m, log)
	h.SetClock(mgr.Controller.Runner.Now) // O1: a suspension ends on the engine's clock
	// Discovered groups are pinned at admission too (D1, B1).
	mgr.Controller.OnGroups = h.SetGroups
	return pinwebhook.Setup(mgr, pinwebhook.Options{
		Host: w.host, Port: w.port, SelfSigned: w.selfSigned, CertDir: w.certDir,
		ConfigName: w.configName, Service: w.service, Namespace: ns,
	}, h, kube, log)
}

// ctrlLoggerMu orders calls of controller-runtime's process-wide SetLogger,
// which is not safe for concurrent use: tests run several `run` in one
// process (C3), and the last one's logger wins.
var ctrlLoggerMu sync.Mutex

func setCtrlLogger(l logr.Logger) {
	ctrlLoggerMu.Lock()
	defer ctrlLoggerMu.Unlock()
	ctrl.SetLogger(l)
}

func (o *runOptions) run(cmd *cobra.Command) error {
	if err := o.validate(); err != nil {
		return err
	}
	notifyToken, err := o.notify.token()
	if err != nil {
		return err
	}
	cfg, err := o.loadServed()
	if err != nil {
		return err
	}
	log := newLogger(cmd.ErrOrStderr(), o.logFormat)
	setCtrlLogger(logr.FromSlogHandler(log.Handler()))
	m := metrics.NewOn(ctrlmetrics.Registry, ctrlmetrics.Registry)
	r, err := o.runner(cfg, log, m)
	if err != nil {
		return err
	}
	r.PromotionRecheck = o.promotionRecheck
	rc, err := o.restConfig()
	if err != nil {
		return err
	}
	var disc *operator.Discovery
	if o.discover {
		disc = &operator.Discovery{Namespaces: o.watchNamespaces}
	}
	mgr, err := operator.NewManager(rc, r, operator.Options{
		Discovery:    disc,
		PollInterval: o.pollInterval, PollJitter: o.pollJitter, Workers: o.workers,
		FightMaxRounds: o.fightMaxRounds, FightWindow: o.fightWindow,
		MetricsAddr: o.metricsAddr, HealthAddr: o.healthAddr,
		LeaderElect: o.leaderElect, LeaderElectionNamespace: o.leaderNS, LeaseDuration: o.leaseDuration,
	})
	if err != nil {
		return err
	}
	if o.webhook.port > 0 {
		if err := o.webhook.setup(mgr, cfg, r.Kube, m, log, mgr.Synced); err != nil {
			return err
		}
	}
	if o.notify.port > 0 {
		if err := o.notify.setup(mgr, notifyToken, mgr.Controller.Poller, ctrlmetrics.Registry, log); err != nil {
			return err
		}
	}
	log.Info("image-refresh controller starting", "version", Version, "groups", len(cfg.Groups), "discovery", o.discover,
		"pollInterval", o.pollInterval.String(), "leaderElect", o.leaderElect, "webhookPort", o.webhook.port, "notifyPort", o.notify.port)
	if err := mgr.Start(cmd.Context()); err != nil {
		return fmt.Errorf("controller stopped: %w", err)
	}
	log.Info("image-refresh controller stopped")
	return nil
}
