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

// Until waits until cond holds, checking it first and again each time the
// channel changed returns is closed: changed is called before each check,
// so a change between the check and the wait is not lost. It is for a
// condition on state whose owner announces each change (a watch, a server
// that counts requests): no poll and no window; the test's deadline bounds
// a hang, and the failure names what.
func Until(t testing.TB, what string, changed func() <-chan struct{}, cond func() bool) {
	t.Helper()
	for {
		ch := changed()
		if cond() {
			return
		}
		Recv(t, ch, what)
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

// Eventually polls cond every 50 ms until it holds and returns how long
// that took; if timeout passes first, the test fails naming what. It is
// for a state no watch or counter announces (a page a server serves, an
// object another process writes): the timeout bounds a hang, it is not a
// window the test waits out.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if cond() {
			return time.Since(start)
		}
		if time.Since(start) >= timeout {
			t.Fatalf("%s: not within %s", what, timeout)
			return 0
		}
		<-tick.C
	}
}
