package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/refresh"
	"github.com/image-refresh/image-refresh/internal/render"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/statestore"
	"github.com/image-refresh/image-refresh/internal/workload"
)

func newRender(o *options) *cobra.Command {
	var (
		c         = common{options: *o}
		namespace string
	)
	cmd := &cobra.Command{
		Use:   "render [--config FILE] [--kubeconfig FILE] [--namespace NS]",
		Short: "Helm post-renderer: pin managed images of a manifest stream to their recorded digests",
		Long: `render reads a rendered manifest stream (what helm template, install and
upgrade render) on stdin and writes it to stdout with every managed
container image pinned to the digest recorded on its group's anchor, in the
configured pinFormat, so that a re-render never deploys the bare tag. Only
those image strings change; every other byte is written as read.

Left as rendered, with a note on stderr: images with no record (a fresh
install, or no cluster reachable, as under "helm template"), on a mirror
registry (docs/mirrors.md), on another tag, or written through YAML aliases.
tick and run pin them; render never replaces them (docs/fix-b.md).

Documents without metadata.namespace are read as --namespace. Helm does not
tell a post-renderer the release namespace: pass it, or export HELM_NAMESPACE.

Helm 3.10 or newer:
  helm upgrade REL CHART -n NS --post-renderer image-refresh \
    --post-renderer-args render --post-renderer-args --config=FILE \
    --post-renderer-args --namespace=NS
Helm 4: install the plugin in plugins/image-refresh-render and pass
  --post-renderer image-refresh-render --post-renderer-args --config=FILE ...
(see docs/post-renderer.md).

Exit codes:
  0  the stream was written, pinned where possible (see the notes on stderr)
  1  stdin is not a YAML stream; nothing was written
  2  the config or the flags are invalid; nothing was written`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := c.load()
			if err != nil {
				return err
			}
			// The declared kinds (K2) join the kind table; render needs
			// no cluster to walk a stream, so they are not checked with
			// the API server here.
			if err := workload.Declare(cfg.Kinds); err != nil {
				return &ExitError{Code: ExitInvalid, Err: fmt.Errorf("%s: %w", c.configPath, err)}
			}
			if msgs := validation.IsDNS1123Label(namespace); len(msgs) > 0 {
				return invalid("--namespace: %q is not a namespace name: %s", namespace, strings.Join(msgs, "; "))
			}
			// Checked here too, so that a wrong flag fails also on a stream
			// that needs no cluster read.
			if c.kubeconfig != "" {
				if _, err := os.Stat(c.kubeconfig); err != nil {
					return invalid("--kubeconfig: %v", err)
				}
			}
			log := newLogger(cmd.ErrOrStderr(), c.logFormat)
			// The labelled workloads are pinned as the configured ones (D1),
			// from the cluster; no cluster (helm template) leaves them on
			// their tags, as it does every image without a record (B2).
			// Discovery and the record reads share one apiTimeout (R14): a
			// cluster that never answers costs a deploy that long, once.
			clusterCtx, cancel := context.WithTimeout(cmd.Context(), cfg.APITimeout)
			defer cancel()
			if found, err := c.withDiscovered(clusterCtx, cfg, nil); err == nil {
				cfg = found
			} else if ee := (*ExitError)(nil); errors.As(err, &ee) {
				return err
			} else if c.discover {
				log.Info("discovery: the cluster cannot be read; labelled workloads are left as rendered", "error", err)
			}
			in, err := io.ReadAll(cmd.InOrStdin())
			if err != nil {
				return fmt.Errorf("read the manifests on stdin: %w", err)
			}
			stream, err := render.Parse(in, cfg, namespace)
			if err != nil {
				return &ExitError{Code: ExitNeedsHuman, Err: fmt.Errorf("the manifests on stdin are not YAML: %w; nothing written", err)}
			}
			recorded, unread, err := c.records(clusterCtx, cfg, stream.Groups(), stream.Suspend)
			if err != nil {
				return err
			}
			res := stream.Pin(recorded, unread)
			for _, ch := range res.Changes {
				log.Info("pinned to the recorded digest", "image", ch.Image, "group", ch.Group, "where", ch.Where, "from", ch.From, "to", ch.To)
			}
			for _, n := range res.Notes {
				level := slog.LevelInfo
				if n.Warning {
					level = slog.LevelWarn
				}
				log.Log(cmd.Context(), level, n.Reason, "image", n.Image, "group", n.Group, "where", n.Where)
			}
			_, err = cmd.OutOrStdout().Write(res.Out)
			return err
		},
	}
	c.bind(cmd)
	cmd.Flags().StringVarP(&namespace, "namespace", "n", defaultRenderNamespace(),
		"namespace of documents without metadata.namespace: the release namespace; $HELM_NAMESPACE when set")
	return cmd
}

// defaultRenderNamespace is $HELM_NAMESPACE, which Helm 3 and 4 pass on to
// a post-renderer only when the user exported it, else "default" (Helm's
// own default).
func defaultRenderNamespace() string {
	if ns := os.Getenv("HELM_NAMESPACE"); ns != "" {
		return ns
	}
	return "default"
}

// records reads the recorded digests (docs/annotations.md) from the anchors of
// groups. A post-renderer must not stall or fail a deploy over them: all
// reads together are bounded by apiTimeout (R14), and a cluster that cannot
// be reached, or an anchor that cannot be read, leaves that group's images
// on their tags, with the reason in unread. Only an invalid --kubeconfig is
// an error.
//
// A suspended group (O1) is told to suspend, with its suspension.
func (c *common) records(ctx context.Context, cfg *config.Config, groups []string, suspend func(group, why string)) (recorded map[render.ImageKey]string, unread map[string]string, err error) {
	recorded, unread = map[render.ImageKey]string{}, map[string]string{}
	if len(groups) == 0 {
		return recorded, unread, nil // nothing managed in the stream: no cluster call
	}
	unreachable := func(err error) {
		for _, g := range groups {
			unread[g] = err.Error()
		}
	}
	rc, err := c.restConfig()
	if err != nil {
		if ee := (*ExitError)(nil); errors.As(err, &ee) {
			return nil, nil, err
		}
		unreachable(fmt.Errorf("no cluster: %w", err))
		return recorded, unread, nil
	}
	rc.UserAgent = "image-refresh/" + Version
	rc.Timeout = cfg.APITimeout
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		unreachable(fmt.Errorf("no cluster: %w", err))
		return recorded, unread, nil
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.APITimeout)
	defer cancel()
	wl := workload.New(kube, cfg.APITimeout)
	if dyn, err := dynamic.NewForConfig(rc); err == nil {
		wl.SetDynamic(dyn) // an anchor of a declared kind (K2)
	}
	keys := state.Keys{Prefix: cfg.AnnotationPrefix}
	for _, name := range groups {
		g, ok := cfg.Group(name)
		if !ok {
			continue
		}
		anchor := g.Anchor
		obj, err := wl.Get(ctx, anchor)
		if err != nil {
			if apierrors.IsNotFound(err) {
				unread[name] = fmt.Sprintf("anchor %s not found (not installed yet?)", anchor)
			} else {
				unread[name] = err.Error()
			}
			continue
		}
		now := time.Now
		if c.now != nil {
			now = c.now
		}
		// The current records and suspension: the copy's, when a rollback
		// rewound the anchor's (R25).
		view, err := (&statestore.Store{Prefix: cfg.AnnotationPrefix, Kube: kube, Workloads: wl, Timeout: cfg.APITimeout}).Read(ctx, obj)
		if err != nil {
			unread[name] = err.Error()
			continue
		}
		by := obj.AnnotationManager(keys.Suspend())
		if by == workload.FieldManager || view.Rewound {
			by = "" // P/suspended-by says who (R25)
		}
		if s := refresh.SuspensionOf(cfg.AnnotationPrefix, view.State, by, now()); s != nil {
			suspend(name, s.Describe())
		}
		for _, img := range g.Images {
			if d := view.State[keys.Record(img.Name)]; d != "" {
				recorded[render.ImageKey{Group: name, Image: img.Name}] = d
			}
		}
	}
	return recorded, unread, nil
}
