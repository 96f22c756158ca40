package workload

// UpdateAnnotationsFrom exposes the compare-and-swap from a given snapshot,
// so a test can start two writers from the very same read.
var UpdateAnnotationsFrom = (*Client).updateAnnotationsFrom
