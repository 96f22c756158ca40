package admission

// R20 across every mode: one Distribution registry (TLS, htpasswd basic
// auth, test/support/distribution) whose password reaches image-refresh only
// through the pull secret "regcred" of the seed's Deployments and through
// $DOCKER_CONFIG/config.json (the only source for the DaemonSet node-agent,
// which lists no pull secret). Every mode runs against it and does its job
// (the pins are checked, so the test cannot pass by never authenticating),
// and everything image-refresh emitted is grepped for the credentials.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/image-refresh/image-refresh/internal/cli"
	"github.com/image-refresh/image-refresh/test/support/distribution"
	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/running"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

// emissions is everything image-refresh emitted, by where it appeared.
type emissions struct {
	mu    sync.Mutex
	items []emission
}

type emission struct{ where, text string }

func (em *emissions) add(where, text string) {
	em.mu.Lock()
	defer em.mu.Unlock()
	em.items = append(em.items, emission{where, text})
}

// addObject records the JSON of a whole API object: metadata (annotations,
// labels, managed fields) and spec, so that nothing on it goes unchecked.
func (em *emissions) addObject(t *testing.T, where string, obj any) {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatalf("marshal %s: %v", where, err)
	}
	em.add(where, string(b))
}

func (em *emissions) count(prefix string) int {
	em.mu.Lock()
	defer em.mu.Unlock()
	n := 0
	for _, it := range em.items {
		if strings.HasPrefix(it.where, prefix) {
			n++
		}
	}
	return n
}

// leakEnv is a Distribution env that records what image-refresh emits.
type leakEnv struct {
	*e2e.DistEnv
	em        *emissions
	dockerCfg string            // the $DOCKER_CONFIG directory
	needles   map[string]string // what must never appear, by description
}

func (l *leakEnv) agentRepo() string { return l.Dist.Host + "/acme/agent" }

// leakConfig is the seed's control plane plus a DaemonSet group whose
// target lists no pull secret (its credentials come from DOCKER_CONFIG);
// extraAPITargets adds targets to image api (render's chart).
func (l *leakEnv) leakConfig(extraAPITargets string) string {
	l.T.Helper()
	return l.Config("  - host: " + l.Dist.Host + "\n    caFile: " + l.Dist.CAFile + "\n" + `groups:
  - name: control-plane
    anchor: {kind: Deployment, namespace: {{ns}}, name: jobs-manager}
    images:
      - name: api
        repository: ` + l.Repo() + `
        tag: prod
        targets:
          - {kind: Deployment, namespace: {{ns}}, name: jobs-manager, container: api}
          - {kind: Deployment, namespace: {{ns}}, name: requests-proxy, container: proxy}
` + extraAPITargets + `  - name: agents
    anchor: {kind: DaemonSet, namespace: {{ns}}, name: node-agent}
    images:
      - name: agent
        repository: ` + l.agentRepo() + `
        tag: prod
        targets:
          - {kind: DaemonSet, namespace: {{ns}}, name: node-agent, container: agent}
`)
}

// writeDockerConfig writes $DOCKER_CONFIG/config.json with pass, and adds
// its bytes, base64-encoded, to the needles.
func (l *leakEnv) writeDockerConfig(pass string) {
	l.T.Helper()
	auth := base64.StdEncoding.EncodeToString([]byte(l.Dist.User + ":" + pass))
	body := fmt.Sprintf(`{"auths":{%q:{"auth":%q}}}`, l.Dist.Host, auth)
	if err := os.WriteFile(filepath.Join(l.dockerCfg, "config.json"), []byte(body), 0o600); err != nil {
		l.T.Fatal(err)
	}
	l.needles["base64 of DOCKER_CONFIG/config.json ("+pass+")"] = base64.RawStdEncoding.EncodeToString([]byte(body))
}

// setPullSecret creates or updates regcred with pass, and adds the
// secret's .dockerconfigjson, base64-encoded, to the needles.
func (l *leakEnv) setPullSecret(pass string, update bool) {
	l.T.Helper()
	l.DockerConfigSecret("regcred", l.Dist.Host, l.Dist.User, pass, update)
	s, err := l.C.Client.CoreV1().Secrets(l.NS).Get(context.Background(), "regcred", metav1.GetOptions{})
	if err != nil {
		l.T.Fatal(err)
	}
	data := s.Data[corev1.DockerConfigJsonKey]
	if !strings.Contains(string(data), pass) {
		l.T.Fatalf("setup: regcred does not hold the password it was written with: %s", data)
	}
	l.needles["base64 of regcred's .dockerconfigjson ("+pass+")"] = base64.RawStdEncoding.EncodeToString(data)
}

// irun runs image-refresh in-process and records its argv, stdout and
// stderr under what.
func (l *leakEnv) irun(what string, args ...string) (code int, stdout, stderr string) {
	l.T.Helper()
	l.em.add("argv of "+what, strings.Join(args, " "))
	code, stdout, stderr = l.Run(args...)
	l.em.add("stdout of "+what, stdout)
	l.em.add("stderr of "+what, stderr)
	l.T.Logf("%s: exit %d\n%s%s", what, code, stdout, stderr)
	return code, stdout, stderr
}

// itick runs tick and waits until every workload of the namespace settled
// again (an annotation write bumps a generation).
func (l *leakEnv) itick(what, cfg string, extra ...string) (code int, stdout, logs string) {
	l.T.Helper()
	code, stdout, logs = l.irun(what, append([]string{"tick", "--config", cfg, "--kubeconfig", l.Kubeconfig}, extra...)...)
	l.settleAll()
	return code, stdout, logs
}

func (l *leakEnv) settleAll() {
	l.T.Helper()
	ctx := context.Background()
	deps, err := l.C.Client.AppsV1().Deployments(l.NS).List(ctx, metav1.ListOptions{})
	if err != nil {
		l.T.Fatal(err)
	}
	for _, d := range deps.Items {
		_ = testenv.WaitSettled(ctx, l.C.Client, "Deployment", l.NS, d.Name, 30*time.Second)
	}
	dss, err := l.C.Client.AppsV1().DaemonSets(l.NS).List(ctx, metav1.ListOptions{})
	if err != nil {
		l.T.Fatal(err)
	}
	for _, d := range dss.Items {
		_ = testenv.WaitSettled(ctx, l.C.Client, "DaemonSet", l.NS, d.Name, 30*time.Second)
	}
}

func (l *leakEnv) agentImage() string {
	l.T.Helper()
	for _, c := range l.DaemonSet("node-agent").Spec.Template.Spec.Containers {
		if c.Name == "agent" {
			return c.Image
		}
	}
	l.T.Fatal("DaemonSet node-agent has no container agent")
	return ""
}

// assertImages checks every target of both groups.
func (l *leakEnv) assertImages(when, api, agent string) {
	l.T.Helper()
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := l.Image(w[0], w[1]); got != api {
			l.T.Errorf("%s: %s/%s runs %s, want %s", when, w[0], w[1], got, api)
		}
	}
	if got := l.agentImage(); got != agent {
		l.T.Errorf("%s: node-agent/agent runs %s, want %s", when, got, agent)
	}
}

// heads counts the manifest HEADs of repo:prod by image-refresh (its
// User-Agent) that Distribution answered with status, from its access log.
func (l *leakEnv) heads(repo, status string) int {
	n := 0
	for _, line := range strings.Split(l.Dist.Log(), "\n") {
		if strings.Contains(line, `"HEAD /v2/`+repo+`/manifests/prod HTTP/`) && strings.Contains(line, `" `+status+` `) && strings.Contains(line, `"image-refresh/`) {
			n++
		}
	}
	return n
}

// snapshot records every object of the namespace that image-refresh writes
// or causes (Deployments, DaemonSets, ReplicaSets, ControllerRevisions,
// Pods, Leases), every Event in both API versions (message, reason,
// annotations, regarding/related, note), and the webhook configuration.
// Pods and ReplicaSets come and go, so it runs after every mode.
func (l *leakEnv) snapshot(phase string) {
	l.T.Helper()
	ctx := context.Background()
	apps, core := l.C.Client.AppsV1(), l.C.Client.CoreV1()
	must := func(err error) {
		if err != nil {
			l.T.Fatalf("snapshot after %s: %v", phase, err)
		}
	}
	all := metav1.ListOptions{}
	for _, k := range []struct {
		kind string
		list func() (runtime.Object, error)
	}{
		{"Deployment", func() (runtime.Object, error) { return apps.Deployments(l.NS).List(ctx, all) }},
		{"DaemonSet", func() (runtime.Object, error) { return apps.DaemonSets(l.NS).List(ctx, all) }},
		{"ReplicaSet", func() (runtime.Object, error) { return apps.ReplicaSets(l.NS).List(ctx, all) }},
		{"ControllerRevision", func() (runtime.Object, error) { return apps.ControllerRevisions(l.NS).List(ctx, all) }},
		{"Pod", func() (runtime.Object, error) { return core.Pods(l.NS).List(ctx, all) }},
		{"Lease", func() (runtime.Object, error) { return l.C.Client.CoordinationV1().Leases(l.NS).List(ctx, all) }},
	} {
		list, err := k.list()
		must(err)
		items, err := meta.ExtractList(list)
		must(err)
		for _, o := range items {
			m, err := meta.Accessor(o)
			must(err)
			l.em.addObject(l.T, k.kind+" "+m.GetName()+" after "+phase, o)
		}
	}
	evs, err := core.Events(l.NS).List(ctx, metav1.ListOptions{})
	must(err)
	for _, o := range evs.Items {
		l.em.addObject(l.T, "Event "+o.Reason+" "+o.Name+" after "+phase, o)
	}
	evs2, err := l.C.Client.EventsV1().Events(l.NS).List(ctx, metav1.ListOptions{})
	must(err)
	for _, o := range evs2.Items {
		l.em.addObject(l.T, "events.k8s.io Event "+o.Reason+" "+o.Name+" after "+phase, o)
	}
	mwc, err := l.C.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "image-refresh-"+l.NS, metav1.GetOptions{})
	if err == nil {
		l.em.addObject(l.T, "MutatingWebhookConfiguration after "+phase, mwc)
	}
}

// captureStderr tees everything the test process writes to file
// descriptor 2 into a buffer: in-process commands log to their own writer,
// but client-go's klog (leader election, warnings) and any stray print of a
// library go to the process's stderr. The returned function stops it.
func captureStderr(t *testing.T) func() string {
	t.Helper()
	saved, err := syscall.Dup(2)
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Dup3(int(w.Fd()), 2, 0); err != nil {
		t.Fatal(err)
	}
	orig := os.NewFile(uintptr(saved), "stderr")
	var mu sync.Mutex
	var buf bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		b := make([]byte, 32<<10)
		for {
			n, err := r.Read(b)
			if n > 0 {
				mu.Lock()
				buf.Write(b[:n])
				mu.Unlock()
				_, _ = orig.Write(b[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	var once sync.Once
	stop := func() string {
		once.Do(func() {
			_ = syscall.Dup3(saved, 2, 0)
			w.Close()
			<-done
			r.Close()
		})
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}
	t.Cleanup(func() { stop() })
	return stop
}

// leakManifests is what a chart renders for the seed's control plane.
func (l *leakEnv) leakManifests() string {
	tag := l.Repo() + ":prod"
	return `apiVersion: apps/v1
kind: Deployment
metadata: {name: jobs-manager}
spec:
  template:
    spec:
      containers:
        - name: api
          image: ` + tag + `
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: requests-proxy, namespace: ` + l.NS + `}
spec:
  template:
    spec:
      containers: [{name: proxy, image: "` + tag + `"}]
`
}

func excerpt(text, s string) string {
	i := strings.Index(text, s)
	from, to := max(0, i-160), min(len(text), i+len(s)+160)
	return text[from:to]
}

func TestSecurity_R20_NoModeLeaksTheRegistryPassword(t *testing.T) {
	stopCapture := captureStderr(t)
	d := e2e.NewDistEnv(t)
	l := &leakEnv{DistEnv: d, em: &emissions{}, dockerCfg: t.TempDir(), needles: map[string]string{}}
	user := d.Dist.User
	for _, p := range []struct{ name, pass string }{{"password", distribution.Password}, {"wrong password", e2e.WrongDistPassword}} {
		l.needles["the "+p.name] = p.pass
		l.needles["base64(user:"+p.name+")"] = base64.RawStdEncoding.EncodeToString([]byte(user + ":" + p.pass))
		l.needles["base64url(user:"+p.name+")"] = base64.RawURLEncoding.EncodeToString([]byte(user + ":" + p.pass))
		l.needles["base64("+p.name+")"] = base64.RawStdEncoding.EncodeToString([]byte(p.pass))
	}
	// Distribution's htpasswd auth answers with a Basic challenge: the
	// client sends user:pass on every request and no bearer token exists
	// (token auth would need a separate token server, not configured).
	client := &http.Client{Transport: d.Dist.Transport(), Timeout: 5 * time.Second}
	resp, err := client.Get("https://" + d.Dist.Host + "/v2/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ch := resp.Header.Get("WWW-Authenticate"); resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(ch, "Basic ") {
		t.Fatalf("Distribution answered /v2/ with %d %q, want 401 with a Basic challenge (a token challenge would need its token checked too)", resp.StatusCode, ch)
	}

	// Seed: credentials only in regcred and in DOCKER_CONFIG.
	t.Setenv("DOCKER_CONFIG", l.dockerCfg)
	l.writeDockerConfig(distribution.Password)
	if b, _ := os.ReadFile(filepath.Join(l.dockerCfg, "config.json")); !strings.Contains(string(b), l.needles["base64(user:password)"]) {
		t.Fatalf("setup: the needle base64(user:password) is not what the docker config holds: %s", b)
	}
	l.setPullSecret(distribution.Password, false)
	d1 := d.Dist.MustPushRandomImage(t, "acme/api", "prod")
	a1 := d.Dist.MustPushRandomImage(t, "acme/agent", "prod")
	tag, agentTag := l.Repo()+":prod", l.agentRepo()+":prod"
	testenv.Deployment(t, d.C.Client, d.NS, "jobs-manager", testenv.WithContainer("api", tag), testenv.WithRecreate(), testenv.WithPullSecrets("regcred"))
	testenv.Deployment(t, d.C.Client, d.NS, "requests-proxy", testenv.WithContainer("proxy", tag), testenv.WithPullSecrets("regcred"))
	testenv.DaemonSet(t, d.C.Client, d.NS, "node-agent", testenv.WithTolerateAll(), testenv.WithContainer("agent", agentTag))
	l.settleAll()
	cfg := l.leakConfig("")
	record := func(anchorKind, name, image string) string {
		if anchorKind == "DaemonSet" {
			return l.DaemonSet(name).Annotations[l.Key("last-refreshed-"+image+"-digest")]
		}
		return l.Annotations(name)[l.Key("last-refreshed-"+image+"-digest")]
	}

	// tick, success: first observation (JSON logs), then the pin (with a
	// metrics file). The registry answers 200 only to authenticated HEADs.
	metricsFile := filepath.Join(t.TempDir(), "tick.prom")
	if code, _, _ := l.itick("tick (first observation, json logs)", cfg, "--log-format", "json"); code != 0 {
		t.Fatalf("first tick: exit %d, want 0", code)
	}
	if record("Deployment", "jobs-manager", "api") != d1 || record("DaemonSet", "node-agent", "agent") != a1 {
		t.Fatalf("first observation did not record the digests Distribution serves")
	}
	if code, _, _ := l.itick("tick (pin)", cfg, "--metrics-file", metricsFile); code != 0 {
		t.Fatalf("pinning tick: exit %d, want 0", code)
	}
	l.assertImages("after the pinning tick", tag+"@"+d1, agentTag+"@"+a1)
	if n := l.heads("acme/api", "200"); n < 2 {
		t.Errorf("%d authenticated HEADs of acme/api (pull secret), want one per tick", n)
	}
	if n := l.heads("acme/agent", "200"); n < 2 {
		t.Errorf("%d authenticated HEADs of acme/agent (DOCKER_CONFIG only), want one per tick", n)
	}
	prom, err := os.ReadFile(metricsFile)
	if err != nil || !strings.Contains(string(prom), "image_refresh_registry_requests_total") {
		t.Errorf("tick --metrics-file wrote %q (%v), want the registry request counter", prom, err)
	}
	l.em.add("tick --metrics-file", string(prom))
	l.snapshot("tick")

	// --dry-run: the tag moved; the plan names the new digest, nothing is written.
	d2 := d.Dist.MustPushRandomImage(t, "acme/api", "prod")
	a2 := d.Dist.MustPushRandomImage(t, "acme/agent", "prod")
	code, plan, _ := l.itick("tick --dry-run", cfg, "--dry-run")
	if code != 0 || !strings.Contains(plan, tag+"@"+d2) || !strings.Contains(plan, agentTag+"@"+a2) {
		t.Errorf("tick --dry-run: exit %d, plan without both new digests:\n%s", code, plan)
	}
	l.assertImages("after --dry-run", tag+"@"+d1, agentTag+"@"+a1)

	// tick, failure: both credential sources hold a wrong password.
	before401 := l.heads("acme/api", "401") + l.heads("acme/agent", "401")
	l.setPullSecret(e2e.WrongDistPassword, true)
	l.writeDockerConfig(e2e.WrongDistPassword)
	code, _, logs := l.itick("tick (wrong password)", cfg)
	if code != 0 {
		t.Errorf("tick with a wrong password: exit %d, want 0 below the failure ceiling", code)
	}
	for _, repo := range []string{l.Repo(), l.agentRepo()} {
		if len(e2e.LogLines(logs, "WARN", repo, "unauthorized", "HTTP 401")) == 0 {
			t.Errorf("no WARN naming %s, unauthorized and HTTP 401:\n%s", repo, logs)
		}
	}
	if after := l.heads("acme/api", "401") + l.heads("acme/agent", "401"); after < before401+2 {
		t.Errorf("Distribution refused %d HEADs with 401, want both images refused", after-before401)
	}
	l.assertImages("with a wrong password", tag+"@"+d1, agentTag+"@"+a1)

	// Fixed again: the next tick re-images both groups (R6).
	l.setPullSecret(distribution.Password, true)
	l.writeDockerConfig(distribution.Password)
	if code, _, _ := l.itick("tick (digest change)", cfg); code != 0 {
		t.Fatalf("tick after the credentials were fixed: exit %d, want 0", code)
	}
	l.assertImages("after the credentials were fixed", tag+"@"+d2, agentTag+"@"+a2)
	l.snapshot("tick --dry-run and the wrong password")

	// status, table and JSON: read-only, but it resolves in the registry too.
	beforeStatus := l.heads("acme/api", "200")
	code, table, _ := l.irun("status (table)", "status", "--config", cfg, "--kubeconfig", l.Kubeconfig)
	if code != 0 || !strings.Contains(table, "pinned") {
		t.Errorf("status: exit %d, no pinned row:\n%s", code, table)
	}
	code, js, _ := l.irun("status (json)", "status", "--config", cfg, "--kubeconfig", l.Kubeconfig, "-o", "json")
	var rows []map[string]any
	if err := json.Unmarshal([]byte(js), &rows); code != 0 || err != nil {
		t.Errorf("status -o json: exit %d, %v:\n%s", code, err, js)
	}
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}, {"node-agent", "agent"}} {
		if r := e2e.Row(rows, w[0], w[1]); r == nil || r["state"] != "pinned" {
			t.Errorf("status row of %s/%s: %v, want state pinned", w[0], w[1], r)
		}
	}
	if n := l.heads("acme/api", "200"); n < beforeStatus+2 {
		t.Errorf("status sent %d authenticated HEADs, want one per run", n-beforeStatus)
	}

	// rearm: a locked-out group (R12 is loud) is re-armed (R18).
	l.Annotate("jobs-manager", map[string]*string{l.Key("refresh-attempt"): e2e.Ptr("3")})
	if code, _, _ := l.itick("tick (locked out)", cfg); code != cli.ExitNeedsHuman {
		t.Errorf("locked-out tick: exit %d, want %d", code, cli.ExitNeedsHuman)
	}
	if got := l.Annotations("jobs-manager")[l.Key("refresh-flap-detected")]; got != "3" {
		t.Errorf("flap marker %q, want \"3\"", got)
	}
	code, out, _ := l.irun("rearm", "rearm", "--config", cfg, "--kubeconfig", l.Kubeconfig, "--group", "control-plane")
	if code != 0 || !strings.Contains(out, "re-armed group control-plane") {
		t.Errorf("rearm: exit %d:\n%s", code, out)
	}
	for _, k := range []string{"refresh-attempt", "refresh-flap-detected"} {
		if v, ok := l.Annotations("jobs-manager")[l.Key(k)]; ok {
			t.Errorf("rearm left %s=%q", k, v)
		}
	}
	l.snapshot("status and rearm")

	// run: controller with leader election and the webhook in one process.
	// requests-proxy is the webhook's (labelled), jobs-manager fix A's.
	l.WhLabel("requests-proxy")
	extra := []string{"--poll-interval", "2s", "--poll-jitter", "0", "--leader-elect", "--leader-election-namespace", l.NS}
	ctl := l.WhStartProbed(cfg, "requests-proxy", map[string]string{"proxy": tag}, extra...)
	mwc, err := d.C.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), "image-refresh-"+l.NS, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hookURL, err := url.Parse(*mwc.Webhooks[0].ClientConfig.URL)
	if err != nil {
		t.Fatal(err)
	}
	// The argv startRun and whStartProbed build.
	l.em.add("argv of run", strings.Join(append(append([]string{"run", "--config", cfg, "--kubeconfig", l.Kubeconfig,
		"--webhook-port", hookURL.Port(), "--webhook-host", "127.0.0.1", "--webhook-config-name", mwc.Name}, extra...),
		"--metrics-addr", ctl.Metrics, "--health-addr", ctl.Health), " "))
	d3 := d.Dist.MustPushRandomImage(t, "acme/api", "prod")
	a3 := d.Dist.MustPushRandomImage(t, "acme/agent", "prod")
	// Each group's workloads, on a watch of their kind: once moved they
	// stay (nothing is pushed meanwhile).
	what := "run re-images every target to the new digests and records them"
	l.UntilDeployments(60*time.Second, what, func() bool {
		return l.Image("jobs-manager", "api") == tag+"@"+d3 && l.Image("requests-proxy", "proxy") == tag+"@"+d3 && record("Deployment", "jobs-manager", "api") == d3
	})
	l.UntilWorkload("DaemonSet", "node-agent", 60*time.Second, what, func() bool {
		return l.agentImage() == agentTag+"@"+a3 && record("DaemonSet", "node-agent", "agent") == a3
	})
	l.SetImageAs("helm", "Deployment", "jobs-manager", "api", tag)
	what = "run re-pins helm's revert of jobs-manager"
	l.UntilDeployments(20*time.Second, what, func() bool { return l.Image("jobs-manager", "api") == tag+"@"+d3 })
	l.UntilEvents(20*time.Second, what, func() bool { return e2e.HasEvent(l.Events("jobs-manager"), "Repinned", "helm") })
	// The webhook: helm's re-render of requests-proxy to the tag is stored
	// pinned to the new record, once the webhook's cache has it (which
	// announces nothing: dry runs probe it).
	testwait.Eventually(t, 20*time.Second, "the webhook pins to the new record", func() bool {
		dd, err := l.WhTry("helm", "requests-proxy", map[string]string{"proxy": tag}, true)
		return err == nil && e2e.WhImages(dd)["proxy"] == tag+"@"+d3
	})
	pins := whMetric(t, ctl, pinsSeries)
	if got := e2e.WhImages(l.WhWrite("helm", "requests-proxy", map[string]string{"proxy": tag}))["proxy"]; got != tag+"@"+d3 {
		t.Errorf("the webhook admitted helm's write as %s, want %s", got, tag+"@"+d3)
	}
	if got := whMetric(t, ctl, pinsSeries) - pins; got != 1 {
		t.Errorf("%s grew by %v, want 1", pinsSeries, got)
	}
	lease, err := d.C.Client.CoordinationV1().Leases(l.NS).Get(context.Background(), "image-refresh", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Errorf("no leader Lease in %s: %v", l.NS, err)
	}
	_, metricsBody := running.Get("http://" + ctl.Metrics + "/metrics")
	for _, want := range []string{
		`image_refresh_repins_total{cause="revert",group="control-plane",image="api"}`,
		`image_refresh_registry_requests_total{code="200",registry="` + d.Dist.Host + `"}`,
		pinsSeries,
	} {
		if !strings.Contains(metricsBody, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	l.em.add("/metrics", metricsBody)
	for _, p := range []string{"/healthz", "/readyz"} {
		code, body := running.Get("http://" + ctl.Health + p)
		if code != http.StatusOK {
			t.Errorf("%s answered %d: %s", p, code, body)
		}
		l.em.add(p, body)
	}
	l.snapshot("run")
	if took := ctl.Stop(t); ctl.Code() != 0 {
		t.Errorf("run stopped after %s with exit %d, want 0", took, ctl.Code())
	}
	l.em.add("logs of run", ctl.Logs())

	// render, directly: the recorded digest read from the cluster.
	renderCfg := l.leakConfig("          - {kind: Deployment, namespace: {{ns}}, name: web, container: web}\n")
	l.em.add("argv of render", strings.Join([]string{"render", "--config", renderCfg, "--kubeconfig", l.Kubeconfig, "--namespace", l.NS}, " "))
	code, rendered, renderLogs, _ := l.Render(l.leakManifests(), "--config", renderCfg, "--kubeconfig", l.Kubeconfig, "--namespace", l.NS)
	l.em.add("stdout of render", rendered)
	l.em.add("stderr of render", renderLogs)
	if code != 0 || strings.Count(rendered, tag+"@"+d3) != 2 {
		t.Errorf("render: exit %d, want both targets pinned to %s:\n%s\n%s", code, d3, rendered, renderLogs)
	}

	// render as Helm's post-renderer (the plugin's script on Helm 3, the
	// plugin on Helm 4), under each major, through a wrapper that records
	// the argv image-refresh runs with. The release is removed between
	// majors: both install Deployment web.
	var h *helmCLI
	for i, m := range helmMajors {
		h = newHelm(t, &env{l.Env}, m)
		dir := t.TempDir()
		argvLog, wrapper := filepath.Join(dir, "argv.log"), filepath.Join(dir, "image-refresh-argv")
		script := "#!/bin/sh\n{ printf 'argv:'; for a in \"$@\"; do printf ' %s' \"$a\"; done; printf '\\n'; } >>'" + argvLog + "'\nexec '" + h.irBin + "' \"$@\"\n"
		if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		// Helm 3 discards a post-renderer's stderr unless it fails: it runs
		// the plugin's script, which appends render's notes to
		// IMAGE_REFRESH_RENDER_LOG, as docs/post-renderer.md says to keep them.
		post := []string{"--post-renderer", "image-refresh-render"}
		if h.major < 4 {
			script, err := filepath.Abs(filepath.Join("..", "..", "..", "plugins", "image-refresh-render", "render.sh"))
			if err != nil {
				t.Fatal(err)
			}
			post = []string{"--post-renderer", script}
		}
		post = append(post, "--post-renderer-args", "--config="+renderCfg, "--post-renderer-args", "--namespace="+l.NS)
		helmEnv := []string{"IMAGE_REFRESH_BIN=" + wrapper}
		chart := webChart(t, tag)
		for _, args := range [][]string{
			append([]string{"template", "web", chart, "-n", l.NS}, post...),
			append([]string{"upgrade", "--install", "web", chart, "-n", l.NS}, post...),
		} {
			out, err := h.try(helmEnv, args...)
			if err != nil {
				t.Fatalf("%s %s: %v\n%s\npost-renderer log:\n%s", m.name, args[0], err, out, h.renderLog())
			}
			// The manifests helm template prints are the post-renderer's output.
			l.em.add("helm "+args[0]+" output (rendered manifests, "+m.name+")", out)
			if args[0] == "template" && !strings.Contains(out, "image: "+tag+"@"+d3+"\n") {
				t.Errorf("%s template with the post-renderer did not pin web:\n%s", m.name, out)
			}
		}
		l.Settle("Deployment", "web")
		if got := l.Image("web", "web"); got != tag+"@"+d3 {
			t.Errorf("%s upgrade --install with the post-renderer stored web with %s, want %s", m.name, got, tag+"@"+d3)
		}
		l.em.add("stderr of render under helm ("+m.name+")", h.renderLog())
		if !strings.Contains(h.renderLog(), "pinned to the recorded digest") {
			t.Errorf("the post-renderer under %s logged no pin:\n%s", m.name, h.renderLog())
		}
		argv, err := os.ReadFile(argvLog)
		if err != nil {
			t.Fatalf("the wrapper never ran under %s: %v", m.name, err)
		}
		lines := strings.Split(strings.TrimSpace(string(argv)), "\n")
		for _, line := range lines {
			if !strings.HasPrefix(line, "argv: render ") {
				t.Errorf("%s ran image-refresh as %q, want render and its flags", m.name, line)
			}
			l.em.add("argv of render under helm ("+m.name+")", line)
		}
		if len(lines) != 2 {
			t.Errorf("image-refresh ran %d times under %s, want 2 (template, install):\n%s", len(lines), m.name, argv)
		}
		if i < len(helmMajors)-1 {
			h.run("uninstall", "web", "-n", l.NS, "--wait")
		}
	}
	// Helm's release Secret (sh.helm.release.v1.web.v1) is not checked: it is
	// Helm's (gzip+base64 of the release), and the manifest in it is the
	// post-renderer's output, checked above as helm's output.
	l.snapshot("render")

	// The binary as a real process: version and a --dry-run tick.
	for _, args := range [][]string{{"version"}, {"tick", "--dry-run", "--config", cfg, "--kubeconfig", l.Kubeconfig}} {
		cmd := exec.Command(h.irBin, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		what := "the binary, " + args[0]
		l.em.add("argv of "+what, strings.Join(cmd.Args, " "))
		l.em.add("stdout of "+what, stdout.String())
		l.em.add("stderr of "+what, stderr.String())
		if err != nil || !strings.Contains(stdout.String(), map[string]string{"version": "image-refresh ", "tick": "group control-plane"}[args[0]]) {
			t.Errorf("%s: %v\n%s%s", what, err, stdout.String(), stderr.String())
		}
	}
	// version and --help in-process.
	for _, args := range [][]string{{"version"}, {"--help"}, {"tick", "--help"}, {"run", "--help"}, {"status", "--help"}, {"rearm", "--help"}, {"render", "--help"}} {
		code, out, _ := l.irun(strings.Join(args, " "), args...)
		if code != 0 || out == "" {
			t.Errorf("%v: exit %d, stdout %q", args, code, out)
		}
	}

	l.em.add("the test process's stderr (klog, stray prints)", stopCapture())

	// Every mode emitted something, under each Helm major too, and Events
	// of every kind were seen.
	prefixes := []string{"stderr of tick", "stdout of status", "stdout of rearm", "logs of run", "/metrics", "stdout of render",
		"stdout of version", "Event ", "events.k8s.io Event ", "Lease ", "Pod ", "ReplicaSet ", "DaemonSet ", "ControllerRevision ", "MutatingWebhookConfiguration"}
	for _, m := range helmMajors {
		prefixes = append(prefixes, "stderr of render under helm ("+m.name+")", "argv of render under helm ("+m.name+")",
			"helm template output (rendered manifests, "+m.name+")")
	}
	for _, prefix := range prefixes {
		if l.em.count(prefix) == 0 {
			t.Errorf("nothing collected from %q: the check below would be vacuous", prefix)
		}
	}
	for _, reason := range []string{"DigestChanged", "Repinned", "RefreshRearmed"} {
		if l.em.count("Event "+reason) == 0 {
			t.Errorf("no %s Event collected", reason)
		}
	}

	// R20: none of it holds a credential.
	leaks := 0
	for _, it := range l.em.items {
		for what, s := range l.needles {
			if strings.Contains(it.text, s) {
				leaks++
				t.Errorf("R20: %s appears in %s: …%s…", what, it.where, excerpt(it.text, s))
			}
		}
	}
	t.Logf("checked %d emissions for %d credential forms; %d leaks", len(l.em.items), len(l.needles), leaks)
}
