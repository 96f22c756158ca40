package config

import (
	"strings"

	"github.com/image-refresh/image-refresh/internal/state"
)

// AnnotationKeyNames returns the name parts (the text after "P/") of the
// per-image state annotation keys (internal/state). Validate checks that
// each one, with the prefix, is a valid annotation key, so that a long image
// name fails at load time and not at the first annotation write.
func AnnotationKeyNames(image string) []string { return state.ImageKeyNames(image) }

// GroupAnnotationKeyNames returns the name parts of the per-group state keys
// on the anchor: the attempt counter and lockout marker (R10) and the skip
// streak (R4). Because they carry no group name, two groups must not share
// an anchor.
func GroupAnnotationKeyNames() []string {
	k := state.Keys{}
	var out []string
	for _, full := range []string{k.Attempt(), k.Flap(), k.SkipStreak()} {
		out = append(out, strings.TrimPrefix(full, "/"))
	}
	return out
}
