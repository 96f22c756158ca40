package workload

// UpdateAnnotationsFrom exposes the compare-and-swap from a given snapshot,
// so a test can start two writers from the very same read.
var UpdateAnnotationsFrom = (*Client).updateAnnotationsFrom

// Bumped and ExcuseOwnBumps expose the own-write generation bookkeeping.
var (
	Bumped         = (*Client).bumped
	ExcuseOwnBumps = (*Client).excuseOwnBumps
)

// PodOf is podOf, for the K1 tests.
var PodOf = podOf
