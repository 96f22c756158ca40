package workload

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/image-refresh/image-refresh/internal/config"
)

// declared holds the kinds the config declared (K2), after the built-in
// ones: Kinds, LookupKind and KindOf see them once Declare ran. Like a
// scheme's registrations, they are the process's: a declaration is never
// taken back, and declaring the same kind again is a no-op.
var (
	declared   atomic.Pointer[[]*Kind]
	declaredMu sync.Mutex // serializes Declare
	decls      = map[string]config.DeclaredKind{}
)

// ErrKindRedeclared means a kind is declared again with another group,
// version, pod template, resource or selector than before in this process.
var ErrKindRedeclared = errors.New("kind already declared otherwise")

// Declare adds the config's declared kinds to the kind table (K2). The
// config validated them; a kind declared earlier in this process with
// other settings is an error, and then none of kinds is added.
func Declare(kinds []config.DeclaredKind) error {
	declaredMu.Lock()
	defer declaredMu.Unlock()
	seen := map[string]bool{}
	for _, d := range kinds {
		if seen[d.Kind] {
			return fmt.Errorf("kinds: %s is declared twice", d)
		}
		seen[d.Kind] = true
	}
	var add []*Kind
	for _, d := range kinds {
		if prev, ok := decls[d.Kind]; ok {
			if prev != d {
				return fmt.Errorf("kinds: %s: %w (as %s, pod template %s)", d, ErrKindRedeclared, prev, prev.PodTemplate)
			}
			continue
		}
		add = append(add, declaredKind(d))
	}
	if len(add) == 0 {
		return nil
	}
	var all []*Kind
	if cur := declared.Load(); cur != nil {
		all = slices.Clone(*cur)
	}
	for _, k := range add {
		decls[k.Name] = k.decl
		all = append(all, k)
	}
	declared.Store(&all)
	return nil
}

// declaredKind builds the table entry of a declared kind: its objects are
// unstructured, its pod template is converted from the declared path, and
// it is read and patched with the dynamic client.
func declaredKind(d config.DeclaredKind) *Kind {
	gvk := schema.GroupVersionKind{Group: d.Group, Version: d.Version, Kind: d.Kind}
	resource := d.Resource
	if resource == "" {
		plural, _ := meta.UnsafeGuessKindToResource(gvk)
		resource = plural.Resource
	}
	gvr := gvk.GroupVersion().WithResource(resource)
	tmplPath := d.PodTemplatePath()
	selPath := d.SelectorPath()
	k := &Kind{
		Name: d.Kind, Group: d.Group, Version: d.Version, Resource: resource,
		PodSpecPath: append(slices.Clone(tmplPath), "spec"),
		Pods:        selPath != nil,
		Declared:    true,
		decl:        d,
	}
	k.newObject = func() client.Object {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		return u
	}
	k.template = func(o client.Object) (*corev1.PodTemplateSpec, error) {
		u := o.(*unstructured.Unstructured)
		m, found, err := unstructured.NestedMap(u.Object, tmplPath...)
		if err != nil || !found {
			return nil, fmt.Errorf("no pod template at %s (kinds: %s declares it there): %v", d.PodTemplate, d, orNotFound(err))
		}
		var t corev1.PodTemplateSpec
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &t); err != nil {
			return nil, fmt.Errorf("%s is not a pod template (kinds: %s): %w", d.PodTemplate, d, err)
		}
		return &t, nil
	}
	k.selector = func(o client.Object) *metav1.LabelSelector {
		if selPath == nil {
			return nil
		}
		m, found, err := unstructured.NestedMap(o.(*unstructured.Unstructured).Object, selPath...)
		if err != nil || !found {
			return nil
		}
		var sel metav1.LabelSelector
		if runtime.DefaultUnstructuredConverter.FromUnstructured(m, &sel) != nil {
			return nil
		}
		return &sel
	}
	k.settled = func(o client.Object) Settledness { return DeclaredSettled(o.(*unstructured.Unstructured)) }
	k.get = func(ctx context.Context, c *Client, ns, n string) (client.Object, error) {
		dyn, err := c.dynamicFor(k)
		if err != nil {
			return nil, err
		}
		return dyn.Resource(gvr).Namespace(ns).Get(ctx, n, metav1.GetOptions{})
	}
	k.patch = func(ctx context.Context, c *Client, ns, n string, pt types.PatchType, data []byte, opts metav1.PatchOptions) (client.Object, error) {
		dyn, err := c.dynamicFor(k)
		if err != nil {
			return nil, err
		}
		return dyn.Resource(gvr).Namespace(ns).Patch(ctx, n, pt, data, opts)
	}
	return k
}

func orNotFound(err error) error {
	if err == nil {
		return errors.New("not found")
	}
	return err
}

// SetDynamic gives the client the dynamic client it reads and writes
// declared kinds with (K2). Call it before the first read.
func (c *Client) SetDynamic(d dynamic.Interface) { c.dyn = d }

func (c *Client) dynamicFor(k *Kind) (dynamic.Interface, error) {
	if c.dyn == nil {
		return nil, fmt.Errorf("%s is a declared kind and this client has no dynamic client (SetDynamic)", k.Name)
	}
	return c.dyn, nil
}

// DeclaredSettled judges a declared kind's rollout (K2, R4), as the
// field's tooling reads such a status:
//   - status.observedGeneration below metadata.generation: the controller
//     has not seen the current spec (an integer, or Argo Rollouts' string);
//   - an Argo Rollouts Rollout: status.phase Healthy is settled, Degraded
//     failed, Paused and Progressing not yet (Argo CD's reading);
//   - any other kind: kstatus (sigs.k8s.io/cli-utils) Current is settled,
//     Failed (a Stalled condition) failed; and where the status counts
//     replicas (updatedReplicas, readyReplicas, availableReplicas), each must
//     reach spec.replicas, as for a Deployment.
func DeclaredSettled(u *unstructured.Unstructured) Settledness {
	gen := u.GetGeneration()
	if observed, ok := observedGeneration(u); ok && observed < gen {
		return unobserved(observed, gen, declaredStatus(u))
	}
	return declaredStatus(u)
}

// observedGeneration reads status.observedGeneration, an integer or (Argo
// Rollouts) a decimal string.
func observedGeneration(u *unstructured.Unstructured) (int64, bool) {
	v, found, _ := unstructured.NestedFieldNoCopy(u.Object, "status", "observedGeneration")
	if !found {
		return 0, false
	}
	switch g := v.(type) {
	case int64:
		return g, true
	case float64:
		return int64(g), true
	case string:
		n, err := strconv.ParseInt(g, 10, 64)
		return n, err == nil
	}
	return 0, false
}

func declaredStatus(u *unstructured.Unstructured) Settledness {
	if u.GroupVersionKind().GroupKind() == (schema.GroupKind{Group: "argoproj.io", Kind: "Rollout"}) {
		return rolloutStatus(u)
	}
	// kstatus reads observedGeneration as an integer; DeclaredSettled
	// compared it already, in either form.
	c := u.DeepCopy()
	unstructured.RemoveNestedField(c.Object, "status", "observedGeneration")
	res, err := status.Compute(c)
	if err != nil {
		return notSettled("its status does not read: %v", err)
	}
	switch res.Status {
	case status.CurrentStatus:
	case status.FailedStatus:
		st := notSettled("%s", res.Message)
		st.Failed = res.Message
		return st
	default:
		return notSettled("%s: %s", strings.ToLower(string(res.Status)), res.Message)
	}
	return replicasStatus(u)
}

// replicasStatus compares the replica counts a status gives with
// spec.replicas (default 1); a count the status does not give is not
// checked.
func replicasStatus(u *unstructured.Unstructured) Settledness {
	want, found, err := unstructured.NestedInt64(u.Object, "spec", "replicas")
	if err != nil {
		return Settledness{Settled: true}
	}
	if !found {
		want = 1
	}
	for _, f := range []struct{ field, what string }{
		{"updatedReplicas", "updated"}, {"readyReplicas", "ready"}, {"availableReplicas", "available"},
	} {
		n, found, err := unstructured.NestedInt64(u.Object, "status", f.field)
		if err == nil && found && n < want {
			return notSettled("%d of %d replicas %s", n, want, f.what)
		}
	}
	return Settledness{Settled: true}
}

// rolloutStatus reads an Argo Rollouts Rollout's status.phase.
func rolloutStatus(u *unstructured.Unstructured) Settledness {
	phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
	msg, _, _ := unstructured.NestedString(u.Object, "status", "message")
	switch phase {
	case "Healthy":
		return Settledness{Settled: true}
	case "Degraded":
		st := notSettled("Rollout is Degraded: %s", msg)
		st.Failed = "Degraded: " + msg
		return st
	case "":
		return notSettled("the Rollout has no status.phase yet")
	}
	if msg != "" {
		return notSettled("Rollout is %s: %s", phase, msg)
	}
	return notSettled("Rollout is %s", phase)
}

// ErrKindNotServed means a declared kind is not served by the API server
// as declared: its CRD is not installed, or under another version or
// resource name.
var ErrKindNotServed = errors.New("not served by the API server")

// CheckServed confirms with the API server's discovery that it serves
// each declared kind as the table reads and writes it: the group and
// version, the resource name, namespaced. tick, run and status call it at
// start, before Declare, so a missing CRD is said once and plainly rather
// than as a failed read of every target, and a kind that is not served
// never joins the kind table.
func CheckServed(disco discovery.DiscoveryInterface, kinds []config.DeclaredKind) error {
	var errs []error
	for i, d := range kinds {
		k := declaredKind(d)
		at := fmt.Sprintf("kinds[%d]: %s", i, d)
		list, err := disco.ServerResourcesForGroupVersion(d.Group + "/" + d.Version)
		switch {
		case apierrors.IsNotFound(err):
			errs = append(errs, fmt.Errorf("%s: %w: no API %s/%s (is its CRD installed? kubectl get crd)", at, ErrKindNotServed, d.Group, d.Version))
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: read the API server's discovery of %s/%s: %w", at, d.Group, d.Version, err))
			continue
		}
		var served *metav1.APIResource
		for j := range list.APIResources {
			r := &list.APIResources[j]
			if r.Kind == d.Kind && !strings.Contains(r.Name, "/") {
				served = r
				break
			}
		}
		switch {
		case served == nil:
			errs = append(errs, fmt.Errorf("%s: %w: %s/%s has no kind %s (is its CRD installed? kubectl get crd)", at, ErrKindNotServed, d.Group, d.Version, d.Kind))
		case served.Name != k.Resource:
			errs = append(errs, fmt.Errorf("%s: %w as resource %s: the API server serves it as %s; set resource: %s", at, ErrKindNotServed, k.Resource, served.Name, served.Name))
		case !served.Namespaced:
			errs = append(errs, fmt.Errorf("%s: %w as a namespaced kind: it is cluster-scoped, and a workload is namespaced", at, ErrKindNotServed))
		}
	}
	return errors.Join(errs...)
}
