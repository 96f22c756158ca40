package config

import (
	"fmt"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/state"
)

// tagPattern is the tag grammar of the distribution reference spec.
var tagPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// groupChecks holds what must be unique across the whole config.
type groupChecks struct {
	prefix  string         // "" when the prefix itself is invalid
	names   map[string]int // group name → index
	anchors map[Workload]int
	// targets maps each target to the path of the image that lists it: one
	// container image field must have one writer.
	targets map[Target]string
}

func (v *validator) groups(groups []Group, prefix string) {
	// No groups is valid: discovery only (D1).
	gc := &groupChecks{
		prefix:  prefix,
		names:   map[string]int{},
		anchors: map[Workload]int{},
		targets: map[Target]string{},
	}
	for i, g := range groups {
		p := fmt.Sprintf("groups[%d]", i)
		if v.name(p+".name", g.Name, "group name (DNS-1123 label)", validation.IsDNS1123Label) {
			if j, dup := gc.names[g.Name]; dup {
				v.errorf(p+".name", "duplicate group name %q (also groups[%d])", g.Name, j)
			} else {
				gc.names[g.Name] = i
			}
		}
		switch g.OnFailedRollout {
		case "", OnFailedRolloutHold, OnFailedRolloutRollback:
		default:
			v.errorf(p+".onFailedRollout", "%q is not one of hold, rollback", g.OnFailedRollout)
		}
		shared := -1 // index of an earlier group on the same anchor
		if v.workload(p+".anchor", g.Anchor) {
			if j, dup := gc.anchors[g.Anchor]; dup {
				shared = j
				v.errorf(p+".anchor", "%s is already the anchor of groups[%d]: the groups would share its %s annotations (docs/annotations.md)",
					g.Anchor, j, strings.Join(state.GroupKeyNames(), ", "))
			} else {
				gc.anchors[g.Anchor] = i
			}
		}
		if len(g.Images) == 0 {
			v.errorf(p+".images", "at least one image is required")
		}
		imageNames := map[string]int{}
		for k, img := range g.Images {
			ip := fmt.Sprintf("%s.images[%d]", p, k)
			v.imageName(ip+".name", img.Name, imageNames, gc.prefix)
			if shared >= 0 && img.Name != "" && hasImage(groups[shared], img.Name) {
				v.errorf(ip+".name", "image %q is also in groups[%d], which has the same anchor: their annotation keys would collide",
					img.Name, shared)
			}
			v.image(ip, img, gc)
		}
	}
}

func hasImage(g Group, name string) bool {
	for _, img := range g.Images {
		if img.Name == name {
			return true
		}
	}
	return false
}

// imageName checks the <image> of the annotation keys: a label, unique in
// its group, and short enough for the longest key built from it.
func (v *validator) imageName(path, name string, seen map[string]int, prefix string) {
	if !v.name(path, name, "image name (DNS-1123 label)", validation.IsDNS1123Label) {
		return
	}
	if j, dup := seen[name]; dup {
		v.errorf(path, "duplicate image name %q in this group (also images[%d])", name, j)
		return
	}
	seen[name] = len(seen)
	if prefix == "" {
		return
	}
	for _, part := range state.ImageKeyNames(name) {
		// Annotation keys follow the label-key syntax (a "qualified name").
		if msgs := content.IsLabelKey(prefix + "/" + part); len(msgs) > 0 {
			v.errorf(path, "image name %q makes the annotation key %q invalid: %s", name, prefix+"/"+part, strings.Join(msgs, "; "))
			return
		}
	}
}

func (v *validator) image(path string, img Image, gc *groupChecks) {
	if img.Repository == "" {
		v.errorf(path+".repository", "missing")
	} else if _, err := imageref.CanonicalRepository(img.Repository); err != nil {
		v.errorf(path+".repository", "invalid: %v", err)
	}
	switch {
	case img.Tag == "":
		v.errorf(path+".tag", "missing")
	case strings.Contains(img.Tag, "@"):
		v.errorf(path+".tag", "%q must not contain '@': an operator pin goes in pinnedDigest", img.Tag)
	default:
		// The tag syntax does not depend on the repository, so a fixed one
		// checks the tag even when the repository is wrong. imageref accepts
		// a leading '.' or '-' that the distribution grammar (and so the
		// kubelet) refuses; tagPattern closes that gap.
		if ref, err := imageref.Parse("localhost/tag-check:" + img.Tag); err != nil || ref.Tag != img.Tag ||
			!tagPattern.MatchString(img.Tag) {
			v.errorf(path+".tag", "%q is not a valid tag (want [A-Za-z0-9_][A-Za-z0-9_.-]{0,127})", img.Tag)
		}
	}
	if img.PinnedDigest != "" {
		if _, err := imageref.ParseDigest(img.PinnedDigest); err != nil {
			v.errorf(path+".pinnedDigest", "%v", err)
		}
	}
	if len(img.Targets) == 0 {
		v.errorf(path+".targets", "at least one target is required")
	}
	local := map[Target]int{}
	for i, t := range img.Targets {
		tp := fmt.Sprintf("%s.targets[%d]", path, i)
		if !v.target(tp, t) {
			continue
		}
		if j, dup := local[t]; dup {
			v.errorf(tp, "duplicate of targets[%d]", j)
			continue
		}
		local[t] = i
		if first, dup := gc.targets[t]; dup {
			v.errorf(tp, "%s is also a target of %s: two images would write one container's image", t, first)
			continue
		}
		gc.targets[t] = path
	}
}

func (v *validator) target(path string, t Target) bool {
	ok := v.workload(path, t.Workload())
	if vol, isVolume := t.Volume(); isVolume {
		return v.name(path+".volume", vol, "volume name (DNS-1123 label)", validation.IsDNS1123Label) && ok
	}
	ok = v.name(path+".container", t.Container, "container name (DNS-1123 label)", validation.IsDNS1123Label) && ok
	return ok
}
