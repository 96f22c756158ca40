package admission

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/image-refresh/image-refresh/internal/cli"
	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

// renderConfig is seedShape with a short apiTimeout, so that the
// unreachable-cluster cases finish quickly.
var renderConfig = "apiTimeout: 2s\n" + e2e.SeedShape

// pinnedSeedManifests is SeedManifests with exactly the two targets'
// image scalars pinned to digest.
func (e *env) pinnedSeedManifests(digest string) string {
	tag := e.Repo("api") + ":prod"
	out := e.SeedManifests()
	for _, r := range [][2]string{
		{"image: " + tag + "\n          imagePullPolicy", "image: " + tag + "@" + digest + "\n          imagePullPolicy"},
		{"image: '" + tag + "'", "image: '" + tag + "@" + digest + "'"},
	} {
		if strings.Count(out, r[0]) != 1 {
			e.T.Fatalf("SeedManifests holds %q %d times, want once", r[0], strings.Count(out, r[0]))
		}
		out = strings.Replace(out, r[0], r[1], 1)
	}
	return out
}

func TestRender_B2_PinsTargetsToTheAnchorsRecordAndKeepsEveryOtherByte(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	cfg := e.Config(renderConfig)
	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("tick exit %d", code)
	}
	if got := e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")]; got != digest {
		t.Fatalf("setup: the tick recorded %q, want %q", got, digest)
	}

	in := e.SeedManifests()
	code, out, logs, _ := e.Render(in, "--config", cfg, "--kubeconfig", e.Kubeconfig, "--namespace", e.NS)
	if code != 0 {
		t.Fatalf("render exit %d:\n%s", code, logs)
	}
	if want := e.pinnedSeedManifests(digest); out != want {
		t.Errorf("render output differs from the input with the two targets pinned:\n%s", lineDiff([]byte(want), []byte(out)))
	}
	if n := len(e2e.LogLines(logs, "INFO", "pinned to the recorded digest")); n != 2 {
		t.Errorf("%d pin log lines, want 2:\n%s", n, logs)
	}
	if strings.Contains(logs, "left") {
		t.Errorf("a note although every target has a record:\n%s", logs)
	}

	// R7: the pinned stream is already on the record: rendering it again
	// changes nothing.
	code, again, logs, _ := e.Render(out, "--config", cfg, "--kubeconfig", e.Kubeconfig, "--namespace", e.NS)
	if code != 0 || again != out {
		t.Errorf("rendering the pinned stream again: exit %d, changed=%v\n%s", code, again != out, logs)
	}
}

func TestRender_B2_R7_R3_RecordedDigestAndMirrorAreLeftAsRendered(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	cfg := e.Config(renderConfig)
	e.Tick(cfg)
	in := e.SeedManifests()
	in = strings.Replace(in, "image: "+e.Repo("api")+":prod\n", "image: mirror.local/acme/api:prod\n", 1)       // R3
	in = strings.Replace(in, "image: '"+e.Repo("api")+":prod'", "image: 'mirror.local/acme/api@"+digest+"'", 1) // R7
	code, out, logs, _ := e.Render(in, "--config", cfg, "--kubeconfig", e.Kubeconfig, "--namespace", e.NS)
	if code != 0 || out != in {
		t.Fatalf("exit %d, output changed=%v; want 0 and the input unchanged:\n%s", code, out != in, logs)
	}
	if len(e2e.LogLines(logs, "INFO", "mirror.local/acme/api is served by another registry", "(docs/mirrors.md)", "container api")) != 1 {
		t.Errorf("no note (R3) for the mirror image:\n%s", logs)
	}
	if strings.Contains(logs, "container proxy") {
		t.Errorf("a note for the container already on the recorded digest (R7 compares only the digest):\n%s", logs)
	}
}

func TestRender_B2_NoRecordOrUnreadableAnchorLeavesTheTagWithOneNotePerImage(t *testing.T) {
	e := newEnv(t)
	e.Seed() // no tick: no record on the anchor
	cfg := e.Config(renderConfig)
	denied, err := e.C.UserKubeconfig("render-no-rights")
	if err != nil {
		t.Fatal(err)
	}
	in := e.SeedManifests()
	for _, tc := range []struct {
		name, kubeconfig, reason string
	}{
		{"no record on the anchor yet", e.Kubeconfig, "the group's anchor holds no recorded digest yet"},
		{"an RBAC denial reading the anchor", denied, "forbidden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &env{e.WithT(t)}
			code, out, logs, _ := e.Render(in, "--config", cfg, "--kubeconfig", tc.kubeconfig, "--namespace", e.NS)
			if code != 0 || out != in {
				t.Fatalf("exit %d, output changed=%v; want 0 and the input unchanged:\n%s", code, out != in, logs)
			}
			// One line for the image, naming both of its containers.
			notes := e2e.LogLines(logs, "INFO", "left on the tag")
			if len(notes) != 1 || !strings.Contains(notes[0], tc.reason) || !strings.Contains(notes[0], "image=api") ||
				!strings.Contains(notes[0], "container api") || !strings.Contains(notes[0], "container proxy") {
				t.Errorf("want one note for image api naming both containers and %q:\n%s", tc.reason, logs)
			}
		})
	}
}

// hangingServer accepts TCP connections and never answers: an API server
// that is reachable but stalled.
func hangingServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "https://" + l.Addr().String()
}

// tokenKubeconfig writes a kubeconfig for server with a bearer token.
func tokenKubeconfig(t *testing.T, server, token string) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: server, InsecureSkipTLSVerify: true}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRender_B2_R14_NoClusterLeavesTheTagAndExitsZeroWithinTheAPITimeout(t *testing.T) {
	e := newEnv(t)
	cfg := e.Config(renderConfig) // apiTimeout: 2s
	in := e.SeedManifests()
	noConfig := filepath.Join(t.TempDir(), "absent")
	for _, tc := range []struct {
		name, kubeconfig string
		env              string // KUBECONFIG, when no --kubeconfig is given
	}{
		{"connection refused", tokenKubeconfig(t, "https://127.0.0.1:1", "x"), ""},
		{"a server that never answers", tokenKubeconfig(t, hangingServer(t), "x"), ""},
		{"no kubeconfig at all, as under helm template on a laptop", "", noConfig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &env{e.WithT(t)}
			args := []string{"--config", cfg, "--namespace", e.NS}
			if tc.kubeconfig != "" {
				args = append(args, "--kubeconfig", tc.kubeconfig)
			} else {
				t.Setenv("KUBECONFIG", tc.env)
				t.Setenv("HOME", t.TempDir())
			}
			code, out, logs, took := e.Render(in, args...)
			if code != 0 || out != in {
				t.Fatalf("exit %d, output changed=%v; want 0 and the input unchanged:\n%s", code, out != in, logs)
			}
			if notes := e2e.LogLines(logs, "INFO", "left on the tag", "could not be read"); len(notes) != 1 {
				t.Errorf("want one note saying the anchor could not be read:\n%s", logs)
			}
			if limit := 2*time.Second + 2*time.Second; took > limit {
				t.Errorf("render took %s, want at most the apiTimeout (2s) plus slack", took)
			}
		})
	}
}

func TestRender_R20_NoCredentialOnStderr(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	cfg := e.Config(renderConfig)
	const token = "image-refresh-test-token-must-not-be-logged-8d1c"
	in := e.SeedManifests()
	for _, tc := range []struct{ name, server string }{
		{"the real API server refuses the token", e.C.Server},
		{"a server that never answers", hangingServer(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &env{e.WithT(t)}
			for _, format := range []string{"text", "json"} {
				code, out, logs, _ := e.Render(in, "--config", cfg, "--kubeconfig", tokenKubeconfig(t, tc.server, token),
					"--namespace", e.NS, "--log-format", format)
				if code != 0 || out != in {
					t.Fatalf("exit %d, output changed=%v:\n%s", code, out != in, logs)
				}
				if strings.Contains(logs, token) || strings.Contains(logs, token[:20]) {
					t.Errorf("the bearer token reached stderr (%s):\n%s", format, logs)
				}
				if !strings.Contains(logs, "could not be read") {
					t.Errorf("no note about the unreadable anchor (%s):\n%s", format, logs)
				}
			}
		})
	}
}

func TestRender_B2_InvalidConfigExitsTwoNamingTheFieldAndWritesNothing(t *testing.T) {
	e := newEnv(t)
	cfg := e.Config(strings.Replace(e2e.SeedShape, "        tag: prod\n", "", 1))
	code, out, logs, _ := e.Render(e.SeedManifests(), "--config", cfg, "--kubeconfig", e.Kubeconfig)
	if code != cli.ExitInvalid || out != "" {
		t.Fatalf("exit %d with %d bytes on stdout, want %d and nothing:\n%s", code, len(out), cli.ExitInvalid, logs)
	}
	if !strings.Contains(logs, "groups[0].images[0].tag") {
		t.Errorf("the error does not name the field:\n%s", logs)
	}
	for flag, args := range map[string][]string{
		"--namespace":  {"--namespace", "Not_A_Namespace"},
		"--kubeconfig": {"--kubeconfig", filepath.Join(t.TempDir(), "absent")},
	} {
		code, out, logs, _ = e.Render("kind: ConfigMap\n", append([]string{"--config", e.Config(e2e.SeedShape)}, args...)...)
		if code != cli.ExitInvalid || out != "" || !strings.Contains(logs, flag) {
			t.Errorf("an invalid %s: exit %d, %d bytes on stdout:\n%s", flag, code, len(out), logs)
		}
	}
}

func TestRender_B2_UnparsableStdinExitsOneNamingDocumentAndLineAndWritesNothing(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	cfg := e.Config(renderConfig)
	e.Tick(cfg) // a record exists: the first document would be pinned
	in := e.SeedManifests() + "\n---\nkind: [broken\n"
	code, out, logs, _ := e.Render(in, "--config", cfg, "--kubeconfig", e.Kubeconfig, "--namespace", e.NS)
	if code != cli.ExitNeedsHuman || out != "" {
		t.Fatalf("exit %d with %d bytes on stdout, want %d and nothing (never a half-rendered stream):\n%s", code, len(out), cli.ExitNeedsHuman, logs)
	}
	lines := strings.Count(e.SeedManifests(), "\n") + 3
	if !strings.Contains(logs, "document 6, line ") || !strings.Contains(logs, "nothing written") {
		t.Errorf("the error does not name document 6 (near line %d):\n%s", lines, logs)
	}
}

// lineDiff shows the differing lines of two streams, for failure messages.
func lineDiff(want, got []byte) string {
	lw, lg := bytes.Split(want, []byte("\n")), bytes.Split(got, []byte("\n"))
	var b strings.Builder
	for i := 0; i < max(len(lw), len(lg)); i++ {
		var w, g []byte
		if i < len(lw) {
			w = lw[i]
		}
		if i < len(lg) {
			g = lg[i]
		}
		if !bytes.Equal(w, g) {
			fmt.Fprintf(&b, "line %d:\n  want %q\n   got %q\n", i+1, w, g)
		}
	}
	return b.String()
}

// linkOrCopy makes dst the file src: a hard link, or a copy where the
// two are on different file systems.
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}

// helmMajor is one Helm CLI the Helm tests run. hack/build-cluster.sh
// builds both next to the cluster binaries: Helm 4 as helm, Helm 3 as helm3.
type helmMajor struct {
	name  string // the subtest's name
	bin   string // the binary's name in the cluster bin dir (or on PATH)
	major int
}

// helmMajors are the Helm majors every Helm test runs under: Helm 3, what
// most clusters run, and Helm 4.
var helmMajors = []helmMajor{{"helm3", "helm3", 3}, {"helm4", "helm", 4}}

// eachHelm runs test once per Helm major, as the subtests helm3 and helm4,
// each in an env (namespace, registry) of its own.
func eachHelm(t *testing.T, test func(t *testing.T, e *env, h *helmCLI)) {
	for _, m := range helmMajors {
		t.Run(m.name, func(t *testing.T) {
			e := newEnv(t)
			start := time.Now()
			test(t, e, newHelm(t, e, m))
			t.Logf("%s: %s", m.name, time.Since(start).Round(time.Millisecond))
		})
	}
}

// helmCLI runs the real Helm CLI against the test cluster, with its homes
// in a temporary directory, the image-refresh binary on PATH and, for Helm
// 4, the post-renderer plugin of plugins/image-refresh-render installed.
type helmCLI struct {
	t      *testing.T
	bin    string
	major  int
	env    []string
	irBin  string // the image-refresh binary
	logPth string // IMAGE_REFRESH_RENDER_LOG: Helm 4 discards a plugin's stderr
	data   string // HELM_DATA_HOME: the plugins
}

// newHelm finds m's binary next to the cluster binaries (hack/build-cluster.sh
// builds it, and testenv.Main runs that script), else on PATH, and checks
// that it is of m's major. Without one the test fails: it never passes
// without having run that Helm.
func newHelm(t *testing.T, e *env, m helmMajor) *helmCLI {
	t.Helper()
	bin, err := exec.LookPath(filepath.Join(e.C.BinDir, m.bin))
	if err != nil {
		bin, err = exec.LookPath(m.bin)
	}
	if err != nil {
		t.Fatalf("no %s binary (Helm %d) in %s or on PATH: run hack/build-cluster.sh", m.bin, m.major, e.C.BinDir)
	}
	dir := t.TempDir()
	h := &helmCLI{t: t, bin: bin, irBin: filepath.Join(dir, "bin", "image-refresh"), logPth: filepath.Join(dir, "render.log"), data: filepath.Join(dir, "data")}
	// The process's one build, linked (or copied) into a directory of
	// its own that goes on Helm's PATH.
	if err := os.MkdirAll(filepath.Dir(h.irBin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := linkOrCopy(e2e.BuildImageRefresh(t), h.irBin); err != nil {
		t.Fatalf("image-refresh for Helm: %v", err)
	}
	h.env = append(os.Environ(),
		"KUBECONFIG="+e.Kubeconfig,
		"HELM_CACHE_HOME="+filepath.Join(dir, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(dir, "config"),
		"HELM_DATA_HOME="+h.data,
		"PATH="+filepath.Dir(h.irBin)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"IMAGE_REFRESH_RENDER_LOG="+h.logPth,
	)
	version := strings.TrimPrefix(strings.TrimSpace(h.run("version", "--template", "{{.Version}}")), "v")
	h.major, _ = strconv.Atoi(strings.SplitN(version, ".", 2)[0])
	if h.major != m.major {
		t.Fatalf("%s is Helm %q, want Helm %d", bin, version, m.major)
	}
	t.Logf("Helm %s (%s)", version, bin)
	if h.major >= 4 {
		plugin, err := filepath.Abs(filepath.Join("..", "..", "..", "plugins", "image-refresh-render"))
		if err != nil {
			t.Fatal(err)
		}
		h.run("plugin", "install", plugin)
	}
	return h
}

// run runs helm and fails the test when it fails.
func (h *helmCLI) run(args ...string) string {
	h.t.Helper()
	out, err := h.try(nil, args...)
	if err != nil {
		h.t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// try runs helm with extra environment and returns its stdout (and stderr
// on failure).
func (h *helmCLI) try(extraEnv []string, args ...string) (string, error) {
	h.t.Helper()
	stdout, stderr, err := h.exec(extraEnv, args...)
	if err != nil {
		return stdout + stderr, err
	}
	return stdout, nil
}

// exec runs helm with extra environment (a variable given twice takes the
// last value) and returns its stdout and stderr.
func (h *helmCLI) exec(extraEnv []string, args ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.bin, args...)
	cmd.Env = append(append([]string(nil), h.env...), extraEnv...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// postRenderer returns the flags that run `image-refresh render`, as
// docs/post-renderer.md gives them: the plugin on Helm 4, the binary on
// PATH itself on Helm 3 (>= 3.10).
func (h *helmCLI) postRenderer(cfg string, extra ...string) []string {
	var args []string
	if h.major >= 4 {
		args = []string{"--post-renderer", "image-refresh-render"}
	} else {
		args = []string{"--post-renderer", "image-refresh", "--post-renderer-args", "render"}
	}
	for _, a := range append([]string{"--config=" + cfg}, extra...) {
		args = append(args, "--post-renderer-args", a)
	}
	return args
}

// renderLog returns what the post-renderer wrote on stderr so far.
func (h *helmCLI) renderLog() string {
	b, _ := os.ReadFile(h.logPth)
	return string(b)
}

// webChart writes a chart with a Deployment "web" (no metadata.namespace,
// as charts usually render) whose container web runs image, a sidecar on
// another image, a Service and a commented ConfigMap.
func webChart(t *testing.T, image string) string {
	return writeWebChart(t, image, 2, "", `        - name: sidecar
          image: example.invalid/sidecar:v1
`, map[string]string{"other.yaml": `# not managed
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: web-settings}
data:
  image: {{ .Values.image | quote }}  # the same text, in data: not an image field
`})
}

// bareTagWatch records every Deployment, ReplicaSet and Pod labelled
// app=web whose pod template or spec runs the bare tag, from the moment it
// starts: the object history, not only the final state.
type bareTagWatch struct {
	mu        sync.Mutex
	seen      []string
	delivered map[string]bool // "kind uid resourceVersion" of every event
	e         *env
	opts      metav1.ListOptions
	cancel    context.CancelFunc
	done      sync.WaitGroup
	changed   chan struct{} // closed and replaced on each event delivered
}

// changes is closed at the next event a watch delivers.
func (w *bareTagWatch) changes() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed
}

func (e *env) watchBareTag(app, tag string) *bareTagWatch {
	e.T.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	opts := metav1.ListOptions{LabelSelector: "app=" + app}
	w := &bareTagWatch{cancel: cancel, delivered: map[string]bool{}, e: e, opts: opts, changed: make(chan struct{})}
	e.T.Cleanup(w.stop)
	apps, core := e.C.Client.AppsV1(), e.C.Client.CoreV1()
	sources := map[string]func() (watch.Interface, error){
		"Deployment": func() (watch.Interface, error) { return apps.Deployments(e.NS).Watch(ctx, opts) },
		"ReplicaSet": func() (watch.Interface, error) { return apps.ReplicaSets(e.NS).Watch(ctx, opts) },
		"Pod":        func() (watch.Interface, error) { return core.Pods(e.NS).Watch(ctx, opts) },
	}
	for kind, start := range sources {
		wi, err := start()
		if err != nil {
			e.T.Fatalf("watch %ss: %v", kind, err)
		}
		w.done.Add(1)
		go func() {
			defer w.done.Done()
			defer wi.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-wi.ResultChan():
					if !ok {
						return
					}
					if o, ok := ev.Object.(metav1.Object); ok {
						w.mu.Lock()
						w.delivered[kind+" "+string(o.GetUID())+" "+o.GetResourceVersion()] = true
						close(w.changed)
						w.changed = make(chan struct{})
						w.mu.Unlock()
					}
					var name string
					var ctrs []corev1.Container
					switch o := ev.Object.(type) {
					case *appsv1.Deployment:
						name, ctrs = o.Name+"@"+o.ResourceVersion, o.Spec.Template.Spec.Containers
					case *appsv1.ReplicaSet:
						name, ctrs = o.Name, o.Spec.Template.Spec.Containers
					case *corev1.Pod:
						name, ctrs = o.Name, o.Spec.Containers
					}
					for _, c := range ctrs {
						if c.Image == tag {
							w.mu.Lock()
							w.seen = append(w.seen, fmt.Sprintf("%s %s %s", ev.Type, kind, name))
							w.mu.Unlock()
						}
					}
				}
			}
		}()
	}
	return w
}

// take returns what was seen since the last call and forgets it, once
// the watches caught up: every object the API server holds now reached its
// watch in its current version, and with it every earlier event of its
// kind (a watch delivers in order).
func (w *bareTagWatch) take() []string {
	w.e.T.Helper()
	testwait.Until(w.e.T, "the bare-tag watches caught up", w.changes, w.caughtUp)
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.seen
	w.seen = nil
	return out
}

// caughtUp is checked on each event a watch delivers (take), not on a
// timer: a failed list would not be checked again, so it fails the test.
func (w *bareTagWatch) caughtUp() bool {
	ctx, e := context.Background(), w.e
	var objs []string
	deps, err := e.C.Client.AppsV1().Deployments(e.NS).List(ctx, w.opts)
	if err != nil {
		e.T.Fatalf("the bare-tag watches caught up: %v", err)
	}
	for _, o := range deps.Items {
		objs = append(objs, "Deployment "+string(o.UID)+" "+o.ResourceVersion)
	}
	rss, err := e.C.Client.AppsV1().ReplicaSets(e.NS).List(ctx, w.opts)
	if err != nil {
		e.T.Fatalf("the bare-tag watches caught up: %v", err)
	}
	for _, o := range rss.Items {
		objs = append(objs, "ReplicaSet "+string(o.UID)+" "+o.ResourceVersion)
	}
	pods, err := e.C.Client.CoreV1().Pods(e.NS).List(ctx, w.opts)
	if err != nil {
		e.T.Fatalf("the bare-tag watches caught up: %v", err)
	}
	for _, o := range pods.Items {
		objs = append(objs, "Pod "+string(o.UID)+" "+o.ResourceVersion)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, k := range objs {
		if !w.delivered[k] {
			return false
		}
	}
	return true
}

func (w *bareTagWatch) stop() {
	w.cancel()
	w.done.Wait()
}

func TestRender_B2_HelmWithThePostRendererNeverDeploysTheBareTag(t *testing.T) {
	eachHelm(t, testRenderB2)
}

func testRenderB2(t *testing.T, e *env, h *helmCLI) {
	digest := e.Push("web", "prod")
	tag := e.Repo("web") + ":prod"
	pinned := tag + "@" + digest

	// The group's anchor lives outside the chart and already carries the
	// record: one tick observes the registry and records the digest (R5).
	testenv.Deployment(t, e.C.Client, e.NS, "state", testenv.WithContainer("app", tag), testenv.WithReplicas(1))
	e.Settle("Deployment", "state")
	group := "groups:\n" + e2e.OneGroup("web", "web", "state", "app")
	tickCfg := e.Config(group)
	cfg := e.Config(group + "          - {kind: Deployment, namespace: {{ns}}, name: web, container: web}\n")
	if code, _ := e.Tick(tickCfg); code != 0 {
		t.Fatalf("tick exit %d", code)
	}
	if got := e.Annotations("state")[e.Key("last-refreshed-web-digest")]; got != digest {
		t.Fatalf("setup: recorded %q, want %q", got, digest)
	}

	chart := webChart(t, tag)
	watch := e.watchBareTag("web", tag)

	// helm template: the post-renderer reads the record from the cluster.
	plain := h.run("template", "web", chart, "-n", e.NS)
	rendered := h.run(append([]string{"template", "web", chart, "-n", e.NS}, h.postRenderer(cfg, "--namespace="+e.NS)...)...)
	if !strings.Contains(rendered, "image: "+pinned+"\n") || strings.Contains(rendered, "image: "+tag+"\n") {
		t.Errorf("helm template with the post-renderer did not pin web:\n%s", rendered)
	}
	if !sameObjects(t, plain, strings.ReplaceAll(rendered, pinned, tag)) {
		t.Errorf("helm template with the post-renderer changed more than the image:\n--- without\n%s\n--- with\n%s", plain, rendered)
	}

	// Install: the first Deployment written is already pinned.
	h.run(append([]string{"upgrade", "--install", "web", chart, "-n", e.NS}, h.postRenderer(cfg, "--namespace="+e.NS)...)...)
	e.Settle("Deployment", "web")
	if got := e.Image("web", "web"); got != pinned {
		t.Fatalf("after helm install web runs %s, want %s\npost-renderer log:\n%s", got, pinned, h.renderLog())
	}
	if h.major >= 4 {
		if !strings.Contains(h.renderLog(), "pinned to the recorded digest") {
			t.Errorf("the post-renderer logged no pin:\n%s", h.renderLog())
		}
	} else {
		// Helm 3 shows a post-renderer's stderr only when it fails, so the
		// binary's notes are gone; the wrapper script keeps them, and takes
		// the config and namespace from the environment (docs/post-renderer.md).
		if log := h.renderLog(); log != "" {
			t.Errorf("Helm 3 ran the binary itself, yet something wrote the render log:\n%s", log)
		}
		script, err := filepath.Abs(filepath.Join("..", "..", "..", "plugins", "image-refresh-render", "render.sh"))
		if err != nil {
			t.Fatal(err)
		}
		out, err := h.try([]string{"IMAGE_REFRESH_CONFIG=" + cfg, "HELM_NAMESPACE=" + e.NS}, "template", "web", chart, "--post-renderer", script)
		if err != nil || !strings.Contains(out, "image: "+pinned+"\n") {
			t.Errorf("helm template --post-renderer render.sh did not pin web: %v\n%s", err, out)
		}
		if !strings.Contains(h.renderLog(), "pinned to the recorded digest") {
			t.Errorf("the wrapper script under Helm 3 logged no pin:\n%s", h.renderLog())
		}
	}

	// Fix A agrees: nothing to do on web (R9), so B and A do not fight.
	rv := e.Deployment("web").ResourceVersion
	if code, logs := e.Tick(cfg); code != 0 {
		t.Fatalf("tick exit %d:\n%s", code, logs)
	}
	if got := e.Deployment("web").ResourceVersion; got != rv {
		t.Errorf("fix A wrote the Deployment the post-renderer pinned (resourceVersion %s -> %s)", rv, got)
	}

	// An upgrade that changes the pod template rolls out, pinned. The
	// release namespace reaches the post-renderer through HELM_NAMESPACE.
	out, err := h.try([]string{"HELM_NAMESPACE=" + e.NS},
		append([]string{"upgrade", "web", chart, "--set", "revision=2"}, h.postRenderer(cfg)...)...)
	if err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	e.Settle("Deployment", "web")
	d := e.Deployment("web")
	if got := d.Spec.Template.Annotations["revision"]; got != "2" {
		t.Fatalf("setup: the upgrade did not roll out (revision %q)", got)
	}
	if got := e.Image("web", "web"); got != pinned {
		t.Errorf("after helm upgrade web runs %s, want %s", got, pinned)
	}
	if seen := watch.take(); len(seen) > 0 {
		t.Errorf("the bare tag %s was deployed with the post-renderer in place: %q", tag, seen)
	}

	// Control: without the post-renderer the same upgrade reverts the pin,
	// and the watch sees it; fix A then re-pins (B3).
	h.run("upgrade", "web", chart, "-n", e.NS, "--set", "revision=3")
	e.Settle("Deployment", "web")
	if seen := watch.take(); len(seen) == 0 {
		t.Errorf("control: a helm upgrade without the post-renderer did not deploy the bare tag, so this test proves nothing")
	}
	if code, logs := e.Tick(cfg); code != 0 || e.Image("web", "web") != pinned {
		t.Fatalf("fix A did not re-pin after the control upgrade: exit %d, %s\n%s", code, e.Image("web", "web"), logs)
	}
	watch.take()

	// With the post-renderer again, the upgrade writes the value fix A
	// wrote: no bare tag, and no --force-conflicts. Under Helm 4's
	// server-side apply that means no field conflict with image-refresh's
	// write (R17); Helm 3 patches client-side, where no conflict exists.
	h.run(append([]string{"upgrade", "web", chart, "-n", e.NS, "--set", "revision=4"}, h.postRenderer(cfg, "--namespace="+e.NS)...)...)
	e.Settle("Deployment", "web")
	if got := e.Image("web", "web"); got != pinned {
		t.Errorf("after the last helm upgrade web runs %s, want %s", got, pinned)
	}
	if fields := e.Deployment("web").ManagedFields; !h.wrote(fields) {
		t.Errorf("Helm %d did not write web with %s: %+v", h.major, h.operation(), fields)
	}
	if seen := watch.take(); len(seen) > 0 {
		t.Errorf("the bare tag was deployed with the post-renderer in place: %q", seen)
	}
}

// Helm 3 and Helm 4 share the plugin directory ($HELM_DATA_HOME/plugins).
// With Helm 4's post-renderer plugin installed there, Helm 3 cannot load it
// and says so on every command, and the documented Helm 3 invocation (the
// binary as --post-renderer) still pins (docs/post-renderer.md).
func TestRender_B2_Helm3BesideHelm4sPluginStillPins(t *testing.T) {
	e := newEnv(t)
	digest, tag, cfg := e.hbSetup()
	h4 := newHelm(t, e, helmMajors[1]) // installs the plugin
	h3 := newHelm(t, e, helmMajors[0])
	if _, err := os.Stat(filepath.Join(h4.data, "plugins", "image-refresh-render", "plugin.yaml")); err != nil {
		t.Fatalf("setup: Helm 4 did not install the plugin: %v", err)
	}
	shared := []string{"HELM_DATA_HOME=" + h4.data}
	chart := hbChart(t, tag)

	// In a data home of its own, Helm 3 refuses to install the plugin.
	stdout, stderr, err := h3.exec(nil, "plugin", "install", filepath.Join("..", "..", "..", "plugins", "image-refresh-render"))
	if err == nil || !strings.Contains(stdout+stderr, `unknown field "apiVersion"`) {
		t.Errorf("helm3 plugin install of the Helm 4 plugin: %v, want the error docs/post-renderer.md quotes:\n%s%s", err, stdout, stderr)
	}

	stdout, stderr, err = h3.exec(shared, append([]string{"template", "web", chart, "-n", e.NS}, h3.postRenderer(cfg, "--namespace="+e.NS)...)...)
	if err != nil {
		t.Fatalf("helm3 template with the post-renderer beside Helm 4's plugin: %v\n%s%s", err, stdout, stderr)
	}
	if !strings.Contains(stdout, "image: "+tag+"@"+digest+"\n") {
		t.Errorf("helm3 template did not pin web:\n%s", stdout)
	}
	if !strings.Contains(stderr, "failed to load plugins") || !strings.Contains(stderr, "image-refresh-render") {
		t.Errorf("Helm 3 did not report the plugin it cannot load; docs/post-renderer.md says it does:\n%s", stderr)
	}
	t.Logf("helm3 stderr beside Helm 4's plugin:\n%s", stderr)
}

// sameObjects reports whether two manifest streams hold the same objects,
// ignoring formatting (Helm 4 re-serialises post-rendered manifests).
func sameObjects(t *testing.T, a, b string) bool {
	t.Helper()
	decode := func(s string) []any {
		var out []any
		dec := yaml.NewDecoder(strings.NewReader(s))
		for {
			var v any
			if err := dec.Decode(&v); err != nil {
				if errors.Is(err, io.EOF) {
					return out
				}
				t.Fatalf("decode helm output: %v", err)
			}
			if v != nil {
				out = append(out, v)
			}
		}
	}
	return reflect.DeepEqual(decode(a), decode(b))
}

// writtenBy reports whether manager wrote the object with operation op.
func writtenBy(fields []metav1.ManagedFieldsEntry, manager string, op metav1.ManagedFieldsOperationType) bool {
	for _, f := range fields {
		if f.Manager == manager && f.Operation == op {
			return true
		}
	}
	return false
}

// operation is how helm writes a workload: Helm 4 with server-side apply
// (Apply), Helm 3 with a client-side three-way merge patch (Update). Both
// name their field manager "helm".
func (h *helmCLI) operation() metav1.ManagedFieldsOperationType {
	if h.major >= 4 {
		return metav1.ManagedFieldsOperationApply
	}
	return metav1.ManagedFieldsOperationUpdate
}

// wrote reports whether helm wrote the object the way its major writes.
func (h *helmCLI) wrote(fields []metav1.ManagedFieldsEntry) bool {
	return writtenBy(fields, "helm", h.operation())
}

// forceConflicts is what a Helm upgrade or rollback of a field that
// image-refresh owns needs: --force-conflicts under Helm 4's server-side
// apply (R17); nothing under Helm 3, which has no such flag and no
// conflicts.
func (h *helmCLI) forceConflicts() []string {
	if h.major >= 4 {
		return []string{"--force-conflicts"}
	}
	return nil
}
