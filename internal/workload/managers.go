package workload

import (
	"encoding/json"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// containersPath leads from the root of a FieldsV1 set to the pod
// template's containers.
var containersPath = []string{"f:spec", "f:template", "f:spec", "f:containers"}

// imageManagers maps container name → the field manager that owns that
// container's image. When several own it (shared ownership after applies
// of the same value), the most recent entry wins: it is the last writer.
// A manager whose entry cannot be parsed is ignored: ownership is
// diagnostic, never a reason to fail a read.
func imageManagers(entries []metav1.ManagedFieldsEntry) map[string]string {
	type owner struct {
		manager string
		at      time.Time
	}
	best := map[string]owner{}
	for _, e := range entries {
		if e.FieldsV1 == nil {
			continue
		}
		var at time.Time
		if e.Time != nil {
			at = e.Time.Time
		}
		for _, name := range containersWithImage(e.FieldsV1.Raw) {
			cur, seen := best[name]
			if !seen || at.After(cur.at) || (at.Equal(cur.at) && e.Manager < cur.manager) {
				best[name] = owner{manager: e.Manager, at: at}
			}
		}
	}
	out := make(map[string]string, len(best))
	for name, o := range best {
		out[name] = o.manager
	}
	return out
}

// containersWithImage returns the names of the containers whose f:image a
// FieldsV1 set holds. Containers are keyed by `k:{"name":"<n>"}`; the key
// is decoded as JSON rather than matched as text.
func containersWithImage(raw []byte) []string {
	node := json.RawMessage(raw)
	for _, key := range containersPath {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(node, &fields); err != nil {
			return nil
		}
		next, ok := fields[key]
		if !ok {
			return nil
		}
		node = next
	}
	var containers map[string]json.RawMessage
	if err := json.Unmarshal(node, &containers); err != nil {
		return nil
	}
	var names []string
	for key, val := range containers {
		id, ok := strings.CutPrefix(key, "k:")
		if !ok {
			continue
		}
		var k struct {
			Name string `json:"name"`
		}
		var fields map[string]json.RawMessage
		if json.Unmarshal([]byte(id), &k) != nil || json.Unmarshal(val, &fields) != nil {
			continue
		}
		if _, ok := fields["f:image"]; ok && k.Name != "" {
			names = append(names, k.Name)
		}
	}
	return names
}

// ImageManagers maps container name → the field manager that owns its
// image in these managedFields ("" when none does).
func ImageManagers(entries []metav1.ManagedFieldsEntry) map[string]string {
	return imageManagers(entries)
}
