// Package e2e is the harness of the end-to-end tests of the commands
// (test/e2e/...): an Env is one test's world, a namespace on the local
// cluster testenv starts per test binary, a registry of its own and config
// files, and runs tick, status, render and run in-process against them.
// A test package wraps it (type env struct{ *e2e.Env }) to add the helpers
// of its own area.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/internal/cli"
	"github.com/image-refresh/image-refresh/test/support/localcluster"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// Main is the TestMain of a package of end-to-end tests: one local cluster
// for the test binary (testenv.Main), and the image-refresh binary
// BuildImageRefresh built removed afterwards.
//
//	func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }
func Main(m *testing.M) int {
	code := testenv.Main(m)
	RemoveBuilt()
	return code
}

// Env is one test's world: a namespace on the shared cluster, its own
// registry on loopback, and a config file.
type Env struct {
	T          *testing.T
	C          *localcluster.Cluster
	Reg        *testregistry.Server
	NS         string
	Kubeconfig string
	Prefix     string
	// clock, when set, is the rollout policy's clock of every command
	// the env runs (cli.WithClock): a test moves it instead of sleeping.
	Clock *Clock
	// stuck names the Deployments the test made unable to settle
	// (wontSettle): tick does not wait for them.
	Stuck map[string]bool
	// WhRules are more rules of the webhook WhStartProbed installs (a
	// declared kind's resource, K2).
	WhRules []admissionregistrationv1.RuleWithOperations
}

// WontSettle tells the env that the test made these Deployments unable to
// settle (no node matches their pods, …), so that tick does not spend its
// 30 s wait on each of them; settle waits for them again.
func (e *Env) WontSettle(names ...string) {
	if e.Stuck == nil {
		e.Stuck = map[string]bool{}
	}
	for _, n := range names {
		e.Stuck[n] = true
	}
}

// Clock is a clock a test moves by hand.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock that says now until it is moved.
func NewClock(now time.Time) *Clock { return &Clock{now: now} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Add moves the clock by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// New is one test's env: a namespace of the cluster testenv.Main
// started, a registry of its own, and the default annotation prefix.
func New(t *testing.T) *Env {
	c := testenv.Cluster(t)
	return &Env{T: t, C: c, Reg: testregistry.Start(t), NS: testenv.Namespace(t, c.Client), Kubeconfig: c.Kubeconfig, Prefix: "image-refresh.io"}
}

// Repo is the registry repository of an image name in this env.
func (e *Env) Repo(name string) string { return e.Reg.Host() + "/acme/" + name }

// Push publishes new random content under repo:tag and returns its digest.
func (e *Env) Push(name, tag string) string {
	e.T.Helper()
	return e.Reg.MustPushRandomImage(e.T, "acme/"+name, tag)
}

// Config writes a config file; body is YAML after the common header, with
// {{ns}} and {{reg}} replaced.
func (e *Env) Config(body string) string {
	e.T.Helper()
	header := ""
	// Settings the body sets itself win over the defaults of the header.
	for _, kv := range [][2]string{{"annotationPrefix", e.Prefix}, {"rolloutTimeout", "60s"}, {"registryTimeout", "2s"}} {
		if !strings.HasPrefix(body, kv[0]+":") && !strings.Contains(body, "\n"+kv[0]+":") {
			header += kv[0] + ": " + kv[1] + "\n"
		}
	}
	header += fmt.Sprintf("registries:\n  - host: %s\n    insecure: true\n", e.Reg.Host())
	text := header + strings.NewReplacer("{{ns}}", e.NS, "{{reg}}", e.Reg.Host()).Replace(body)
	path := filepath.Join(e.T.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		e.T.Fatal(err)
	}
	return path
}

// Run runs an image-refresh command in-process and returns its exit code
// and output (stdout, then logs on stderr).
func (e *Env) Run(args ...string) (code int, stdout, stderr string) {
	e.T.Helper()
	var out, errOut bytes.Buffer
	var opts []cli.Option
	if e.Clock != nil {
		opts = append(opts, cli.WithClock(e.Clock.Now))
	}
	root := cli.NewRoot(&out, &errOut, opts...)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	if err != nil {
		fmt.Fprintln(&errOut, "image-refresh:", err)
	}
	return cli.ExitCode(err), out.String(), errOut.String()
}

// Render runs `image-refresh render` in-process with stdin and returns its
// exit code, stdout, stderr and how long it took.
func (e *Env) Render(stdin string, args ...string) (code int, stdout, stderr string, took time.Duration) {
	e.T.Helper()
	var out, errOut bytes.Buffer
	root := cli.NewRoot(&out, &errOut)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(append([]string{"render"}, args...))
	start := time.Now()
	err := root.ExecuteContext(context.Background())
	took = time.Since(start)
	if err != nil {
		errOut.WriteString("image-refresh: " + err.Error() + "\n")
	}
	return cli.ExitCode(err), out.String(), errOut.String(), took
}

// Tick runs `tick` with the env's kubeconfig, then waits until every
// Deployment of the namespace settled again: an annotation write bumps a
// Deployment's generation, and ticks here run back to back instead of
// minutes apart.
func (e *Env) Tick(cfg string, extra ...string) (int, string) {
	e.T.Helper()
	code, _, logs := e.Run(append([]string{"tick", "--config", cfg, "--kubeconfig", e.Kubeconfig}, extra...)...)
	e.T.Logf("tick exit %d:\n%s", code, logs)
	list, err := e.C.Client.AppsV1().Deployments(e.NS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	for _, d := range list.Items {
		if e.Stuck[d.Name] {
			continue
		}
		if d.Spec.Replicas == nil || *d.Spec.Replicas > 0 {
			_ = testenv.WaitSettled(context.Background(), e.C.Client, "Deployment", e.NS, d.Name, 30*time.Second)
		}
	}
	return code, logs
}

// Rollouts counts a Deployment's ReplicaSets: one per pod template it ran.
func (e *Env) Rollouts(deploy string) int {
	e.T.Helper()
	list, err := e.C.Client.AppsV1().ReplicaSets(e.NS).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + deploy})
	if err != nil {
		e.T.Fatal(err)
	}
	return len(list.Items)
}

// Deployment reads Deployment name of the env's namespace.
func (e *Env) Deployment(name string) *appsv1.Deployment {
	e.T.Helper()
	d, err := e.C.Client.AppsV1().Deployments(e.NS).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	return d
}

// DaemonSet reads DaemonSet name of the env's namespace.
func (e *Env) DaemonSet(name string) *appsv1.DaemonSet {
	e.T.Helper()
	d, err := e.C.Client.AppsV1().DaemonSets(e.NS).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	return d
}

// DaemonSetImage returns the live image of a DaemonSet's first container.
func (e *Env) DaemonSetImage(name string) string {
	e.T.Helper()
	return e.DaemonSet(name).Spec.Template.Spec.Containers[0].Image
}

// Image returns the live image of container in a Deployment.
func (e *Env) Image(deploy, container string) string {
	e.T.Helper()
	for _, c := range e.Deployment(deploy).Spec.Template.Spec.Containers {
		if c.Name == container {
			return c.Image
		}
	}
	e.T.Fatalf("Deployment %s has no container %s", deploy, container)
	return ""
}

// Annotations are the annotations of Deployment deploy.
func (e *Env) Annotations(deploy string) map[string]string {
	e.T.Helper()
	return e.Deployment(deploy).Annotations
}

// Annotate sets (or with value nil deletes) annotations on a Deployment.
func (e *Env) Annotate(deploy string, kv map[string]*string) {
	e.T.Helper()
	e.AnnotateAs("", deploy, kv)
}

// AnnotateAs sets (nil: deletes) annotations on a Deployment as field
// manager manager ("": the client's default), as `kubectl annotate`
// (kubectl-annotate) or a GitOps controller does.
func (e *Env) AnnotateAs(manager, deploy string, kv map[string]*string) {
	e.T.Helper()
	var parts []string
	for k, v := range kv {
		if v == nil {
			parts = append(parts, fmt.Sprintf("%q:null", k))
		} else {
			parts = append(parts, fmt.Sprintf("%q:%q", k, *v))
		}
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%s}}}`, strings.Join(parts, ","))
	if _, err := e.C.Client.AppsV1().Deployments(e.NS).Patch(context.Background(), deploy, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: manager}); err != nil {
		e.T.Fatal(err)
	}
}

// SetImageAs re-renders a container's image the way another writer does
// (e.g. field manager "helm"), and waits for the rollout.
func (e *Env) SetImageAs(manager, kind, name, container, image string) {
	e.T.Helper()
	e.WriteImageAs(manager, kind, name, container, image)
	e.Settle(kind, name)
}

// WriteImageAs writes a container's image as setImageAs does, without
// waiting for the rollout it starts.
func (e *Env) WriteImageAs(manager, kind, name, container, image string) {
	e.T.Helper()
	patch := []byte(fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":%q,"image":%q}]}}}}`, container, image))
	if kind == "CronJob" {
		patch = []byte(fmt.Sprintf(`{"spec":{"jobTemplate":{"spec":{"template":{"spec":{"containers":[{"name":%q,"image":%q}]}}}}}}`, container, image))
	}
	ctx := context.Background()
	opts := metav1.PatchOptions{FieldManager: manager}
	var err error
	switch kind {
	case "Deployment":
		_, err = e.C.Client.AppsV1().Deployments(e.NS).Patch(ctx, name, types.StrategicMergePatchType, patch, opts)
	case "DaemonSet":
		_, err = e.C.Client.AppsV1().DaemonSets(e.NS).Patch(ctx, name, types.StrategicMergePatchType, patch, opts)
	case "CronJob":
		_, err = e.C.Client.BatchV1().CronJobs(e.NS).Patch(ctx, name, types.StrategicMergePatchType, patch, opts)
	default:
		e.T.Fatalf("writeImageAs: kind %s", kind)
	}
	if err != nil {
		e.T.Fatal(err)
	}
}

// WriteInitImageAs writes an init container's image of a Deployment or
// DaemonSet as manager, as a helm upgrade re-rendering a migration step
// does (K1), without waiting for the rollout it starts.
func (e *Env) WriteInitImageAs(manager, kind, name, container, image string) {
	e.T.Helper()
	patch := []byte(fmt.Sprintf(`{"spec":{"template":{"spec":{"initContainers":[{"name":%q,"image":%q}]}}}}`, container, image))
	opts := metav1.PatchOptions{FieldManager: manager}
	var err error
	switch kind {
	case "Deployment":
		_, err = e.C.Client.AppsV1().Deployments(e.NS).Patch(context.Background(), name, types.StrategicMergePatchType, patch, opts)
	case "DaemonSet":
		_, err = e.C.Client.AppsV1().DaemonSets(e.NS).Patch(context.Background(), name, types.StrategicMergePatchType, patch, opts)
	default:
		e.T.Fatalf("WriteInitImageAs: kind %s", kind)
	}
	if err != nil {
		e.T.Fatal(err)
	}
}

// Settle waits until the workload's rollout is complete.
func (e *Env) Settle(kind, name string) {
	e.T.Helper()
	delete(e.Stuck, name)
	if err := testenv.WaitSettled(context.Background(), e.C.Client, kind, e.NS, name, 60*time.Second); err != nil {
		e.T.Fatal(err)
	}
}

// Events returns "reason: message" of every event on the named object.
func (e *Env) Events(name string) []string {
	e.T.Helper()
	return e.EventsWhere(func(ev corev1.Event) bool { return ev.InvolvedObject.Name == name })
}

// EventsWhere returns "reason: message" of every event of the namespace
// that match accepts.
func (e *Env) EventsWhere(match func(corev1.Event) bool) []string {
	e.T.Helper()
	list, err := e.C.Client.CoreV1().Events(e.NS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	var out []string
	for _, ev := range list.Items {
		if match(ev) {
			out = append(out, ev.Reason+": "+ev.Message)
		}
	}
	return out
}

// HasEvent says whether one of events (as Events returns them) has reason
// and contains substr.
func HasEvent(events []string, reason, substr string) bool {
	for _, ev := range events {
		if strings.HasPrefix(ev, reason+": ") && strings.Contains(ev, substr) {
			return true
		}
	}
	return false
}

// Key is the annotation key name under the env's prefix.
func (e *Env) Key(name string) string { return e.Prefix + "/" + name }

// Ptr is &s, for annotation patches (nil removes a key).
func Ptr(s string) *string { return &s }

var _ = corev1.PullIfNotPresent
