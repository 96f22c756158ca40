package workload

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// AnnotationManager returns the field manager that last wrote the
// annotation key per the object's managedFields ("" when none owns it): who
// set an operator's annotation such as an anchor's suspension (O1). It is
// decoded on demand, for the one key a caller asks about: a pass reads
// every workload's managed fields (C6).
func (o *Object) AnnotationManager(key string) string {
	var (
		best string
		at   time.Time
	)
	for _, e := range o.managedFields {
		if e.FieldsV1 == nil {
			continue
		}
		var root struct {
			Metadata struct {
				Annotations map[string]json.RawMessage `json:"f:annotations"`
			} `json:"f:metadata"`
		}
		if json.Unmarshal(e.FieldsV1.Raw, &root) != nil {
			continue
		}
		if _, ok := root.Metadata.Annotations["f:"+key]; !ok {
			continue
		}
		var t time.Time
		if e.Time != nil {
			t = e.Time.Time
		}
		if best == "" || t.After(at) {
			best, at = e.Manager, t
		}
	}
	return best
}

// SuspendFieldManager is the field manager of `image-refresh suspend` and
// `resume` (O1): the suspension is the operator's write, not a pass's, and
// status names its writer from managedFields.
const SuspendFieldManager = "image-refresh-suspend"

// SetOperatorAnnotations writes the operator's annotations set (nil:
// delete) on ref as field manager manager, a JSON merge patch carrying the
// resourceVersion read, retried on 409 Conflict like UpdateAnnotations. It
// touches only metadata.annotations.
func (c *Client) SetOperatorAnnotations(ctx context.Context, ref Ref, set map[string]*string, manager string) (*Object, error) {
	if err := ref.validate(); err != nil {
		return nil, err
	}
	k, _ := LookupKind(ref.Kind)
	for retry := 0; ; retry++ {
		obj, err := c.read(ctx, ref)
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
		callCtx, cancel := c.bounded(ctx)
		out, err := k.patch(callCtx, c.kube, ref.Namespace, ref.Name, types.MergePatchType, data, metav1.PatchOptions{FieldManager: manager})
		cancel()
		switch {
		case err == nil:
			return FromObject(out), nil
		case !apierrors.IsConflict(err):
			return nil, fmt.Errorf("update annotations of %s: %w", ref, err)
		case retry == conflictRetries:
			return nil, fmt.Errorf("update annotations of %s: still conflicting after %d retries: %w", ref, conflictRetries, err)
		}
	}
}
