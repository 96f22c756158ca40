package cli

import (
	"context"
	"fmt"
	"log/slog"

	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/discovery"
	"github.com/image-refresh/image-refresh/internal/pass"
	"github.com/image-refresh/image-refresh/internal/statestore"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// withDiscovered returns cfg with the discovered groups after the
// configured ones (D1, D2): the one-shot front ends (tick, status,
// render, rearm) list the labelled objects from the API. cfg itself is not
// changed. With --discovery=false it returns cfg.
func (c *common) withDiscovered(ctx context.Context, cfg *config.Config, log *slog.Logger) (*config.Config, error) {
	d, err := c.discoverGroups(ctx, cfg, log)
	if err != nil || d == nil {
		return cfg, err
	}
	return d.cfg, nil
}

// discovered is one discovery from the API: the config with the
// discovered groups, what was listed and found, and the client that
// listed it.
type discovered struct {
	cfg *config.Config
	in  discovery.Input
	res discovery.Result
	api client.Client
}

// discoverGroups is withDiscovered with what `tick` needs to adopt and let
// go (D1); nil with --discovery=false.
func (c *common) discoverGroups(ctx context.Context, cfg *config.Config, log *slog.Logger) (*discovered, error) {
	if !c.discover {
		return nil, nil
	}
	rc, err := c.restConfig()
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "image-refresh/" + Version
	rc.QPS, rc.Burst = pass.APIQPS, pass.APIBurst
	// Every request of the lists, also the REST mapper's API discovery,
	// which does not take ctx: a server that never answers must not hold a
	// render or a tick past apiTimeout (R14).
	rc.Timeout = cfg.APITimeout
	cl, err := client.New(rc, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	lctx, cancel := context.WithTimeout(ctx, cfg.APITimeout)
	defer cancel()
	in, err := discovery.List(lctx, cl, cfg.AnnotationPrefix, c.watchNamespaces)
	if err != nil {
		return nil, fmt.Errorf("discovery (turn it off with --discovery=false): %w", err)
	}
	in.Configured = cfg.Groups
	res := discovery.Discover(in)
	logNotes(log, res.Notes)
	out := *cfg
	out.Groups = append(append([]config.Group{}, cfg.Groups...), res.Groups...)
	return &discovered{cfg: &out, in: in, res: res, api: cl}, nil
}

// adopt marks the anchors of the discovered groups and lets go of the
// marked workloads no longer labelled (D1): the same code as `run`'s
// discovery pass. A failed list is loud and returned (R15).
func (d *discovered) adopt(ctx context.Context, wc *workload.Client, st *statestore.Store, scope []string, log *slog.Logger) error {
	a := discovery.Adoption{Prefix: d.cfg.AnnotationPrefix, Workloads: wc, State: st, API: d.api, Scope: scope, Log: log}
	a.Mark(ctx, d.in, d.res)
	lctx, cancel := context.WithTimeout(ctx, d.cfg.APITimeout)
	defer cancel()
	if _, err := a.LetGoUnlabelled(lctx, d.res.Managed, d.cfg.Groups); err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	return nil
}

func logNotes(log *slog.Logger, notes []discovery.Note) {
	if log == nil {
		return
	}
	for _, n := range notes {
		attrs := []any{"workload", n.Workload.String()}
		if n.Container != "" {
			attrs = append(attrs, "container", n.Container)
		}
		log.Info("discovery: "+n.Msg, attrs...)
	}
}
