package workload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
)

// ImageChange re-images one container: From is the image the caller read,
// To the image it wants.
type ImageChange struct {
	Container, From, To string
}

// jsonPatchOp is one RFC 6902 operation.
type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// SetImages changes the named containers of one workload in one write, so
// that they roll out together (R9). Containers whose snapshot image already
// is To are left out; when none is left it writes nothing and returns false
// (R9: no write, no rollout, no resourceVersion bump).
//
// The write is a JSON patch that only replaces image fields (R16: never
// imagePullPolicy, other containers or anything else) and is optimistic:
// "test" operations require the same UID, the container's name at the
// index it was read at, and its image still From. If another writer got in
// between (a helm upgrade, a second instance), the server rejects the whole
// patch and SetImages returns an error satisfying errors.Is(err,
// ErrChanged); the other writer's image is kept.
func (c *Client) SetImages(ctx context.Context, obj *Object, changes []ImageChange) (bool, error) {
	if obj == nil {
		return false, errors.New("set images: no object")
	}
	ref := obj.Ref
	if err := validate(ref); err != nil {
		return false, err
	}
	ops, err := imagePatch(obj, changes)
	if err != nil {
		return false, fmt.Errorf("set images of %s: %w", ref, err)
	}
	if len(ops) == 0 {
		return false, nil
	}
	data, err := json.Marshal(ops)
	if err != nil {
		return false, fmt.Errorf("set images of %s: %w", ref, err)
	}
	stored, err := c.patch(ctx, ref, types.JSONPatchType, data)
	if err == nil {
		return true, rewritten(stored, changes)
	}
	if c.changedSince(ctx, obj, changes, err) {
		return false, fmt.Errorf("set images of %s: %w: %w", ref, ErrChanged, err)
	}
	return false, fmt.Errorf("set images of %s: %w", ref, err)
}

// imagePatch builds the operations, or none when every container already
// runs its wanted image.
func imagePatch(obj *Object, changes []ImageChange) ([]jsonPatchOp, error) {
	seen := map[string]bool{}
	var ops []jsonPatchOp
	for _, ch := range changes {
		if ch.From == "" || ch.To == "" {
			return nil, fmt.Errorf("container %q: both the old and the new image are required", ch.Container)
		}
		if seen[ch.Container] {
			return nil, fmt.Errorf("container %q is changed twice", ch.Container)
		}
		seen[ch.Container] = true
		i := obj.containerIndex(ch.Container)
		if i < 0 {
			return nil, fmt.Errorf("%w: %s has no container %q", ErrContainerNotFound, obj.Ref, ch.Container)
		}
		if obj.Containers[i].Image == ch.To {
			continue
		}
		if len(ops) == 0 {
			ops = append(ops, jsonPatchOp{Op: "test", Path: "/metadata/uid", Value: obj.UID})
		}
		k, _ := LookupKind(obj.Ref.Kind)
		pi := obj.Containers[i].PodImage()
		name := pi.Key
		if v, ok := (config.Target{Container: pi.Key}).Volume(); ok {
			name = v
		}
		at := pi.Pointer(k.PodSpecPointer())
		ops = append(ops,
			jsonPatchOp{Op: "test", Path: fmt.Sprintf("%s/%s/%d/name", k.PodSpecPointer(), pi.Slot.field(), pi.Index), Value: name},
			jsonPatchOp{Op: "test", Path: at, Value: ch.From},
			jsonPatchOp{Op: "replace", Path: at, Value: ch.To},
		)
	}
	return ops, nil
}

// changedSince tells a lost race from a real rejection. A failed "test"
// operation comes back as 422 Invalid, which is also what a validation
// failure (say, a malformed image) returns; so on 422 the live object is
// re-read and compared with what the patch expected. A 409 is a race.
func (c *Client) changedSince(ctx context.Context, obj *Object, changes []ImageChange, patchErr error) bool {
	if apierrors.IsConflict(patchErr) {
		return true
	}
	if !apierrors.IsInvalid(patchErr) {
		return false
	}
	live, err := c.read(ctx, obj.Ref)
	if err != nil {
		return false
	}
	if live.UID != obj.UID {
		return true
	}
	for _, ch := range changes {
		i := obj.containerIndex(ch.Container)
		if obj.Containers[i].Image == ch.To {
			continue // not part of the patch
		}
		if c, ok := live.Container(ch.Container); !ok || c.Slot != obj.Containers[i].Slot || c.Index != obj.Containers[i].Index || c.Image != ch.From {
			return true
		}
	}
	return false
}

// rewritten checks what the API server stored: a mutating admission webhook
// may have changed the image on the way in. Only the digest part counts
// (R7): a mirror webhook that rewrites the registry prefix keeps it.
func rewritten(stored *Object, changes []ImageChange) error {
	if stored == nil {
		return nil
	}
	var errs []error
	for _, ch := range changes {
		c, ok := stored.Container(ch.Container)
		if ok && imageref.DigestOf(c.Image) != imageref.DigestOf(ch.To) {
			errs = append(errs, fmt.Errorf("%w: container %s of %s was written as %s and stored as %s", ErrRewritten, ch.Container, stored.Ref, ch.To, c.Image))
		}
	}
	return errors.Join(errs...)
}
