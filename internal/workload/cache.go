package workload

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/resourceversion"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/image-refresh/image-refresh/internal/config"
)

// ownWriteFresh bounds how long a read after this client's own write
// distrusts the cache: the informer delivers the write within milliseconds,
// and a cache that still shows an older object after this long is current
// and someone else wrote since.
const ownWriteFresh = 10 * time.Second

// maxOwnBumps bounds the generations remembered per workload.
const maxOwnBumps = 16

// ownWrite is the object a write of this client stored.
type ownWrite struct {
	resourceVersion string
	at              time.Time
}

// SetCache makes Observe-side reads (GetObserved, Cached) come from r, the
// controller manager's informer cache, instead of a GET per read (C6
// issue: a steady state with nothing to change makes no API request).
// Writes and the reads of the write path (the compare-and-swap's re-read,
// the rewrite check) stay direct. Call it before the first read.
func (c *Client) SetCache(r client.Reader) { c.cache = r }

// Cached reads a workload from the cache when one is set, else as Get.
// Right after this client's own write to it, while the cache does not show
// that write (or a later version) yet, it reads directly, so that a pass
// never decides on the object from before its own write.
func (c *Client) Cached(ctx context.Context, ref config.Workload) (*Object, error) {
	if err := validate(ref); err != nil {
		return nil, err
	}
	if c.cache == nil {
		return c.Get(ctx, ref)
	}
	obj, err := c.readCache(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("read %s from the cache: %w", ref, err)
	}
	c.mu.Lock()
	w, wrote := c.written[ref]
	if wrote && (atLeast(obj.ResourceVersion, w.resourceVersion) || time.Since(w.at) > ownWriteFresh) {
		delete(c.written, ref)
		wrote = false
	}
	c.mu.Unlock()
	if wrote {
		return c.Get(ctx, ref)
	}
	return obj, nil
}

// atLeast reports whether the cache's object is the own write or a later
// version of it. Resource versions of one resource compare as integers
// (KEP-5504, apimachinery's CompareResourceVersion), so a cache that moved
// past the write (a rollout's status update after it) is trusted too; a
// version that does not parse counts only when it is equal.
func atLeast(cached, written string) bool {
	if cached == written {
		return true
	}
	cmp, err := resourceversion.CompareResourceVersion(cached, written)
	return err == nil && cmp >= 0
}

// readCache reads without the cache's deep copy: FromObject only reads
// the object and copies what it keeps (the Object shares nothing mutable
// with the cache), so the copy of the whole workload, managed fields and
// status included, would be garbage at once — a fifth of a resync's CPU at
// 10,000 workloads (C6).
func (c *Client) readCache(ctx context.Context, ref config.Workload) (*Object, error) {
	k, _ := LookupKind(ref.Kind)
	obj := k.New()
	if err := c.cache.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, obj, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	return Snapshot(obj)
}

// wrote remembers the object a write of this client stored (Cached).
func (c *Client) wrote(out *Object) {
	if c.cache == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.written == nil {
		c.written = map[config.Workload]ownWrite{}
	}
	c.written[out.Ref] = ownWrite{resourceVersion: out.ResourceVersion, at: time.Now()}
}

// bumped remembers that an annotation write of this client, from before to
// after, moved metadata.generation: the API server does that on a
// Deployment for any annotation change. The write carried before's
// resourceVersion, so no other write is in between.
func (c *Client) bumped(before, after *Object) {
	if after.Generation <= before.Generation {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bumps == nil {
		c.bumps = map[config.Workload][]int64{}
	}
	gens := c.bumps[after.Ref]
	for g := before.Generation + 1; g <= after.Generation; g++ {
		gens = append(gens, g)
	}
	if len(gens) > maxOwnBumps {
		gens = gens[len(gens)-maxOwnBumps:]
	}
	c.bumps[after.Ref] = gens
}

// excuseOwnBumps re-evaluates an object whose controller has not observed
// its current generation: when every generation it has not observed was
// caused by this client's own annotation writes alone, nothing about the
// pod template changed since the status was written, and the status
// decides (issue: own writes are not unsettledness).
func (c *Client) excuseOwnBumps(obj *Object) {
	s := obj.Settled
	if !s.Unobserved || s.status == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	gens := c.bumps[obj.Ref]
	own := map[int64]bool{}
	var keep []int64
	for _, g := range gens {
		if g > s.ObservedGeneration {
			own[g] = true
			keep = append(keep, g)
		}
	}
	if len(keep) == 0 {
		delete(c.bumps, obj.Ref)
	} else {
		c.bumps[obj.Ref] = keep
	}
	for g := s.ObservedGeneration + 1; g <= s.Generation; g++ {
		if !own[g] {
			return
		}
	}
	obj.Settled = *s.status
	obj.Settled.OwnBumps = true
}
