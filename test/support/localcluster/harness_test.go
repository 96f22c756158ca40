package localcluster_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/image-refresh/image-refresh/test/support/localcluster"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// waitPod watches the pods of ns on node until one satisfies cond, and
// returns it.
func waitPod(t *testing.T, client kubernetes.Interface, ns, node, what string, timeout time.Duration, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	sel := fields.OneTermEqualSelector("spec.nodeName", node).String()
	lw := &cache.ListWatch{
		ListFunc: func(o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return client.CoreV1().Pods(ns).List(ctx, o)
		},
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return client.CoreV1().Pods(ns).Watch(ctx, o)
		},
	}
	var found *corev1.Pod
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Deleted && cond(p) {
			found = p
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("wait for a pod of %s on %s that %s: %v", ns, node, what, err)
	}
	return found
}

func podCondition(p *corev1.Pod, typ corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

func TestHarness_N1_NodeThatComesBackReReportsItsPodsReady(t *testing.T) {
	c := testenv.Cluster(t)
	ctx := context.Background()
	ns := testenv.Namespace(t, c.Client)
	testenv.DaemonSet(t, c.Client, ns, "agent", testenv.WithTolerateAll())
	if err := testenv.WaitSettled(ctx, c.Client, "DaemonSet", ns, "agent", 60*time.Second); err != nil {
		t.Fatalf("initial rollout: %v", err)
	}
	before := waitPod(t, c.Client, ns, "node-3", "is Ready", 30*time.Second, func(p *corev1.Pod) bool {
		return podCondition(p, corev1.PodReady) == corev1.ConditionTrue
	})

	if err := c.NodeDown(ctx, "node-3"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.NodeUp(context.Background(), "node-3") })
	// The node-lifecycle controller marks the pods of a NotReady node
	// unready: the fault the harness must recover from did happen.
	waitPod(t, c.Client, ns, "node-3", "is not Ready", 90*time.Second, func(p *corev1.Pod) bool {
		return p.UID == before.UID && podCondition(p, corev1.PodReady) == corev1.ConditionFalse
	})
	ds, err := c.Client.AppsV1().DaemonSets(ns).Get(ctx, "agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node-3 down: DaemonSet %d of %d available", ds.Status.NumberAvailable, ds.Status.DesiredNumberScheduled)

	if err := c.NodeUp(ctx, "node-3"); err != nil {
		t.Fatal(err)
	}
	after := waitPod(t, c.Client, ns, "node-3", "is Ready again", 90*time.Second, func(p *corev1.Pod) bool {
		return podCondition(p, corev1.PodReady) == corev1.ConditionTrue
	})
	if after.UID != before.UID {
		t.Errorf("node-3 runs pod %s after it came back, want the same pod %s re-reported Ready", after.UID, before.UID)
	}
	if err := testenv.WaitSettled(ctx, c.Client, "DaemonSet", ns, "agent", 90*time.Second); err != nil {
		t.Fatalf("DaemonSet after node-3 is back: %v", err)
	}
	// The DaemonSet controller counts a pod available only after it saw it
	// Ready; wait for its status (on a watch) rather than for a time.
	deadline, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	watchDS, err := testenv.WatchWorkload(c.Client, "DaemonSet", ns, "agent")
	if err != nil {
		t.Fatal(err)
	}
	err = testenv.UntilWatched(deadline, watchDS, func(ctx context.Context) (bool, error) {
		var err error
		ds, err = c.Client.AppsV1().DaemonSets(ns).Get(ctx, "agent", metav1.GetOptions{})
		return err == nil && ds.Status.NumberAvailable == 3 && ds.Status.NumberReady == 3, err
	})
	if err != nil {
		t.Fatalf("DaemonSet after node-3 is back: %d available, %d ready, want 3 (%v)", ds.Status.NumberAvailable, ds.Status.NumberReady, err)
	}
}

// startPod creates a bare pod bound to node (no scheduler involved) with
// one container running image under policy, and waits until it is Ready.
func startPod(t *testing.T, client kubernetes.Interface, ns, name, node, image string, policy corev1.PullPolicy, pullSecrets ...string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			Containers:                    []corev1.Container{{Name: "app", Image: image, ImagePullPolicy: policy}},
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			TerminationGracePeriodSeconds: new(int64),
		},
	}
	for _, s := range pullSecrets {
		p.Spec.ImagePullSecrets = append(p.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
	}
	created, err := client.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	return waitPod(t, client, ns, node, "is pod "+name+" Ready", 60*time.Second, func(p *corev1.Pod) bool {
		return p.UID == created.UID && podCondition(p, corev1.PodReady) == corev1.ConditionTrue
	})
}

func TestHarness_N1_NodesReportImageIDsFromTheirCache(t *testing.T) {
	c := testenv.Cluster(t)
	ns := testenv.Namespace(t, c.Client)
	reg := testregistry.Start(t)
	repo := reg.Host() + "/acme/app"
	tag := repo + ":prod"
	old := reg.MustPushRandomImage(t, "acme/app", "prod")
	cur := reg.MustPushRandomImage(t, "acme/app", "prod")
	// node-2 pulled :prod before the tag moved: its cache is stale.
	if err := c.SetNodeImageCache("node-2", tag, old); err != nil {
		t.Fatal(err)
	}
	reg.ResetRequests()

	type want struct {
		pod, node, image string
		policy           corev1.PullPolicy
		imageID          string
	}
	check := func(w want) {
		t.Helper()
		p := startPod(t, c.Client, ns, w.pod, w.node, w.image, w.policy)
		if len(p.Status.ContainerStatuses) != 1 {
			t.Fatalf("pod %s: %d container statuses, want 1", w.pod, len(p.Status.ContainerStatuses))
		}
		st := p.Status.ContainerStatuses[0]
		if st.ImageID != w.imageID || st.Image != w.image {
			t.Errorf("pod %s on %s asking for %s (%s): image %q imageID %q, want image %q imageID %q",
				w.pod, w.node, w.image, w.policy, st.Image, st.ImageID, w.image, w.imageID)
		}
		if st.State.Running == nil || !st.Ready {
			t.Errorf("pod %s: container not running and ready: %+v", w.pod, st)
		}
	}
	check(want{"fresh", "node-1", tag, corev1.PullIfNotPresent, repo + "@" + cur})
	check(want{"stale", "node-2", tag, corev1.PullIfNotPresent, repo + "@" + old})
	check(want{"pinned", "node-3", repo + "@" + old, corev1.PullIfNotPresent, repo + "@" + old})
	check(want{"pinned-with-tag", "node-1", tag + "@" + old, corev1.PullIfNotPresent, repo + "@" + old})
	if n := reg.Count("GET", "/v2/acme/app/manifests/"); n != 1 {
		t.Errorf("%d manifest GETs, want 1: node-1's first pull of :prod (a cached tag and a digest need no pull)", n)
	}

	// The tag moves again: a node runs what it has cached unless the pod
	// says Always.
	next := reg.MustPushRandomImage(t, "acme/app", "prod")
	check(want{"fresh-again", "node-1", tag, corev1.PullIfNotPresent, repo + "@" + cur})
	check(want{"always", "node-2", tag, corev1.PullAlways, repo + "@" + next})
	if n := reg.Count("GET", "/v2/acme/app/manifests/prod"); n != 2 {
		t.Errorf("%d GETs of acme/app:prod, want 2 (node-1's first pull, node-2's Always)", n)
	}
	cache, err := c.NodeImageCache("node-2")
	if err != nil {
		t.Fatal(err)
	}
	if got := cache[tag]; got != next {
		t.Errorf("node-2 caches %s for %s after an Always pull, want %s", got, tag, next)
	}
	check(want{"stale-fixed", "node-2", tag, corev1.PullIfNotPresent, repo + "@" + next})

	// A node can be made to report another digest than the one asked for,
	// as a runtime that reports an index's platform manifest does.
	index := reg.MustPushRandomIndex(t, "acme/multi", "prod", 2)
	platform := "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	multi := reg.Host() + "/acme/multi@" + index
	if err := c.SetNodeImageCache("node-3", multi, platform); err != nil {
		t.Fatal(err)
	}
	check(want{"platform", "node-3", multi, corev1.PullIfNotPresent, reg.Host() + "/acme/multi@" + platform})
	check(want{"index", "node-1", multi, corev1.PullIfNotPresent, multi})
}

func TestHarness_N1_PodWhoseImageCannotBePulledRunsWithoutImageID(t *testing.T) {
	c := testenv.Cluster(t)
	ns := testenv.Namespace(t, c.Client)
	reg := testregistry.Start(t)
	// No such tag: the pull fails (404), the pod still runs, and says why
	// it has no image ID.
	p := startPod(t, c.Client, ns, "missing", "node-1", reg.Host()+"/acme/none:prod", corev1.PullIfNotPresent)
	if id := p.Status.ContainerStatuses[0].ImageID; id != "" {
		t.Errorf("imageID %q for a tag the registry does not have, want none", id)
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == localcluster.ImagesPulledCondition && (cond.Reason != "NotPulled" || cond.Message == "") {
			t.Errorf("condition %s: reason %q message %q, want NotPulled and the pull error", cond.Type, cond.Reason, cond.Message)
		}
	}
	if reg.Count("GET", "/v2/acme/none/manifests/prod") == 0 {
		t.Errorf("the node never tried to pull acme/none:prod")
	}
}

func TestHarness_N1_NodePullsWithThePodsPullSecret(t *testing.T) {
	c := testenv.Cluster(t)
	ns := testenv.Namespace(t, c.Client)
	reg := testregistry.Start(t, testregistry.WithBasicAuth("robot", "s3cr3t"))
	digest := reg.MustPushRandomImage(t, "acme/private", "prod")
	tag := reg.Host() + "/acme/private:prod"
	auth := base64.StdEncoding.EncodeToString([]byte("robot:s3cr3t"))
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: ns},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: []byte(fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, reg.Host(), auth))},
	}
	if _, err := c.Client.CoreV1().Secrets(ns).Create(context.Background(), secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	anon := startPod(t, c.Client, ns, "anonymous", "node-1", tag, corev1.PullAlways)
	if id := anon.Status.ContainerStatuses[0].ImageID; id != "" {
		t.Errorf("pod without a pull secret reports %q, want no image ID (401)", id)
	}
	p := startPod(t, c.Client, ns, "with-secret", "node-1", tag, corev1.PullAlways, "regcred")
	if id, want := p.Status.ContainerStatuses[0].ImageID, reg.Host()+"/acme/private@"+digest; id != want {
		t.Errorf("pod with the pull secret reports %q, want %q", id, want)
	}
}

// A node that looks Ready but does not start pods (its kwok loaded no pod
// stage, its image agent is gone) fails the cluster's start with its name,
// instead of leaving every rollout that lands on it unsettled (N1).
func TestHarness_N1_StartFailsOnANodeThatDoesNotRunPods(t *testing.T) {
	c := testenv.Cluster(t)
	ctx := context.Background()
	// A node that plays its part passes, and the check leaves no pod.
	if err := c.CheckNodesRunPods(ctx, []string{"node-1"}, 60*time.Second); err != nil {
		t.Fatalf("node-1 runs pods, but the check says: %v", err)
	}
	left, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=localcluster-node-check"})
	if err != nil {
		t.Fatal(err)
	}
	if len(left.Items) != 0 {
		t.Errorf("the check left %d pods behind", len(left.Items))
	}

	if err := c.StopImageAgent("node-2"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.StartNodeAgain("node-2")
		_ = c.Client.CoreV1().Pods("kube-system").Delete(context.Background(), "localcluster-node-check-node-2", metav1.DeleteOptions{})
	})
	err = c.CheckNodesRunPods(ctx, []string{"node-2"}, 3*time.Second)
	if err == nil {
		t.Fatal("node-2 has no image agent, so its pods stay Pending, but the check passed")
	}
	for _, want := range []string{"node-2", "Pending", "agent-node-2.log"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the check's error does not name %q: %v", want, err)
		}
	}

	// The same node with its agent back runs the pod the check left.
	if err := c.StartNodeAgain("node-2"); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckNodesRunPods(ctx, []string{"node-2"}, 60*time.Second); err != nil {
		t.Fatalf("node-2 with its agent back: %v", err)
	}
}

// A kubelet never writes a readiness gate's condition: the gate's owner
// does, and the kubelet keeps the pod Ready only while every gate is True
// (R4 reads a rollout through that). So does the harness's node: a pod
// whose two gates nobody sets starts with ready containers and is not
// Ready; it is Ready once its owner set both True, and not at any moment
// before; and unready again when one turns False.
func TestHarness_R4_TheNodeLeavesReadinessGatesToTheirOwnersAndIsReadyOnlyWhileAllAreTrue(t *testing.T) {
	c := testenv.Cluster(t)
	ns := testenv.Namespace(t, c.Client)
	pods := c.Client.CoreV1().Pods(ns)
	gates := []corev1.PodConditionType{"lb.acme.example/registered", "mesh.acme.example/ready"}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gated", Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:                      "node-1",
			Containers:                    []corev1.Container{{Name: "app", Image: "registry.test/acme/app:prod"}},
			ReadinessGates:                []corev1.PodReadinessGate{{ConditionType: gates[0]}, {ConditionType: gates[1]}},
			TerminationGracePeriodSeconds: new(int64),
		},
	}
	created, err := pods.Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := pods.Watch(context.Background(), metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", "gated").String(), ResourceVersion: created.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	// until reads the pod's every version from the watch until one
	// satisfies cond; with early, none on the way may be Ready with a gate
	// not True (once a gate turns False, Ready may follow a moment later,
	// as a kubelet's does).
	until := func(what string, early bool, cond func(*corev1.Pod) bool) *corev1.Pod {
		t.Helper()
		deadline := time.After(60 * time.Second)
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					t.Fatalf("the watch of the pod ended before it %s", what)
				}
				p, ok := ev.Object.(*corev1.Pod)
				if !ok {
					t.Fatalf("watch event %s: %v", ev.Type, ev.Object)
				}
				for _, g := range gates {
					if early && podCondition(p, corev1.PodReady) == corev1.ConditionTrue && podCondition(p, g) != corev1.ConditionTrue {
						t.Fatalf("pod Ready while its gate %s is %q (resourceVersion %s): %+v", g, podCondition(p, g), p.ResourceVersion, p.Status.Conditions)
					}
				}
				if cond(p) {
					return p
				}
			case <-deadline:
				t.Fatalf("the pod never %s", what)
			}
		}
	}
	setGate := func(g corev1.PodConditionType, status corev1.ConditionStatus) {
		t.Helper()
		patch := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":%q,"lastTransitionTime":%q}]}}`, g, status, time.Now().UTC().Format(time.RFC3339))
		if _, err := pods.Patch(context.Background(), "gated", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "gate-owner"}, "status"); err != nil {
			t.Fatal(err)
		}
	}

	started := until("started", true, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if got := podCondition(started, corev1.ContainersReady); got != corev1.ConditionTrue {
		t.Errorf("started with ContainersReady %q, want True", got)
	}
	if got := podCondition(started, corev1.PodReady); got != corev1.ConditionFalse {
		t.Errorf("started with Ready %q, want False: no gate is set", got)
	}
	for _, g := range gates {
		if got := podCondition(started, g); got != "" {
			t.Errorf("the node wrote gate %s = %q: only its owner may", g, got)
		}
	}

	setGate(gates[0], corev1.ConditionTrue)
	until("saw its first gate True", true, func(p *corev1.Pod) bool { return podCondition(p, gates[0]) == corev1.ConditionTrue })
	setGate(gates[1], corev1.ConditionTrue)
	until("was Ready with both gates True", true, func(p *corev1.Pod) bool { return podCondition(p, corev1.PodReady) == corev1.ConditionTrue })

	setGate(gates[1], corev1.ConditionFalse)
	until("was unready again after a gate turned False", false, func(p *corev1.Pod) bool {
		return podCondition(p, gates[1]) == corev1.ConditionFalse && podCondition(p, corev1.PodReady) == corev1.ConditionFalse
	})
}
