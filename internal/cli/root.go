// Package cli holds the cobra commands of image-refresh. Commands return
// errors; main turns them into exit codes (ExitCode).
package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/metrics"
	"github.com/image-refresh/image-refresh/internal/pass"
	"github.com/image-refresh/image-refresh/internal/verify"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// Exit codes of `tick` (and every command): 0 healthy or benignly skipped,
// 1 a group needs a human, 2 invalid config or flags (nothing read or written).
const (
	ExitOK         = 0
	ExitNeedsHuman = 1
	ExitInvalid    = 2
)

// ExitError carries an exit code out of a command.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// ExitCode maps a command's error to the process exit code.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	return ExitNeedsHuman
}

// noArgs refuses positional arguments as invalid flags (exit 2).
func noArgs(cmd *cobra.Command, args []string) error {
	if err := cobra.NoArgs(cmd, args); err != nil {
		return &ExitError{Code: ExitInvalid, Err: err}
	}
	return nil
}

func invalid(format string, args ...any) error {
	return &ExitError{Code: ExitInvalid, Err: fmt.Errorf(format, args...)}
}

// Version is set at build time with -ldflags -X.
var Version = "dev"

// NewRootFor builds the command tree for the program named program
// (os.Args[0]): installed as kubectl-image_refresh, the binary is the
// kubectl plugin `kubectl image-refresh`, and its help says so.
func NewRootFor(program string, out, errOut io.Writer) *cobra.Command {
	root := NewRoot(out, errOut)
	if strings.HasPrefix(filepath.Base(program), "kubectl-") {
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl image-refresh"}
	}
	return root
}

// Option tunes the command tree beyond its flags: what a program embeds,
// not what a user types.
type Option func(*options)

type options struct {
	now func() time.Time
}

// WithClock sets the decision engine's clock (refresh.Settings.Now): the
// rollout policy counts on it (R21 churn window, R22 minimum age, R24
// windows), and so do the attempt holder's times (C3, C6). The default is
// time.Now. Tests move it forward instead of sleeping for an hour.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// NewRoot builds the command tree. out and errOut receive the commands'
// output and logs.
func NewRoot(out, errOut io.Writer, opts ...Option) *cobra.Command {
	o := &options{}
	for _, opt := range opts {
		opt(o)
	}
	root := &cobra.Command{
		Use:   "image-refresh",
		Short: "Pin workloads to the digest their tag points to now, and keep them pinned",
		Long: "image-refresh keeps every managed " + kindList() + ` (and any
kind with a pod template the config declares under kinds:, docs/kinds.md)
running exactly the image its tag points to in the registry now, pinned by
digest, and re-pins it when Helm, a rollback or any other writer re-renders
it to repo:tag.

What it does, rule by rule: docs/rules.md. Every state status shows, and its
fix: docs/states/README.md.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(out)
	root.SetErr(errOut)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &ExitError{Code: ExitInvalid, Err: err} })
	root.AddCommand(newTick(o), newRun(o), newStatus(o), newRearm(o), newSuspend(o), newResume(o), newRender(o), newVersion())
	return root
}

// common holds the flags every cluster command shares.
type common struct {
	options
	configPath string
	kubeconfig string
	logFormat  string
	// discover and watchNamespaces shape discovery (D1).
	discover        bool
	watchNamespaces []string
}

func (c *common) bind(cmd *cobra.Command) {
	cmd.Flags().StringVar(&c.configPath, "config", "", "config file (YAML; see docs/config.md); without it, the defaults and discovery alone")
	cmd.Flags().BoolVar(&c.discover, "discovery", true, "manage the workloads labelled <annotationPrefix>/enabled=true and those of namespaces labelled so (docs/discovery.md)")
	cmd.Flags().StringSliceVar(&c.watchNamespaces, "watch-namespaces", nil, "discover only in these namespaces (comma-separated); default: the whole cluster")
	cmd.Flags().StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file; default: in-cluster when running in a pod, else $KUBECONFIG or ~/.kube/config")
	cmd.Flags().StringVar(&c.logFormat, "log-format", "text", "log format: text or json")
}

// load validates flags and config before anything touches the cluster, so
// an invalid one exits 2 with nothing read or written.
func (c *common) load() (*config.Config, error) {
	if c.logFormat != "text" && c.logFormat != "json" {
		return nil, invalid("--log-format: %q is not one of text, json", c.logFormat)
	}
	for _, ns := range c.watchNamespaces {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			return nil, invalid("--watch-namespaces: %q is not a namespace name: %s", ns, strings.Join(msgs, "; "))
		}
	}
	if c.configPath == "" {
		if !c.discover {
			return nil, invalid("--config is required with --discovery=false")
		}
		return config.Defaults(), nil
	}
	// The policies' trust material is parsed by verify (V1): config
	// only reads it.
	cfg, err := config.Load(c.configPath, verify.CheckTrust)
	if err != nil {
		return nil, &ExitError{Code: ExitInvalid, Err: err} // names the file already
	}
	return cfg, nil
}

// statusCommand is the status command line matching this one's flags.
func (c *common) statusCommand() string {
	if c.configPath == "" {
		return "image-refresh status"
	}
	return "image-refresh status --config " + c.configPath
}

// kindList names the built-in workload kinds for help texts:
// "Deployment, DaemonSet, StatefulSet and CronJob".
func kindList() string {
	return andList(config.KindNames())
}

// andList joins words as prose: "a", "a and b", "a, b and c".
func andList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " and " + words[len(words)-1]
}

func newLogger(w io.Writer, format string) *slog.Logger {
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, nil))
	}
	return slog.New(slog.NewTextHandler(w, nil))
}

// restConfig: --kubeconfig, else in-cluster when the service account is
// mounted, else $KUBECONFIG / ~/.kube/config.
func (c *common) restConfig() (*rest.Config, error) {
	if c.kubeconfig == "" {
		if _, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token"); err == nil {
			if cfg, err := rest.InClusterConfig(); err == nil {
				return cfg, nil
			}
		}
	}
	if c.kubeconfig != "" {
		if _, err := os.Stat(c.kubeconfig); err != nil {
			return nil, &ExitError{Code: ExitInvalid, Err: fmt.Errorf("--kubeconfig: %w", err)}
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = c.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	return cfg, nil
}

// NewRunner is the pass executor tick, run and status build, for a loaded
// config read from configPath and the cluster of kubeconfig: the end-to-end
// tests drive one pass of run's own Runner with it.
func NewRunner(configPath, kubeconfig string, cfg *config.Config, log *slog.Logger) (*pass.Runner, error) {
	c := &common{configPath: configPath, kubeconfig: kubeconfig}
	return c.runner(cfg, log, nil)
}

// runner builds the tick executor from a loaded config (pass.NewRunner).
func (c *common) runner(cfg *config.Config, log *slog.Logger, m *metrics.Metrics) (*pass.Runner, error) {
	rc, err := c.restConfig()
	if err != nil {
		return nil, err
	}
	r, err := pass.NewRunner(rc, cfg, pass.RunnerOptions{
		ConfigPath: c.configPath, UserAgent: "image-refresh/" + Version,
		Metrics: m, Log: log, Now: c.now,
	})
	var invalidRegistries *pass.RegistriesError
	if errors.As(err, &invalidRegistries) {
		return nil, &ExitError{Code: ExitInvalid, Err: invalidRegistries.Err}
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// loadServed is load, then the config's declared kinds (K2) checked with
// the API server and added to the kind table, before discovery lists
// them or a pass reads one: a kind the API server does not serve as
// declared exits 2, said once, naming its kinds: entry, and never joins
// the table.
func (c *common) loadServed() (*config.Config, error) {
	cfg, err := c.load()
	if err != nil || len(cfg.Kinds) == 0 {
		return cfg, err
	}
	rc, err := c.restConfig()
	if err != nil {
		return nil, err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return nil, err
	}
	if err := workload.CheckServed(disco, cfg.Kinds); err != nil {
		if errors.Is(err, workload.ErrKindNotServed) {
			return nil, &ExitError{Code: ExitInvalid, Err: fmt.Errorf("%s: %w", c.configPath, err)}
		}
		return nil, err
	}
	if err := workload.Declare(cfg.Kinds); err != nil {
		return nil, &ExitError{Code: ExitInvalid, Err: fmt.Errorf("%s: %w", c.configPath, err)}
	}
	return cfg, nil
}

func newVersion() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), "image-refresh", Version)
			return nil
		},
	}
}
