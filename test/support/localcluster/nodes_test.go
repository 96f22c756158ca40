package localcluster

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeUp waits for exactly the pods a kubelet that comes back moves on
// (N1): a running pod whose Ready condition disagrees with its readiness
// gates (made NotReady while the node was down), and a pending pod whose
// images are settled. Others are left alone, so that a pod held back on
// purpose (a readiness gate) never makes NodeUp wait.
func TestWaitsForNode_N1_OnlyPodsTheNodeShouldMoveOn(t *testing.T) {
	conds := func(kv ...any) []corev1.PodCondition {
		var out []corev1.PodCondition
		for i := 0; i < len(kv); i += 2 {
			out = append(out, corev1.PodCondition{Type: kv[i].(corev1.PodConditionType), Status: kv[i+1].(corev1.ConditionStatus)})
		}
		return out
	}
	const yes, no = corev1.ConditionTrue, corev1.ConditionFalse
	gate := corev1.PodConditionType("example.com/gate")
	now := metav1.Now()
	for _, tc := range []struct {
		name string
		pod  corev1.Pod
		want bool
	}{
		{"running, containers ready, made NotReady", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: conds(corev1.ContainersReady, yes, corev1.PodReady, no)}}, true},
		{"running and Ready", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: conds(corev1.ContainersReady, yes, corev1.PodReady, yes)}}, false},
		{"running, containers not ready", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: conds(corev1.ContainersReady, no, corev1.PodReady, no)}}, false},
		{"readiness gate False", corev1.Pod{Spec: corev1.PodSpec{ReadinessGates: []corev1.PodReadinessGate{{ConditionType: gate}}}, Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: conds(corev1.ContainersReady, yes, corev1.PodReady, no, gate, no)}}, false},
		{"readiness gate not set", corev1.Pod{Spec: corev1.PodSpec{ReadinessGates: []corev1.PodReadinessGate{{ConditionType: gate}}}, Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: conds(corev1.ContainersReady, yes, corev1.PodReady, no)}}, false},
		{"Ready although its readiness gate turned False", corev1.Pod{Spec: corev1.PodSpec{ReadinessGates: []corev1.PodReadinessGate{{ConditionType: gate}}}, Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: conds(corev1.ContainersReady, yes, corev1.PodReady, yes, gate, no)}}, true},
		{"readiness gate True", corev1.Pod{Spec: corev1.PodSpec{ReadinessGates: []corev1.PodReadinessGate{{ConditionType: gate}}}, Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: conds(corev1.ContainersReady, yes, corev1.PodReady, no, gate, yes)}}, true},
		{"pending, images settled", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: conds(ImagesPulledCondition, yes)}}, true},
		{"pending, images not settled yet", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending}}, false},
		{"being deleted", corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}, Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: conds(corev1.ContainersReady, yes, corev1.PodReady, no)}}, false},
		{"a Job's pod", corev1.Pod{ObjectMeta: metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{{Kind: "Job", Name: "j"}}}, Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: conds(corev1.ContainersReady, yes, corev1.PodReady, no)}}, false},
		{"succeeded", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodSucceeded}}, false},
	} {
		if got := waitsForNode(&tc.pod); got != tc.want {
			t.Errorf("%s: waitsForNode = %v, want %v", tc.name, got, tc.want)
		}
	}
}
