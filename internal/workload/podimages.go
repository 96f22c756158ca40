package workload

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/image-refresh/image-refresh/internal/config"
)

// Slot says which list of a pod spec holds an image reference (K1): a pod
// runs the images of its containers, of its init containers (native
// sidecars included) and of its image volumes, and each is a target.
type Slot int

const (
	SlotContainer Slot = iota
	SlotInitContainer
	SlotImageVolume
)

// field is the slot's list in a pod spec, as in JSON.
func (s Slot) field() string {
	switch s {
	case SlotInitContainer:
		return "initContainers"
	case SlotImageVolume:
		return "volumes"
	}
	return "containers"
}

// imageField is the path from one entry of the slot's list to its image.
func (s Slot) imageField() []string {
	if s == SlotImageVolume {
		return []string{"image", "reference"}
	}
	return []string{"image"}
}

// Noun names the slot for people: "container", "init container", "image
// volume".
func (s Slot) Noun() string {
	switch s {
	case SlotInitContainer:
		return "init container"
	case SlotImageVolume:
		return "image volume"
	}
	return "container"
}

// PodImage is one image reference of a pod spec.
type PodImage struct {
	// Key names it as a target does (config.Target.Container): the
	// container's or init container's name (one name space in a pod), or
	// config.VolumeKey of the image volume's name.
	Key   string
	Image string
	Slot  Slot
	// Index is its position in the slot's list.
	Index int
}

// Pointer is the JSON pointer of the image field below the pod spec at
// podSpec ("/spec/template/spec"): ".../initContainers/0/image",
// ".../volumes/2/image/reference".
func (p PodImage) Pointer(podSpec string) string {
	out := podSpec + "/" + p.Slot.field() + "/" + strconv.Itoa(p.Index)
	for _, f := range p.Slot.imageField() {
		out += "/" + f
	}
	return out
}

// Path is Pointer's steps below the pod spec, for walking a manifest.
func (p PodImage) Path() []string {
	return append([]string{p.Slot.field(), strconv.Itoa(p.Index)}, p.Slot.imageField()...)
}

// String names it for people: "init container migrate", "image volume
// models".
func (p PodImage) String() string {
	name := p.Key
	if v, ok := (config.Target{Container: p.Key}).Volume(); ok {
		name = v
	}
	return fmt.Sprintf("%s %s", p.Slot.Noun(), name)
}

// PodImages lists every image reference of a pod spec, in a fixed order:
// containers, init containers, image volumes (K1). Volumes of other
// sources are not images; an image volume without a reference is left
// out.
func PodImages(spec *corev1.PodSpec) []PodImage {
	if spec == nil {
		return nil
	}
	out := make([]PodImage, 0, len(spec.Containers)+len(spec.InitContainers))
	for i, c := range spec.Containers {
		out = append(out, PodImage{Key: c.Name, Image: c.Image, Slot: SlotContainer, Index: i})
	}
	for i, c := range spec.InitContainers {
		out = append(out, PodImage{Key: c.Name, Image: c.Image, Slot: SlotInitContainer, Index: i})
	}
	for i, v := range spec.Volumes {
		if v.Image == nil || v.Image.Reference == "" {
			continue
		}
		out = append(out, PodImage{Key: config.VolumeKey(v.Name), Image: v.Image.Reference, Slot: SlotImageVolume, Index: i})
	}
	return out
}

// SameImages reports whether two pod specs have the same images in the
// same places (PodImages of both equal), without building the lists: the
// controller asks it on every watch event of a workload.
func SameImages(a, b *corev1.PodSpec) bool {
	if a == nil || b == nil {
		return a == b
	}
	if !sameContainers(a.Containers, b.Containers) || !sameContainers(a.InitContainers, b.InitContainers) || len(a.Volumes) != len(b.Volumes) {
		return false
	}
	for i := range a.Volumes {
		va, vb := a.Volumes[i].Image, b.Volumes[i].Image
		if (va == nil) != (vb == nil) || (va != nil && (a.Volumes[i].Name != b.Volumes[i].Name || va.Reference != vb.Reference)) {
			return false
		}
	}
	return true
}

func sameContainers(a, b []corev1.Container) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].Image != b[i].Image {
			return false
		}
	}
	return true
}
