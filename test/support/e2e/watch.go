package e2e

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// UntilWatched waits until cond holds and returns how long that took. cond
// is a check of what open watches only: it is checked at once and again
// on every change the watch delivers, the API server's signal, not on a
// timer (testenv.UntilWatched). timeout bounds a hang; if it passes first,
// the test fails naming what. A condition on anything else (logs,
// metrics, Events) has no signal here: wait for it with the controller's
// or the registry's own signals, or testwait.Eventually.
func (e *Env) UntilWatched(timeout time.Duration, what string, open testenv.Watcher, cond func() bool) time.Duration {
	e.T.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := testenv.UntilWatched(ctx, open, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		e.T.Fatalf("%s: not within %s (%v)", what, timeout, err)
	}
	return time.Since(start)
}

// WatchDeployments watches the namespace's Deployments.
func (e *Env) WatchDeployments() testenv.Watcher {
	deployments := e.C.Client.AppsV1().Deployments(e.NS)
	return func(ctx context.Context) (watch.Interface, error) {
		return deployments.Watch(ctx, metav1.ListOptions{})
	}
}

// UntilDeployments is UntilWatched for a check of the namespace's
// Deployments (Image, Annotations, StateOf).
func (e *Env) UntilDeployments(timeout time.Duration, what string, cond func() bool) time.Duration {
	e.T.Helper()
	return e.UntilWatched(timeout, what, e.WatchDeployments(), cond)
}

// UntilWorkload is UntilWatched for a check of one workload of the
// namespace, of any kind of the kind table.
func (e *Env) UntilWorkload(kind, name string, timeout time.Duration, what string, cond func() bool) time.Duration {
	e.T.Helper()
	open, err := testenv.WatchWorkload(e.C.Client, kind, e.NS, name)
	if err != nil {
		e.T.Fatal(err)
	}
	return e.UntilWatched(timeout, what, open, cond)
}

// WatchEvents watches the namespace's Events: the core and events.k8s.io
// APIs serve the same objects, so it sees both recorders' writes, a
// series' updates too.
func (e *Env) WatchEvents() testenv.Watcher {
	events := e.C.Client.CoreV1().Events(e.NS)
	return func(ctx context.Context) (watch.Interface, error) {
		return events.Watch(ctx, metav1.ListOptions{})
	}
}

// UntilEvents is UntilWatched for a check of the namespace's Events
// (Events, EventsWhere).
func (e *Env) UntilEvents(timeout time.Duration, what string, cond func() bool) time.Duration {
	e.T.Helper()
	return e.UntilWatched(timeout, what, e.WatchEvents(), cond)
}
