package workload

import (
	"bytes"
	"encoding/json"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// StripWorkload keeps of a built-in kind's workload what image-refresh
// reads from the informer cache of `run` (a cache.TransformFunc; any other
// object, a declared kind's included, passes unchanged). A Deployment
// costs a few hundred bytes instead of about 10 KiB, most of which was its
// managedFields (issue 38). Nothing writes from a cached object (image
// writes are JSON patches with test ops, annotation writes merge patches
// checked against the resourceVersion), so the cache holds only what the
// reads below take:
//   - FromObject (every pass, the webhook's anchor state): the metadata
//     (name, namespace, uid, resourceVersion, generation, labels,
//     annotations but kubectl's last-applied-configuration), the pod template's images with their names and
//     places (K1), imagePullSecrets and serviceAccountName (R20), the
//     selector (N1), and the settledness (R4);
//   - the settled guard (R4): generation, replicas, the StatefulSet's
//     updateStrategy, the status's counts and revisions, and of its
//     conditions only the one it reads, a Deployment's failed rollout
//     (ProgressDeadlineExceeded); a CronJob's status is not read at all.
//     The other rollout parameters (strategy, paused, minReadySeconds,
//     progressDeadlineSeconds) are scalars kept for it too;
//   - the managedFields entries, and within them only the fields, that
//     name a writer: of an image of the pod template (imageManagers: N1,
//     O2, C5, R7, R17), of an annotation (AnnotationManager: O1);
//   - discovery (D1) and the watches' predicates: labels, annotations and
//     the images;
//   - where the pods may run (V3): nodeSelector, affinity, tolerations and
//     os; and each container's restartPolicy (a native sidecar).
func StripWorkload(in any) (any, error) {
	switch o := in.(type) {
	case *appsv1.Deployment:
		k, _ := KindOf(o)
		out := &appsv1.Deployment{TypeMeta: o.TypeMeta, ObjectMeta: stripMeta(k, &o.ObjectMeta), Status: o.Status}
		out.Status.Conditions = failedRollout(o.Status.Conditions)
		s := &o.Spec
		out.Spec = appsv1.DeploymentSpec{
			Replicas: s.Replicas, Selector: s.Selector, Template: stripTemplate(&s.Template), Strategy: s.Strategy,
			MinReadySeconds: s.MinReadySeconds, Paused: s.Paused, ProgressDeadlineSeconds: s.ProgressDeadlineSeconds,
		}
		return out, nil
	case *appsv1.DaemonSet:
		k, _ := KindOf(o)
		out := &appsv1.DaemonSet{TypeMeta: o.TypeMeta, ObjectMeta: stripMeta(k, &o.ObjectMeta), Status: o.Status}
		out.Status.Conditions = nil
		s := &o.Spec
		out.Spec = appsv1.DaemonSetSpec{
			Selector: s.Selector, Template: stripTemplate(&s.Template), UpdateStrategy: s.UpdateStrategy, MinReadySeconds: s.MinReadySeconds,
		}
		return out, nil
	case *appsv1.StatefulSet:
		k, _ := KindOf(o)
		out := &appsv1.StatefulSet{TypeMeta: o.TypeMeta, ObjectMeta: stripMeta(k, &o.ObjectMeta), Status: o.Status}
		out.Status.Conditions = nil
		s := &o.Spec
		out.Spec = appsv1.StatefulSetSpec{
			Replicas: s.Replicas, Selector: s.Selector, Template: stripTemplate(&s.Template), UpdateStrategy: s.UpdateStrategy,
			MinReadySeconds: s.MinReadySeconds,
		}
		return out, nil
	case *batchv1.CronJob:
		k, _ := KindOf(o)
		out := &batchv1.CronJob{TypeMeta: o.TypeMeta, ObjectMeta: stripMeta(k, &o.ObjectMeta)}
		out.Spec.JobTemplate.Spec.Template = stripTemplate(&o.Spec.JobTemplate.Spec.Template)
		return out, nil
	}
	return in, nil
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

// stripMeta keeps the workload's own metadata but for the managed fields
// no read needs.
func stripMeta(k *Kind, m *metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion, Generation: m.Generation,
		CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp,
		Labels: m.Labels, Annotations: withoutLastApplied(m.Annotations), OwnerReferences: m.OwnerReferences,
		ManagedFields: stripManagedFields(k, m.ManagedFields),
	}
}

// withoutLastApplied is a's annotations without kubectl's copy of the
// whole manifest (kubectl.kubernetes.io/last-applied-configuration, which
// `kubectl apply` and Argo CD's client-side apply write): often the
// largest part of a workload's metadata, and no rule reads it. Every
// annotation write is a merge patch of the keys it sets, so the key is
// never written back or lost.
func withoutLastApplied(a map[string]string) map[string]string {
	if _, ok := a[corev1.LastAppliedConfigAnnotation]; !ok {
		return a
	}
	out := make(map[string]string, len(a)-1)
	for k, v := range a {
		if k != corev1.LastAppliedConfigAnnotation {
			out[k] = v
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
		kept := corev1.Volume{Name: v.Name}
		if v.Image != nil {
			kept.Image = &corev1.ImageVolumeSource{Reference: v.Image.Reference}
		}
		out.Spec.Volumes = append(out.Spec.Volumes, kept)
	}
	return out
}

func stripContainers(in []corev1.Container) []corev1.Container {
	if in == nil {
		return nil
	}
	out := make([]corev1.Container, len(in))
	for i, c := range in {
		out[i] = corev1.Container{Name: c.Name, Image: c.Image, RestartPolicy: c.RestartPolicy}
	}
	return out
}

// fAnnotations is the key of the annotations in a field set.
var fAnnotations = []byte(`"f:annotations"`)

// stripManagedFields keeps the entries that own an image of the pod
// template or an annotation, each with only those fields: the image field
// of each container, init container and image volume that has one, and
// the annotations' keys. imageManagers and AnnotationManager read nothing
// else; an entry that owns neither (the controller-manager's status, the
// rest of a spec) is dropped whole.
func stripManagedFields(k *Kind, entries []metav1.ManagedFieldsEntry) []metav1.ManagedFieldsEntry {
	var out []metav1.ManagedFieldsEntry
	for _, e := range entries {
		if e.FieldsV1 == nil || (!bytes.Contains(e.FieldsV1.Raw, fImage) && !bytes.Contains(e.FieldsV1.Raw, fAnnotations)) {
			continue
		}
		raw, ok := stripFields(k, e.FieldsV1.Raw)
		if !ok {
			continue
		}
		e.FieldsV1 = &metav1.FieldsV1{Raw: raw}
		out = append(out, e)
	}
	return out
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
// pod template or an annotation; false when it owns neither (or does not
// parse: imageManagers and AnnotationManager ignore such an entry too).
func stripFields(k *Kind, raw []byte) ([]byte, bool) {
	var root ownedRoot
	if json.Unmarshal(raw, &root) != nil {
		return nil, false
	}
	out := ownedRoot{}
	if root.Metadata != nil && root.Metadata.Annotations != nil {
		out.Metadata = root.Metadata
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
