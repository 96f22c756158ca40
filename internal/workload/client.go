// Package workload reads and writes the workloads image-refresh pins (the
// kinds of kinds.go: Deployments, DaemonSets, StatefulSets, CronJobs): it
// is the executor's hands. It reads a workload into a snapshot (Object),
// changes image fields with an
// optimistic JSON patch (R9, R16), keeps its state annotations with a
// compare-and-swap, waits for rollouts (R4) and records Events (R15). Every
// API call is bounded (R14) and every write carries one field manager (R17).
package workload

import (
	"context"
	"errors"
	"sync"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/image-refresh/image-refresh/internal/config"
)

// FieldManager is the field manager of every write (R17). In
// metadata.managedFields it owns the image fields image-refresh pinned, so
// a Helm 4 server-side-apply upgrade that renders `repo:tag` again conflicts
// with it; Helm resolves that with --force-conflicts, takes the field back,
// and fix A (R7) re-pins it.
const FieldManager = "image-refresh"

// DefaultAPITimeout bounds each API call when New is given no timeout.
const DefaultAPITimeout = 30 * time.Second

var (
	// ErrChanged means the workload is no longer what the caller read: a
	// test operation of a patch failed, the API server answered 409, or an
	// expected annotation differs. Re-read and decide again.
	ErrChanged = errors.New("workload changed since it was read")
	// ErrRewritten means the write landed but the API server stored another
	// image: a mutating admission webhook rewrote it (C5).
	ErrRewritten = errors.New("the image was rewritten on admission")

	// ErrUnsupportedKind means a config.Workload names a kind that is not
	// in the kind table (kinds.go): a configuration error (R19).
	ErrUnsupportedKind = errors.New("unsupported workload kind")

	// ErrContainerNotFound means a workload has no container of the given
	// name: a configuration error (R19), not an unreadable target.
	ErrContainerNotFound = errors.New("container not found")
)

// Client reads and writes workloads through client-go.
type Client struct {
	// Now stamps the Events Event records (firstTimestamp,
	// lastTimestamp); nil is time.Now. A test injects its clock, so that a
	// repeat lands on a later second without waiting one out (the
	// timestamps have second precision).
	Now func() time.Time

	kube       kubernetes.Interface
	dyn        dynamic.Interface // SetDynamic: declared kinds (K2)
	apiTimeout time.Duration
	cache      client.Reader // SetCache; nil: every read is a GET

	mu      sync.Mutex
	written map[config.Workload]ownWrite // the last object each write stored (Cached)
	bumps   map[config.Workload][]int64  // generations own annotation writes caused
}

// New returns a Client whose every API call is bounded by apiTimeout (R14);
// a non-positive apiTimeout means DefaultAPITimeout.
func New(kube kubernetes.Interface, apiTimeout time.Duration) *Client {
	if apiTimeout <= 0 {
		apiTimeout = DefaultAPITimeout
	}
	return &Client{kube: kube, apiTimeout: apiTimeout}
}

// bounded derives the context of one API call (R14).
func (c *Client) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.apiTimeout)
}
