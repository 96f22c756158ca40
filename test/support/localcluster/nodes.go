package localcluster

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// nodeAnnotation selects which kwok process manages a node: each node has
// its own value, so stopping one kwok stops exactly one node's heartbeat.
const nodeAnnotation = "kwok.x-k8s.io/node"

// kwokStages are kwok's own Stage documents (shipped in its module, copied
// next to the binary by hack/build-cluster.sh) for the node: initialise and
// heartbeat with a lease. kwok's "node-not-ready" chaos stage is
// deliberately absent: new pods still go Ready under it, which is not what
// a dead node does. The pod stages are the harness's own (podStages); the
// pod-delete one is kwok's.
var kwokStages = []string{
	"node/fast/node-initialize.yaml",
	"node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
	"pod/fast/pod-delete.yaml",
}

func (c *Cluster) createNode(ctx context.Context, name string) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{nodeAnnotation: name, "node.alpha.kubernetes.io/ttl": "0"},
			Labels: map[string]string{
				"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "type": "kwok",
			},
		},
	}
	_, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	return nil
}

func (c *Cluster) nodeIndex(name string) (int, error) {
	for i, n := range c.NodeNames {
		if n == name {
			return i, nil
		}
	}
	return 0, fmt.Errorf("no node %q in this cluster (nodes: %v)", name, c.NodeNames)
}

func (c *Cluster) startKwok(name string, i int) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	args := []string{
		"--kubeconfig=" + c.Kubeconfig,
		"--manage-nodes-with-annotation-selector=" + nodeAnnotation + "=" + name,
		fmt.Sprintf("--node-lease-duration-seconds=%d", NodeLeaseSeconds),
		// Pod and node addresses are only data in the API: nothing listens
		// on them and no traffic is sent there.
		fmt.Sprintf("--cidr=10.244.%d.0/24", i+1),
		fmt.Sprintf("--node-ip=10.245.0.%d", i+1),
		"--server-address=" + addr(port),
	}
	for _, s := range kwokStages {
		args = append(args, "-c", filepath.Join(c.BinDir, "stage", s))
	}
	own, err := writeStages(c.RunDir)
	if err != nil {
		return err
	}
	for _, s := range own {
		args = append(args, "-c", s)
	}
	return c.run("kwok-"+name, "kwok", args...)
}

// startNode starts what plays a node's kubelet: its image agent and its
// kwok.
func (c *Cluster) startNode(name string, i int) error {
	if !c.agentAlive(name) {
		if err := c.startAgent(name); err != nil {
			return err
		}
	}
	if !c.Procs["kwok-"+name].alive() {
		return c.startKwok(name, i)
	}
	return nil
}

// AddNode creates one more fake node, with its own kwok process, and waits
// until it is Ready and has run a pod.
func (c *Cluster) AddNode(ctx context.Context, name string) error {
	if _, err := c.nodeIndex(name); err == nil {
		return fmt.Errorf("node %s already exists", name)
	}
	c.NodeNames = append(c.NodeNames, name)
	if err := c.createNode(ctx, name); err != nil {
		return err
	}
	if err := c.startNode(name, len(c.NodeNames)-1); err != nil {
		return err
	}
	if err := c.WaitNodeReady(ctx, name, true); err != nil {
		return err
	}
	return c.checkNodesRunPods(ctx, []string{name}, nodeCheckTimeout)
}

// NodeDown makes a node NotReady the way a real one goes: the kwok process
// that heartbeats it is stopped, and the node-lifecycle controller marks it
// Unknown after the grace period. It waits for that (up to ~60 s) so the
// caller observes a NotReady node.
func (c *Cluster) NodeDown(ctx context.Context, name string) error {
	if err := c.StopNodeAgent(name); err != nil {
		return err
	}
	return c.WaitNodeReady(ctx, name, false)
}

// StopNodeAgent stops the kwok process and the image agent of a node and
// returns at once: the node still reads Ready for the grace period, but
// nothing it is sent runs any more — a node that dies in the middle of a
// rollout.
func (c *Cluster) StopNodeAgent(name string) error {
	if _, err := c.nodeIndex(name); err != nil {
		return err
	}
	if p := c.Procs["kwok-"+name]; p != nil {
		if err := p.stop(5 * time.Second); err != nil {
			return err
		}
		delete(c.Procs, "kwok-"+name)
	}
	if err := c.stopAgent(name); err != nil {
		return err
	}
	return c.save()
}

// NodeUp restarts the node's kwok process and image agent and waits until
// it is Ready and has re-reported its pods, as a kubelet does: a running
// pod is Ready again (pod-readiness, every readiness gate permitting), and
// a pending one whose images are settled starts.
func (c *Cluster) NodeUp(ctx context.Context, name string) error {
	i, err := c.nodeIndex(name)
	if err != nil {
		return err
	}
	if err := c.startNode(name, i); err != nil {
		return err
	}
	if err := c.WaitNodeReady(ctx, name, true); err != nil {
		return err
	}
	return c.waitPodsReReported(ctx, name)
}

// nudgeAnnotation is the pod annotation waitPodsReReported writes.
const nudgeAnnotation = "localcluster.image-refresh/nudge"

// waitPodsReReported waits until no pod of node is left that its kwok should
// move on (waitsForNode), and writes an annotation on each such pod about
// once a second meanwhile.
//
// The write is needed because kwok (v0.8) plays a pod's stages only while
// its lease cache shows it holding the node's lease. A restarted kwok takes
// the lease over from the one that ran before and lists the node's pods at
// once; a pod it reads before its cache shows the new holder is skipped
// ("read only") and not looked at again until the pod changes. On a loaded
// machine that left a DaemonSet's pod NotReady for good.
func (c *Cluster) waitPodsReReported(ctx context.Context, node string) error {
	polls := 0
	return c.poll(ctx, "wait for the pods of node "+node+" to be re-reported", 60*time.Second, "kwok-"+node, func(ctx context.Context) error {
		list, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return err
		}
		polls++
		var waiting []string
		for i := range list.Items {
			p := &list.Items[i]
			if !waitsForNode(p) {
				continue
			}
			waiting = append(waiting, p.Namespace+"/"+p.Name)
			if polls%10 == 0 {
				patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, nudgeAnnotation, strconv.Itoa(polls))
				done := "nudged"
				if _, err := c.Client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
					done = "nudge failed: " + err.Error()
				}
				c.logf("node %s is back, pod %s/%s not re-reported yet: %s", node, p.Namespace, p.Name, done)
			}
		}
		if len(waiting) > 0 {
			return fmt.Errorf("not re-reported yet: %s: %w", strings.Join(waiting, ", "), errNotReady)
		}
		return nil
	})
}

// waitsForNode reports whether p is a pod its node's kwok has to move on:
// pending with its images settled (pod-ready starts it), or running with
// ready containers and a Ready condition that disagrees with its readiness
// gates (pod-readiness): made NotReady while the node was down although
// every gate is True, or Ready although a gate's owner has not set it True.
// A Job's pods and pods being deleted are left alone, as the stages leave
// them.
func waitsForNode(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, o := range p.OwnerReferences {
		if o.Kind == "Job" {
			return false
		}
	}
	cond := map[corev1.PodConditionType]corev1.ConditionStatus{}
	for _, c := range p.Status.Conditions {
		cond[c.Type] = c.Status
	}
	switch p.Status.Phase {
	case corev1.PodPending:
		return cond[ImagesPulledCondition] == corev1.ConditionTrue
	case corev1.PodRunning:
		if cond[corev1.ContainersReady] != corev1.ConditionTrue {
			return false
		}
		gates := true
		for _, g := range p.Spec.ReadinessGates {
			gates = gates && cond[g.ConditionType] == corev1.ConditionTrue
		}
		return (cond[corev1.PodReady] == corev1.ConditionTrue) != gates
	}
	return false
}

// WaitNodeReady waits until the node's Ready condition is True (ready) or
// anything else (not ready).
func (c *Cluster) WaitNodeReady(ctx context.Context, name string, ready bool) error {
	proc := ""
	if ready {
		proc = "kwok-" + name
		if c.Real != nil && name == c.Real.Name {
			proc = "kubelet-" + name
		}
	}
	want := map[bool]string{true: "Ready", false: "NotReady"}[ready]
	return c.poll(ctx, "wait for node "+name+" "+want, time.Duration(NodeLeaseSeconds+60)*time.Second, proc, func(ctx context.Context) error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		isReady := false
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				isReady = true
			}
		}
		if isReady != ready {
			return fmt.Errorf("node %s is not %s yet: %w", name, want, errNotReady)
		}
		return nil
	})
}
