package operator

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/poller"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// Discovery configures `run`'s discovery of labelled workloads (SPEC D1).
type Discovery struct {
	// Namespaces limits discovery to these namespaces; empty: the cluster.
	Namespaces []string
}

// SetDiscovered replaces the groups discovered by label (D1), as
// internal/operator/discoverer's passes find them: new and changed groups are
// reconciled, images no group uses any more are no longer polled (C2), and
// the webhook is told every group (OnGroups). A group dropped leaves
// /metrics (D2) once its pass in flight, if any, ended (lockPass): a pass
// still running could write its gauges, or the state back after the
// let-go; a later pass finds the group gone. It returns the discovered
// groups it replaced and every group, sorted by name (discoverer.Groups).
func (c *Controller) SetDiscovered(groups []config.Group) (old map[string]config.Group, all []config.Group) {
	c.mu.Lock()
	old = c.discovered
	c.discovered = map[string]config.Group{}
	for _, g := range groups {
		c.discovered[g.Name] = g
	}
	c.rebuildLocked()
	q := c.queue
	c.mu.Unlock()
	for _, g := range groups {
		c.Poller.Add(g.Images...)
		if prev, ok := old[g.Name]; !ok || !reflect.DeepEqual(prev, g) {
			if !ok {
				c.Runner.Log.Info("discovered a group", "group", g.Name, "anchor", g.Anchor.String(), "images", len(g.Images))
			}
			if q != nil {
				q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: g.Name}})
			}
		}
	}
	all = c.allGroups()
	slices.SortFunc(all, func(a, b config.Group) int { return strings.Compare(a.Name, b.Name) })
	c.Poller.Remove(unused(old, all)...)
	if c.OnGroups != nil {
		c.OnGroups(all)
	}
	kept := map[string]bool{}
	for _, g := range all {
		kept[g.Name] = true
	}
	for name := range old {
		if !kept[name] {
			// A standby runs no pass: it does not wait.
			c.lockPass(name)()
			c.forgetMetrics(name)
		}
	}
	return old, all
}

// unused returns the images of the old discovered groups whose
// repository:tag no group of all uses any more: the poller stops asking
// for them (C2).
func unused(old map[string]config.Group, all []config.Group) []config.Image {
	used := map[string]bool{}
	for _, g := range all {
		for _, img := range g.Images {
			used[poller.Key(img)] = true
		}
	}
	var out []config.Image
	for _, name := range slices.Sorted(maps.Keys(old)) {
		for _, img := range old[name].Images {
			if k := poller.Key(img); !used[k] {
				used[k] = true // once
				out = append(out, img)
			}
		}
	}
	return out
}

// forgetMetrics deletes the gauges of a group no longer managed (D2).
func (c *Controller) forgetMetrics(group string) {
	if c.Runner.Metrics != nil {
		c.Runner.Metrics.ForgetGroup(group)
	}
}

// lockPass takes the pass lock of a group and returns its unlock.
func (c *Controller) lockPass(group string) func() {
	m, _ := c.passLocks.LoadOrStore(group, &sync.Mutex{})
	mu := m.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// watchNamespaceCache adds the controller's watches on the cache of a
// labelled namespace (internal/operator/discoverer starts it): the same handlers as
// on the manager's cache.
func (c *Controller) watchNamespaceCache(nc cache.Cache) error {
	for _, k := range workload.Kinds() {
		if err := c.ctrl.Watch(source.Kind(nc, k.New(), c.groupHandler(), c.groupPredicates())); err != nil {
			return err
		}
	}
	return nil
}
