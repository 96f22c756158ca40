package workload

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/image-refresh/image-refresh/internal/config"
)

// Pod is what N1 needs of one pod of a workload: where it runs and, per
// image of its spec, the image its runtime reports: a container's and an
// init container's status imageID ("" until it started; a finished init
// container keeps its own), and an image volume's imageRef where the
// kubelet reports the mounts' volume status (K1).
type Pod struct {
	Name, Node string
	ImageIDs   map[string]string // image key (PodImage.Key) → imageID
	// Failing holds, per container that cannot run, why: its waiting
	// reason (CrashLoopBackOff, ImagePullBackOff, …), message and last exit
	// code (V2).
	Failing map[string]string
	// Ready: the pod's Ready condition is True; Restarts: the sum of its
	// containers' restart counts (P1's soak).
	Ready    bool
	Restarts int
}

// failingReasons are the waiting reasons of a container that will not run
// without a change (V2): not the ones of a container still starting.
var failingReasons = map[string]bool{
	"CrashLoopBackOff": true, "ImagePullBackOff": true, "ErrImagePull": true, "InvalidImageName": true,
	"CreateContainerConfigError": true, "CreateContainerError": true, "RunContainerError": true,
}

// failing says why a container cannot run, or "".
func failing(cs corev1.ContainerStatus) string {
	w := cs.State.Waiting
	if w == nil || !failingReasons[w.Reason] {
		return ""
	}
	why := w.Reason
	if t := cs.LastTerminationState.Terminated; t != nil {
		why += fmt.Sprintf(" (last exit code %d", t.ExitCode)
		if t.Reason != "" {
			why += ", " + t.Reason
		}
		why += ")"
	}
	if w.Message != "" {
		why += ": " + w.Message
	}
	return why
}

// Pods lists the pods of obj that run its current pod template's images
// (a rollout's old pods are the rollout's business, R4): from the cache
// when one is set (SetCache), else with one LIST by the workload's
// selector. A kind without long-running pods (CronJob) has none.
func (c *Client) Pods(ctx context.Context, obj *Object) ([]Pod, error) {
	if obj == nil || obj.Selector == nil {
		return nil, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(obj.Selector)
	if err != nil {
		return nil, fmt.Errorf("pods of %s: selector: %w", obj.Ref, err)
	}
	var items []corev1.Pod
	if c.cache != nil {
		var list corev1.PodList
		// The loop below only reads the pods and copies what it keeps: no
		// deep copy of every pod of the workload.
		if err := c.cache.List(ctx, &list, client.InNamespace(obj.Ref.Namespace), client.MatchingLabelsSelector{Selector: sel}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("list the pods of %s from the cache: %w", obj.Ref, err)
		}
		items = list.Items
	} else {
		callCtx, cancel := c.bounded(ctx)
		list, err := c.kube.CoreV1().Pods(obj.Ref.Namespace).List(callCtx, metav1.ListOptions{LabelSelector: sel.String()})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("list the pods of %s: %w", obj.Ref, err)
		}
		items = list.Items
	}
	var out []Pod
	for i := range items {
		p := &items[i]
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || !current(obj, p) {
			continue
		}
		out = append(out, podOf(p))
	}
	return out, nil
}

// podOf reads what N1 and V2 need of p.
func podOf(p *corev1.Pod) Pod {
	pod := Pod{Name: p.Name, Node: p.Spec.NodeName, ImageIDs: map[string]string{}}
	statuses := append(slices.Clip(p.Status.ContainerStatuses), p.Status.InitContainerStatuses...)
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			pod.Ready = c.Status == corev1.ConditionTrue
		}
	}
	for _, cs := range statuses {
		pod.ImageIDs[cs.Name] = cs.ImageID
		pod.Restarts += int(cs.RestartCount)
		for _, m := range cs.VolumeMounts {
			if m.VolumeStatus != nil && m.VolumeStatus.Image != nil && m.VolumeStatus.Image.ImageRef != "" {
				pod.ImageIDs[config.VolumeKey(m.Name)] = m.VolumeStatus.Image.ImageRef
			}
		}
		if why := failing(cs); why != "" {
			if pod.Failing == nil {
				pod.Failing = map[string]string{}
			}
			pod.Failing[cs.Name] = why
		}
	}
	return pod
}

// current reports whether pod runs the images of obj's pod template: every
// image of its spec, init containers and image volumes included (K1).
func current(obj *Object, pod *corev1.Pod) bool {
	imgs := PodImages(&pod.Spec)
	if len(imgs) != len(obj.Containers) {
		return false
	}
	for i, pi := range imgs {
		if pi.Key != obj.Containers[i].Name || pi.Image != obj.Containers[i].Image {
			return false
		}
	}
	return true
}

// StripPod keeps of a pod what Pods reads, for the informer cache of
// `run` (a cache.TransformFunc): the managed namespaces' pods cost a few
// hundred bytes each instead of their whole spec and status.
func StripPod(in any) (any, error) {
	p, ok := in.(*corev1.Pod)
	if !ok {
		return in, nil
	}
	out := &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			Labels: p.Labels, DeletionTimestamp: p.DeletionTimestamp,
		},
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName},
		Status: corev1.PodStatus{Phase: p.Status.Phase},
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady { // P1's soak reads Ready
			out.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	for _, c := range p.Spec.Containers {
		out.Spec.Containers = append(out.Spec.Containers, corev1.Container{Name: c.Name, Image: c.Image})
	}
	for _, c := range p.Spec.InitContainers {
		out.Spec.InitContainers = append(out.Spec.InitContainers, corev1.Container{Name: c.Name, Image: c.Image})
	}
	for _, v := range p.Spec.Volumes {
		kept := corev1.Volume{Name: v.Name} // every volume, so that indices hold
		if v.Image != nil {                 // only image volumes are images (K1)
			kept.Image = &corev1.ImageVolumeSource{Reference: v.Image.Reference}
		}
		out.Spec.Volumes = append(out.Spec.Volumes, kept)
	}
	out.Status.ContainerStatuses = stripStatuses(p.Status.ContainerStatuses)
	out.Status.InitContainerStatuses = stripStatuses(p.Status.InitContainerStatuses)
	return out, nil
}

// stripStatuses keeps of container statuses what podOf reads.
func stripStatuses(in []corev1.ContainerStatus) []corev1.ContainerStatus {
	var out []corev1.ContainerStatus
	for _, cs := range in {
		kept := corev1.ContainerStatus{Name: cs.Name, ImageID: cs.ImageID, RestartCount: cs.RestartCount}
		if failing(cs) != "" { // V2 reads why it cannot run
			kept.State.Waiting, kept.LastTerminationState.Terminated = cs.State.Waiting, cs.LastTerminationState.Terminated
		}
		for _, m := range cs.VolumeMounts {
			if m.VolumeStatus != nil && m.VolumeStatus.Image != nil {
				kept.VolumeMounts = append(kept.VolumeMounts, corev1.VolumeMountStatus{Name: m.Name, VolumeStatus: m.VolumeStatus})
			}
		}
		out = append(out, kept)
	}
	return out
}
