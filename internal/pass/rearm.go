package pass

import (
	"context"
	"fmt"
	"strings"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/state"
)

// Rearmed is what Rearm did: the keys it cleared, none when the group had
// nothing to clear, and the message it recorded and `rearm` prints.
type Rearmed struct {
	Cleared []string
	Message string
}

// Rearm clears group g's attempt counter, its holder and the lockout marker
// on the anchor, ends a flapping tag's hold (R21) and takes the digests
// lockouts locked on out of quarantine (R23): R18. It reads the group's
// current state (the copy's, when a rollback rewound the anchor's: R25),
// deletes the keys in one compare-and-swap on what it read, and records a
// RefreshRearmed Event on the anchor; an Event that cannot be recorded is
// logged, not returned.
func (r *Runner) Rearm(ctx context.Context, g config.Group) (Rearmed, error) {
	obj, err := r.Workloads.Get(ctx, g.Anchor)
	if err != nil {
		return Rearmed{}, fmt.Errorf("rearm group %s: %w", g.Name, err)
	}
	view, err := r.States().Read(ctx, obj)
	if err != nil {
		return Rearmed{}, fmt.Errorf("rearm group %s: %w", g.Name, err)
	}
	keys := state.Keys{Prefix: r.Config.AnnotationPrefix}
	expect, set := map[string]*string{}, map[string]*string{}
	var images []string
	for _, img := range g.Images {
		images = append(images, img.Name)
	}
	var out Rearmed
	for _, k := range keys.Rearmed(images) {
		if v, ok := view.State[k]; ok {
			expect[k], set[k] = &v, nil
			out.Cleared = append(out.Cleared, k)
		}
	}
	if len(set) == 0 {
		out.Message = fmt.Sprintf("group %s is not locked out, has no pending attempt and no held image; nothing to do", g.Name)
		return out, nil
	}
	if _, err := r.States().Update(ctx, g.Anchor, expect, set); err != nil {
		return Rearmed{}, fmt.Errorf("rearm group %s: %w", g.Name, err)
	}
	out.Message = fmt.Sprintf("re-armed group %s: cleared %s; the next tick acts again", g.Name, strings.Join(out.Cleared, ", "))
	if err := r.Workloads.Event(ctx, obj, "Normal", "RefreshRearmed", out.Message); err != nil && r.Log != nil {
		r.Log.Warn("could not record an event", "object", g.Anchor.String(), "error", err)
	}
	return out, nil
}
