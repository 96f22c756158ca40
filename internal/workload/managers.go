package workload

import (
	"bytes"
	"encoding/json"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/image-refresh/image-refresh/internal/config"
)

// fImage is the key of a container's image in a field set.
var fImage = []byte(`"f:image"`)

// podSpecPath leads from the root of a FieldsV1 set to the pod
// template's spec of kind k.
func podSpecPath(k *Kind) []string {
	out := make([]string, 0, len(k.PodSpecPath))
	for _, p := range k.PodSpecPath {
		out = append(out, "f:"+p)
	}
	return out
}

// imageManagers maps the key of each image of the pod template
// (PodImage.Key: a container's or init container's name, an image
// volume's config.VolumeKey) → the field manager that owns that image. When several own it (shared ownership after applies
// of the same value), the most recent entry wins: it is the last writer.
// A manager whose entry cannot be parsed is ignored: ownership is
// diagnostic, never a reason to fail a read.
func imageManagers(k *Kind, entries []metav1.ManagedFieldsEntry) map[string]string {
	path := podSpecPath(k)
	type owner struct {
		manager string
		at      time.Time
	}
	best := map[string]owner{}
	for _, e := range entries {
		// An entry that owns no image at all (the controller-manager's
		// status, an annotation write) is not decoded: every pass reads
		// every workload's managed fields (C6). The API server writes
		// field sets as plain JSON, which never escapes a letter of a key.
		if e.FieldsV1 == nil || !bytes.Contains(e.FieldsV1.Raw, fImage) {
			continue
		}
		var at time.Time
		if e.Time != nil {
			at = e.Time.Time
		}
		for _, name := range imagesOwned(path, e.FieldsV1.Raw) {
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

// imagesOwned returns the keys of the pod spec's images whose image field a
// FieldsV1 set holds: containers' and init containers' f:image, image
// volumes' f:image.f:reference (K1). Entries of each list are keyed by
// `k:{"name":"<n>"}`; the key is decoded as JSON rather than matched as
// text.
func imagesOwned(path []string, raw []byte) []string {
	node := json.RawMessage(raw)
	for _, key := range path {
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
	var spec map[string]json.RawMessage
	if err := json.Unmarshal(node, &spec); err != nil {
		return nil
	}
	names := withImage(spec["f:containers"], "")
	names = append(names, withImage(spec["f:initContainers"], "")...)
	return append(names, withImage(spec["f:volumes"], config.VolumePrefix)...)
}

// withImage returns the names, each after prefix, of the entries of one
// list's field set that own an image: f:image of a container, f:image with
// f:reference below it of a volume.
func withImage(list json.RawMessage, prefix string) []string {
	if list == nil {
		return nil
	}
	var containers map[string]json.RawMessage
	if err := json.Unmarshal(list, &containers); err != nil {
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
		img, ok := fields["f:image"]
		if !ok || k.Name == "" {
			continue
		}
		if prefix != "" { // a volume: its image source's reference
			var src map[string]json.RawMessage
			if json.Unmarshal(img, &src) != nil {
				continue
			}
			if _, ok := src["f:reference"]; !ok {
				continue
			}
		}
		names = append(names, prefix+k.Name)
	}
	return names
}

// ImageManagers maps image key (PodImage.Key) → the field manager that owns its
// image in a workload's managedFields ("" when none does); nil for an
// object of a kind outside the table.
func ImageManagers(obj client.Object) map[string]string {
	k, ok := KindOf(obj)
	if !ok {
		return nil
	}
	return imageManagers(k, obj.GetManagedFields())
}
