package localcluster

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	kauth "github.com/google/go-containerregistry/pkg/authn/kubernetes"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// ImagesPulledCondition is the pod condition a node's agent sets once it
// has settled the pod's images; the harness's pod-ready stage starts a pod
// only after it, so a running pod already reports its image IDs, as from a
// kubelet. Its reason says how: Pulled, or NotPulled with a message naming
// the containers that run without an image ID.
const ImagesPulledCondition corev1.PodConditionType = "localcluster.image-refresh/ImagesPulled"

// pullTimeout bounds one pull, so that a test that makes the registry hang
// on purpose delays a pod's start, not the node's for good.
const pullTimeout = 20 * time.Second

// nodeAgent plays the part of a kubelet that kwok does not: the image side.
// For each pod bound to its node it decides which digest every container
// runs — the node's image cache for a tag, a pull from the registry the
// first time (or every time, imagePullPolicy Always) — and reports it as
// containerStatuses[].imageID before the pod starts.
type nodeAgent struct {
	node      string
	client    kubernetes.Interface
	cache     imageCache
	log       io.Writer
	transport http.RoundTripper
	// pullMu serialises pulls, as a kubelet does by default
	// (serializeImagePulls), so one tag is pulled once per node.
	pullMu sync.Mutex
}

// agentRun is an agent running as a goroutine of this process.
type agentRun struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// RunNodeAgent runs the image agent of node of the cluster recorded in
// runDir until ctx ends (the node-agent command of hack/localcluster).
func RunNodeAgent(ctx context.Context, runDir, node string, log io.Writer) error {
	c, err := Attach(runDir)
	if err != nil {
		return err
	}
	if _, err := c.nodeIndex(node); err != nil {
		return err
	}
	return c.newNodeAgent(node, log).run(ctx)
}

func (c *Cluster) newNodeAgent(node string, log io.Writer) *nodeAgent {
	t := http.DefaultTransport.(*http.Transport).Clone()
	// Only loopback registries are pulled from, and they are the tests'
	// own, with certificates this node was never given (a registry test's
	// self-signed one): a node of the harness trusts them all.
	t.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // loopback test registries only
	return &nodeAgent{node: node, client: c.Client, cache: c.imageCache(node), log: log, transport: t}
}

// startAgent starts node's agent: its own process when the cluster runs
// detached (AgentCommand), otherwise a goroutine of this process.
func (c *Cluster) startAgent(node string) error {
	if len(c.AgentCommand) > 0 {
		// The agent reads the node list from state.json: save it first.
		if err := c.save(); err != nil {
			return err
		}
		args := append(append([]string{}, c.AgentCommand[1:]...), c.RunDir, node)
		p, err := startProcess(c.RunDir, "agent-"+node, c.AgentCommand[0], args, c.Detach)
		if err != nil {
			return err
		}
		c.Procs["agent-"+node] = p
		return c.save()
	}
	if err := os.MkdirAll(filepath.Join(c.RunDir, "logs"), 0o755); err != nil {
		return err
	}
	logFile, err := os.OpenFile(filepath.Join(c.RunDir, "logs", "agent-"+node+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &agentRun{cancel: cancel, done: make(chan struct{})}
	a := c.newNodeAgent(node, logFile)
	go func() {
		defer close(run.done)
		defer logFile.Close()
		if err := a.run(ctx); err != nil {
			a.logf("agent stopped: %v", err)
		}
	}()
	c.agentsMu.Lock()
	if c.agents == nil {
		c.agents = map[string]*agentRun{}
	}
	c.agents[node] = run
	c.agentsMu.Unlock()
	return nil
}

// stopAgent stops node's agent, process or goroutine.
func (c *Cluster) stopAgent(node string) error {
	if p := c.Procs["agent-"+node]; p != nil {
		if err := p.stop(5 * time.Second); err != nil {
			return err
		}
		delete(c.Procs, "agent-"+node)
	}
	c.agentsMu.Lock()
	run := c.agents[node]
	delete(c.agents, node)
	c.agentsMu.Unlock()
	if run != nil {
		run.cancel()
		<-run.done
	}
	return nil
}

func (c *Cluster) agentAlive(node string) bool {
	if c.Procs["agent-"+node].alive() {
		return true
	}
	c.agentsMu.Lock()
	defer c.agentsMu.Unlock()
	run := c.agents[node]
	if run == nil {
		return false
	}
	select {
	case <-run.done:
		return false
	default:
		return true
	}
}

func (a *nodeAgent) run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(a.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = "spec.nodeName=" + a.node
	}))
	pods := factory.Core().V1().Pods()
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	enqueue := func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok && needsImages(p) {
			queue.Add(p.Namespace + "/" + p.Name)
		}
	}
	if _, err := pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("node %s: pod cache of %v did not sync", a.node, typ)
		}
	}
	a.logf("agent of %s running", a.node)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				key, shutdown := queue.Get()
				if shutdown {
					return
				}
				if err := a.settle(ctx, pods.Lister(), key); err != nil {
					a.logf("pod %s: %v (retrying)", key, err)
					queue.AddRateLimited(key)
				} else {
					queue.Forget(key)
				}
				queue.Done(key)
			}
		})
	}
	<-ctx.Done()
	queue.ShutDown()
	wg.Wait()
	return nil
}

func needsImages(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || (p.Status.Phase != "" && p.Status.Phase != corev1.PodPending) {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == ImagesPulledCondition && c.Status == corev1.ConditionTrue {
			return false
		}
	}
	return true
}

// settle reports the image ID of every container of the pod key (waiting in
// ContainerCreating) and sets ImagesPulledCondition. A pull that fails does
// not hold the pod back, unlike on a kubelet (ErrImagePull): tests break
// registries on purpose and still need their pods to run. That container
// reports no image ID, and the condition's message says why.
func (a *nodeAgent) settle(ctx context.Context, lister corev1listers.PodLister, key string) error {
	ns, podName, _ := strings.Cut(key, "/")
	pod, err := lister.Pods(ns).Get(podName)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !needsImages(pod) {
		return nil
	}
	var problems []string
	var kc authn.Keychain
	keychain := func() authn.Keychain {
		if kc == nil {
			kc = a.keychain(ctx, pod)
		}
		return kc
	}
	statuses := func(cs []corev1.Container) []corev1.ContainerStatus {
		var out []corev1.ContainerStatus
		for _, c := range cs {
			id, err := a.imageIDOf(ctx, c, keychain)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", c.Name, err))
				a.logf("pod %s container %s: no image ID: %v", key, c.Name, err)
			}
			out = append(out, corev1.ContainerStatus{
				Name: c.Name, Image: c.Image, ImageID: id,
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}},
			})
		}
		return out
	}
	status := map[string]any{}
	if s := statuses(pod.Spec.InitContainers); len(s) > 0 {
		status["initContainerStatuses"] = s
	}
	status["containerStatuses"] = statuses(pod.Spec.Containers)
	cond := corev1.PodCondition{Type: ImagesPulledCondition, Status: corev1.ConditionTrue, Reason: "Pulled", LastTransitionTime: metav1.Now()}
	if len(problems) > 0 {
		cond.Reason, cond.Message = "NotPulled", strings.Join(problems, "; ")
	}
	status["conditions"] = []corev1.PodCondition{cond}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	_, err = a.client.CoreV1().Pods(ns).Patch(ctx, podName, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: "localcluster-node-agent"}, "status")
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("report image IDs: %w", err)
	}
	a.logf("pod %s: images settled (%s)", key, cond.Reason)
	return nil
}

// imageIDOf decides what digest container c runs on this node and returns
// it as containerd reports it ("" and an error when it cannot say).
func (a *nodeAgent) imageIDOf(ctx context.Context, c corev1.Container, keychain func() authn.Keychain) (string, error) {
	key, ref, err := cacheKey(c.Image)
	if err != nil {
		return "", err
	}
	a.pullMu.Lock()
	defer a.pullMu.Unlock()
	cached, err := a.cache.lookup(key)
	if err != nil {
		return "", err
	}
	if d, ok := ref.(name.Digest); ok {
		// A digest runs as itself, unless a test made this node report
		// another one on purpose (SetNodeImageCache).
		if cached != "" {
			return imageID(ref, cached), nil
		}
		return imageID(ref, d.DigestStr()), nil
	}
	policy := c.ImagePullPolicy
	if cached != "" && policy != corev1.PullAlways {
		return imageID(ref, cached), nil
	}
	if policy == corev1.PullNever {
		return "", fmt.Errorf("%s is not on the node and imagePullPolicy is Never", c.Image)
	}
	if !onLoopback(ref) {
		return "", fmt.Errorf("%s is not on the node and its registry is not on loopback (the harness pulls from loopback registries only)", c.Image)
	}
	pullCtx, cancel := context.WithTimeout(ctx, pullTimeout)
	defer cancel()
	desc, err := remote.Get(ref, remote.WithContext(pullCtx), remote.WithAuthFromKeychain(keychain()), remote.WithTransport(a.transport))
	if err != nil {
		return "", fmt.Errorf("pull %s: %w", c.Image, err)
	}
	digest := desc.Digest.String()
	if err := a.cache.update(func(m map[string]string) { m[key] = digest }); err != nil {
		return "", err
	}
	a.logf("pulled %s: %s", c.Image, digest)
	return imageID(ref, digest), nil
}

// keychain is the pod's pull credentials, as a kubelet finds them: its
// imagePullSecrets and its ServiceAccount's (kubernetes.io/dockerconfigjson
// or dockercfg Secrets); anonymous when there are none.
func (a *nodeAgent) keychain(ctx context.Context, pod *corev1.Pod) authn.Keychain {
	var secrets []string
	for _, s := range pod.Spec.ImagePullSecrets {
		secrets = append(secrets, s.Name)
	}
	kc, err := kauth.New(ctx, a.client, kauth.Options{Namespace: pod.Namespace, ServiceAccountName: pod.Spec.ServiceAccountName, ImagePullSecrets: secrets})
	if err != nil {
		a.logf("pod %s/%s: pull credentials: %v (pulling anonymously)", pod.Namespace, pod.Name, err)
		return authn.NewMultiKeychain() // anonymous
	}
	return kc
}

func (a *nodeAgent) logf(format string, args ...any) {
	fmt.Fprintf(a.log, "%s %s\n", time.Now().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
}
