package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/localcluster"
)

// Namespace creates a fresh namespace named after the test and deletes it
// when the test ends.
func Namespace(t testing.TB, client kubernetes.Interface) string {
	t.Helper()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	prefix := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(prefix) > 40 {
		prefix = prefix[:40]
	}
	name := strings.Trim(prefix, "-") + "-" + hex.EncodeToString(b)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// Spec describes a test workload; Option functions fill it.
type Spec struct {
	Replicas   int32
	Containers []corev1.Container
	// InitContainers run before Containers (K1); ImageVolumes are image
	// volumes: name → reference.
	InitContainers []corev1.Container
	ImageVolumes   []corev1.Volume
	Recreate       bool
	TolerateAll    bool
	PullSecrets    []string
	Annotations    map[string]string
	NodeSelector   map[string]string
	Tolerations    []corev1.Toleration
	// ReadinessGates are pod condition types the pods must also report
	// True to be Ready; MinReadySeconds is how long a pod must have been
	// Ready to count as available (Deployment).
	ReadinessGates  []string
	MinReadySeconds int32
}

// Option changes a Spec.
type Option func(*Spec)

// WithContainer adds a container running image with IfNotPresent, the
// pull policy of the seed's fleet.
func WithContainer(name, image string) Option {
	return func(s *Spec) {
		s.Containers = append(s.Containers, corev1.Container{Name: name, Image: image, ImagePullPolicy: corev1.PullIfNotPresent})
	}
}

// OnRealNode puts the pods on the cluster's real node (kubelet and
// containerd, localcluster.Options.RealNodes): its label as the
// nodeSelector, its taint tolerated.
func OnRealNode() Option {
	return func(s *Spec) {
		s.NodeSelector = map[string]string{localcluster.RuntimeLabel: "containerd"}
		s.Tolerations = []corev1.Toleration{{Key: localcluster.RuntimeLabel, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	}
}

// WithInitContainer adds an init container running image (IfNotPresent),
// as a chart's migration step does (K1).
func WithInitContainer(name, image string) Option {
	return func(s *Spec) {
		s.InitContainers = append(s.InitContainers, corev1.Container{Name: name, Image: image, ImagePullPolicy: corev1.PullIfNotPresent})
	}
}

// WithSidecar adds a native sidecar: an init container with restartPolicy
// Always, which runs beside the containers (K1).
func WithSidecar(name, image string) Option {
	return func(s *Spec) {
		always := corev1.ContainerRestartPolicyAlways
		s.InitContainers = append(s.InitContainers, corev1.Container{Name: name, Image: image, ImagePullPolicy: corev1.PullIfNotPresent, RestartPolicy: &always})
	}
}

// WithImageVolume adds an image volume (an OCI image mounted as a volume,
// K1) of reference, mounted read-only at /mnt/NAME in the first container.
func WithImageVolume(name, reference string) Option {
	return func(s *Spec) {
		s.ImageVolumes = append(s.ImageVolumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			Image: &corev1.ImageVolumeSource{Reference: reference, PullPolicy: corev1.PullIfNotPresent}}})
	}
}

// WithReplicas sets the replica count (Deployment, StatefulSet).
func WithReplicas(n int32) Option { return func(s *Spec) { s.Replicas = n } }

// WithRecreate uses the Recreate strategy (Deployment).
func WithRecreate() Option { return func(s *Spec) { s.Recreate = true } }

// WithTolerateAll tolerates every taint, as the seed's DaemonSet does, so a
// NotReady node stays in desiredNumberScheduled.
func WithTolerateAll() Option { return func(s *Spec) { s.TolerateAll = true } }

// WithAnnotations sets the workload's own annotations.
func WithAnnotations(a map[string]string) Option { return func(s *Spec) { s.Annotations = a } }

// WithReadinessGate adds a readinessGate on a pod condition of type
// conditionType, as a load balancer controller asks for. Note that kwok's
// pod-ready stage reports every gate True when it starts a pod, like a
// kubelet whose gates all pass at once; a test that wants the gate to fail
// sets the condition False itself, as the gate's owner would.
func WithReadinessGate(conditionType string) Option {
	return func(s *Spec) { s.ReadinessGates = append(s.ReadinessGates, conditionType) }
}

// WithMinReadySeconds sets minReadySeconds (Deployment): a pod counts as
// available only after it has been Ready that long, so a pod that turns
// unready within it never made the rollout progress.
func WithMinReadySeconds(n int32) Option { return func(s *Spec) { s.MinReadySeconds = n } }

// WithPullSecrets sets the pod template's imagePullSecrets.
func WithPullSecrets(names ...string) Option { return func(s *Spec) { s.PullSecrets = names } }

func build(name string, opts []Option) (Spec, metav1.ObjectMeta, *metav1.LabelSelector, corev1.PodTemplateSpec) {
	s := Spec{Replicas: 2}
	for _, o := range opts {
		o(&s)
	}
	if len(s.Containers) == 0 {
		s.Containers = []corev1.Container{{Name: "app", Image: "example.invalid/app:v1", ImagePullPolicy: corev1.PullIfNotPresent}}
	}
	labels := map[string]string{"app": name}
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec:       corev1.PodSpec{Containers: s.Containers, InitContainers: s.InitContainers, Volumes: s.ImageVolumes, TerminationGracePeriodSeconds: new(int64)},
	}
	for _, v := range s.ImageVolumes {
		c := &tmpl.Spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: v.Name, MountPath: "/mnt/" + v.Name, ReadOnly: true})
	}
	for _, ps := range s.PullSecrets {
		tmpl.Spec.ImagePullSecrets = append(tmpl.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: ps})
	}
	for _, g := range s.ReadinessGates {
		tmpl.Spec.ReadinessGates = append(tmpl.Spec.ReadinessGates, corev1.PodReadinessGate{ConditionType: corev1.PodConditionType(g)})
	}
	if s.TolerateAll {
		tmpl.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	}
	if len(s.NodeSelector) > 0 {
		tmpl.Spec.NodeSelector = s.NodeSelector
		tmpl.Spec.Tolerations = append(tmpl.Spec.Tolerations, s.Tolerations...)
	}
	return s, metav1.ObjectMeta{Name: name, Annotations: s.Annotations, Labels: labels}, &metav1.LabelSelector{MatchLabels: labels}, tmpl
}

// Deployment creates a Deployment and returns it.
func Deployment(t testing.TB, client kubernetes.Interface, ns, name string, opts ...Option) *appsv1.Deployment {
	t.Helper()
	s, meta, sel, tmpl := build(name, opts)
	meta.Namespace = ns
	d := &appsv1.Deployment{ObjectMeta: meta, Spec: appsv1.DeploymentSpec{Replicas: &s.Replicas, Selector: sel, Template: tmpl, MinReadySeconds: s.MinReadySeconds}}
	if s.Recreate {
		d.Spec.Strategy.Type = appsv1.RecreateDeploymentStrategyType
	}
	return created(t, "Deployment", ns, name, client.AppsV1().Deployments(ns).Create, d)
}

// DaemonSet creates a DaemonSet and returns it.
func DaemonSet(t testing.TB, client kubernetes.Interface, ns, name string, opts ...Option) *appsv1.DaemonSet {
	t.Helper()
	_, meta, sel, tmpl := build(name, opts)
	meta.Namespace = ns
	ds := &appsv1.DaemonSet{ObjectMeta: meta, Spec: appsv1.DaemonSetSpec{Selector: sel, Template: tmpl}}
	return created(t, "DaemonSet", ns, name, client.AppsV1().DaemonSets(ns).Create, ds)
}

// StatefulSet creates a StatefulSet and returns it.
func StatefulSet(t testing.TB, client kubernetes.Interface, ns, name string, opts ...Option) *appsv1.StatefulSet {
	t.Helper()
	s, meta, sel, tmpl := build(name, opts)
	meta.Namespace = ns
	st := &appsv1.StatefulSet{ObjectMeta: meta, Spec: appsv1.StatefulSetSpec{
		Replicas: &s.Replicas, Selector: sel, Template: tmpl, ServiceName: name,
		PodManagementPolicy: appsv1.ParallelPodManagement,
	}}
	return created(t, "StatefulSet", ns, name, client.AppsV1().StatefulSets(ns).Create, st)
}

// CronJob creates a CronJob whose schedule does not come round during a
// test (once a year) and returns it: a CronJob has no rollout, its next Job
// runs the template as stored.
func CronJob(t testing.TB, client kubernetes.Interface, ns, name string, opts ...Option) *batchv1.CronJob {
	t.Helper()
	_, meta, _, tmpl := build(name, opts)
	meta.Namespace = ns
	tmpl.Spec.RestartPolicy = corev1.RestartPolicyNever
	cj := &batchv1.CronJob{ObjectMeta: meta, Spec: batchv1.CronJobSpec{
		Schedule:    "0 0 1 1 *",
		JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: tmpl}},
	}}
	return created(t, "CronJob", ns, name, client.BatchV1().CronJobs(ns).Create, cj)
}

// Settled reads a workload and reports whether its rollout finished, using
// the product's own definition (internal/workload).
func Settled(ctx context.Context, client kubernetes.Interface, kind, ns, name string) (workload.Settledness, error) {
	obj, err := workload.New(client, 0).Get(ctx, config.Workload{Kind: kind, Namespace: ns, Name: name})
	if err != nil {
		return workload.Settledness{}, err
	}
	return obj.Settled, nil
}

// WaitSettled waits until the workload's rollout finished or timeout; it
// returns the last reason when it did not. It checks on each change a
// watch of the workload delivers (its settledness is its own status), not
// on a timer.
func WaitSettled(ctx context.Context, client kubernetes.Interface, kind, ns, name string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	open, err := WatchWorkload(client, kind, ns, name)
	if err != nil {
		return err
	}
	var s workload.Settledness
	err = UntilWatched(ctx, open, func(ctx context.Context) (bool, error) {
		var err error
		s, err = Settled(ctx, client, kind, ns, name)
		return err == nil && s.Settled, err
	})
	if err != nil {
		return fmt.Errorf("%s %s/%s did not settle in %s: %s: %w", kind, ns, name, timeout, s.Reason, err)
	}
	return nil
}

// created creates obj, workload kind ns/name, with create and returns what
// the API server stored; the test fails naming the workload if it cannot.
func created[T any](t testing.TB, kind, ns, name string, create func(context.Context, T, metav1.CreateOptions) (T, error), obj T) T {
	t.Helper()
	out, err := create(context.Background(), obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create %s %s/%s: %v", kind, ns, name, err)
	}
	return out
}
