// Package testwait waits in tests for a signal (a channel receive), not a
// wall-clock window: on a loaded machine a fixed timeout flakes. The only
// bound is the test binary's own deadline (go test -timeout), less a margin
// so that the failure names what was awaited instead of ending in the
// runtime's timeout panic.
package testwait

import (
	"testing"
	"time"
)

// margin is what Recv leaves of the test deadline to report the failure.
const margin = 10 * time.Second

// Recv returns the next value of ch. If the test's deadline comes first,
// the test fails naming what.
func Recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	d, ok := deadline(t)
	if !ok {
		return <-ch
	}
	timer := time.NewTimer(time.Until(d))
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("waited until the test deadline for %s", what)
		var zero T
		return zero
	}
}

func deadline(t testing.TB) (time.Time, bool) {
	dt, ok := t.(interface{ Deadline() (time.Time, bool) })
	if !ok {
		return time.Time{}, false
	}
	d, ok := dt.Deadline()
	if !ok {
		return time.Time{}, false
	}
	return d.Add(-margin), true
}
