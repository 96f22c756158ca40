package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/statestore"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// Adoption is what the front ends that write (`tick`, and `run`'s leader)
// do with a discovery result besides reconciling its groups (D1): mark the
// anchor of each discovered group, and let go of the marked workloads that
// are no longer labelled. `status` and `render` only read.
type Adoption struct {
	Prefix string
	// Workloads writes the marks and removes the state annotations.
	Workloads *workload.Client
	// State, when set, writes the marks as state (R25: numbered, copied)
	// and deletes a let-go workload's copy of its state with its
	// annotations.
	State *statestore.Store
	// API lists the marked workloads: the object metadata of every
	// workload in scope (a label selector cannot find a workload whose
	// label was removed).
	API client.Reader
	// Scope limits the lists to these namespaces; empty: the cluster.
	Scope []string
	Log   *slog.Logger
}

// Mark writes the DiscoveredGroup marker on the anchor of each discovered
// group that lacks it, so that a later pass can tell a workload that was
// discovered from the anchor of a configured group. in holds the listed
// objects (their annotations), so a marked anchor costs no request.
func (a Adoption) Mark(ctx context.Context, in Input, res Result) {
	key := state.Keys{Prefix: a.Prefix}.DiscoveredGroup()
	anchors := map[config.Workload]client.Object{}
	for _, obj := range in.Workloads {
		if k, ok := workload.KindOf(obj); ok {
			anchors[config.Workload{Kind: k.Name, Namespace: obj.GetNamespace(), Name: obj.GetName()}] = obj
		}
	}
	for _, g := range res.Groups {
		obj := anchors[g.Anchor]
		if obj != nil && obj.GetAnnotations()[key] == g.Name {
			continue
		}
		name := g.Name
		update := a.Workloads.UpdateAnnotations
		if a.State != nil {
			update = a.State.Update
		}
		if _, err := update(ctx, g.Anchor, nil, map[string]*string{key: &name}); err != nil {
			a.Log.Warn("discovery: could not mark the anchor of a discovered group; it is managed, but not let go by itself when its label goes",
				"group", g.Name, "anchor", g.Anchor.String(), "annotation", key, "error", err)
		}
	}
}

// Released returns the workloads of marked to let go (D1): those that
// carry the DiscoveredGroup marker, are not labelled in (managed, as
// Discover saw it), and that no group of groups names — the configured
// groups win (D2), so their workloads, the anchors above all, keep their
// state. Sorted.
func Released(prefix string, marked []client.Object, managed map[config.Workload]bool, groups []config.Group) []config.Workload {
	key := state.Keys{Prefix: prefix}.DiscoveredGroup()
	named := map[config.Workload]bool{}
	for _, g := range groups {
		for _, w := range g.Workloads() {
			named[w] = true
		}
	}
	var out []config.Workload
	for _, obj := range marked {
		if _, ok := obj.GetAnnotations()[key]; !ok {
			continue
		}
		k, ok := kindOfMeta(obj)
		if !ok {
			continue
		}
		w := config.Workload{Kind: k.Name, Namespace: obj.GetNamespace(), Name: obj.GetName()}
		if !managed[w] && !named[w] {
			out = append(out, w)
		}
	}
	slices.SortFunc(out, func(a, b config.Workload) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(out)
}

// LetGoUnlabelled lists the marked workloads in scope and lets go of those
// Released names; it returns them. groups are every group of this pass,
// configured and discovered; managed is Discover's Result.Managed. An error
// is a failed list: nothing was let go.
func (a Adoption) LetGoUnlabelled(ctx context.Context, managed map[config.Workload]bool, groups []config.Group) ([]config.Workload, error) {
	marked, err := a.listMetadata(ctx)
	if err != nil {
		return nil, err
	}
	out := Released(a.Prefix, marked, managed, groups)
	for _, w := range out {
		a.LetGo(ctx, w)
	}
	return out, nil
}

// LetGo removes the state annotations of a workload that is no longer
// managed: its label or its namespace's was removed. Its pin stays, so it
// keeps running what it runs, and the log says so (D1). The discovery keys
// an operator wrote (enabled, group, ignore-containers) stay.
func (a Adoption) LetGo(ctx context.Context, w config.Workload) {
	log := a.Log.With("workload", w.String())
	obj, err := a.Workloads.Get(ctx, w)
	if apierrors.IsNotFound(err) {
		log.Info("let go: the workload is gone")
		return
	}
	if err != nil {
		log.Warn("let go: cannot read the workload to remove its state annotations; remove them by hand", "error", err)
		return
	}
	keys := state.Keys{Prefix: a.Prefix}
	if g := obj.Annotations[keys.DiscoveredGroup()]; g != "" {
		log = log.With("group", g)
	}
	operator := keys.Operator()
	expect, set := map[string]*string{}, map[string]*string{}
	var removed []string
	for k, v := range obj.Annotations {
		if !strings.HasPrefix(k, a.Prefix+"/") || slices.Contains(operator, k) {
			continue
		}
		expect[k], set[k] = &v, nil
		removed = append(removed, k)
	}
	if a.State != nil {
		// Before the annotations: a copy left behind would bring the state
		// back if the workload were managed again (R25).
		if err := a.State.Delete(ctx, w); err != nil {
			log.Warn("let go: could not delete the copy of its state; delete it by hand, or it brings the state back if the workload is managed again", "error", err)
		}
	}
	if len(set) == 0 {
		log.Info("let go: no longer labelled; its pin stays, it had no state annotations")
		return
	}
	slices.Sort(removed)
	if _, err := a.Workloads.UpdateAnnotations(ctx, w, expect, set); err != nil {
		log.Warn("let go: could not remove the state annotations; remove them by hand", "annotations", strings.Join(removed, ","), "error", err)
		return
	}
	log.Info("let go: no longer labelled; its pin stays and its state annotations were removed", "annotations", strings.Join(removed, ","))
}

// listMetadata lists the metadata (not the pod templates) of every
// workload in scope.
func (a Adoption) listMetadata(ctx context.Context) ([]client.Object, error) {
	var out []client.Object
	for _, kind := range workload.Kinds() {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(schema.GroupVersionKind{Group: kind.Group, Version: kind.Version, Kind: kind.Name + "List"})
		namespaces := a.Scope
		if len(namespaces) == 0 {
			namespaces = []string{""}
		}
		for _, ns := range namespaces {
			if err := a.API.List(ctx, list, client.InNamespace(ns)); err != nil {
				return nil, fmt.Errorf("list the %s to find those no longer labelled %s=true: %w", kind.Resource, state.Keys{Prefix: a.Prefix}.Enabled(), err)
			}
			for i := range list.Items {
				it := list.Items[i]
				it.SetGroupVersionKind(schema.GroupVersionKind{Group: kind.Group, Version: kind.Version, Kind: kind.Name})
				out = append(out, &it)
			}
		}
	}
	return out, nil
}

// kindOfMeta returns the kind of a typed object or of object metadata.
func kindOfMeta(obj client.Object) (*workload.Kind, bool) {
	if k, ok := workload.KindOf(obj); ok {
		return k, true
	}
	if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
		return workload.LookupKind(m.Kind)
	}
	return nil, false
}
