package localcluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// nodeCheckNamespace holds the pods with which Start proves every node runs
// pods; they are deleted before Start returns.
const nodeCheckNamespace = "kube-system"

// nodeCheckTimeout is how long a node has to run its check pod.
const nodeCheckTimeout = 60 * time.Second

// realNodeCheckTimeout is the same for a real node, whose first pod also
// makes the pod network.
const realNodeCheckTimeout = 120 * time.Second

// checkNodesRunPods sends one pod to each node and waits until each is
// Ready, then deletes them. A node whose kwok or image agent does not play
// its part would otherwise look Ready (its heartbeat is a separate stage)
// while every pod bound to it stays Pending, and the cluster's users would
// see only rollouts that never finish. The pods ask for an image that is
// never pulled (imagePullPolicy Never), so the check touches no registry
// and no node image cache. Each pod has timeout to become Ready.
func (c *Cluster) checkNodesRunPods(ctx context.Context, nodes []string, timeout time.Duration) error {
	pods := c.Client.CoreV1().Pods(nodeCheckNamespace)
	grace := int64(0)
	name := func(node string) string { return "localcluster-node-check-" + node }
	for _, n := range nodes {
		// A real node runs the one image it has: the sandbox's.
		image, tolerations := "localcluster.invalid/node-check:none", []corev1.Toleration(nil)
		if c.Real != nil && n == c.Real.Name {
			image, tolerations = PauseImage, []corev1.Toleration{{Key: RuntimeLabel, Operator: corev1.TolerationOpExists}}
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name(n), Labels: map[string]string{"app.kubernetes.io/name": "localcluster-node-check"}},
			Spec: corev1.PodSpec{
				NodeName:                      n,
				TerminationGracePeriodSeconds: &grace,
				Tolerations:                   tolerations,
				Containers: []corev1.Container{{
					Name: "check", Image: image, ImagePullPolicy: corev1.PullNever,
				}},
			},
		}
		if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("node check: create pod %s/%s: %w", nodeCheckNamespace, pod.Name, err)
		}
	}
	for _, n := range nodes {
		what := fmt.Sprintf("node check: wait for pod %s/%s on node %s to be Ready (if it stays Pending, see logs/kwok-%s.log and logs/agent-%s.log of %s)",
			nodeCheckNamespace, name(n), n, n, n, c.RunDir)
		proc := "kwok-" + n
		if c.Real != nil && n == c.Real.Name {
			proc = "kubelet-" + n
			what = fmt.Sprintf("node check: wait for pod %s/%s on real node %s to be Ready (see logs/kubelet-%s.log and logs/containerd-%s.log of %s)",
				nodeCheckNamespace, name(n), n, n, n, c.RunDir)
		}
		err := c.poll(ctx, what, timeout, proc, func(ctx context.Context) error {
			p, err := pods.Get(ctx, name(n), metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					return nil
				}
			}
			return fmt.Errorf("pod is %s, not Ready: %w", p.Status.Phase, errNotReady)
		})
		if err != nil {
			return err
		}
	}
	for _, n := range nodes {
		if err := pods.Delete(ctx, name(n), metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("node check: delete pod %s/%s: %w", nodeCheckNamespace, name(n), err)
		}
	}
	return c.poll(ctx, "node check: wait for the check pods to be gone", 60*time.Second, "", func(ctx context.Context) error {
		for _, n := range nodes {
			_, err := pods.Get(ctx, name(n), metav1.GetOptions{})
			if err == nil {
				return errors.New("pod " + name(n) + " still exists")
			}
			if !apierrors.IsNotFound(err) {
				return err
			}
		}
		return nil
	})
}
