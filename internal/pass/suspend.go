package pass

import (
	"context"
	"fmt"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// Suspension is what `image-refresh suspend` writes (O1): until when (zero:
// until resumed) and why.
type Suspension struct {
	Until  time.Time
	Reason string
	// ResumeCommand is the command that ends it, named in the message of a
	// suspension without an end.
	ResumeCommand string
}

// Value is the P/suspend annotation: "true", or the RFC 3339 end.
func (s Suspension) Value() string {
	if s.Until.IsZero() {
		return "true"
	}
	return s.Until.UTC().Format(time.RFC3339)
}

// Suspend writes a group's suspension on its anchor and in the copy of its
// state, which a `rollout undo` cannot reach (R25), as the suspend field
// manager, with P/suspended-by naming it; records a Suspended Event on the
// anchor, and returns what it did in one line.
func (r *Runner) Suspend(ctx context.Context, g config.Group, s Suspension) (string, error) {
	keys := state.Keys{Prefix: r.Config.AnnotationPrefix}
	value, by := s.Value(), workload.SuspendFieldManager
	set := map[string]*string{keys.Suspend(): &value, keys.SuspendReason(): nil, keys.SuspendedBy(): &by}
	if s.Reason != "" {
		set[keys.SuspendReason()] = &s.Reason
	}
	until := "resumed (" + s.ResumeCommand + ")"
	if !s.Until.IsZero() {
		until = value
	}
	msg := fmt.Sprintf("suspended group %s until %s: image-refresh writes nothing to its targets meanwhile", g.Name, until)
	if s.Reason != "" {
		msg += "; reason: " + s.Reason
	}
	return msg, r.writeSuspension(ctx, "suspend", g, set, "Suspended", msg)
}

// Resume ends a group's suspension (O1): it removes P/suspend and
// P/suspend-reason from the anchor and the copy of its state, records a
// Resumed Event, and returns what it did; a group that is not suspended
// (in the state as read, the copy's when a rollback rewound the anchor) is
// left alone.
func (r *Runner) Resume(ctx context.Context, g config.Group) (string, error) {
	keys := state.Keys{Prefix: r.Config.AnnotationPrefix}
	obj, err := r.Workloads.Get(ctx, g.Anchor)
	if err != nil {
		return "", fmt.Errorf("resume group %s: %w", g.Name, err)
	}
	view, err := r.States().Read(ctx, obj)
	if err != nil {
		return "", fmt.Errorf("resume group %s: %w", g.Name, err)
	}
	if _, ok := view.State[keys.Suspend()]; !ok {
		return fmt.Sprintf("group %s is not suspended; nothing to do", g.Name), nil
	}
	set := map[string]*string{keys.Suspend(): nil, keys.SuspendReason(): nil}
	msg := fmt.Sprintf("resumed group %s: image-refresh writes to its targets again", g.Name)
	return msg, r.writeSuspension(ctx, "resume", g, set, "Resumed", msg)
}

// writeSuspension writes set on g's anchor and in its state's copy as the
// suspend field manager and records a Normal Event of reason.
func (r *Runner) writeSuspension(ctx context.Context, verb string, g config.Group, set map[string]*string, reason, msg string) error {
	obj, err := r.States().UpdateAs(ctx, g.Anchor, workload.SuspendFieldManager, nil, set)
	if err != nil {
		return fmt.Errorf("%s group %s: %w", verb, g.Name, err)
	}
	if err := r.Workloads.Event(ctx, obj, "Normal", reason, msg); err != nil && r.Log != nil {
		r.Log.Warn("could not record an event", "object", g.Anchor.String(), "error", err)
	}
	return nil
}
