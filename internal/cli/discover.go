package cli

import (
	"context"
	"fmt"
	"log/slog"

	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/discovery"
)

// withDiscovered returns cfg with the discovered groups after the
// configured ones (SPEC D1, D2): the one-shot front ends (tick, status,
// render, rearm) list the labelled objects from the API. cfg itself is not
// changed. With --discovery=false it returns cfg.
func (c *common) withDiscovered(ctx context.Context, cfg *config.Config, log *slog.Logger) (*config.Config, error) {
	if !c.discover {
		return cfg, nil
	}
	rc, err := c.restConfig()
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "image-refresh/" + Version
	rc.QPS, rc.Burst = 50, 100
	// Every request of the lists, also the REST mapper's API discovery,
	// which does not take ctx: a server that never answers must not hold a
	// render or a tick past apiTimeout (R14).
	rc.Timeout = cfg.APITimeout
	cl, err := client.New(rc, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.APITimeout)
	defer cancel()
	in, err := discovery.List(ctx, cl, cfg.AnnotationPrefix, c.watchNamespaces)
	if err != nil {
		return nil, fmt.Errorf("discovery (turn it off with --discovery=false): %w", err)
	}
	in.Configured = cfg.Groups
	res := discovery.Discover(in)
	logNotes(log, res.Notes)
	out := *cfg
	out.Groups = append(append([]config.Group{}, cfg.Groups...), res.Groups...)
	return &out, nil
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
