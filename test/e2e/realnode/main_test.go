// Package realnode holds the end-to-end tests that need a real node: a
// kubelet with containerd and runc (localcluster.Options.RealNodes), on
// which containers really run. They show what the kwok nodes can only
// play: what a node's image cache makes a container run (N1), and the
// product running as it ships, as a pod installed by its chart (S1).
// docs/local-cluster.md.
package realnode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/image-refresh/image-refresh/internal/cli"
	"github.com/image-refresh/image-refresh/test/support/localcluster"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

func TestMain(m *testing.M) {
	os.Exit(testenv.MainWith(m, localcluster.Options{Nodes: []string{"node-1"}, RealNodes: 1}))
}

// world is one test's: a namespace, a loopback registry exposed to the real
// node (host is the name the node, its pods and the host all use), and the
// cluster.
type world struct {
	t    *testing.T
	c    *localcluster.Cluster
	reg  *testregistry.Server
	host string // the registry as the real node reaches it: 198.18.N.2:PORT
	ns   string
}

func newWorld(t *testing.T) *world {
	c := testenv.Cluster(t)
	reg := testregistry.Start(t)
	_, portText, _ := strings.Cut(reg.Host(), ":")
	port, err := strconv.Atoi(portText)
	if err != nil {
		t.Fatalf("registry host %s: %v", reg.Host(), err)
	}
	host, err := c.Expose(port)
	if err != nil {
		t.Fatal(err)
	}
	return &world{t: t, c: c, reg: reg, host: host, ns: testenv.Namespace(t, c.Client)}
}

// pushBuild pushes nodeapp for build to repo:tag and returns its digest.
func (w *world) pushBuild(repo, tag, build string) string {
	w.t.Helper()
	img, err := localcluster.AppImage(w.c.BinDir, build)
	return w.push(repo, tag, build, img, err)
}

// push pushes img (made with err) for build to repo:tag and returns its
// digest.
func (w *world) push(repo, tag, build string, img v1.Image, err error) string {
	w.t.Helper()
	if err != nil {
		w.t.Fatal(err)
	}
	ref, err := name.NewTag(w.reg.Host()+"/"+repo+":"+tag, name.Insecure)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		w.t.Fatalf("push build %s to %s: %v", build, ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		w.t.Fatal(err)
	}
	return d.String()
}

// run runs an image-refresh command in-process: exit code, stdout, stderr.
func (w *world) run(args ...string) (int, string, string) {
	w.t.Helper()
	var out, errOut bytes.Buffer
	root := cli.NewRoot(&out, &errOut)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	if err != nil {
		fmt.Fprintln(&errOut, "image-refresh:", err)
	}
	return cli.ExitCode(err), out.String(), errOut.String()
}

// tick runs `tick` on cfg without discovery and logs what it said; the
// test fails unless it exits 0 (what names the tick). It returns the logs.
func (w *world) tick(cfg, what string) string {
	w.t.Helper()
	code, _, logs := w.run("tick", "--config", cfg, "--kubeconfig", w.c.Kubeconfig, "--discovery=false")
	w.t.Logf("%s exit %d:\n%s", what, code, logs)
	if code != 0 {
		w.t.Fatalf("%s exit %d", what, code)
	}
	return logs
}

// statusRow runs `status -o json` on cfg without discovery and returns the
// row whose target ends in target (nil when there is none).
func (w *world) statusRow(cfg, target string) map[string]any {
	w.t.Helper()
	_, out, errOut := w.run("status", "--config", cfg, "--kubeconfig", w.c.Kubeconfig, "--discovery=false", "-o", "json")
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		w.t.Fatalf("status -o json: %v\n%s\n%s", err, out, errOut)
	}
	var row map[string]any
	for _, r := range rows {
		if t, _ := r["target"].(string); strings.HasSuffix(t, target) {
			row = r
		}
	}
	return row
}

// config writes a config file of the registry's header and body, with
// {{ns}} and {{reg}} (the registry as the node names it) replaced.
func (w *world) config(body string) string {
	w.t.Helper()
	text := fmt.Sprintf("annotationPrefix: image-refresh.io\nrolloutTimeout: 120s\nregistryTimeout: 5s\nregistries:\n  - host: %s\n    insecure: true\n", w.host) +
		strings.NewReplacer("{{ns}}", w.ns, "{{reg}}", w.host).Replace(body)
	path := filepath.Join(w.t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		w.t.Fatal(err)
	}
	return path
}

// readyPod waits until the Deployment's pods are exactly one Ready pod of
// its current template, other than the pods named in not, and returns it.
func (w *world) readyPod(deploy string, not ...string) *corev1.Pod {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := testenv.WaitSettled(ctx, w.c.Client, "Deployment", w.ns, deploy, 3*time.Minute); err != nil {
		w.t.Fatalf("Deployment %s/%s: %v", w.ns, deploy, err)
	}
	// Each change of the Deployment's pods is the signal to look at the
	// whole set again.
	var last string
	var found *corev1.Pod
	lw := cache.NewFilteredListWatchFromClient(w.c.Client.CoreV1().RESTClient(), "pods", w.ns, func(o *metav1.ListOptions) { o.LabelSelector = "app=" + deploy })
	err := until(ctx, lw, &corev1.Pod{}, func(runtime.Object) (bool, error) {
		list, err := w.c.Client.CoreV1().Pods(w.ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + deploy})
		if err != nil {
			return false, err
		}
		var ready []*corev1.Pod
		for i := range list.Items {
			p := &list.Items[i]
			if p.DeletionTimestamp != nil || contains(not, p.Name) {
				continue
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready = append(ready, p)
				}
			}
		}
		if len(ready) == 1 && len(list.Items) == 1+countNamed(list.Items, not) {
			found = ready[0]
			return true, nil
		}
		last = fmt.Sprintf("%d pods, %d Ready and new", len(list.Items), len(ready))
		return false, nil
	})
	if err != nil {
		w.t.Fatalf("Deployment %s/%s: no single new Ready pod: %s (%v)", w.ns, deploy, last, err)
	}
	return found
}

// until watches what lw lists, from its current state, until cond is true
// for an event (added, modified or the initial list), or ctx ends: a
// watch is the signal, never a sleep.
func until(ctx context.Context, lw cache.ListerWatcher, obj runtime.Object, cond func(runtime.Object) (bool, error)) error {
	_, err := watchtools.UntilWithSync(ctx, lw, obj, nil, func(ev watch.Event) (bool, error) {
		if ev.Type == watch.Deleted {
			return false, nil
		}
		return cond(ev.Object)
	})
	return err
}

// byName lists and watches the one object name of resource in ns.
func byName(c rest.Interface, resource, ns, name string) cache.ListerWatcher {
	return cache.NewListWatchFromClient(c, resource, ns, fields.OneTermEqualSelector("metadata.name", name))
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func countNamed(pods []corev1.Pod, names []string) int {
	n := 0
	for _, p := range pods {
		if contains(names, p.Name) {
			n++
		}
	}
	return n
}

// logs is the container's own output, read through the kubelet.
func (w *world) logs(p *corev1.Pod) string {
	w.t.Helper()
	b, err := w.c.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(context.Background())
	if err != nil {
		w.t.Fatalf("logs of pod %s: %v", p.Name, err)
	}
	return string(b)
}

// served is what the container answers on :8080, from the host's shell
// through the pod network.
func (w *world) served(p *corev1.Pod) string {
	w.t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + p.Status.PodIP + ":8080/")
	if err != nil {
		w.t.Fatalf("GET pod %s at %s: %v", p.Name, p.Status.PodIP, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b))
}

// imageID is what the node's runtime reports the container runs.
func imageID(p *corev1.Pod, container string) string {
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == container {
			return s.ImageID
		}
	}
	return ""
}

func deleteNow() metav1.DeleteOptions {
	grace := int64(0)
	return metav1.DeleteOptions{GracePeriodSeconds: &grace}
}
