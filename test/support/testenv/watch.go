package testenv

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/image-refresh/image-refresh/internal/workload"
)

// Watcher opens a watch; UntilWatched opens it again when the API server
// ends it.
type Watcher func(ctx context.Context) (watch.Interface, error)

// UntilWatched waits until cond holds: it opens the watch, checks cond,
// and checks it again on every event the watch delivers, so that it waits
// on the API server's signal, not a poll. Any change after the watch
// opened arrives as an event, so a change between a check and the wait is
// not lost. A watch the API server ends (a restart, its timeout) is opened
// again and cond checked again; only while it cannot be opened does this
// retry on a timer. It returns ctx's error, with cond's last error, if ctx
// ends first.
func UntilWatched(ctx context.Context, open Watcher, cond func(ctx context.Context) (bool, error)) error {
	var last error
	for {
		w, err := open(ctx)
		if err == nil {
			done, cerr := watchUntil(ctx, w, cond)
			if done {
				return nil
			}
			last = cerr
		} else {
			last = err
			select { // the API server is not reachable: nothing to watch
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
		if ctx.Err() != nil {
			if last != nil {
				return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
			}
			return ctx.Err()
		}
	}
}

// watchUntil checks cond now and on each event of w, until it holds, ctx
// ends or the watch closes.
func watchUntil(ctx context.Context, w watch.Interface, cond func(ctx context.Context) (bool, error)) (bool, error) {
	defer w.Stop()
	for {
		ok, err := cond(ctx)
		if ok {
			return true, nil
		}
		select {
		case <-ctx.Done():
			return false, err
		case _, open := <-w.ResultChan():
			if !open {
				return false, err
			}
		}
	}
}

// WatchWorkload watches one workload of a kind of the kind table.
func WatchWorkload(client kubernetes.Interface, kind, ns, name string) (Watcher, error) {
	k, ok := workload.LookupKind(kind)
	if !ok {
		return nil, fmt.Errorf("watch %s %s/%s: %w", kind, ns, name, workload.ErrUnsupportedKind)
	}
	var rc rest.Interface
	switch k.Group {
	case "apps":
		rc = client.AppsV1().RESTClient()
	case "batch":
		rc = client.BatchV1().RESTClient()
	default:
		return nil, fmt.Errorf("watch %s %s/%s: no client for API group %q", kind, ns, name, k.Group)
	}
	return func(ctx context.Context) (watch.Interface, error) {
		opts := metav1.ListOptions{Watch: true, FieldSelector: "metadata.name=" + name}
		return rc.Get().Namespace(ns).Resource(k.Resource).VersionedParams(&opts, scheme.ParameterCodec).Watch(ctx)
	}, nil
}
