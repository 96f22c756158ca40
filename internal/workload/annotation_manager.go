package workload

import (
	"encoding/json"
	"time"
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
