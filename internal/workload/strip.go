package workload

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/internal/gitops"
)

// StripWorkload returns the transform that keeps of a built-in kind's
// workload what image-refresh reads from the informer cache of `run` (a
// cache.TransformFunc; any other object, a declared kind's included, passes
// unchanged), prefix being the config's annotation prefix. A Deployment
// costs a few hundred bytes instead of about 10 KiB, most of which was its
// managedFields (issue 38). Nothing writes from a cached object (image
// writes are JSON patches with test ops, annotation writes merge patches
// checked against the resourceVersion), so the cache holds only what the
// reads below take:
//   - FromObject (every pass, the webhook's anchor state): the metadata
//     (name, namespace, uid, resourceVersion, generation), the labels and
//     annotations a rule reads (below), the pod template's images with
//     their names and places (K1), imagePullSecrets and serviceAccountName
//     (R20), the selector (N1), and the settledness (R4);
//   - of the labels and annotations only the keys under prefix (the
//     state, the suspension, discovery's keys: every read of them goes
//     through state.Keys) and the GitOps tools' tracking keys
//     (gitops.TrackingKeys, O2); the rest (an app label, Helm's
//     annotations, kubectl's last-applied-configuration) no rule reads.
//     Every annotation write is a merge patch of the keys it sets, so a
//     dropped key is never written back or lost;
//   - the settled guard (R4): generation, replicas, a StatefulSet's
//     updateStrategy type, the status's replica counts and revisions (not
//     the collision count), and of its
//     conditions only the one it reads, a Deployment's failed rollout
//     (ProgressDeadlineExceeded); a CronJob's status is not read at all,
//     nor a Deployment's or DaemonSet's rollout parameters (strategy,
//     paused, minReadySeconds, progressDeadlineSeconds);
//   - the managedFields entries, and within them only the fields, that
//     name a writer: of an image of the pod template (imageManagers: N1,
//     O2, C5, R7, R17), of a kept annotation (AnnotationManager: O1);
//   - discovery (D1) and the watches' predicates: the labels and
//     annotations under prefix, and the images;
//   - where the pods may run (V3): nodeSelector, affinity, tolerations and
//     os; and each container's restartPolicy (a native sidecar).
//
// The strings every object of a group repeats (annotation keys and values,
// namespaces, images, container names, managers, the kept field sets and
// their times) and equal container and managedFields lists are shared
// between the cached objects (intern.go).
func StripWorkload(prefix string) func(any) (any, error) {
	keep := func(key string) bool {
		return strings.HasPrefix(key, prefix+"/") || slices.Contains(gitops.TrackingKeys, key)
	}
	return func(in any) (any, error) { return strip(keep, in), nil }
}

func strip(keep func(string) bool, in any) any {
	switch o := in.(type) {
	case *appsv1.Deployment:
		k, _ := KindOf(o)
		out := &appsv1.Deployment{TypeMeta: o.TypeMeta, ObjectMeta: stripMeta(k, keep, &o.ObjectMeta), Status: o.Status}
		out.Status.Conditions, out.Status.CollisionCount = failedRollout(o.Status.Conditions), nil
		s := &o.Spec
		out.Spec = appsv1.DeploymentSpec{Replicas: s.Replicas, Selector: s.Selector, Template: stripTemplate(&s.Template)}
		return out
	case *appsv1.DaemonSet:
		k, _ := KindOf(o)
		out := &appsv1.DaemonSet{TypeMeta: o.TypeMeta, ObjectMeta: stripMeta(k, keep, &o.ObjectMeta), Status: o.Status}
		out.Status.Conditions, out.Status.CollisionCount = nil, nil
		s := &o.Spec
		out.Spec = appsv1.DaemonSetSpec{Selector: s.Selector, Template: stripTemplate(&s.Template)}
		return out
	case *appsv1.StatefulSet:
		k, _ := KindOf(o)
		out := &appsv1.StatefulSet{TypeMeta: o.TypeMeta, ObjectMeta: stripMeta(k, keep, &o.ObjectMeta), Status: o.Status}
		out.Status.Conditions, out.Status.CollisionCount = nil, nil
		s := &o.Spec
		out.Spec = appsv1.StatefulSetSpec{
			Replicas: s.Replicas, Selector: s.Selector, Template: stripTemplate(&s.Template),
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: s.UpdateStrategy.Type},
		}
		return out
	case *batchv1.CronJob:
		k, _ := KindOf(o)
		out := &batchv1.CronJob{TypeMeta: o.TypeMeta, ObjectMeta: stripMeta(k, keep, &o.ObjectMeta)}
		out.Spec.JobTemplate.Spec.Template = stripTemplate(&o.Spec.JobTemplate.Spec.Template)
		return out
	}
	return in
}

// failedRollout keeps of a Deployment's conditions the one the settled
// guard reads: Progressing False for ProgressDeadlineExceeded (R4, V2).
// The others (Available, a Progressing True) are most of a status's bytes.
func failedRollout(cs []appsv1.DeploymentCondition) []appsv1.DeploymentCondition {
	var out []appsv1.DeploymentCondition
	for _, c := range cs {
		if c.Type == appsv1.DeploymentProgressing && c.Status == corev1.ConditionFalse && c.Reason == "ProgressDeadlineExceeded" {
			out = append(out, c)
		}
	}
	return out
}

// stripMeta keeps the workload's own metadata but for the labels,
// annotations and managed fields no read needs.
func stripMeta(k *Kind, keep func(string) bool, m *metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: m.Name, Namespace: intern(m.Namespace), UID: m.UID, ResourceVersion: m.ResourceVersion, Generation: m.Generation,
		CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp,
		Labels: keptKeys(keep, m.Labels), Annotations: keptKeys(keep, m.Annotations), OwnerReferences: m.OwnerReferences,
		ManagedFields: stripManagedFields(k, keep, m.ManagedFields),
	}
}

// keptKeys is a's entries whose key a rule reads, with shared strings;
// nil when none is (a Go map costs a few hundred bytes even with one
// entry).
func keptKeys(keep func(string) bool, a map[string]string) map[string]string {
	n := 0
	for k := range a {
		if keep(k) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make(map[string]string, n)
	for k, v := range a {
		if keep(k) {
			out[intern(k)] = intern(v)
		}
	}
	return out
}

// stripTemplate keeps of a pod template what the reads take: the images
// where they are (every container and volume, so that indices hold: the
// image writes' JSON pointers and test ops name them), and the pod spec's
// pull secrets, service account and placement.
func stripTemplate(t *corev1.PodTemplateSpec) corev1.PodTemplateSpec {
	s := &t.Spec
	out := corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		ServiceAccountName: s.ServiceAccountName, ImagePullSecrets: s.ImagePullSecrets,
		NodeSelector: s.NodeSelector, Affinity: s.Affinity, Tolerations: s.Tolerations, OS: s.OS,
		Containers: stripContainers(s.Containers), InitContainers: stripContainers(s.InitContainers),
	}}
	for _, v := range s.Volumes {
		kept := corev1.Volume{Name: intern(v.Name)}
		if v.Image != nil {
			kept.Image = &corev1.ImageVolumeSource{Reference: intern(v.Image.Reference)}
		}
		out.Spec.Volumes = append(out.Spec.Volumes, kept)
	}
	return out
}

// stripContainers keeps of each container its name, image and restart
// policy. A corev1.Container is about 700 bytes however little it holds,
// so equal lists (the workloads of one chart, of one group) share one
// slice (internContainers): the cached objects are read only.
func stripContainers(in []corev1.Container) []corev1.Container {
	if in == nil {
		return nil
	}
	var key strings.Builder
	for _, c := range in {
		key.WriteString(c.Name)
		key.WriteByte(0)
		key.WriteString(c.Image)
		key.WriteByte(0)
		if c.RestartPolicy != nil {
			key.WriteString("=" + string(*c.RestartPolicy))
		}
		key.WriteByte(0)
	}
	return internContainers(key.String(), func() []corev1.Container {
		out := make([]corev1.Container, len(in))
		for i, c := range in {
			out[i] = corev1.Container{Name: intern(c.Name), Image: intern(c.Image), RestartPolicy: c.RestartPolicy}
		}
		return out
	})
}

// fAnnotations is the key of the annotations in a field set.
var fAnnotations = []byte(`"f:annotations"`)

// stripManagedFields keeps the entries that own an image of the pod
// template or a kept annotation, each with only those fields: the image
// field of each container, init container and image volume that has one,
// and the kept annotations' keys. imageManagers and AnnotationManager
// (asked about the suspension, O1) read nothing else; an entry that owns
// neither (the controller-manager's status, the rest of a spec, Helm's
// own annotations) is dropped whole.
func stripManagedFields(k *Kind, keep func(string) bool, entries []metav1.ManagedFieldsEntry) []metav1.ManagedFieldsEntry {
	var out []metav1.ManagedFieldsEntry
	for _, e := range entries {
		if e.FieldsV1 == nil || (!bytes.Contains(e.FieldsV1.Raw, fImage) && !bytes.Contains(e.FieldsV1.Raw, fAnnotations)) {
			continue
		}
		raw, ok := stripFields(k, keep, e.FieldsV1.Raw)
		if !ok {
			continue
		}
		e.Manager, e.APIVersion, e.Subresource = intern(e.Manager), intern(e.APIVersion), intern(e.Subresource)
		e.Operation, e.FieldsType = metav1.ManagedFieldsOperationType(intern(string(e.Operation))), intern(e.FieldsType)
		e.Time, e.FieldsV1 = internTime(e.Time), internFields(raw)
		out = append(out, e)
	}
	return internEntries(out)
}

// The parts of a FieldsV1 set that name a writer, decoded in one pass
// (the informer runs the transform on every watch event): an entry's
// annotations, and the image field of each container, init container and
// volume of the pod template, whose path depends on the kind.
type (
	ownedRoot struct {
		Metadata *struct {
			Annotations json.RawMessage `json:"f:annotations,omitempty"`
		} `json:"f:metadata,omitempty"`
		Spec *ownedSpec `json:"f:spec,omitempty"`
	}
	ownedSpec struct {
		Template    *ownedTemplate `json:"f:template,omitempty"` // spec.template.spec
		JobTemplate *struct {
			Spec *struct {
				Template *ownedTemplate `json:"f:template,omitempty"`
			} `json:"f:spec,omitempty"`
		} `json:"f:jobTemplate,omitempty"` // spec.jobTemplate.spec.template.spec
	}
	ownedTemplate struct {
		Spec *ownedPodSpec `json:"f:spec,omitempty"`
	}
	ownedPodSpec struct {
		Containers     map[string]ownedImage `json:"f:containers,omitempty"`
		InitContainers map[string]ownedImage `json:"f:initContainers,omitempty"`
		Volumes        map[string]ownedImage `json:"f:volumes,omitempty"`
	}
	ownedImage struct {
		Image json.RawMessage `json:"f:image,omitempty"`
	}
)

// stripFields returns the part of a field set that owns an image of the
// pod template or a kept annotation; false when it owns neither (or does not
// parse: imageManagers and AnnotationManager ignore such an entry too).
func stripFields(k *Kind, keep func(string) bool, raw []byte) ([]byte, bool) {
	var root ownedRoot
	if json.Unmarshal(raw, &root) != nil {
		return nil, false
	}
	out := ownedRoot{}
	if root.Metadata != nil && root.Metadata.Annotations != nil {
		if a := keptFieldKeys(keep, root.Metadata.Annotations); a != nil {
			out.Metadata = root.Metadata
			out.Metadata.Annotations = a
		}
	}
	if spec := ownedPod(k, root.Spec); spec != nil {
		kept := &ownedPodSpec{
			Containers: withImages(spec.Containers, false), InitContainers: withImages(spec.InitContainers, false),
			Volumes: withImages(spec.Volumes, true),
		}
		if kept.Containers != nil || kept.InitContainers != nil || kept.Volumes != nil {
			t := &ownedTemplate{Spec: kept}
			if k.Name == KindCronJob {
				out.Spec = &ownedSpec{JobTemplate: root.Spec.JobTemplate}
				out.Spec.JobTemplate.Spec.Template = t
			} else {
				out.Spec = &ownedSpec{Template: t}
			}
		}
	}
	if out.Metadata == nil && out.Spec == nil {
		return nil, false
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, false
	}
	return b, true
}

// keptFieldKeys is the part of a field set's annotations ("f:KEY": {})
// of the keys the cache keeps; nil when none is.
func keptFieldKeys(keep func(string) bool, set json.RawMessage) json.RawMessage {
	var keys map[string]json.RawMessage
	if json.Unmarshal(set, &keys) != nil {
		return nil
	}
	for f := range keys {
		if key, ok := strings.CutPrefix(f, "f:"); !ok || !keep(key) {
			delete(keys, f)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	b, err := json.Marshal(keys)
	if err != nil {
		return nil
	}
	return b
}

// ownedPod is the pod spec's part of a field set at kind k's path, nil if
// the set has none.
func ownedPod(k *Kind, spec *ownedSpec) *ownedPodSpec {
	if spec == nil {
		return nil
	}
	t := spec.Template
	if k.Name == KindCronJob {
		if spec.JobTemplate == nil || spec.JobTemplate.Spec == nil {
			return nil
		}
		t = spec.JobTemplate.Spec.Template
	}
	if t == nil {
		return nil
	}
	return t.Spec
}

// withImages keeps of a list's entries those that own an image: f:image
// of a container, f:image with f:reference below it of a volume.
func withImages(list map[string]ownedImage, volume bool) map[string]ownedImage {
	var out map[string]ownedImage
	for key, e := range list {
		if e.Image == nil {
			continue
		}
		if volume {
			var src struct {
				Reference json.RawMessage `json:"f:reference"`
			}
			if json.Unmarshal(e.Image, &src) != nil || src.Reference == nil {
				continue
			}
		}
		if out == nil {
			out = map[string]ownedImage{}
		}
		out[key] = e
	}
	return out
}
