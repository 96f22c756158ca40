package workload

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// V2 reads why a rollout will not finish: a Deployment's
// ProgressDeadlineExceeded, and containers that cannot run.

func TestDeploymentSettled_V2_ProgressDeadlineExceededIsAFailureAlsoUnobserved(t *testing.T) {
	one := int32(1)
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Generation: 2}, Spec: appsv1.DeploymentSpec{Replicas: &one},
		Status: appsv1.DeploymentStatus{ObservedGeneration: 2, Replicas: 2, UpdatedReplicas: 1, AvailableReplicas: 1,
			Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse,
				Reason: "ProgressDeadlineExceeded", Message: `ReplicaSet "api-2" has timed out progressing.`}}}}
	if got := DeploymentSettled(d).FailedReason(); got != `ProgressDeadlineExceeded: ReplicaSet "api-2" has timed out progressing.` {
		t.Errorf("FailedReason() = %q", got)
	}
	d.Generation = 3 // an annotation write the controller has not observed yet
	if got := DeploymentSettled(d).FailedReason(); got == "" {
		t.Errorf("an unobserved generation hid the failure")
	}
	d.Status.Conditions[0].Reason = "ReplicaSetUpdated"
	d.Status.Conditions[0].Status = corev1.ConditionTrue
	if got := DeploymentSettled(d).FailedReason(); got != "" {
		t.Errorf("a progressing rollout reads as failed: %q", got)
	}
}

func TestStripPod_V2_AContainerThatCannotRunKeepsWhyAndAStartingOneDoesNot(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "api-x"}, Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{
		{Name: "api", ImageID: "reg/acme/api@sha256:b",
			State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 10s restarting failed container"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}}},
		{Name: "sidecar", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}},
	}}}
	out, err := StripPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	st := out.(*corev1.Pod).Status.ContainerStatuses
	if got := failing(st[0]); got != "CrashLoopBackOff (last exit code 1, Error): back-off 10s restarting failed container" {
		t.Errorf("after StripPod the crashing container says %q", got)
	}
	if st[1].State.Waiting != nil || failing(st[1]) != "" {
		t.Errorf("a container still being created is kept as failing: %+v", st[1])
	}
}

// P1: the soak reads a pod's Ready condition and its containers' restarts,
// from the stripped pods of `run`'s cache as from a LIST.
func TestStripPod_P1_KeepsReadyAndRestarts(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "api-x"}, Status: corev1.PodStatus{
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, Message: "dropped"},
		},
		ContainerStatuses:     []corev1.ContainerStatus{{Name: "api", ImageID: "reg/acme/api@sha256:b", RestartCount: 2}},
		InitContainerStatuses: []corev1.ContainerStatus{{Name: "proxy", ImageID: "reg/acme/proxy@sha256:c", RestartCount: 1}},
	}}
	out, err := StripPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	got := podOf(out.(*corev1.Pod))
	if !got.Ready || got.Restarts != 3 {
		t.Errorf("after StripPod: Ready %v, Restarts %d; want true, 3", got.Ready, got.Restarts)
	}
	pod.Status.Conditions[1].Status = corev1.ConditionFalse
	out, _ = StripPod(pod)
	if podOf(out.(*corev1.Pod)).Ready {
		t.Error("a pod whose Ready condition is False reads Ready after StripPod")
	}
}
