package workload

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/image-refresh/image-refresh/internal/config"
)

// The workload kinds image-refresh manages, as config names them.
const (
	KindDeployment  = config.KindDeployment
	KindDaemonSet   = config.KindDaemonSet
	KindStatefulSet = config.KindStatefulSet
	KindCronJob     = config.KindCronJob
)

// Kind is everything image-refresh knows about one workload kind. The table
// below has one entry per kind config names (config.KindNames, which config
// validation asks): the reads and writes here, the controller's watches,
// the webhook and the post-renderer all ask it, so a kind is added by
// naming it in config and adding its entry (and its settledness rule).
type Kind struct {
	Name     string // "Deployment"
	Group    string // API group: "apps", "batch"
	Version  string // "v1"
	Resource string // plural resource: "deployments"
	// PodSpecPath is the path of the pod template's spec from the object's
	// root: the post-renderer walks it in YAML, the webhook and SetImages
	// patch below it.
	PodSpecPath []string
	// Pods: the kind runs long-lived pods of its current template (not a
	// CronJob's Jobs), whose running images N1 checks.
	Pods bool

	// Declared: the config declared the kind (K2); its objects are
	// *unstructured.Unstructured, read and written with the dynamic client.
	Declared bool
	decl     config.DeclaredKind

	typ       reflect.Type // a built-in kind's Go type
	newObject func() client.Object
	template  func(client.Object) (*corev1.PodTemplateSpec, error)
	selector  func(client.Object) *metav1.LabelSelector
	settled   func(client.Object) Settledness
	get       func(ctx context.Context, c *Client, namespace, name string) (client.Object, error)
	patch     func(ctx context.Context, c *Client, namespace, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) (client.Object, error)
}

// APIVersion is the kind's group/version, as in a manifest: "apps/v1".
func (k *Kind) APIVersion() string { return k.Group + "/" + k.Version }

// PodSpecPointer is PodSpecPath as a JSON pointer: "/spec/template/spec".
func (k *Kind) PodSpecPointer() string { return "/" + strings.Join(k.PodSpecPath, "/") }

// New returns an empty object of the kind, for decoding and cache reads.
func (k *Kind) New() client.Object { return k.newObject() }

// typed is the part of a client-go typed client (DeploymentInterface, …)
// that reads and patches one object.
type typed[T client.Object] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error)
}

// kind builds a table entry from the kind's typed client and accessors.
func kind[T client.Object](name, group, resource string, path []string, newObject func() T,
	clientFor func(kubernetes.Interface, string) typed[T],
	template func(T) *corev1.PodTemplateSpec, selector func(T) *metav1.LabelSelector, settled func(T) Settledness) *Kind {
	return &Kind{
		Name: name, Group: group, Version: "v1", Resource: resource, PodSpecPath: path, Pods: true,
		typ:       reflect.TypeOf(newObject()),
		newObject: func() client.Object { return newObject() },
		template:  func(o client.Object) (*corev1.PodTemplateSpec, error) { return template(o.(T)), nil },
		selector:  func(o client.Object) *metav1.LabelSelector { return selector(o.(T)) },
		settled:   func(o client.Object) Settledness { return settled(o.(T)) },
		get: func(ctx context.Context, c *Client, ns, n string) (client.Object, error) {
			return clientFor(c.kube, ns).Get(ctx, n, metav1.GetOptions{})
		},
		patch: func(ctx context.Context, c *Client, ns, n string, pt types.PatchType, data []byte, opts metav1.PatchOptions) (client.Object, error) {
			return clientFor(c.kube, ns).Patch(ctx, n, pt, data, opts)
		},
	}
}

var templatePath = []string{"spec", "template", "spec"}

// kinds is the table, in the order messages list them.
var kinds = table(
	kind(KindDeployment, "apps", "deployments", templatePath,
		func() *appsv1.Deployment { return &appsv1.Deployment{} },
		func(k kubernetes.Interface, ns string) typed[*appsv1.Deployment] { return k.AppsV1().Deployments(ns) },
		func(d *appsv1.Deployment) *corev1.PodTemplateSpec { return &d.Spec.Template },
		func(d *appsv1.Deployment) *metav1.LabelSelector { return d.Spec.Selector }, DeploymentSettled),
	kind(KindDaemonSet, "apps", "daemonsets", templatePath,
		func() *appsv1.DaemonSet { return &appsv1.DaemonSet{} },
		func(k kubernetes.Interface, ns string) typed[*appsv1.DaemonSet] { return k.AppsV1().DaemonSets(ns) },
		func(d *appsv1.DaemonSet) *corev1.PodTemplateSpec { return &d.Spec.Template },
		func(d *appsv1.DaemonSet) *metav1.LabelSelector { return d.Spec.Selector }, DaemonSetSettled),
	kind(KindStatefulSet, "apps", "statefulsets", templatePath,
		func() *appsv1.StatefulSet { return &appsv1.StatefulSet{} },
		func(k kubernetes.Interface, ns string) typed[*appsv1.StatefulSet] { return k.AppsV1().StatefulSets(ns) },
		func(s *appsv1.StatefulSet) *corev1.PodTemplateSpec { return &s.Spec.Template },
		func(s *appsv1.StatefulSet) *metav1.LabelSelector { return s.Spec.Selector }, StatefulSetSettled),
	kind(KindCronJob, "batch", "cronjobs", []string{"spec", "jobTemplate", "spec", "template", "spec"},
		func() *batchv1.CronJob { return &batchv1.CronJob{} },
		func(k kubernetes.Interface, ns string) typed[*batchv1.CronJob] { return k.BatchV1().CronJobs(ns) },
		func(c *batchv1.CronJob) *corev1.PodTemplateSpec { return &c.Spec.JobTemplate.Spec.Template },
		// A CronJob's pods belong to its Jobs, which come and go: no
		// long-running pods to check (N1).
		func(*batchv1.CronJob) *metav1.LabelSelector { return nil }, CronJobSettled).withoutPods(),
)

// table orders the entries as config.KindNames. A kind config names with
// no entry, or an entry config does not name, is a programming error that
// every binary and test of this package fails on at once.
func table(entries ...*Kind) []*Kind {
	byName := map[string]*Kind{}
	for _, k := range entries {
		byName[k.Name] = k
	}
	names := config.KindNames()
	if len(names) != len(entries) || len(byName) != len(entries) {
		panic(fmt.Sprintf("workload kinds: the table has %d entries, config names %d kinds (%s)", len(entries), len(names), strings.Join(names, ", ")))
	}
	out := make([]*Kind, 0, len(names))
	for _, n := range names {
		k, ok := byName[n]
		if !ok {
			panic(fmt.Sprintf("workload kinds: config names %s, the table has no entry for it", n))
		}
		out = append(out, k)
	}
	return out
}

func (k *Kind) withoutPods() *Kind { k.Pods = false; return k }

// Kinds lists the supported kinds: the built-in ones, then those the
// config declared (Declare).
func Kinds() []*Kind {
	if d := declared.Load(); d != nil {
		return slices.Concat(kinds, *d)
	}
	return kinds
}

// KindNames lists the supported kinds' names: "Deployment", ….
func KindNames() []string {
	var out []string
	for _, k := range Kinds() {
		out = append(out, k.Name)
	}
	return out
}

// LookupKind returns the entry of a kind name.
func LookupKind(name string) (*Kind, bool) {
	for _, k := range Kinds() {
		if k.Name == name {
			return k, true
		}
	}
	return nil, false
}

// KindOf returns the entry of an object's Go type, or of a declared kind's
// object (unstructured) its group, version and kind.
func KindOf(obj client.Object) (*Kind, bool) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		gvk := u.GroupVersionKind()
		for _, k := range Kinds() {
			if k.Declared && k.Name == gvk.Kind && k.Group == gvk.Group && k.Version == gvk.Version {
				return k, true
			}
		}
		return nil, false
	}
	t := reflect.TypeOf(obj)
	for _, k := range kinds {
		if k.typ == t {
			return k, true
		}
	}
	return nil, false
}

// Images maps image key (PodImage.Key) → image of every image of a
// workload's pod template (nil for an object that is not a workload).
func Images(o client.Object) map[string]string {
	spec := PodSpec(o)
	if spec == nil {
		return nil
	}
	imgs := PodImages(spec)
	out := make(map[string]string, len(imgs))
	for _, p := range imgs {
		out[p.Key] = p.Image
	}
	return out
}

// PodSpec returns the pod template spec of a supported object, else nil
// (also for a declared kind's object whose pod template does not decode:
// FromObject's error names it). A built-in kind's is the object's own; a
// declared kind's is a copy.
func PodSpec(obj client.Object) *corev1.PodSpec {
	if k, ok := KindOf(obj); ok {
		if t, err := k.template(obj); err == nil {
			return &t.Spec
		}
	}
	return nil
}

// SettlednessOf judges a supported object's rollout (R4).
func SettlednessOf(obj client.Object) Settledness {
	if k, ok := KindOf(obj); ok {
		return k.settled(obj)
	}
	return notSettled("unsupported kind %T", obj)
}

// FromObject snapshots a supported object; nil for another type, or for a
// declared kind's object whose pod template does not decode (Snapshot says
// why). It never writes to obj, and the Object shares nothing mutable with
// it, so obj may be the informer cache's own object (readCache).
func FromObject(obj client.Object) *Object {
	o, _ := Snapshot(obj)
	return o
}

// Snapshot is FromObject with the reason an object is not snapshotted.
func Snapshot(obj client.Object) (*Object, error) {
	k, ok := KindOf(obj)
	if !ok {
		return nil, fmt.Errorf("%T %s/%s: %w", obj, obj.GetNamespace(), obj.GetName(), UnsupportedKind(obj.GetObjectKind().GroupVersionKind().Kind))
	}
	tmpl, err := k.template(obj)
	if err != nil {
		return nil, fmt.Errorf("%s %s/%s: %w", k.Name, obj.GetNamespace(), obj.GetName(), err)
	}
	o := newObject(k, metaOf(obj), tmpl, k.settled(obj))
	o.Selector = k.selector(obj).DeepCopy()
	return o, nil
}

// metaOf is a built-in object's own ObjectMeta, or a declared kind's
// metadata (unstructured) as one.
func metaOf(obj client.Object) *metav1.ObjectMeta {
	if m, ok := obj.(interface{ GetObjectMeta() metav1.Object }); ok {
		if om, ok := m.GetObjectMeta().(*metav1.ObjectMeta); ok {
			return om
		}
	}
	return &metav1.ObjectMeta{
		Namespace: obj.GetNamespace(), Name: obj.GetName(), UID: obj.GetUID(),
		ResourceVersion: obj.GetResourceVersion(), Generation: obj.GetGeneration(),
		Labels: obj.GetLabels(), Annotations: obj.GetAnnotations(), ManagedFields: obj.GetManagedFields(),
	}
}

// read and patch are the only API calls on workloads: everything else
// works on Object. Callers have validated ref.

func (c *Client) read(ctx context.Context, ref config.Workload) (*Object, error) {
	k, _ := LookupKind(ref.Kind)
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	obj, err := k.get(ctx, c, ref.Namespace, ref.Name)
	if err != nil {
		return nil, err
	}
	return Snapshot(obj)
}

// patch writes with FieldManager (R17) and returns the object as written.
func (c *Client) patch(ctx context.Context, ref config.Workload, pt types.PatchType, data []byte) (*Object, error) {
	return c.patchAs(ctx, ref, pt, data, FieldManager)
}

func (c *Client) patchAs(ctx context.Context, ref config.Workload, pt types.PatchType, data []byte, manager string) (*Object, error) {
	k, _ := LookupKind(ref.Kind)
	callCtx, cancel := c.bounded(ctx)
	defer cancel()
	obj, err := k.patch(callCtx, c, ref.Namespace, ref.Name, pt, data, metav1.PatchOptions{FieldManager: manager})
	if err != nil {
		return nil, err
	}
	out, err := Snapshot(obj)
	if err != nil {
		return nil, err
	}
	c.wrote(out)
	return out, nil
}
