package workload_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/image-refresh/image-refresh/internal/discovery"
	"github.com/image-refresh/image-refresh/internal/gitops"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

const stripPrefix = "image-refresh.io"

// richWorkload creates one object of kind with every image slot (two
// containers, an init container, a native sidecar, an image volume), pull
// secrets, placement, discovery and GitOps labels, then has several field
// managers write it: helm an image (strategic merge), image-refresh
// another, Argo CD's server-side apply the sidecar's, Flux's
// kustomize-controller the image volume's, `image-refresh suspend` an
// annotation, and kubectl a label. The controller-manager writes its
// status, and it settles. It returns the object as stored, managedFields and all.
func richWorkload(t *testing.T, kube kubernetes.Interface, ns, kind, name string) client.Object {
	t.Helper()
	ctx := context.Background()
	opts := []testenv.Option{
		testenv.WithContainer("app", "registry.test/acme/app:prod"),
		testenv.WithContainer("proxy", "registry.test/acme/proxy@"+digestA),
		testenv.WithInitContainer("migrate", "registry.test/acme/migrate:prod"),
		testenv.WithSidecar("mesh", "registry.test/acme/mesh:1.2"),
		testenv.WithImageVolume("models", "registry.test/acme/models:v3"),
		testenv.WithPullSecrets("regcred", "mirror"),
		testenv.WithTolerateAll(),
		testenv.WithAnnotations(map[string]string{
			stripPrefix + "/record.app": "registry.test/acme/app:prod@" + digestB,
			gitops.ArgoTrackingID:       "shop:apps/Deployment:" + ns + "/" + name,
			// Flux's tracking in annotations (meta reads the labels,
			// then these); the labels have it in the fight test below.
			gitops.KustomizeName: "apps", gitops.KustomizeNS: "flux-system",
			// Helm's own, which no rule reads.
			"meta.helm.sh/release-name": "shop",
			// kubectl's copy of the manifest, which nothing reads.
			corev1.LastAppliedConfigAnnotation: `{"apiVersion":"v1","kind":"` + kind + `","metadata":{"name":"` + name + `"},"spec":{"template":{"spec":{"containers":[{"name":"app","image":"registry.test/acme/app:prod","resources":{"limits":{"cpu":"1","memory":"1Gi"}}}]}}}}`,
		}),
	}
	switch kind {
	case workload.KindDeployment:
		testenv.Deployment(t, kube, ns, name, opts...)
	case workload.KindDaemonSet:
		testenv.DaemonSet(t, kube, ns, name, opts...)
	case workload.KindStatefulSet:
		testenv.StatefulSet(t, kube, ns, name, opts...)
	case workload.KindCronJob:
		testenv.CronJob(t, kube, ns, name, opts...)
	}
	k, _ := workload.LookupKind(kind)
	// wrap nests a pod spec's patch under the kind's pod template path.
	wrap := func(podSpec map[string]any) map[string]any {
		v := any(podSpec)
		for i := len(k.PodSpecPath) - 1; i >= 0; i-- {
			v = map[string]any{k.PodSpecPath[i]: v}
		}
		return v.(map[string]any)
	}
	patch := func(pt types.PatchType, manager string, body map[string]any) {
		t.Helper()
		data, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		opts := metav1.PatchOptions{FieldManager: manager}
		if pt == types.ApplyPatchType {
			opts.Force = new(bool)
			*opts.Force = true
		}
		var perr error
		switch kind {
		case workload.KindDeployment:
			_, perr = kube.AppsV1().Deployments(ns).Patch(ctx, name, pt, data, opts)
		case workload.KindDaemonSet:
			_, perr = kube.AppsV1().DaemonSets(ns).Patch(ctx, name, pt, data, opts)
		case workload.KindStatefulSet:
			_, perr = kube.AppsV1().StatefulSets(ns).Patch(ctx, name, pt, data, opts)
		case workload.KindCronJob:
			_, perr = kube.BatchV1().CronJobs(ns).Patch(ctx, name, pt, data, opts)
		}
		if perr != nil {
			t.Fatalf("%s patch of %s %s/%s by %s: %v", pt, kind, ns, name, manager, perr)
		}
	}
	placement := map[string]any{
		"nodeSelector": map[string]any{"kubernetes.io/os": "linux"},
		"affinity": map[string]any{"nodeAffinity": map[string]any{"preferredDuringSchedulingIgnoredDuringExecution": []any{
			map[string]any{"weight": 1, "preference": map[string]any{"matchExpressions": []any{
				map[string]any{"key": "kubernetes.io/arch", "operator": "In", "values": []any{"amd64", "arm64"}}}}}}}},
	}
	patch(types.StrategicMergePatchType, "kubectl-edit", wrap(placement))
	patch(types.StrategicMergePatchType, "helm", wrap(map[string]any{
		"containers": []any{map[string]any{"name": "app", "image": "registry.test/acme/app:v2"}}}))
	patch(types.StrategicMergePatchType, workload.FieldManager, wrap(map[string]any{
		"containers": []any{map[string]any{"name": "proxy", "image": "registry.test/acme/proxy:prod@" + digestA}}}))
	patch(types.StrategicMergePatchType, "kustomize-controller", wrap(map[string]any{
		"volumes": []any{map[string]any{"name": "models", "image": map[string]any{"reference": "registry.test/acme/models:v4"}}}}))
	patch(types.MergePatchType, workload.SuspendFieldManager, map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		stripPrefix + "/suspend": "true", stripPrefix + "/suspend-reason": "incident 7"}}})
	patch(types.MergePatchType, "kubectl-label", map[string]any{"metadata": map[string]any{"labels": map[string]any{
		stripPrefix + "/enabled": "true", gitops.ArgoInstance: "shop", stripPrefix + "/group": "web"}}})
	apply := wrap(map[string]any{"initContainers": []any{map[string]any{"name": "mesh", "image": "registry.test/acme/mesh:1.3"}}})
	apply["apiVersion"], apply["kind"], apply["metadata"] = k.APIVersion(), kind, map[string]any{"name": name, "namespace": ns}
	patch(types.ApplyPatchType, "argocd-controller", apply)

	if kind != workload.KindCronJob {
		if err := testenv.WaitSettled(ctx, kube, kind, ns, name, 90*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	var (
		obj client.Object
		err error
	)
	switch kind {
	case workload.KindDeployment:
		obj, err = kube.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	case workload.KindDaemonSet:
		obj, err = kube.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
	case workload.KindStatefulSet:
		obj, err = kube.AppsV1().StatefulSets(ns).Get(ctx, name, metav1.GetOptions{})
	case workload.KindCronJob:
		obj, err = kube.BatchV1().CronJobs(ns).Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

// stripped is the transform's output for obj, which it must not change.
func stripped(t *testing.T, obj client.Object) client.Object {
	t.Helper()
	before := obj.DeepCopyObject()
	out, err := workload.StripWorkload(stripPrefix)(obj)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before, obj) {
		t.Fatalf("StripWorkload changed its input %s", obj.GetName())
	}
	return out.(client.Object)
}

// sameReads fails unless every read the rules make of a workload answers
// the same of orig and of its stripped copy s.
func sameReads(t *testing.T, orig, s client.Object) {
	t.Helper()
	// FromObject: identity, annotations, labels, images with their
	// places and last writers (N1, O2, C5, R7, R17), pull secrets and
	// service account (R20), selector (N1), settledness (R4).
	o1, err1 := workload.Snapshot(orig)
	o2, err2 := workload.Snapshot(s)
	if err1 != nil || err2 != nil {
		t.Fatalf("snapshot: %v / %v", err1, err2)
	}
	// The labels and annotations, key by key below: of them the copy
	// keeps those the rules read.
	if a, b := withoutMetadataMaps(workload.WithoutManagedFields(o1)), withoutMetadataMaps(workload.WithoutManagedFields(o2)); !reflect.DeepEqual(a, b) {
		t.Errorf("the Object differs:\noriginal %+v\nstripped %+v", a, b)
	}
	// Every key under the prefix: the state (state.Keys), the suspension,
	// discovery's keys (D1), of the labels and the annotations, as
	// FromObject reads them and as the object holds them.
	for _, m := range []struct {
		what       string
		orig, copy map[string]string
	}{
		{"Object.Annotations", o1.Annotations, o2.Annotations}, {"Object.Labels", o1.Labels, o2.Labels},
		{"annotations", orig.GetAnnotations(), s.GetAnnotations()}, {"labels", orig.GetLabels(), s.GetLabels()},
	} {
		for key, v := range m.orig {
			if !strings.HasPrefix(key, stripPrefix+"/") {
				continue
			}
			if got, ok := m.copy[key]; !ok || got != v {
				t.Errorf("%s[%s]: original %q, stripped %q (kept %v)", m.what, key, v, got, ok)
			}
		}
	}
	// D1: the cache's label selector of the labelled workloads.
	sel := discovery.Selector(state.Keys{Prefix: stripPrefix})
	if a, b := sel.Matches(labels.Set(orig.GetLabels())), sel.Matches(labels.Set(s.GetLabels())); a != b {
		t.Errorf("discovery's selector %s: matches the original %v, the stripped copy %v", sel, a, b)
	}
	// O1: the writer of every annotation under the prefix (the
	// suspension's is the one a rule asks about).
	for key := range orig.GetAnnotations() {
		if !strings.HasPrefix(key, stripPrefix+"/") {
			continue
		}
		if a, b := o1.AnnotationManager(key), o2.AnnotationManager(key); a != b {
			t.Errorf("AnnotationManager(%s): original %q, stripped %q", key, a, b)
		}
	}
	// The watches' predicates: images and their writers (C1, C6), the
	// settled guard (R4).
	if a, b := workload.ImageManagers(orig), workload.ImageManagers(s); !reflect.DeepEqual(a, b) {
		t.Errorf("ImageManagers: original %v, stripped %v", a, b)
	}
	if !workload.SameImages(workload.PodSpec(orig), workload.PodSpec(s)) {
		t.Errorf("SameImages of the original and the stripped pod spec is false")
	}
	if a, b := workload.SettlednessOf(orig), workload.SettlednessOf(s); !reflect.DeepEqual(a, b) {
		t.Errorf("SettlednessOf: original %+v, stripped %+v", a, b)
	}
	// O2: the GitOps writer of every image, and what each tool's write
	// would be named by (its tracking labels and annotations).
	managers := []string{"argocd-controller", "argocd-application-controller", gitops.KustomizeManager, gitops.HelmManager}
	for _, c := range o1.Containers {
		managers = append(managers, c.ImageManager)
	}
	for _, m := range managers {
		w1, ok1 := gitops.Identify(m, orig.GetLabels(), orig.GetAnnotations())
		w2, ok2 := gitops.Identify(m, s.GetLabels(), s.GetAnnotations())
		if w1 != w2 || ok1 != ok2 {
			t.Errorf("gitops.Identify of a write by %s: original %+v %v, stripped %+v %v", m, w1, ok1, w2, ok2)
		}
		// The same through FromObject's maps, which the passes read.
		w3, ok3 := gitops.Identify(m, o2.Labels, o2.Annotations)
		if w1 != w3 || ok1 != ok3 {
			t.Errorf("gitops.Identify of a write by %s: original %+v %v, the stripped Object %+v %v", m, w1, ok1, w3, ok3)
		}
	}
	// D1: what discovery makes of it.
	d1 := discovery.Discover(discovery.Input{Prefix: stripPrefix, Workloads: []client.Object{orig}})
	d2 := discovery.Discover(discovery.Input{Prefix: stripPrefix, Workloads: []client.Object{s}})
	if !reflect.DeepEqual(d1, d2) {
		t.Errorf("discovery: original %+v, stripped %+v", d1, d2)
	}
	// V3: where the pods may run; K1: native sidecars.
	p1, p2 := workload.PodSpec(orig), workload.PodSpec(s)
	if !reflect.DeepEqual(p1.NodeSelector, p2.NodeSelector) || !reflect.DeepEqual(p1.Affinity, p2.Affinity) ||
		!reflect.DeepEqual(p1.Tolerations, p2.Tolerations) || !reflect.DeepEqual(p1.OS, p2.OS) {
		t.Errorf("placement differs: original %v %v %v, stripped %v %v %v", p1.NodeSelector, p1.Affinity, p1.Tolerations, p2.NodeSelector, p2.Affinity, p2.Tolerations)
	}
	for i := range p1.InitContainers {
		if !reflect.DeepEqual(p1.InitContainers[i].RestartPolicy, p2.InitContainers[i].RestartPolicy) {
			t.Errorf("init container %s: restartPolicy differs", p1.InitContainers[i].Name)
		}
	}
}

// withoutMetadataMaps is o without its labels and annotations, which
// sameReads compares key by key.
func withoutMetadataMaps(o *workload.Object) *workload.Object {
	c := *o
	c.Labels, c.Annotations = nil, nil
	return &c
}

// TestStripWorkload_N1_O1_O2_C5_R4_R17_R20_D1_K1_TheCacheKeepsWhatTheRulesRead:
// of real objects of every built-in kind, written by several field
// managers on the local API server, the stripped copy the cache of `run`
// holds answers every read the rules make exactly as the object does,
// also in every state of the settled guard; and it is much smaller.
func TestStripWorkload_N1_O1_O2_C5_R4_R17_R20_D1_K1_TheCacheKeepsWhatTheRulesRead(t *testing.T) {
	t.Parallel()
	c := testenv.Cluster(t)
	ns := testenv.Namespace(t, c.Client)
	for _, kind := range []string{workload.KindDeployment, workload.KindDaemonSet, workload.KindStatefulSet, workload.KindCronJob} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			orig := richWorkload(t, c.Client, ns, kind, "rich-"+map[string]string{
				workload.KindDeployment: "deploy", workload.KindDaemonSet: "ds", workload.KindStatefulSet: "sts", workload.KindCronJob: "cron"}[kind])
			s := stripped(t, orig)
			sameReads(t, orig, s)

			// The test has teeth: the object names every writer the
			// rules look for, and the copy still names them.
			obj := workload.FromObject(s)
			got := map[string]string{}
			for _, ctr := range obj.Containers {
				got[ctr.Name] = ctr.ImageManager
			}
			want := map[string]string{"app": "helm", "proxy": workload.FieldManager, "mesh": "argocd-controller", "volume:models": "kustomize-controller"}
			for name, m := range want {
				if got[name] != m {
					t.Errorf("stripped: image %s written by %q, want %q (all: %v)", name, got[name], m, got)
				}
			}
			if by := obj.AnnotationManager(stripPrefix + "/suspend"); by != workload.SuspendFieldManager {
				t.Errorf("stripped: the suspension written by %q, want %q", by, workload.SuspendFieldManager)
			}
			if w, ok := gitops.Identify("argocd-controller", obj.Labels, obj.Annotations); !ok || w.App != "Application shop" {
				t.Errorf("stripped: Argo CD's application %+v %v, want Application shop", w, ok)
			}
			if d := discovery.Discover(discovery.Input{Prefix: stripPrefix, Workloads: []client.Object{s}}); len(d.Groups) != 1 {
				t.Errorf("stripped: discovery made %d groups, want 1: %+v", len(d.Groups), d)
			}
			// What is dropped: the entries that own no image and no
			// annotation (the placement's writer), and within the others
			// every other field (the status, the rest of the spec).
			var managers []string
			for _, e := range s.GetManagedFields() {
				managers = append(managers, e.Manager+"/"+e.Subresource)
				for _, f := range []string{`"f:status"`, `"f:nodeSelector"`, `"f:labels"`, `"f:imagePullPolicy"`, `"f:restartPolicy"`, `"f:pullPolicy"`} {
					if strings.Contains(string(e.FieldsV1.Raw), f) {
						t.Errorf("stripped: %s's entry keeps %s: %s", e.Manager, f, e.FieldsV1.Raw)
					}
				}
			}
			// Of the labels and annotations, the keys under the prefix
			// and the GitOps tools' tracking keys are kept; the others
			// (testenv's app label, Helm's release name, kubectl's
			// last-applied-configuration), which no rule reads, are not.
			for _, m := range []struct {
				what       string
				orig, copy map[string]string
				kept       []string
				dropped    []string
			}{
				{"annotation", orig.GetAnnotations(), s.GetAnnotations(),
					[]string{stripPrefix + "/record.app", stripPrefix + "/suspend", gitops.ArgoTrackingID, gitops.KustomizeName, gitops.KustomizeNS},
					[]string{corev1.LastAppliedConfigAnnotation, "meta.helm.sh/release-name"}},
				{"label", orig.GetLabels(), s.GetLabels(),
					[]string{stripPrefix + "/enabled", stripPrefix + "/group", gitops.ArgoInstance}, []string{"app"}},
			} {
				for _, key := range slices.Concat(m.kept, m.dropped) {
					if _, ok := m.orig[key]; !ok {
						t.Errorf("the object has no %s %s", m.what, key)
					}
				}
				for _, key := range m.kept {
					if _, ok := m.copy[key]; !ok {
						t.Errorf("stripped: %s %s dropped", m.what, key)
					}
				}
				for _, key := range m.dropped {
					if _, ok := m.copy[key]; ok {
						t.Errorf("stripped: %s %s kept, which no rule reads", m.what, key)
					}
				}
			}
			if w, ok := gitops.Identify(gitops.KustomizeManager, obj.Labels, obj.Annotations); !ok || w.App != "Kustomization flux-system/apps" {
				t.Errorf("stripped: Flux's Kustomization %+v %v, want Kustomization flux-system/apps", w, ok)
			}
			if d, ok := orig.(*appsv1.Deployment); ok {
				if len(d.Status.Conditions) == 0 {
					t.Errorf("the settled Deployment has no status conditions to drop")
				}
				if cs := s.(*appsv1.Deployment).Status.Conditions; len(cs) != 0 {
					t.Errorf("stripped: status conditions the settled guard does not read kept: %+v", cs)
				}
			}
			if slices.Contains(managers, "kubectl-edit/") || slices.Contains(managers, "kubectl-label/") {
				t.Errorf("stripped: managedFields entries kept that own no image and no annotation: %v", managers)
			}
			a, _ := json.Marshal(orig.GetManagedFields())
			b, _ := json.Marshal(s.GetManagedFields())
			if len(b)*2 > len(a) {
				t.Errorf("stripped: managedFields of %d bytes of JSON, the original's %d: want less than half", len(b), len(a))
			}
			whole, _ := json.Marshal(orig)
			small, _ := json.Marshal(s)
			t.Logf("%s: %d bytes of JSON stripped to %d (managedFields %d to %d); managedFields kept: %v", kind, len(whole), len(small), len(a), len(b), managers)

			// R4: every branch of the settled guard reads the same.
			for name, variant := range settledVariants(orig) {
				sameReads(t, variant, stripped(t, variant))
				if t.Failed() {
					t.Fatalf("variant %s", name)
				}
			}
		})
	}
}

// settledVariants are copies of obj in each state the settled guard tells
// apart: an unobserved generation, replicas not updated, not available,
// old replicas left, a failed rollout, a StatefulSet's OnDelete strategy
// and revisions.
func settledVariants(obj client.Object) map[string]client.Object {
	out := map[string]client.Object{}
	add := func(name string, f func(client.Object)) {
		c := obj.DeepCopyObject().(client.Object)
		f(c)
		out[name] = c
	}
	add("unobserved", func(o client.Object) { o.SetGeneration(o.GetGeneration() + 3) })
	switch o := obj.(type) {
	case *appsv1.Deployment:
		r := int32(3)
		add("not updated", func(c client.Object) { d := c.(*appsv1.Deployment); d.Spec.Replicas = &r })
		add("old replicas", func(c client.Object) { d := c.(*appsv1.Deployment); d.Status.Replicas = d.Status.UpdatedReplicas + 1 })
		add("not available", func(c client.Object) { d := c.(*appsv1.Deployment); d.Status.AvailableReplicas = 0 })
		add("deadline exceeded", func(c client.Object) {
			d := c.(*appsv1.Deployment)
			d.Spec.Replicas = &r
			d.Status.Conditions = append(d.Status.Conditions, appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Status: "False",
				Reason: "ProgressDeadlineExceeded", Message: fmt.Sprintf("ReplicaSet %q has timed out progressing.", o.Name)})
		})
		add("unobserved and failed", func(c client.Object) {
			d := c.(*appsv1.Deployment)
			d.Generation += 2
			d.Spec.Replicas = &r
			d.Status.Conditions = append(d.Status.Conditions, appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Status: "False", Reason: "ProgressDeadlineExceeded"})
		})
	case *appsv1.DaemonSet:
		add("not updated", func(c client.Object) {
			d := c.(*appsv1.DaemonSet)
			d.Status.DesiredNumberScheduled = d.Status.UpdatedNumberScheduled + 1
		})
		add("not available", func(c client.Object) {
			d := c.(*appsv1.DaemonSet)
			d.Status.NumberAvailable = 0
			d.Status.DesiredNumberScheduled = 1
		})
	case *appsv1.StatefulSet:
		r := int32(5)
		add("not updated", func(c client.Object) { s := c.(*appsv1.StatefulSet); s.Spec.Replicas = &r })
		add("OnDelete", func(c client.Object) {
			s := c.(*appsv1.StatefulSet)
			s.Spec.Replicas = &r
			s.Spec.UpdateStrategy = appsv1.StatefulSetUpdateStrategy{Type: appsv1.OnDeleteStatefulSetStrategyType}
			s.Status.ReadyReplicas, s.Status.AvailableReplicas = r, r
			s.Status.CurrentRevision, s.Status.UpdateRevision = "a", "b"
		})
		add("revisions", func(c client.Object) {
			s := c.(*appsv1.StatefulSet)
			s.Status.CurrentRevision, s.Status.UpdateRevision = "a", "b"
		})
	case *batchv1.CronJob:
	}
	return out
}

// TestStripWorkload_K2_OtherObjectsPassUnchanged: the transform leaves a
// declared kind's object (unstructured) and any other type as they are.
func TestStripWorkload_K2_OtherObjectsPassUnchanged(t *testing.T) {
	t.Parallel()
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
		"metadata": map[string]any{"name": "r", "managedFields": []any{map[string]any{"manager": "x"}}}}}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}}, Data: map[string]string{"a": "b"}}
	for _, in := range []any{u, cm} {
		before := in.(client.Object).DeepCopyObject()
		out, err := workload.StripWorkload(stripPrefix)(in)
		if err != nil {
			t.Fatal(err)
		}
		if out != in || !reflect.DeepEqual(before, out) {
			t.Errorf("%T changed: %+v", in, out)
		}
	}
	// The same transform strips a Deployment (the check above ran on the
	// right function).
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "d", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{}}`)}}}}}
	out, _ := workload.StripWorkload(stripPrefix)(d)
	if got := out.(*appsv1.Deployment).ManagedFields; len(got) != 0 {
		t.Errorf("a Deployment's entry that owns no image kept: %v", got)
	}
}

// TestStripWorkload_O2_C5_AGitOpsFightReadsTheSame replays, on the local
// API server, the writes of `run`'s GitOps fight test (test/e2e/run,
// TestRun_O2_C5_…) for each tool: the tool applies the workload with its
// tracking metadata, image-refresh pins the image (a JSON patch with a
// test op, its own field manager), the tool syncs the bare tag back (its
// apply of the whole manifest, or its patch of the one field), and
// image-refresh re-pins. After every write the stripped copy answers every
// read as the object does, and names the writer of the image and the tool
// that applied it: the reads the revert predicate (ownWrite), the
// re-pin's Event and C5's fight finding make.
func TestStripWorkload_O2_C5_AGitOpsFightReadsTheSame(t *testing.T) {
	t.Parallel()
	c := testenv.Cluster(t)
	ns := testenv.Namespace(t, c.Client)
	ctx := context.Background()
	const (
		tag    = "registry.test/acme/api:prod"
		pinned = tag + "@" + digestA
	)
	helmLabels := map[string]string{gitops.HelmName: "api", gitops.HelmNS: "shop", "app.kubernetes.io/managed-by": "Helm"}
	helmAnnotations := map[string]string{"meta.helm.sh/release-name": "api", "meta.helm.sh/release-namespace": ns}
	for _, tc := range []struct {
		name, manager string
		revert        types.PatchType // "": the tool's apply of the whole manifest
		labels, ann   map[string]string
		app           string // the application gitops.Identify names
	}{
		{name: "argo", manager: "argocd-controller", ann: map[string]string{gitops.ArgoTrackingID: "shop:apps/Deployment:" + ns + "/argo"}, app: "Application shop"},
		{name: "argo-csa", manager: "argocd-controller", revert: types.StrategicMergePatchType, labels: map[string]string{gitops.ArgoInstance: "shop"}, app: "Application shop"},
		{name: "kustomized", manager: gitops.KustomizeManager, labels: map[string]string{gitops.KustomizeName: "apps", gitops.KustomizeNS: "flux-system"}, app: "Kustomization flux-system/apps"},
		{name: "released", manager: gitops.HelmManager, labels: helmLabels, ann: helmAnnotations, app: "HelmRelease shop/api"},
		{name: "corrected", manager: gitops.HelmManager, revert: types.JSONPatchType, labels: helmLabels, ann: helmAnnotations, app: "HelmRelease shop/api"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			deployments := c.Client.AppsV1().Deployments(ns)
			labels := map[string]string{"app": tc.name}
			maps.Copy(labels, tc.labels)
			apply := func() {
				t.Helper()
				manifest, err := json.Marshal(map[string]any{
					"apiVersion": "apps/v1", "kind": "Deployment",
					"metadata": map[string]any{"name": tc.name, "namespace": ns, "labels": labels, "annotations": tc.ann},
					"spec": map[string]any{
						"replicas": 1, "selector": map[string]any{"matchLabels": map[string]string{"app": tc.name}},
						"template": map[string]any{
							"metadata": map[string]any{"labels": map[string]string{"app": tc.name}},
							"spec":     map[string]any{"containers": []any{map[string]any{"name": "app", "image": tag, "imagePullPolicy": "IfNotPresent"}}},
						},
					},
				})
				if err != nil {
					t.Fatal(err)
				}
				force := true
				if _, err := deployments.Patch(ctx, tc.name, types.ApplyPatchType, manifest, metav1.PatchOptions{FieldManager: tc.manager, Force: &force}); err != nil {
					t.Fatalf("%s applies %s: %v", tc.manager, tc.name, err)
				}
			}
			write := func(manager string, pt types.PatchType, patch string) {
				t.Helper()
				if _, err := deployments.Patch(ctx, tc.name, pt, []byte(patch), metav1.PatchOptions{FieldManager: manager}); err != nil {
					t.Fatalf("%s writes %s: %v", manager, tc.name, err)
				}
			}
			pin := func() {
				t.Helper()
				write(workload.FieldManager, types.JSONPatchType, fmt.Sprintf(`[{"op":"test","path":"/spec/template/spec/containers/0/image","value":%q},`+
					`{"op":"replace","path":"/spec/template/spec/containers/0/image","value":%q}]`, tag, pinned))
			}
			revert := func() {
				t.Helper()
				switch tc.revert {
				case "":
					apply()
				case types.JSONPatchType:
					write(tc.manager, tc.revert, fmt.Sprintf(`[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":%q}]`, tag))
				default:
					write(tc.manager, tc.revert, fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":"app","image":%q}]}}}}`, tag))
				}
			}
			// check compares the reads of the stored object and its
			// stripped copy, and that the copy names the image's writer.
			check := func(step, image, writer string) {
				t.Helper()
				orig, err := deployments.Get(ctx, tc.name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				s := stripped(t, orig)
				sameReads(t, orig, s)
				app, ok := workload.FromObject(s).Container("app")
				if !ok || app.Image != image || app.ImageManager != writer {
					t.Errorf("%s: stripped copy reads image %q written by %q (found %v), want %q by %q", step, app.Image, app.ImageManager, ok, image, writer)
				}
				if writer != workload.FieldManager {
					w, ok := gitops.Identify(app.ImageManager, s.GetLabels(), s.GetAnnotations())
					if !ok || w.App != tc.app {
						t.Errorf("%s: stripped copy names the tool %+v (%v), want its application %s", step, w, ok, tc.app)
					}
				}
				if t.Failed() {
					t.Fatalf("after %s", step)
				}
			}
			apply()
			check("the tool's apply", tag, tc.manager)
			pin()
			check("the pin", pinned, workload.FieldManager)
			for round := range 3 {
				revert()
				check(fmt.Sprintf("revert %d", round+1), tag, tc.manager)
				pin()
				check(fmt.Sprintf("re-pin %d", round+1), pinned, workload.FieldManager)
			}
			if err := testenv.WaitSettled(ctx, c.Client, workload.KindDeployment, ns, tc.name, 90*time.Second); err != nil {
				t.Fatal(err)
			}
			check("the settled re-pin", pinned, workload.FieldManager)
		})
	}
}

// TestStripWorkload_K1_EqualContainerListsAreSharedAndOthersKeepTheirOwn:
// the stripped copies of workloads whose containers have the same names,
// images and restart policies share one list (a container is about 700
// bytes), and a copy whose list differs in any of them reads its own.
func TestStripWorkload_K1_EqualContainerListsAreSharedAndOthersKeepTheirOwn(t *testing.T) {
	t.Parallel()
	always := corev1.ContainerRestartPolicyAlways
	deployment := func(name string, init []corev1.Container, containers ...corev1.Container) *appsv1.Deployment {
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop"}}
		d.Spec.Template.Spec.Containers, d.Spec.Template.Spec.InitContainers = containers, init
		return d
	}
	app := corev1.Container{Name: "app", Image: "registry.test/acme/app:prod", Args: []string{"--serve"}}
	mesh := corev1.Container{Name: "mesh", Image: "registry.test/acme/mesh:1.2", RestartPolicy: &always}
	objs := map[string]*appsv1.Deployment{
		"a":          deployment("a", []corev1.Container{mesh}, app),
		"b":          deployment("b", []corev1.Container{mesh}, app),
		"other tag":  deployment("c", nil, corev1.Container{Name: "app", Image: "registry.test/acme/app:canary"}),
		"other name": deployment("d", nil, corev1.Container{Name: "web", Image: "registry.test/acme/app:prod"}),
		"no policy":  deployment("e", []corev1.Container{{Name: "mesh", Image: "registry.test/acme/mesh:1.2"}}),
		"two":        deployment("f", nil, app, app),
	}
	out := map[string]*appsv1.Deployment{}
	for name, d := range objs {
		s, err := workload.StripWorkload(stripPrefix)(d)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = s.(*appsv1.Deployment)
	}
	spec := func(name string) *corev1.PodSpec { return &out[name].Spec.Template.Spec }
	if &spec("a").Containers[0] != &spec("b").Containers[0] || &spec("a").InitContainers[0] != &spec("b").InitContainers[0] {
		t.Errorf("equal container lists not shared")
	}
	if spec("a").Containers[0].Args != nil {
		t.Errorf("stripped container keeps its args: %+v", spec("a").Containers[0])
	}
	for name, d := range objs {
		if !workload.SameImages(workload.PodSpec(d), workload.PodSpec(out[name])) {
			t.Errorf("%s: images differ: %+v, stripped %+v", name, d.Spec.Template.Spec, *spec(name))
		}
		for i, c := range d.Spec.Template.Spec.InitContainers {
			if got := spec(name).InitContainers[i]; got.Name != c.Name || got.Image != c.Image || !reflect.DeepEqual(got.RestartPolicy, c.RestartPolicy) {
				t.Errorf("%s: init container %d %+v, want %s %s %v", name, i, got, c.Name, c.Image, c.RestartPolicy)
			}
		}
		for i, c := range d.Spec.Template.Spec.Containers {
			if got := spec(name).Containers[i]; got.Name != c.Name || got.Image != c.Image {
				t.Errorf("%s: container %d %+v, want %s %s", name, i, got, c.Name, c.Image)
			}
		}
	}
	if len(spec("two").Containers) != 2 {
		t.Errorf("two containers stripped to %d", len(spec("two").Containers))
	}
}
