package realnode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/image-refresh/image-refresh/test/support/localcluster"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// repoRoot is the module root, three levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// product is the image `make image` builds, pushed once per test binary to
// a registry of its own that the real node reaches.
var product struct {
	once sync.Once
	reg  *testregistry.Server
	// repository is the image's repository as the node names it, digest
	// its digest.
	repository, digest string
	err                error
}

// productImage builds and pushes the product exactly as `make image` does
// (hack/image/build.sh: the base with the CA roots, then ko) and returns
// repository and digest as the chart's values take them.
func productImage(t *testing.T, c *localcluster.Cluster) (repository, digest string) {
	t.Helper()
	product.once.Do(func() {
		reg := testregistry.New()
		if err := reg.Start("127.0.0.1:0"); err != nil {
			product.err = err
			return
		}
		product.reg = reg
		host, err := exposeHost(c, reg.Host())
		if err != nil {
			product.err = err
			return
		}
		root := repoRoot(t)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		// REGISTRY as cluster-up prints it with a real node: the forward.
		cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "image", "build.sh"))
		cmd.Dir = root
		cmd.Env = append(cleanEnv(), "REGISTRY="+host, "VERSION=0.0.0-realnode")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		if err := cmd.Run(); err != nil {
			product.err = fmt.Errorf("hack/image/build.sh: %v\n%s", err, &stderr)
			return
		}
		ref := strings.TrimSpace(stdout.String())
		dref, err := name.NewDigest(ref, name.Insecure)
		if err != nil {
			product.err = fmt.Errorf("build.sh printed %q, want a digest reference: %v", ref, err)
			return
		}
		product.repository, product.digest = dref.Context().Name(), dref.DigestStr()
		fmt.Fprintf(os.Stderr, "realnode: make image: %s in %s\n", ref, time.Since(start).Round(100*time.Millisecond))
	})
	if product.err != nil {
		t.Fatal(product.err)
	}
	return product.repository, product.digest
}

// cleanEnv is this process's environment without what a developer may
// have set for `make image` (KO_*, REGISTRY, TAG, VERSION).
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "KO_") || k == "REGISTRY" || k == "TAG" || k == "VERSION" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func exposeHost(c *localcluster.Cluster, loopback string) (string, error) {
	_, portText, _ := strings.Cut(loopback, ":")
	port, err := strconv.Atoi(portText)
	if err != nil {
		return "", fmt.Errorf("registry host %s: %v", loopback, err)
	}
	return c.Expose(port)
}

// helm runs the cluster's Helm (v4, or helm3) against the cluster.
func (w *world) helm(bin string, args ...string) string {
	w.t.Helper()
	cmd := exec.Command(filepath.Join(w.c.BinDir, bin), append(args, "--kubeconfig", w.c.Kubeconfig)...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(w.c.RunDir, "helm", "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(w.c.RunDir, "helm", "config"), "HELM_DATA_HOME="+filepath.Join(w.c.RunDir, "helm", "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		w.t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// valuesFile writes values as a Helm values file.
func (w *world) valuesFile(values map[string]any) string {
	w.t.Helper()
	b, err := json.Marshal(values)
	if err != nil {
		w.t.Fatal(err)
	}
	path := filepath.Join(w.t.TempDir(), "values.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		w.t.Fatal(err)
	}
	return path
}

// productValues are the chart's defaults plus what the README says to set
// (the image) and what this cluster needs: the registry (plain HTTP) and
// the real node (its nodeSelector and taint).
func (w *world) productValues(repository, digest string, extra map[string]any) map[string]any {
	v := map[string]any{
		"image": map[string]any{"repository": repository, "digest": digest},
		"config": map[string]any{
			"registries": []any{
				map[string]any{"host": w.host, "insecure": true},
				map[string]any{"host": strings.SplitN(repository, "/", 2)[0], "insecure": true},
			},
		},
		"nodeSelector": map[string]any{localcluster.RuntimeLabel: "containerd"},
		"tolerations":  []any{map[string]any{"key": localcluster.RuntimeLabel, "operator": "Exists", "effect": "NoSchedule"}},
	}
	for k, val := range extra {
		v[k] = val
	}
	return v
}

// installProduct installs the chart as release ir in a namespace of its
// own, as the README says, and uninstalls it when the test ends.
func (w *world) installProduct(extra map[string]any) (releaseNS string) {
	w.t.Helper()
	releaseNS = testenv.Namespace(w.t, w.c.Client)
	w.installProductIn(releaseNS, extra)
	return releaseNS
}

// installProductIn is installProduct into an existing namespace.
func (w *world) installProductIn(releaseNS string, extra map[string]any) {
	w.t.Helper()
	repository, digest := productImage(w.t, w.c)
	out := w.helm("helm", "install", "ir", filepath.Join(repoRoot(w.t), "charts", "image-refresh"), "-n", releaseNS,
		"-f", w.valuesFile(w.productValues(repository, digest, extra)), "--wait", "--timeout", "4m")
	w.t.Logf("helm install:\n%s", out)
	w.t.Cleanup(func() {
		// The release's running pods are gone before the next test starts, so no
		// controller of this test (its discovery is cluster-wide, as the
		// chart's default) acts on the next test's workloads. The test
		// waits for that itself, on a watch of the pods: Helm 4's
		// `uninstall --wait` can give up at once, reporting a resource
		// that is still Terminating under the foreground cascade (CI saw
		// it so with the ServiceAccount) as an error.
		cmd := exec.Command(filepath.Join(w.c.BinDir, "helm"), "uninstall", "ir", "-n", releaseNS, "--cascade", "foreground", "--kubeconfig", w.c.Kubeconfig)
		if out, err := cmd.CombinedOutput(); err != nil {
			w.t.Errorf("helm uninstall ir: %v\n%s", err, out)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		pods, sel := w.c.Client.CoreV1().Pods(releaseNS), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=ir"}
		var left []string
		err := testenv.UntilWatched(ctx, func(ctx context.Context) (watch.Interface, error) {
			return pods.Watch(ctx, sel)
		}, func(ctx context.Context) (bool, error) {
			list, err := pods.List(ctx, sel)
			if err != nil {
				return false, err
			}
			left = left[:0]
			for _, p := range list.Items {
				// A tick Job's pod that ran to its end acts on nothing
				// (and the test's own Jobs are not the release's to delete).
				if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
					left = append(left, p.Name)
				}
			}
			return len(left) == 0, nil
		})
		if err != nil {
			w.t.Errorf("helm uninstall ir: the release's pods %v are still there: %v", left, err)
		}
	})
}

// productPods are the release's controller pods.
func (w *world) productPods(releaseNS string) []corev1.Pod {
	w.t.Helper()
	list, err := w.c.Client.CoreV1().Pods(releaseNS).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=ir"})
	if err != nil {
		w.t.Fatal(err)
	}
	return list.Items
}

// installApp installs the test application chart (Deployment api, adopted
// by its label) as release app in w.ns with image, using Helm bin.
func (w *world) installApp(bin, image string) {
	w.t.Helper()
	w.helm(bin, "install", "app", filepath.Join("testdata", "app"), "-n", w.ns, "--set", "image="+image)
}

// deployment reads Deployment name of w.ns.
func (w *world) deployment(name string) *appsv1.Deployment {
	w.t.Helper()
	d, err := w.c.Client.AppsV1().Deployments(w.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	return d
}

// waitImage waits until Deployment name's container asks for want.
func (w *world) waitImage(name, want string, timeout time.Duration) *appsv1.Deployment {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var got string
	var found *appsv1.Deployment
	err := until(ctx, byName(w.c.Client.AppsV1().RESTClient(), "deployments", w.ns, name), &appsv1.Deployment{}, func(o runtime.Object) (bool, error) {
		d := o.(*appsv1.Deployment)
		if got = d.Spec.Template.Spec.Containers[0].Image; got == want {
			found = d
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		w.t.Fatalf("Deployment %s/%s asks for %s, want %s: %v", w.ns, name, got, want, err)
	}
	return found
}

// TestProduct_S1_TheChartsPodDiscoversPinsAndHealsAHelmUpgrade installs the
// product as it ships — the image `make image` builds, the chart with its
// defaults — on the real node: the controller pods start, are Ready by
// their own probes, run under the chart's ServiceAccount with in-cluster
// configuration, discover a labelled workload and pin it, and re-pin it
// after a `helm upgrade` re-renders the bare tag.
func TestProduct_S1_TheChartsPodDiscoversPinsAndHealsAHelmUpgrade(t *testing.T) {
	w := newWorld(t)
	releaseNS := w.installProduct(nil)
	pods := w.productPods(releaseNS)
	if len(pods) != 1 {
		t.Fatalf("release ir runs %d pods, want the chart's default 1 (no leader election)", len(pods))
	}
	for _, p := range pods {
		if p.Spec.NodeName != w.c.RealNodeName() {
			t.Errorf("pod %s on node %s, want the real node", p.Name, p.Spec.NodeName)
		}
		if p.Spec.ServiceAccountName != "ir-image-refresh" {
			t.Errorf("pod %s runs as ServiceAccount %q, want the chart's ir-image-refresh", p.Name, p.Spec.ServiceAccountName)
		}
		for _, c := range p.Spec.Containers {
			for _, a := range c.Args {
				if strings.Contains(a, "kubeconfig") {
					t.Errorf("pod %s is given a kubeconfig (%s): it must use in-cluster configuration", p.Name, a)
				}
			}
		}
		ready := false
		for _, c := range p.Status.Conditions {
			ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
		}
		if !ready || len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].RestartCount != 0 {
			t.Errorf("pod %s: Ready %v, statuses %+v; want Ready by its probes, never restarted", p.Name, ready, p.Status.ContainerStatuses)
		}
	}

	a := w.pushBuild("acme/api", "prod", "A")
	tag := w.host + "/acme/api:prod"
	w.installApp("helm3", tag)
	pinned := w.waitImage("api", tag+"@"+a, 3*time.Minute)
	pod := w.readyPod("api")
	if got := w.logs(pod); !strings.Contains(got, "serving build A") {
		t.Errorf("the pinned pod says %q, want build A", got)
	}

	// helm upgrade re-renders the bare tag (Helm 3's three-way merge puts
	// the chart's image back); the controller pod pins it again.
	w.helm("helm3", "upgrade", "app", filepath.Join("testdata", "app"), "-n", w.ns, "--reuse-values", "--set", "revision=2")
	healed := w.waitImage("api", tag+"@"+a, 2*time.Minute)
	if healed.Spec.Template.Annotations["revision"] != "2" {
		t.Errorf("the healed template has revision %q, want 2 (the upgrade's)", healed.Spec.Template.Annotations["revision"])
	}
	if healed.Generation < pinned.Generation+2 {
		t.Errorf("generation %d after the upgrade, was %d when pinned: the upgrade's bare tag and the re-pin should be two writes", healed.Generation, pinned.Generation)
	}
	var logs strings.Builder
	for _, p := range w.productPods(releaseNS) {
		logs.WriteString(w.logs(&p))
	}
	if !strings.Contains(logs.String(), "re-pinned") {
		t.Errorf("no controller pod logged the re-pin:\n%s", logs.String())
	}
}
