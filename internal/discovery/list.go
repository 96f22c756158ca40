package discovery

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// Selector selects the objects labelled k.Enabled()=true: the namespaces,
// and the workloads outside a labelled namespace.
func Selector(k state.Keys) labels.Selector {
	req, err := labels.NewRequirement(k.Enabled(), selection.Equals, []string{"true"})
	if err != nil {
		// The prefix is validated as a DNS subdomain, so the key is valid.
		panic(fmt.Sprintf("discovery label %q: %v", k.Enabled(), err))
	}
	return labels.NewSelector().Add(*req)
}

// List reads what Discover needs through r (the API, or the informer
// cache of `run`): the labelled namespaces, the labelled workloads, and
// every workload of a labelled namespace. With scope, only those
// namespaces are looked at; without, the whole cluster. An error (an RBAC
// denial, the API down) names what could not be listed: discovery that
// silently found nothing would be a silent failure (R15).
func List(ctx context.Context, r client.Reader, prefix string, scope []string) (Input, error) {
	k := state.Keys{Prefix: prefix}
	in := Input{Prefix: prefix, Namespaces: map[string]bool{}}
	sel := Selector(k)
	if len(scope) == 0 {
		var nss corev1.NamespaceList
		if err := r.List(ctx, &nss, client.MatchingLabelsSelector{Selector: sel}); err != nil {
			return in, fmt.Errorf("list the namespaces labelled %s=true: %w", k.Enabled(), err)
		}
		for _, ns := range nss.Items {
			in.Namespaces[ns.Name] = true
		}
	} else {
		for _, name := range scope {
			var ns corev1.Namespace
			err := r.Get(ctx, client.ObjectKey{Name: name}, &ns)
			switch {
			case apierrors.IsNotFound(err):
				continue
			case err != nil:
				return in, fmt.Errorf("read namespace %s: %w", name, err)
			}
			if sel.Matches(labels.Set(ns.Labels)) {
				in.Namespaces[name] = true
			}
		}
	}
	for _, kind := range workload.Kinds() {
		list := func(opts ...client.ListOption) error {
			l, err := listOf(kind)
			if err != nil {
				return err
			}
			if err := r.List(ctx, l, opts...); err != nil {
				return fmt.Errorf("list %s: %w", kind.Resource, err)
			}
			return meta(l, func(o client.Object) { in.Workloads = append(in.Workloads, o) })
		}
		if len(scope) == 0 {
			if err := list(client.MatchingLabelsSelector{Selector: sel}); err != nil {
				return in, fmt.Errorf("list the %s labelled %s=true: %w", kind.Resource, k.Enabled(), err)
			}
		} else {
			for _, ns := range scope {
				if in.Namespaces[ns] {
					continue // listed whole below
				}
				if err := list(client.InNamespace(ns), client.MatchingLabelsSelector{Selector: sel}); err != nil {
					return in, fmt.Errorf("list the %s labelled %s=true in namespace %s: %w", kind.Resource, k.Enabled(), ns, err)
				}
			}
		}
		for ns := range in.Namespaces {
			if err := list(client.InNamespace(ns)); err != nil {
				return in, fmt.Errorf("list the %s of namespace %s (labelled %s=true): %w", kind.Resource, ns, k.Enabled(), err)
			}
		}
	}
	return in, nil
}

// listOf returns an empty list object of kind from client-go's scheme, so
// that the kinds table stays the one list of kinds.
func listOf(kind *workload.Kind) (client.ObjectList, error) {
	gvk := schema.GroupVersionKind{Group: kind.Group, Version: kind.Version, Kind: kind.Name + "List"}
	if kind.Declared {
		// A declared kind (K2) is listed as unstructured objects.
		l := &unstructured.UnstructuredList{}
		l.SetGroupVersionKind(gvk)
		return l, nil
	}
	obj, err := scheme.Scheme.New(gvk)
	if err != nil {
		return nil, fmt.Errorf("list type of %s: %w", kind.Name, err)
	}
	l, ok := obj.(client.ObjectList)
	if !ok {
		return nil, fmt.Errorf("list type of %s: %T is not a list", kind.Name, obj)
	}
	return l, nil
}

// meta calls each for every item of l.
func meta(l client.ObjectList, each func(client.Object)) error {
	items, err := apimeta.ExtractList(l)
	if err != nil {
		return err
	}
	for _, it := range items {
		if o, ok := it.(client.Object); ok {
			each(o)
		}
	}
	return nil
}
