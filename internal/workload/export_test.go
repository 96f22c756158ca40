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

// WithoutManagedFields is a copy of o without the managed fields it keeps
// for AnnotationManager, which the strip tests compare by what they answer.
func WithoutManagedFields(o *Object) *Object {
	c := *o
	c.managedFields = nil
	return &c
}
