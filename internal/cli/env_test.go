package cli

import (
	"bytes"
	"context"
	"fmt"
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

	"github.com/image-refresh/image-refresh/internal/localcluster"
	"github.com/image-refresh/image-refresh/internal/testenv"
	"github.com/image-refresh/image-refresh/internal/testregistry"
)

func TestMain(m *testing.M) {
	code := testenv.Main(m)
	removeBuilt()
	os.Exit(code)
}

// env is one test's world: a namespace on the shared cluster, its own
// registry on loopback, and a config file.
type env struct {
	t          *testing.T
	c          *localcluster.Cluster
	reg        *testregistry.Server
	ns         string
	kubeconfig string
	prefix     string
	// clock, when set, is the rollout policy's clock of every command
	// the env runs (cli.WithClock): a test moves it instead of sleeping.
	clock *testClock
	// stuck names the Deployments the test made unable to settle
	// (wontSettle): tick does not wait for them.
	stuck map[string]bool
}

// wontSettle tells the env that the test made these Deployments unable to
// settle (no node matches their pods, …), so that tick does not spend its
// 30 s wait on each of them; settle waits for them again.
func (e *env) wontSettle(names ...string) {
	if e.stuck == nil {
		e.stuck = map[string]bool{}
	}
	for _, n := range names {
		e.stuck[n] = true
	}
}

// testClock is a clock a test moves by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newEnv(t *testing.T) *env {
	c := testenv.Cluster(t)
	return &env{t: t, c: c, reg: testregistry.Start(t), ns: testenv.Namespace(t, c.Client), kubeconfig: c.Kubeconfig, prefix: "image-refresh.io"}
}

// repo is the registry repository of an image name in this env.
func (e *env) repo(name string) string { return e.reg.Host() + "/acme/" + name }

// push publishes new random content under repo:tag and returns its digest.
func (e *env) push(name, tag string) string {
	e.t.Helper()
	return e.reg.MustPushRandomImage(e.t, "acme/"+name, tag)
}

// config writes a config file; body is YAML after the common header, with
// {{ns}} and {{reg}} replaced.
func (e *env) config(body string) string {
	e.t.Helper()
	header := ""
	// Settings the body sets itself win over the defaults of the header.
	for _, kv := range [][2]string{{"annotationPrefix", e.prefix}, {"rolloutTimeout", "60s"}, {"registryTimeout", "2s"}} {
		if !strings.HasPrefix(body, kv[0]+":") && !strings.Contains(body, "\n"+kv[0]+":") {
			header += kv[0] + ": " + kv[1] + "\n"
		}
	}
	header += fmt.Sprintf("registries:\n  - host: %s\n    insecure: true\n", e.reg.Host())
	text := header + strings.NewReplacer("{{ns}}", e.ns, "{{reg}}", e.reg.Host()).Replace(body)
	path := filepath.Join(e.t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return path
}

// run runs an image-refresh command in-process and returns its exit code
// and output (stdout, then logs on stderr).
func (e *env) run(args ...string) (code int, stdout, stderr string) {
	e.t.Helper()
	var out, errOut bytes.Buffer
	var opts []Option
	if e.clock != nil {
		opts = append(opts, WithClock(e.clock.Now))
	}
	root := NewRoot(&out, &errOut, opts...)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	if err != nil {
		fmt.Fprintln(&errOut, "image-refresh:", err)
	}
	return ExitCode(err), out.String(), errOut.String()
}

// tick runs `tick` with the env's kubeconfig, then waits until every
// Deployment of the namespace settled again: an annotation write bumps a
// Deployment's generation, and ticks here run back to back instead of
// minutes apart.
func (e *env) tick(cfg string, extra ...string) (int, string) {
	e.t.Helper()
	code, _, logs := e.run(append([]string{"tick", "--config", cfg, "--kubeconfig", e.kubeconfig}, extra...)...)
	e.t.Logf("tick exit %d:\n%s", code, logs)
	list, err := e.c.Client.AppsV1().Deployments(e.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, d := range list.Items {
		if e.stuck[d.Name] {
			continue
		}
		if d.Spec.Replicas == nil || *d.Spec.Replicas > 0 {
			_ = testenv.WaitSettled(context.Background(), e.c.Client, "Deployment", e.ns, d.Name, 30*time.Second)
		}
	}
	return code, logs
}

// rollouts counts a Deployment's ReplicaSets: one per pod template it ran.
func (e *env) rollouts(deploy string) int {
	e.t.Helper()
	list, err := e.c.Client.AppsV1().ReplicaSets(e.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + deploy})
	if err != nil {
		e.t.Fatal(err)
	}
	return len(list.Items)
}

func (e *env) deployment(name string) *appsv1.Deployment {
	e.t.Helper()
	d, err := e.c.Client.AppsV1().Deployments(e.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return d
}

func (e *env) daemonSet(name string) *appsv1.DaemonSet {
	e.t.Helper()
	d, err := e.c.Client.AppsV1().DaemonSets(e.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return d
}

// image returns the live image of container in a Deployment.
func (e *env) image(deploy, container string) string {
	e.t.Helper()
	for _, c := range e.deployment(deploy).Spec.Template.Spec.Containers {
		if c.Name == container {
			return c.Image
		}
	}
	e.t.Fatalf("Deployment %s has no container %s", deploy, container)
	return ""
}

func (e *env) annotations(deploy string) map[string]string {
	e.t.Helper()
	return e.deployment(deploy).Annotations
}

// annotate sets (or with value nil deletes) annotations on a Deployment.
func (e *env) annotate(deploy string, kv map[string]*string) {
	e.t.Helper()
	var parts []string
	for k, v := range kv {
		if v == nil {
			parts = append(parts, fmt.Sprintf("%q:null", k))
		} else {
			parts = append(parts, fmt.Sprintf("%q:%q", k, *v))
		}
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%s}}}`, strings.Join(parts, ","))
	if _, err := e.c.Client.AppsV1().Deployments(e.ns).Patch(context.Background(), deploy, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// setImageAs re-renders a container's image the way another writer does
// (e.g. field manager "helm"), and waits for the rollout.
func (e *env) setImageAs(manager, kind, name, container, image string) {
	e.t.Helper()
	e.writeImageAs(manager, kind, name, container, image)
	e.settle(kind, name)
}

// writeImageAs writes a container's image as setImageAs does, without
// waiting for the rollout it starts.
func (e *env) writeImageAs(manager, kind, name, container, image string) {
	e.t.Helper()
	patch := []byte(fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":%q,"image":%q}]}}}}`, container, image))
	if kind == "CronJob" {
		patch = []byte(fmt.Sprintf(`{"spec":{"jobTemplate":{"spec":{"template":{"spec":{"containers":[{"name":%q,"image":%q}]}}}}}}`, container, image))
	}
	ctx := context.Background()
	opts := metav1.PatchOptions{FieldManager: manager}
	var err error
	switch kind {
	case "Deployment":
		_, err = e.c.Client.AppsV1().Deployments(e.ns).Patch(ctx, name, types.StrategicMergePatchType, patch, opts)
	case "DaemonSet":
		_, err = e.c.Client.AppsV1().DaemonSets(e.ns).Patch(ctx, name, types.StrategicMergePatchType, patch, opts)
	case "CronJob":
		_, err = e.c.Client.BatchV1().CronJobs(e.ns).Patch(ctx, name, types.StrategicMergePatchType, patch, opts)
	default:
		e.t.Fatalf("writeImageAs: kind %s", kind)
	}
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) settle(kind, name string) {
	e.t.Helper()
	delete(e.stuck, name)
	if err := testenv.WaitSettled(context.Background(), e.c.Client, kind, e.ns, name, 60*time.Second); err != nil {
		e.t.Fatal(err)
	}
}

// events returns "reason: message" of every event on the named object.
func (e *env) events(name string) []string {
	e.t.Helper()
	return e.eventsWhere(func(ev corev1.Event) bool { return ev.InvolvedObject.Name == name })
}

// eventsWhere returns "reason: message" of every event of the namespace
// that match accepts.
func (e *env) eventsWhere(match func(corev1.Event) bool) []string {
	e.t.Helper()
	list, err := e.c.Client.CoreV1().Events(e.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, ev := range list.Items {
		if match(ev) {
			out = append(out, ev.Reason+": "+ev.Message)
		}
	}
	return out
}

func hasEvent(events []string, reason, substr string) bool {
	for _, ev := range events {
		if strings.HasPrefix(ev, reason+": ") && strings.Contains(ev, substr) {
			return true
		}
	}
	return false
}

func (e *env) key(name string) string { return e.prefix + "/" + name }

func ptr(s string) *string { return &s }

var _ = corev1.PullIfNotPresent
