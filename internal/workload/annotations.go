package workload

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/internal/config"
)

// conflictRetries bounds the re-read-and-retry loop on 409 Conflict.
const conflictRetries = 5

// UpdateAnnotations is a compare-and-swap on the state annotations
// image-refresh keeps on a group's anchor (attempt counter, lockout marker,
// digest records: R10, R13).
//
// expect holds the values the caller read (nil: the key must be absent); if
// any differs, nothing is written and the error satisfies
// errors.Is(err, ErrChanged). set holds the new values (nil: delete the
// key); an empty set, or one that changes nothing, writes nothing.
//
// The write is a JSON merge patch carrying metadata.resourceVersion, so of
// two instances writing from the same read only one succeeds (C3). On 409
// Conflict it re-reads, checks expect again and retries, at most 5 times:
// a conflict caused by an unrelated write (a status update, another key) is
// not a lost race. It touches only metadata.annotations (R16) and writes
// with FieldManager (R17). It returns the object as written.
//
// On a Deployment the API server bumps metadata.generation for any
// annotation change (the controller copies annotations to ReplicaSets), so
// the anchor reads not settled (observedGeneration behind) until the
// controller catches up, usually within milliseconds. No rollout starts,
// and GetObserved of this Client knows the bump for its own.
func (c *Client) UpdateAnnotations(ctx context.Context, ref config.Workload, expect, set map[string]*string) (*Object, error) {
	return c.UpdateAnnotationsWith(ctx, ref, func(obj *Object) (map[string]*string, error) {
		if err := CheckExpected(obj.Annotations, expect); err != nil {
			return nil, err
		}
		return set, nil
	})
}

// UpdateAnnotationsWith is the compare-and-swap of UpdateAnnotations with
// the check and the values computed by decide from the object as read, on
// the first read and again on each re-read after a 409 Conflict: decide
// returns the annotations to set (nil deletes a key), or an error, and
// nothing is written. internal/statestore decides on the state chosen
// between the anchor and its copy (R25).
func (c *Client) UpdateAnnotationsWith(ctx context.Context, ref config.Workload, decide func(*Object) (map[string]*string, error)) (*Object, error) {
	return c.UpdateAnnotationsAs(ctx, ref, FieldManager, decide)
}

// UpdateAnnotationsAs is UpdateAnnotationsWith written as field manager
// manager: the suspend and resume commands write the operator's
// suspension (O1) under their own (SuspendFieldManager), which status
// names.
func (c *Client) UpdateAnnotationsAs(ctx context.Context, ref config.Workload, manager string, decide func(*Object) (map[string]*string, error)) (*Object, error) {
	if err := validate(ref); err != nil {
		return nil, err
	}
	obj, err := c.read(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("update annotations of %s: %w", ref, err)
	}
	return c.updateFrom(ctx, obj, manager, decide)
}

// updateAnnotationsFrom runs the compare-and-swap starting from a snapshot.
func (c *Client) updateAnnotationsFrom(ctx context.Context, obj *Object, expect, set map[string]*string) (*Object, error) {
	return c.updateFrom(ctx, obj, FieldManager, func(obj *Object) (map[string]*string, error) {
		if err := CheckExpected(obj.Annotations, expect); err != nil {
			return nil, err
		}
		return set, nil
	})
}

// updateFrom runs UpdateAnnotationsWith's loop starting from a snapshot.
func (c *Client) updateFrom(ctx context.Context, obj *Object, manager string, decide func(*Object) (map[string]*string, error)) (*Object, error) {
	ref := obj.Ref
	for retry := 0; ; retry++ {
		set, err := decide(obj)
		if err != nil {
			return nil, fmt.Errorf("update annotations of %s: %w", ref, err)
		}
		if !changes(obj.Annotations, set) {
			return obj, nil
		}
		data, err := annotationPatch(obj.ResourceVersion, set)
		if err != nil {
			return nil, fmt.Errorf("update annotations of %s: %w", ref, err)
		}
		out, err := c.patchAs(ctx, ref, types.MergePatchType, data, manager)
		switch {
		case err == nil:
			c.bumped(obj, out)
			return out, nil
		case !apierrors.IsConflict(err):
			return nil, fmt.Errorf("update annotations of %s: %w", ref, err)
		case retry == conflictRetries:
			return nil, fmt.Errorf("update annotations of %s: still conflicting after %d retries: %w", ref, conflictRetries, err)
		}
		if obj, err = c.read(ctx, ref); err != nil {
			return nil, fmt.Errorf("update annotations of %s: re-read after a conflict: %w", ref, err)
		}
	}
}

// CheckExpected checks the values a caller read (expect; nil: absent)
// against have; the error satisfies errors.Is(err, ErrChanged).
func CheckExpected(have map[string]string, expect map[string]*string) error {
	return checkExpected(have, expect)
}

func checkExpected(have map[string]string, expect map[string]*string) error {
	for key, want := range expect {
		got, ok := have[key]
		switch {
		case want == nil && ok:
			return fmt.Errorf("%w: annotation %s is %q, expected it absent", ErrChanged, key, got)
		case want != nil && !ok:
			return fmt.Errorf("%w: annotation %s is absent, expected %q", ErrChanged, key, *want)
		case want != nil && got != *want:
			return fmt.Errorf("%w: annotation %s is %q, expected %q", ErrChanged, key, got, *want)
		}
	}
	return nil
}

// changes reports whether applying set to have would change anything.
func changes(have map[string]string, set map[string]*string) bool {
	for key, v := range set {
		got, ok := have[key]
		if (v == nil) == ok || (v != nil && got != *v) {
			return true
		}
	}
	return false
}

func annotationPatch(resourceVersion string, set map[string]*string) ([]byte, error) {
	// A nil value marshals to null, which a merge patch reads as delete.
	return json.Marshal(map[string]any{
		"metadata": map[string]any{
			"resourceVersion": resourceVersion,
			"annotations":     set,
		},
	})
}
