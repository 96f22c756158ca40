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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/localcluster"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// world is what every measurement runs against: a local cluster (three
// kwok nodes) and a registry on loopback, both owned by this process.
type world struct {
	cluster *localcluster.Cluster
	kube    kubernetes.Interface // the bench's own client (not counted)
	reg     *testregistry.Server
	runDir  string
	log     io.Writer // controller logs (a file in runDir)
	fleet   *fleet    // set up by the first measurement that needs it
}

// startWorld starts the cluster and the registry; stop undoes both.
func startWorld(ctx context.Context, binDir, runDir string) (*world, error) {
	start := time.Now()
	c, err := localcluster.Start(ctx, localcluster.Options{BinDir: binDir, RunDir: runDir, Log: os.Stderr})
	if err != nil {
		return nil, fmt.Errorf("start the local cluster: %w", err)
	}
	w := &world{cluster: c, kube: c.Client, runDir: runDir}
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
				if _, err := w.kube.AppsV1().Deployments(d.Namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
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
	if total > 2000 {
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
