package reconcile

import (
	"context"
	"log/slog"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/refresh"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// Result is what one tick over every group did.
type Result struct {
	Plans []*refresh.Plan
}

// NeedsHuman reports whether any group needs a human (exit 1, R15).
func (r Result) NeedsHuman() bool {
	for _, p := range r.Plans {
		if p.NeedsHuman() {
			return true
		}
	}
	return false
}

// Tick runs one reconcile pass over every group, bounded by the config's
// tick deadline (R14). With dryRun it decides and reports, and writes
// nothing: no annotation, no image, no event.
func (r *Runner) Tick(ctx context.Context, dryRun bool) Result {
	ctx, cancel := context.WithTimeout(ctx, r.Config.EffectiveTickTimeout())
	defer cancel()
	latest := &TickSource{Resolver: r.Resolver}
	var res Result
	for _, g := range r.Config.Groups {
		res.Plans = append(res.Plans, r.Group(ctx, g, latest, GroupOptions{DryRun: dryRun}))
	}
	return res
}

// GroupOptions tune one group pass.
type GroupOptions struct {
	DryRun bool
	// Fights are targets to leave alone (C5), from the controller's memory.
	Fights map[config.Target]string
	// SkipUncounted: see refresh.Observation.SkipUncounted.
	SkipUncounted bool
}

// Group runs one reconcile pass over one group: observe, decide, execute
// (unless DryRun), report. It returns the plan with every finding.
func (r *Runner) Group(ctx context.Context, g config.Group, latest Latest, opts GroupOptions) *refresh.Plan {
	snap := r.Observe(ctx, g, latest)
	snap.Observation.Fights = opts.Fights
	snap.Observation.SkipUncounted = opts.SkipUncounted
	plan := refresh.Decide(refresh.SettingsFrom(r.Config, r.ConfigPath), snap.Observation)
	if !opts.DryRun {
		r.Execute(ctx, plan, snap)
	}
	r.report(ctx, plan, snap, opts.DryRun)
	return plan
}

// report tells the operator: a log line per finding (with the
// remediation), a Warning Event on the anchor for each non-benign one, and
// the metrics (R15).
func (r *Runner) report(ctx context.Context, p *refresh.Plan, snap Snapshot, dryRun bool) {
	anchor := snap.Objects[p.Anchor]
	for _, f := range p.Findings {
		attrs := []any{"group", p.Group}
		if f.Image != "" {
			attrs = append(attrs, "image", f.Image)
		}
		if f.Target != nil {
			attrs = append(attrs, "target", f.Target.String())
		}
		if f.Reason != "" {
			attrs = append(attrs, "reason", f.Reason)
		}
		if f.Remediation != "" {
			attrs = append(attrs, "remediation", f.Remediation)
		}
		if dryRun {
			attrs = append(attrs, "dryRun", true)
		}
		msg := f.Message
		if f.Severity == refresh.SeverityNote {
			msg = "NOTE: " + msg
		}
		r.Log.Log(ctx, level(f.Severity), msg, attrs...)
		if f.NeedsHuman && !dryRun && anchor != nil {
			msg := f.Message
			if f.Remediation != "" {
				msg += ". Remediation: " + f.Remediation
			}
			r.event(ctx, anchor, "Warning", f.Reason, msg)
		}
	}
	if r.Metrics == nil {
		return
	}
	m := r.Metrics
	locked := 0.0
	if p.LockedOut {
		locked = 1
	}
	m.GroupLockedOut.WithLabelValues(p.Group).Set(locked)
	for _, reason := range []string{refresh.ReasonRefreshLockedOut, refresh.ReasonRefreshFrozen, refresh.ReasonStalePin, refresh.ReasonRefreshError} {
		v := 0.0
		for _, f := range p.Findings {
			if f.NeedsHuman && f.Reason == reason {
				v = 1
			}
		}
		m.NeedsAttention.WithLabelValues(p.Group, reason).Set(v)
	}
	if p.NeedsHuman() {
		m.ReconcileErrors.WithLabelValues(p.Group).Inc()
	}
	for _, row := range p.Rows {
		t := row.TargetRef()
		on := 0.0
		if row.State == refresh.StatePinned {
			on = 1
		}
		m.TargetOnDigest.WithLabelValues(p.Group, row.Image, t.Namespace, t.Name, t.Container).Set(on)
	}
	m.LastTick.WithLabelValues(p.Group).Set(float64(time.Now().Unix()))
}

func (r *Runner) event(ctx context.Context, obj *workload.Object, typ, reason, msg string) {
	if reason == "" {
		reason = refresh.ReasonRefreshError
	}
	if err := r.Workloads.Event(ctx, obj, typ, reason, msg); err != nil {
		r.Log.Warn("could not record an event", "object", obj.Ref.String(), "reason", reason, "error", err)
	}
}

func level(s refresh.Severity) slog.Level {
	switch s {
	case refresh.SeverityWarn:
		return slog.LevelWarn
	case refresh.SeverityError:
		return slog.LevelError
	}
	return slog.LevelInfo
}
