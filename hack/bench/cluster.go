package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/localcluster"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// world is what every measurement runs against: a local cluster (three
// kwok nodes) and a registry on loopback, both owned by this process.
type world struct {
	cluster *localcluster.Cluster
	kube    kubernetes.Interface // the bench's own client (not counted)
	bulk    kubernetes.Interface // the bench's client for creating many
	budget  string               // the cluster's budget, for the notes
	// writeStatus: the cluster has no deployment controller; the bench
	// writes the status of the zero-replica Deployments it creates and
	// reverts (writeZeroStatus).
	writeStatus  bool
	stopObserver context.CancelFunc
	reg          *testregistry.Server
	runDir       string
	log          io.Writer // controller logs (a file in runDir)
	fleet        *fleet    // set up by the first measurement that needs it
}

// startWorld starts the cluster and the registry; stop undoes both.
//
// With large, the cluster is sized for 100,000 zero-replica Deployments
// (largeCluster) and the bench creates them with a client of a larger
// budget; the controllers under test keep the client `run` builds.
func startWorld(ctx context.Context, binDir, runDir string, large bool) (*world, error) {
	start := time.Now()
	opts := localcluster.Options{BinDir: binDir, RunDir: runDir, Log: os.Stderr}
	budget := "kube-controller-manager --kube-api-qps=200 --kube-api-burst=400, the bench's client 200 QPS"
	if large {
		opts.ExtraArgs = largeCluster
		budget = "the large cluster (-large-cluster): kube-controller-manager " + strings.Join(largeCluster["kube-controller-manager"], " ") +
			", the bench writes each Deployment's zero-replica status itself; the bench's client 2000 QPS"
	}
	c, err := localcluster.Start(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("start the local cluster: %w", err)
	}
	w := &world{cluster: c, kube: c.Client, bulk: c.Client, runDir: runDir, budget: budget, writeStatus: large}
	if large {
		rc := rest.CopyConfig(c.Config)
		rc.QPS, rc.Burst = 2000, 4000
		if w.bulk, err = kubernetes.NewForConfig(rc); err != nil {
			_ = c.Stop()
			return nil, err
		}
		octx, cancel := context.WithCancel(context.Background())
		w.stopObserver = cancel
		if err := w.startObserver(octx); err != nil {
			w.stop()
			return nil, err
		}
	}
	w.reg = testregistry.New()
	if err := w.reg.Start("127.0.0.1:0"); err != nil {
		_ = c.Stop()
		return nil, err
	}
	f, err := os.Create(runDir + "/controller.log")
	if err != nil {
		w.stop()
		return nil, err
	}
	w.log = f
	progress("cluster and registry (%s) up in %s; controller logs: %s", w.reg.Host(), since(start), runDir+"/controller.log")
	return w, nil
}

func (w *world) stop() {
	if w.stopObserver != nil {
		w.stopObserver()
	}
	if w.reg != nil {
		_ = w.reg.Close()
	}
	if c, ok := w.log.(io.Closer); ok {
		_ = c.Close()
	}
	if err := w.cluster.Stop(); err != nil {
		progress("stop the cluster: %v", err)
	}
}

// largeCluster are the local cluster's flags for 100,000 zero-replica
// Deployments, beside its defaults: etcd's backend quota past its 2 GiB
// default, the apiserver's in-flight limits, and kube-controller-manager
// without its deployment controller: the bench writes each Deployment's
// status itself (writeZeroStatus), what the deployment controller writes
// for a zero-replica Deployment, in one request instead of its five (a
// ReplicaSet, an Event, status writes), which on two shared cores is what
// makes 100,000 take an hour. None of them is a flag of the controller
// under test, which watches Deployments only.
var largeCluster = map[string][]string{
	"etcd":                    {"--quota-backend-bytes=8589934592"},
	"kube-apiserver":          {"--max-requests-inflight=1600", "--max-mutating-requests-inflight=800"},
	"kube-controller-manager": {"--controllers=*,-deployment-controller", "--kube-api-qps=2000", "--kube-api-burst=4000"},
}

// repo is the full repository name of an image in the registry.
func (w *world) repo(name string) string { return w.reg.Host() + "/acme/" + name }

// push publishes a random image as name:prod and returns its digest.
func (w *world) push(name string) (string, error) {
	return w.reg.PushRandomImage("acme/"+name, "prod")
}

func (w *world) namespace(ctx context.Context, name string) error {
	_, err := w.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	return err
}

// deployment is a one-replica Deployment with one container "app".
func deployment(ns, name, image string) *appsv1.Deployment {
	return deploymentN(ns, name, image, 1)
}

// deploymentN is deployment with the given replicas.
func deploymentN(ns, name, image string, replicas int32) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers:                    []corev1.Container{{Name: "app", Image: image, ImagePullPolicy: corev1.PullIfNotPresent}},
					TerminationGracePeriodSeconds: new(int64),
				},
			},
		},
	}
}

// createDeployments creates the Deployments with a bounded worker pool.
func (w *world) createDeployments(ctx context.Context, ds []*appsv1.Deployment, workers int) error {
	jobs := make(chan *appsv1.Deployment)
	errs := make(chan error, len(ds))
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for d := range jobs {
				if w.writeStatus {
					d = d.DeepCopy()
					// The deployment controller's first write on a new
					// Deployment: its revision (the cache keeps it).
					metav1.SetMetaDataAnnotation(&d.ObjectMeta, "deployment.kubernetes.io/revision", "1")
				}
				if _, err := w.bulk.AppsV1().Deployments(d.Namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("create Deployment %s/%s: %w", d.Namespace, d.Name, err)
				}
			}
		})
	}
	for _, d := range ds {
		select {
		case jobs <- d:
		case <-ctx.Done():
		}
	}
	close(jobs)
	wg.Wait()
	close(errs)
	return <-errs // the first error, or nil
}

// startObserver stands in for the deployment controller on a cluster
// without one (largeCluster): it lists and then watches every Deployment
// (a stream, no cache, so the bench process's memory stays the
// controller's) and writes the zero-replica status of each whose
// generation is not yet observed: a new one, a revert, and the annotation
// writes of the controller under test, which bump a Deployment's
// generation too. 16 writes at a time; the watch never waits for them (a
// watch that falls behind is closed by the apiserver), and when it ends
// (closed, or its resourceVersion compacted) the loop lists again.
func (w *world) startObserver(ctx context.Context) error {
	deployments := w.bulk.AppsV1().Deployments("")
	if _, err := deployments.List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		return err
	}
	jobs := make(chan *appsv1.Deployment, 1<<18)
	for range 16 {
		go func() {
			for d := range jobs {
				err := w.writeZeroStatus(ctx, d)
				if apierrors.IsConflict(err) || apierrors.IsNotFound(err) { // written again since: its event follows
					continue
				}
				if err != nil && ctx.Err() == nil {
					progress("observer: %v", err)
				}
			}
		}()
	}
	unobserved := func(d *appsv1.Deployment) bool {
		return d.Status.ObservedGeneration < d.Generation && d.Spec.Replicas != nil && *d.Spec.Replicas == 0
	}
	send := func(d *appsv1.Deployment) bool {
		select {
		case jobs <- d:
			return true
		case <-ctx.Done():
			return false
		}
	}
	go func() {
		defer close(jobs)
		for ctx.Err() == nil {
			rv, cont := "", ""
			for {
				// From the apiserver's watch cache (resourceVersion 0):
				// a paged list from etcd of 100,000 takes minutes on
				// a loaded machine, and its resourceVersion is then
				// compacted before the watch starts.
				l, err := deployments.List(ctx, metav1.ListOptions{ResourceVersion: "0", Continue: cont})
				if err != nil {
					if ctx.Err() == nil {
						progress("observer: list: %v", err)
						time.Sleep(time.Second)
					}
					rv = ""
					break
				}
				for i := range l.Items {
					if unobserved(&l.Items[i]) && !send(&l.Items[i]) {
						return
					}
				}
				if rv, cont = l.ResourceVersion, l.Continue; cont == "" {
					break
				}
			}
			if rv == "" {
				continue
			}
			wi, err := deployments.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
			if err != nil {
				continue
			}
			for ev := range wi.ResultChan() {
				if d, ok := ev.Object.(*appsv1.Deployment); ok && ev.Type != watch.Deleted && unobserved(d) && !send(d) {
					wi.Stop()
					return
				}
			}
			wi.Stop()
		}
	}()
	return nil
}

// writeZeroStatus writes the status the deployment controller writes for
// a zero-replica Deployment it rolled out at d's generation: observed, no
// replicas, Available and Progressing (NewReplicaSetAvailable). Only on a
// cluster without that controller (largeCluster).
func (w *world) writeZeroStatus(ctx context.Context, d *appsv1.Deployment) error {
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 0 {
		return fmt.Errorf("Deployment %s/%s: the bench writes the status of zero-replica Deployments only", d.Namespace, d.Name)
	}
	now := metav1.Now()
	d = d.DeepCopy()
	d.Status = appsv1.DeploymentStatus{
		ObservedGeneration: d.Generation,
		Conditions: []appsv1.DeploymentCondition{
			{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue, LastUpdateTime: now, LastTransitionTime: now,
				Reason: "MinimumReplicasAvailable", Message: "Deployment has minimum availability."},
			{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, LastUpdateTime: now, LastTransitionTime: now,
				Reason: "NewReplicaSetAvailable", Message: fmt.Sprintf("ReplicaSet %q has successfully progressed.", d.Name+"-bench")},
		},
	}
	_, err := w.bulk.AppsV1().Deployments(d.Namespace).UpdateStatus(ctx, d, metav1.UpdateOptions{})
	return err
}

// waitSettled waits until every Deployment of the namespaces is settled
// (the product's own test, internal/workload) and, if want is not nil,
// runs an image that want accepts.
func (w *world) waitSettled(ctx context.Context, namespaces []string, want func(image string) bool, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		pending, total, why := 0, 0, ""
		for _, ns := range namespaces {
			list, err := w.kube.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
			if err != nil {
				pending, why = -1, err.Error()
				break
			}
			for i := range list.Items {
				d := &list.Items[i]
				total++
				if s := workload.DeploymentSettled(d); !s.Settled {
					pending++
					why = d.Name + ": " + s.Reason
				} else if want != nil && !want(d.Spec.Template.Spec.Containers[0].Image) {
					pending++
					why = d.Name + ": runs " + d.Spec.Template.Spec.Containers[0].Image
				}
			}
		}
		if pending == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d Deployments not settled after %s (e.g. %s)", pending, total, timeout, why)
		case <-time.After(pollEvery(total)):
		}
	}
}

// pollEvery spaces the bench's own lists of many Deployments, so that
// they do not load the cluster they measure.
func pollEvery(total int) time.Duration {
	switch {
	case total > 20000:
		return 15 * time.Second
	case total > 2000:
		return 5 * time.Second
	}
	return time.Second
}

// group describes one config group: its targets are Deployments of one
// namespace running one image; the first target is the anchor.
type group struct {
	name, ns, image string // image: the repository name under acme/
	targets         []string
	// promotion, if set, is the group's promotion: a YAML flow mapping
	// (P1, P2).
	promotion string
}

// configYAML renders an image-refresh config for the groups; extra is
// more top-level settings (YAML lines), or "".
func (w *world) configYAML(groups []group, extra string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "annotationPrefix: %s\nrolloutTimeout: 5m\nregistryTimeout: 5s\n%s", prefix, extra)
	fmt.Fprintf(&b, "registries:\n  - host: %s\n    insecure: true\ngroups:\n", w.reg.Host())
	for _, g := range groups {
		fmt.Fprintf(&b, "  - name: %s\n    anchor: {kind: Deployment, namespace: %s, name: %s}\n", g.name, g.ns, g.targets[0])
		if g.promotion != "" {
			fmt.Fprintf(&b, "    promotion: %s\n", g.promotion)
		}
		fmt.Fprintf(&b, "    images:\n      - name: %s\n        repository: %s\n        tag: prod\n        targets:\n", g.image, w.repo(g.image))
		for _, t := range g.targets {
			fmt.Fprintf(&b, "          - {kind: Deployment, namespace: %s, name: %s, container: app}\n", g.ns, t)
		}
	}
	return []byte(b.String())
}

const prefix = "image-refresh.io"

func names(pfx string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%04d", pfx, i)
	}
	return out
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[bench %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func since(t time.Time) time.Duration { return time.Since(t).Round(100 * time.Millisecond) }

// onDigest accepts an image pinned to digest.
func onDigest(digest string) func(string) bool {
	return func(image string) bool { return strings.HasSuffix(image, "@"+digest) }
}

// pinned accepts any image pinned to a digest.
func pinned(image string) bool { return strings.Contains(image, "@sha256:") }
