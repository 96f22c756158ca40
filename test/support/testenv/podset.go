package testenv

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/image-refresh/image-refresh/internal/config"
)

// PodSet is a custom kind the tests define (K2): a CRD with a pod template
// at spec.template and a label selector at spec.selector, whose status no
// controller writes: the test drives it (PodSetDriver), as Argo Rollouts
// or OpenKruise would.
var PodSet = config.DeclaredKind{Group: "e2e.image-refresh.io", Version: "v1", Kind: "PodSet", PodTemplate: "spec.template"}

// PodSetResource is the PodSet's resource.
var PodSetResource = schema.GroupVersionResource{Group: PodSet.Group, Version: PodSet.Version, Resource: "podsets"}

// PodSetKindYAML is PodSet as a config's kinds: entry.
const PodSetKindYAML = "kinds:\n  - {group: e2e.image-refresh.io, version: v1, kind: PodSet, podTemplate: spec.template}\n"

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// podSetCRD is the PodSet's CRD: its spec and status keep any field (the
// pod template is not validated here; the API server validates the pods
// the tests do not create), with the status subresource, so a spec change
// moves metadata.generation and a status write does not.
const podSetCRD = `{
  "apiVersion": "apiextensions.k8s.io/v1",
  "kind": "CustomResourceDefinition",
  "metadata": {"name": "PLURAL.e2e.image-refresh.io"},
  "spec": {
    "group": "e2e.image-refresh.io",
    "scope": "Namespaced",
    "names": {"plural": "PLURAL", "singular": "SINGULAR", "kind": "KIND", "listKind": "KINDList"},
    "versions": [{
      "name": "v1", "served": true, "storage": true,
      "subresources": {"status": {}},
      "schema": {"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
      }}}
    }]
  }
}`

// InstallPodSet creates the PodSet CRD once per cluster (tests share it;
// it is never deleted) and waits until the API server serves the kind.
func InstallPodSet(t testing.TB, rc *rest.Config) dynamic.Interface {
	t.Helper()
	return InstallPodSetLike(t, rc, PodSet.Kind)
}

// InstallPodSetLike installs a CRD of the PodSet's shape under another
// kind of the same group (plural: the kind in lower case and "s"), for a
// test that declares it in a way no other test may share.
func InstallPodSetLike(t testing.TB, rc *rest.Config, kind string) dynamic.Interface {
	t.Helper()
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	singular := strings.ToLower(kind)
	var crd unstructured.Unstructured
	if err := crd.UnmarshalJSON([]byte(strings.NewReplacer("PLURAL", singular+"s", "SINGULAR", singular, "KIND", kind).Replace(podSetCRD))); err != nil {
		t.Fatal(err)
	}
	res := PodSetResource
	res.Resource = singular + "s"
	ctx := context.Background()
	if _, err := dyn.Resource(crdGVR).Create(ctx, &crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create the PodSet CRD: %v", err)
	}
	// Served once a list answers (the CRD is Established and the
	// discovery of its group updated).
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := dyn.Resource(res).Namespace("default").List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the %s CRD is not served: %v", kind, err)
	}
	return dyn
}

// unstructuredSpec is the spec of a custom kind with a pod template at
// spec.template and its selector at spec.selector, from the Spec the
// options build; meta is the object's metadata.
func unstructuredSpec(t testing.TB, name string, opts []Option) (map[string]any, metav1.ObjectMeta) {
	t.Helper()
	s, meta, sel, tmpl := build(name, opts)
	tm, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&tmpl)
	if err != nil {
		t.Fatal(err)
	}
	sm, err := runtime.DefaultUnstructuredConverter.ToUnstructured(sel)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]any{"replicas": int64(s.Replicas), "selector": sm, "template": tm}, meta
}

// CreatePodSet creates a PodSet of the Spec the options build (replicas,
// containers, init containers, image volumes, labels) and returns it.
func CreatePodSet(t testing.TB, dyn dynamic.Interface, ns, name string, opts ...Option) *unstructured.Unstructured {
	t.Helper()
	spec, meta := unstructuredSpec(t, name, opts)
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetAPIVersion(PodSet.Group + "/" + PodSet.Version)
	u.SetKind(PodSet.Kind)
	u.SetNamespace(ns)
	u.SetName(meta.Name)
	u.SetLabels(meta.Labels)
	u.SetAnnotations(meta.Annotations)
	out, err := dyn.Resource(PodSetResource).Namespace(ns).Create(context.Background(), u, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create PodSet %s/%s: %v", ns, name, err)
	}
	return out
}

// PodSetDriver is the PodSet's stand-in controller: on every change of
// the PodSet it writes a status that says the current generation rolled
// out (observedGeneration, every replica updated, ready and available),
// unless the test holds it or makes it report a stall.
type PodSetDriver struct {
	dyn      dynamic.Interface
	ns, name string
	mu       sync.Mutex
	held     bool
	stalled  string
	observed atomic.Int64 // the generation the last status write observed
	done     chan struct{}
	// lastError is the driver's last failure (errors of several types).
	lastError atomic.Pointer[error]
}

// DrivePodSet starts the driver of one PodSet; it stops when the test ends.
func DrivePodSet(t testing.TB, dyn dynamic.Interface, ns, name string) *PodSetDriver {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &PodSetDriver{dyn: dyn, ns: ns, name: name, done: make(chan struct{})}
	go d.run(ctx)
	t.Cleanup(func() { cancel(); <-d.done })
	return d
}

// Hold stops (true) or resumes (false) the status writes: a held PodSet's
// status stays what it was, so a new generation stays unobserved.
func (d *PodSetDriver) Hold(held bool) {
	d.mu.Lock()
	d.held = held
	d.mu.Unlock()
	d.kick()
}

// Stall makes the next status report the rollout stalled (a Stalled
// condition, kstatus' Failed) with message; "" clears it.
func (d *PodSetDriver) Stall(message string) {
	d.mu.Lock()
	d.stalled = message
	d.mu.Unlock()
	d.kick()
}

// Observed is the generation the driver's last status write observed.
func (d *PodSetDriver) Observed() int64 { return d.observed.Load() }

// WaitObserved waits until the driver's status observed generation gen or
// later.
func (d *PodSetDriver) WaitObserved(t testing.TB, gen int64) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return d.observed.Load() >= gen, nil
	})
	if err != nil {
		t.Fatalf("PodSet %s/%s: the driver did not observe generation %d (observed %d; last error %v)", d.ns, d.name, gen, d.observed.Load(), d.lastErr())
	}
}

// kick writes the status the driver's settings now call for at once, not
// waiting for the next change of the PodSet.
func (d *PodSetDriver) kick() {
	_ = d.sync(context.Background())
}

// lastErr is the driver's last failure, or nil.
func (d *PodSetDriver) lastErr() error {
	if p := d.lastError.Load(); p != nil {
		return *p
	}
	return nil
}

func (d *PodSetDriver) run(ctx context.Context) {
	defer close(d.done)
	for ctx.Err() == nil {
		w, err := d.dyn.Resource(PodSetResource).Namespace(d.ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + d.name})
		if err != nil {
			d.lastError.Store(&err)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		d.consume(ctx, w)
		w.Stop()
	}
}

func (d *PodSetDriver) consume(ctx context.Context, w watch.Interface) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			if ev.Type == watch.Added || ev.Type == watch.Modified {
				if err := d.sync(ctx); err != nil {
					d.lastError.Store(&err)
				}
			}
		}
	}
}

// sync writes the status the PodSet's current generation should have.
func (d *PodSetDriver) sync(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.held {
		return nil
	}
	r := d.dyn.Resource(PodSetResource).Namespace(d.ns)
	u, err := r.Get(ctx, d.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	replicas, _, _ := unstructured.NestedInt64(u.Object, "spec", "replicas")
	conds := []any{}
	if d.stalled != "" {
		conds = append(conds, map[string]any{"type": "Stalled", "status": "True", "reason": "TestStall", "message": d.stalled})
	}
	want := map[string]any{
		"observedGeneration": u.GetGeneration(),
		"replicas":           replicas, "updatedReplicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
		"conditions": conds,
	}
	cur, _, _ := unstructured.NestedMap(u.Object, "status")
	if fmt.Sprint(cur) == fmt.Sprint(want) {
		d.observed.Store(u.GetGeneration())
		return nil
	}
	if err := unstructured.SetNestedField(u.Object, want, "status"); err != nil {
		return err
	}
	if _, err := r.UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
		return err // a conflict: the next event writes again
	}
	d.observed.Store(u.GetGeneration())
	return nil
}

// WatchPodSet opens a watch of one PodSet (UntilWatched).
func WatchPodSet(dyn dynamic.Interface, ns, name string) Watcher {
	return func(ctx context.Context) (watch.Interface, error) {
		return dyn.Resource(PodSetResource).Namespace(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	}
}

// PatchPodSet merge-patches (JSON patch when patch starts with "[") one
// PodSet as field manager.
func PatchPodSet(t testing.TB, dyn dynamic.Interface, ns, name, manager, patch string) *unstructured.Unstructured {
	t.Helper()
	pt := types.MergePatchType
	if strings.HasPrefix(patch, "[") {
		pt = types.JSONPatchType
	}
	out, err := dyn.Resource(PodSetResource).Namespace(ns).Patch(context.Background(), name, pt, []byte(patch), metav1.PatchOptions{FieldManager: manager})
	if err != nil {
		t.Fatalf("patch PodSet %s/%s: %v", ns, name, err)
	}
	return out
}

// PodSetImage is the image of the PodSet's container or init container
// name ("" when it has none).
func PodSetImage(u *unstructured.Unstructured, name string) string {
	for _, list := range []string{"containers", "initContainers"} {
		items, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", list)
		for _, it := range items {
			if m, ok := it.(map[string]any); ok && m["name"] == name {
				s, _ := m["image"].(string)
				return s
			}
		}
	}
	return ""
}

// GetPodSet reads one PodSet.
func GetPodSet(t testing.TB, dyn dynamic.Interface, ns, name string) *unstructured.Unstructured {
	t.Helper()
	u, err := dyn.Resource(PodSetResource).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read PodSet %s/%s: %v", ns, name, err)
	}
	return u
}
