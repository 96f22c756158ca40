package config

// AnnotationKeyNames returns the name parts (the text after "P/") of the
// per-image state annotation keys (SPEC "State"): the recorded digest, the
// stale-pin finding (R2), the ever-pinned marker (R5), and the live-read (R7)
// and resolve (R1) failure streaks. Validate checks that each one, with the
// prefix, is a valid annotation key, so that a long image name fails at load
// time and not at the first annotation write.
func AnnotationKeyNames(image string) []string {
	return []string{
		"last-refreshed-" + image + "-digest",
		"stale-pin-" + image,
		"ever-pinned-" + image,
		"live-read-failure-streak-" + image,
		"resolve-failure-streak-" + image,
	}
}

// GroupAnnotationKeyNames returns the name parts of the per-group state keys on
// the anchor: the attempt counter and lockout marker (R10) and the skip
// streak (R4). Because they carry no group name, two groups must not share
// an anchor.
func GroupAnnotationKeyNames() []string {
	return []string{"refresh-attempt", "refresh-flap-detected", "refresh-skip-streak"}
}
