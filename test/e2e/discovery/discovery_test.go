package discovery

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httputil"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/image-refresh/image-refresh/internal/cli"
	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/running"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

// settings is a config with settings and no groups: discovery only.
func (e *env) settings() string { return e.Config("") }

// defaultServiceAccount waits until the namespace's ServiceAccount default
// exists (the ServiceAccount controller creates it), on a watch.
func (e *env) defaultServiceAccount() {
	e.T.Helper()
	sas := e.C.Client.CoreV1().ServiceAccounts(e.NS)
	e.UntilWatched(30*time.Second, "the namespace's default ServiceAccount", func(ctx context.Context) (watch.Interface, error) {
		return sas.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=default"})
	}, func() bool {
		_, err := sas.Get(context.Background(), "default", metav1.GetOptions{})
		return err == nil
	})
}

// object reads a workload of any kind through the product's own reader.
func (e *env) object(kind, name string) *workload.Object {
	e.T.Helper()
	obj, err := workload.New(e.C.Client, 10*time.Second).Get(context.Background(), config.Workload{Kind: kind, Namespace: e.NS, Name: name})
	if err != nil {
		e.T.Fatal(err)
	}
	return obj
}

func (e *env) imageOf(kind, name, container string) string {
	e.T.Helper()
	c, ok := e.object(kind, name).Container(container)
	if !ok {
		e.T.Fatalf("%s %s has no container %s", kind, name, container)
	}
	return c.Image
}

func TestTick_D1_ALabelledDeploymentIsPinnedWithItsTagKept(t *testing.T) {
	e := &env{e2e.DiscoveryEnv(t)}
	digest := e.Push("api", "prod")
	tag := e.Repo("api") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "api", testenv.WithContainer("api", tag))
	e.Settle("Deployment", "api")
	// The configured groups' pins drop the tag; a discovered target's keep it.
	cfg := e.Config("pinFormat: digest\n")

	// Not labelled: not managed. This tick runs discovery and finds nothing.
	if code, _ := e.DiscoveryTick(cfg); code != 0 {
		t.Fatalf("tick without a labelled workload exit %d, want 0", code)
	}
	if a := e.Annotations("api"); a[e.Key("last-refreshed-api-digest")] != "" {
		t.Fatalf("an unlabelled workload was recorded: %v", a)
	}

	e.Enable("Deployment", "api")
	if code, _ := e.DiscoveryTick(cfg); code != 0 {
		t.Fatalf("first tick exit %d, want 0", code)
	}
	if got := e.Annotations("api")[e.Key("last-refreshed-api-digest")]; got != digest {
		t.Fatalf("first observation on the discovered anchor recorded %q, want %q", got, digest)
	}
	if code, _ := e.DiscoveryTick(cfg); code != 0 {
		t.Fatalf("second tick exit %d, want 0", code)
	}
	// D1: the tag survives the pin, so the target stays discoverable.
	if got, want := e.Image("api", "api"), tag+"@"+digest; got != want {
		t.Fatalf("labelled Deployment runs %s, want %s", got, want)
	}
	// And it is still discovered with its pin: a steady tick writes nothing.
	rv := e.Deployment("api").ResourceVersion
	if code, _ := e.DiscoveryTick(cfg); code != 0 {
		t.Fatalf("steady tick exit %d", code)
	}
	if got := e.Deployment("api").ResourceVersion; got != rv {
		t.Errorf("a pinned discovered workload was written again (resourceVersion %s -> %s)", rv, got)
	}
}

func TestTick_D1_ALabelledNamespaceIsManagedGroupsJoinAndIgnoredContainersAreLeftAlone(t *testing.T) {
	e := &env{e2e.DiscoveryEnv(t)}
	api := e.Push("api", "prod")
	db := e.Push("db", "prod")
	job := e.Push("job", "prod")
	side := "example.invalid/side:v1" // unresolvable: a tick that touched it would fail
	group := map[string]string{e.Key("group"): "front"}
	testenv.Deployment(t, e.C.Client, e.NS, "a-api", testenv.WithContainer("api", e.Repo("api")+":prod"), testenv.WithAnnotations(group))
	testenv.StatefulSet(t, e.C.Client, e.NS, "b-db", testenv.WithContainer("db", e.Repo("db")+":prod"), testenv.WithAnnotations(group))
	testenv.CronJob(t, e.C.Client, e.NS, "nightly", testenv.WithContainer("job", e.Repo("job")+":prod"), testenv.WithContainer("side", side),
		testenv.WithAnnotations(map[string]string{e.Key("ignore-containers"): "side"}))
	e.Settle("Deployment", "a-api")
	e.Settle("StatefulSet", "b-db")
	cfg := e.settings()

	e.Label("Namespace", e.NS, map[string]*string{e.Key("enabled"): e2e.Ptr("true")})
	for i := range 2 {
		if code, _ := e.DiscoveryTick(cfg); code != 0 {
			t.Fatalf("tick %d exit %d, want 0", i+1, code)
		}
		_ = testenv.WaitSettled(context.Background(), e.C.Client, "StatefulSet", e.NS, "b-db", 30*time.Second)
	}
	for _, w := range []struct{ kind, name, container, want string }{
		{"Deployment", "a-api", "api", e.Repo("api") + ":prod@" + api},
		{"StatefulSet", "b-db", "db", e.Repo("db") + ":prod@" + db},
		{"CronJob", "nightly", "job", e.Repo("job") + ":prod@" + job},
		{"CronJob", "nightly", "side", side},
	} {
		if got := e.imageOf(w.kind, w.name, w.container); got != w.want {
			t.Errorf("%s %s container %s runs %s, want %s", w.kind, w.name, w.container, got, w.want)
		}
	}
	// P/group joined a-api and b-db: the first is the anchor and holds both
	// records; b-db holds none.
	anchor := e.object("Deployment", "a-api").Annotations
	for _, img := range []string{"api", "db"} {
		if anchor[e.Key("last-refreshed-"+img+"-digest")] == "" {
			t.Errorf("anchor a-api has no record of %s: %v", img, anchor)
		}
	}
	for k := range e.object("StatefulSet", "b-db").Annotations {
		if len(k) > len(e.Prefix) && k[:len(e.Prefix)] == e.Prefix && k != e.Key("group") {
			t.Errorf("b-db, not the anchor, carries state %s", k)
		}
	}

	// D3: status with no groups lists every discovered target by its full name.
	rows := e.statusRows("--config", cfg, "--watch-namespaces", e.NS)
	for _, w := range [][2]string{{"a-api", "api"}, {"b-db", "db"}, {"nightly", "job"}} {
		r := e2e.Row(rows, w[0], w[1])
		if r == nil {
			t.Errorf("status lists no row for %s/%s: %v", w[0], w[1], rows)
			continue
		}
		if r["state"] != "pinned" {
			t.Errorf("status row of %s/%s: state %v, want pinned", w[0], w[1], r["state"])
		}
	}
	if r := e2e.Row(rows, "nightly", "side"); r != nil {
		t.Errorf("status lists the ignored container: %v", r)
	}
	if r := e2e.Row(rows, "a-api", "api"); r != nil && r["group"] != e.NS+"/front" {
		t.Errorf("a-api's group is %v, want %s", r["group"], e.NS+"/front")
	}
}

// statusRows runs `status -o json` with args and decodes its rows.
func (e *env) statusRows(args ...string) []map[string]any {
	e.T.Helper()
	code, out, errOut := e.Run(append([]string{"status", "--kubeconfig", e.Kubeconfig, "-o", "json"}, args...)...)
	if code != 0 {
		e.T.Fatalf("status exit %d:\n%s", code, errOut)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		e.T.Fatalf("status -o json is not a JSON list: %v\n%s", err, out)
	}
	return rows
}

func TestRun_D1_LabelAdoptsNamespaceLabelAdoptsRevertIsRepinnedAndUnlabelLetsGo(t *testing.T) {
	e := &env{e2e.DiscoveryEnv(t)}
	api := e.Push("api", "prod")
	db := e.Push("db", "prod")
	testenv.Deployment(t, e.C.Client, e.NS, "api", testenv.WithContainer("api", e.Repo("api")+":prod"))
	testenv.StatefulSet(t, e.C.Client, e.NS, "db", testenv.WithContainer("db", e.Repo("db")+":prod"))
	e.Settle("Deployment", "api")
	e.Settle("StatefulSet", "db")
	group := e.NS + "/deployment/api"

	ctl := e.StartRun(e.settings(), "--poll-interval", "1h", "--watch-namespaces", e.NS)
	ctl.WaitReady(t)

	// A label alone adopts the Deployment: the first pass records (R5) …
	e.Enable("Deployment", "api")
	e.UntilDeployments(20*time.Second, "labelled Deployment recorded", func() bool {
		return e.Annotations("api")[e.Key("last-refreshed-api-digest")] == api
	})
	if a := e.object("StatefulSet", "db").Annotations; a[e.Key("last-refreshed-db-digest")] != "" {
		t.Fatalf("the unlabelled StatefulSet was managed: %v", a)
	}
	// … and the next one pins it, its tag kept (D1).
	pinned := e.Repo("api") + ":prod@" + api
	from := ctl.Passes(t, group)
	e.Kick("api")
	ctl.WaitPasses(t, group, from, 1)
	e.UntilDeployments(20*time.Second, "labelled Deployment pinned", func() bool { return e.Image("api", "api") == pinned })
	e.Settle("Deployment", "api")

	// C1 holds for a discovered group as for a configured one.
	e.SetImageAs("helm", "Deployment", "api", "api", e.Repo("api")+":prod")
	took := e.UntilDeployments(10*time.Second, "revert of a discovered target re-pinned", func() bool { return e.Image("api", "api") == pinned })
	t.Logf("revert re-pinned after %s", took.Round(time.Millisecond))

	// Labelling the namespace adopts its other workloads, from a cache of
	// that namespace started when the label is seen.
	e.Label("Namespace", e.NS, map[string]*string{e.Key("enabled"): e2e.Ptr("true")})
	e.UntilWorkload("StatefulSet", "db", 20*time.Second, "StatefulSet of the labelled namespace recorded", func() bool {
		return e.object("StatefulSet", "db").Annotations[e.Key("last-refreshed-db-digest")] == db
	})

	// Both groups report their gauges while managed …
	groups := []string{group, e.NS + "/statefulset/db"}
	gauges := []string{"image_refresh_target_on_digest", "image_refresh_group_locked_out", "image_refresh_last_tick_timestamp_seconds"}
	// present lists the gauges of the two groups /metrics serves.
	present := func() (out []string) {
		_, body := running.Get("http://" + ctl.Metrics + "/metrics")
		for _, g := range groups {
			for _, m := range gauges {
				if v, ok := running.MetricValue(body, m, map[string]string{"group": g}); ok {
					out = append(out, fmt.Sprintf("%s{group=%q} = %s", m, g, v))
				}
			}
		}
		return out
	}
	testwait.Eventually(t, 20*time.Second, "gauges of both discovered groups", func() bool { return len(present()) == len(groups)*len(gauges) })

	// Label removed: let go. The pin stays, the state annotations go, and
	// the log says so.
	e.Label("Namespace", e.NS, map[string]*string{e.Key("enabled"): nil})
	e.Label("Deployment", "api", map[string]*string{e.Key("enabled"): nil})
	for _, w := range [][2]string{{"Deployment", "api"}, {"StatefulSet", "db"}} {
		e.UntilWorkload(w[0], w[1], 20*time.Second, w[0]+" "+w[1]+" let go", func() bool {
			for k := range e.object(w[0], w[1]).Annotations {
				if strings.HasPrefix(k, e.Prefix+"/") {
					return false
				}
			}
			return true
		})
	}
	if got := e.Image("api", "api"); got != pinned {
		t.Errorf("let go changed the image to %s, want the pin %s kept", got, pinned)
	}
	// … and none once let go (D2): a group nobody manages any more must not
	// keep its last state, and a locked-out 1 would page forever. The
	// gauges go before the annotations.
	for _, s := range present() {
		t.Errorf("%s after the let-go, want the series gone", s)
	}
	if n := len(e2e.LogLines(ctl.Logs(), "INFO", "let go", "state annotations were removed")); n < 2 {
		t.Errorf("let go logged %d times, want once per workload:\n%s", n, ctl.Logs())
	}
}

// D1, D2: a container newly listed in ignore-containers leaves the
// discovered group, and its target series leave /metrics with it; the
// group's other target keeps its series.
func TestRun_D1_D2_AContainerNewlyIgnoredLeavesNoTargetSeries(t *testing.T) {
	e := &env{e2e.DiscoveryEnv(t)}
	e.Push("api", "prod")
	e.Push("side", "prod")
	testenv.Deployment(t, e.C.Client, e.NS, "web",
		testenv.WithContainer("api", e.Repo("api")+":prod"), testenv.WithContainer("side", e.Repo("side")+":prod"))
	e.Settle("Deployment", "web")
	group := e.NS + "/deployment/web"
	ctl := e.StartRun(e.settings(), "--poll-interval", "1h", "--watch-namespaces", e.NS)
	ctl.WaitReady(t)
	e.Enable("Deployment", "web")

	has := func(body, container string) bool {
		_, ok := running.MetricValue(body, "image_refresh_target_on_digest", map[string]string{"group": group, "container": container})
		return ok
	}
	testwait.Eventually(t, 20*time.Second, "target series of both containers", func() bool {
		_, body := running.Get("http://" + ctl.Metrics + "/metrics")
		return has(body, "api") && has(body, "side")
	})

	from := ctl.Passes(t, group)
	e.Annotate("web", map[string]*string{e.Key("ignore-containers"): e2e.Ptr("side")})
	ctl.WaitPasses(t, group, from, 1) // the pass over the group without side
	testwait.Eventually(t, 20*time.Second, "side's target series gone", func() bool {
		_, body := running.Get("http://" + ctl.Metrics + "/metrics")
		return !has(body, "side")
	})
	_, body := running.Get("http://" + ctl.Metrics + "/metrics")
	if !has(body, "api") {
		t.Errorf("the group's remaining target api lost its series too:\n%s", body)
	}
}

// TestStatus_D3_KubectlPluginListsEveryManagedTargetWithoutAConfig builds
// the binary as kubectl-image_refresh and runs it through kubectl, with no
// config file: every managed target of the cluster (in scope: this test's
// namespace) is listed from the cluster, and no name is cut.
func TestStatus_D3_KubectlPluginListsEveryManagedTargetWithoutAConfig(t *testing.T) {
	e := newEnv(t) // the default prefix: what a config-less status reads
	// Unlabelled before the namespace goes, so that no other test's
	// cluster-wide discovery sees a namespace being deleted.
	t.Cleanup(func() {
		_, _ = e.C.Client.CoreV1().Namespaces().Patch(context.Background(), e.NS, types.MergePatchType,
			[]byte(`{"metadata":{"labels":{"image-refresh.io/enabled":null}}}`), metav1.PatchOptions{})
	})
	digest := e.Push("api", "prod")
	long := "a-deployment-with-a-name-longer-than-any-column"
	testenv.Deployment(t, e.C.Client, e.NS, long, testenv.WithContainer("application-container", e.Repo("api")+":prod"))
	testenv.Deployment(t, e.C.Client, e.NS, "unmanaged", testenv.WithContainer("app", e.Repo("api")+":prod"),
		testenv.WithAnnotations(map[string]string{"image-refresh.io/ignore-containers": "app"}))
	e.Settle("Deployment", long)
	e.Label("Namespace", e.NS, map[string]*string{"image-refresh.io/enabled": e2e.Ptr("true")})
	cfg := e.settings() // the registry's TLS setting alone, for the ticks
	for range 2 {
		e.DiscoveryTick(cfg)
	}
	if got, want := e.Image(long, "application-container"), e.Repo("api")+":prod@"+digest; got != want {
		t.Fatalf("setup: %s runs %s, want %s", long, got, want)
	}

	bin := e2e.BuildImageRefresh(t)
	dir := t.TempDir()
	plugin := filepath.Join(dir, "kubectl-image_refresh")
	if err := os.Link(bin, plugin); err != nil {
		t.Fatal(err)
	}
	kubectl := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(e.C.BinDir, "kubectl"), args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+e.Kubeconfig, "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if help := kubectl("image-refresh", "status", "--help"); !strings.Contains(help, "kubectl image-refresh status") {
		t.Errorf("the plugin's help does not name itself kubectl image-refresh:\n%s", help)
	}
	out := kubectl("image-refresh", "status", "--watch-namespaces", e.NS)
	t.Logf("kubectl image-refresh status:\n%s", out)
	group := e.NS + "/deployment/" + long
	found := false
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 6 && f[0] == group {
			found = true
			if f[2] != long+"/application-container" || f[3] != "pinned" {
				t.Errorf("row %q: want TARGET %s/application-container, state pinned", l, long)
			}
		}
		if strings.Contains(l, "unmanaged") {
			t.Errorf("the ignored container is listed: %q", l)
		}
	}
	if !found {
		t.Errorf("no row for group %s, its name whole", group)
	}
	wide := kubectl("image-refresh", "status", "--watch-namespaces", e.NS, "-o", "wide")
	if !strings.Contains(wide, digest) || !strings.Contains(wide, e.NS) {
		t.Errorf("-o wide lacks the namespace or the full digest:\n%s", wide)
	}
}

// TestRender_D1_ALabelledWorkloadIsRenderedPinned: a re-render of a
// labelled workload comes out pinned to its recorded digest, as a
// configured target's does (B2 for a discovered group), its tag kept; an
// unlabelled workload's is written as read.
func TestRender_D1_ALabelledWorkloadIsRenderedPinned(t *testing.T) {
	e, digest, tag := labelledAPI(t)
	cfg := e.settings()
	e.DiscoveryTick(cfg) // records
	manifest := func(name string) string {
		return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: %s
  namespace: %s
spec:
  template:
    spec:
      containers:
        - name: api
          image: %s
`, name, e.NS, tag)
	}
	stream := manifest("api") + "---\n" + manifest("other")
	var out, errOut bytes.Buffer
	root := cli.NewRoot(&out, &errOut)
	root.SetIn(strings.NewReader(stream))
	root.SetArgs([]string{"render", "--config", cfg, "--kubeconfig", e.Kubeconfig, "--watch-namespaces", e.NS})
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("render: %v\n%s", err, errOut.String())
	}
	t.Logf("render log:\n%s", errOut.String())
	want := strings.Replace(stream, "image: "+tag+"\n", "image: "+tag+"@"+digest+"\n", 1)
	if out.String() != want {
		t.Errorf("render wrote\n%s\nwant (only the labelled workload's image pinned)\n%s", out.String(), want)
	}
}

// TestWebhook_D1_B1_AReRenderOfALabelledWorkloadIsPinnedAtAdmission: the
// webhook pins the targets discovery found, as it pins configured ones.
func TestWebhook_D1_B1_AReRenderOfALabelledWorkloadIsPinnedAtAdmission(t *testing.T) {
	e, tag, pinned, cfg := webhookedAPI(t)
	// whStartProbed waits until a dry-run re-render of api comes back
	// pinned: before discovery's first pass the webhook knows no group.
	e.WhStartProbed(cfg, "api", map[string]string{"api": tag}, "--poll-interval", "1h", "--watch-namespaces", e.NS)
	stored := e.WhWrite("helm", "api", map[string]string{"api": tag})
	if got := e2e.WhImages(stored)["api"]; got != pinned {
		t.Fatalf("helm's re-render to %s was stored as %s, want %s", tag, got, pinned)
	}
}

// TestTick_D1_ADiscoveredWorkloadResolvesWithItsServiceAccountsPullSecrets:
// a registry that needs credentials is asked with the imagePullSecrets of
// the pods' ServiceAccount, as the kubelet pulls, when the pod template
// lists none.
func TestTick_D1_ADiscoveredWorkloadResolvesWithItsServiceAccountsPullSecrets(t *testing.T) {
	e := &env{e2e.DiscoveryEnv(t)}
	const user, pass = "puller", "s3cret-for-the-service-account"
	e.Reg = testregistry.Start(t, testregistry.WithBasicAuth(user, pass))
	digest := e.Push("api", "prod")
	e.DockerConfigSecret("regcred", e.Reg.Host(), user, pass, false)
	testenv.Deployment(t, e.C.Client, e.NS, "api", testenv.WithContainer("api", e.Repo("api")+":prod"))
	e.Settle("Deployment", "api")
	e.Enable("Deployment", "api")
	cfg := e.settings()

	// Without the ServiceAccount's secret the registry refuses: not recorded.
	e.DiscoveryTick(cfg)
	if got := e.Annotations("api")[e.Key("last-refreshed-api-digest")]; got != "" {
		t.Fatalf("recorded %s without credentials", got)
	}
	ctx := context.Background()
	sas := e.C.Client.CoreV1().ServiceAccounts(e.NS)
	e.defaultServiceAccount()
	if _, err := sas.Patch(ctx, "default", types.MergePatchType, []byte(`{"imagePullSecrets":[{"name":"regcred"}]}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if code, logs := e.DiscoveryTick(cfg); code != 0 || strings.Contains(logs, pass) {
		t.Fatalf("tick exit %d (want 0), or the password in its logs:\n%s", code, logs)
	}
	if got := e.Annotations("api")[e.Key("last-refreshed-api-digest")]; got != digest {
		t.Errorf("recorded %q with the ServiceAccount's pull secret, want %s", got, digest)
	}
}

// TestRun_D1_C6_ADiscoveredWorkloadResolvesWithItsServiceAccountsPullSecretsFromTheCache:
// `run` resolves a discovered workload with its pods' ServiceAccount's
// imagePullSecrets as tick does, but reads the ServiceAccount from its
// informer cache (a list and a watch), never with a GET: a steady state
// makes no API request for it (C6).
func TestRun_D1_C6_ADiscoveredWorkloadResolvesWithItsServiceAccountsPullSecretsFromTheCache(t *testing.T) {
	e := &env{e2e.DiscoveryEnv(t)}
	const user, pass = "puller", "s3cret-for-the-service-account"
	e.Reg = testregistry.Start(t, testregistry.WithBasicAuth(user, pass))
	digest := e.Push("api", "prod")
	e.DockerConfigSecret("regcred", e.Reg.Host(), user, pass, false)
	testenv.Deployment(t, e.C.Client, e.NS, "api", testenv.WithContainer("api", e.Repo("api")+":prod"))
	e.Settle("Deployment", "api")
	ctx := context.Background()
	sas := e.C.Client.CoreV1().ServiceAccounts(e.NS)
	e.defaultServiceAccount()
	if _, err := sas.Patch(ctx, "default", types.MergePatchType, []byte(`{"imagePullSecrets":[{"name":"regcred"}]}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var reads []string // the controller's requests for ServiceAccounts
	_, kubeconfig := e.StartAPIProxy("kubeconfig-sa", make(chan struct{}), func(w http.ResponseWriter, r *http.Request, rp *httputil.ReverseProxy) {
		if strings.Contains(r.URL.Path, "/serviceaccounts") {
			mu.Lock()
			reads = append(reads, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery)
			mu.Unlock()
		}
		rp.ServeHTTP(w, r)
	})
	ctl := e.StartRun(e.settings(), "--kubeconfig", kubeconfig, "--poll-interval", "1s", "--watch-namespaces", e.NS)
	ctl.WaitReady(t)
	e.Enable("Deployment", "api")
	e.UntilDeployments(30*time.Second, "recorded with the ServiceAccount's pull secret", func() bool {
		return e.Annotations("api")[e.Key("last-refreshed-api-digest")] == digest
	})
	// A few more polls, each of which rebuilds the keychain (its TTL is the
	// poll interval) and so reads the ServiceAccount again.
	from := e.Reg.Count("HEAD", "/v2/acme/api/manifests/prod")
	e.Reg.Await(t, "three more polls", func() bool {
		return e.Reg.Count("HEAD", "/v2/acme/api/manifests/prod") >= from+3
	})
	mu.Lock()
	defer mu.Unlock()
	if len(reads) == 0 {
		t.Fatal("the controller read no ServiceAccount through the proxy: the check below would prove nothing")
	}
	for _, r := range reads {
		if strings.HasPrefix(r, "GET ") && strings.Contains(r, "/serviceaccounts/") {
			t.Errorf("the controller read a ServiceAccount with a GET, not from its cache: %s (all: %v)", r, reads)
		}
	}
	if logs := ctl.Logs(); strings.Contains(logs, pass) {
		t.Errorf("the password is in the controller's logs:\n%s", logs)
	}
}

// TestTick_D1_R15_ADiscoveryThatCannotListIsLoudAndTheConfiguredGroupsStillRun:
// an identity with the explicit form's RBAC only cannot list for
// discovery: the tick says so (ERROR with the remediation, exit 1) and the
// configured groups still get their pass.
func TestTick_D1_R15_ADiscoveryThatCannotListIsLoudAndTheConfiguredGroupsStillRun(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	kubeconfig, _ := e.LimitedKubeconfig("jobs-manager", "requests-proxy")
	code, _, logs := e.Run("tick", "--config", cfg, "--kubeconfig", kubeconfig)
	t.Logf("tick exit %d:\n%s", code, logs)
	if code != 1 {
		t.Errorf("exit %d, want 1: discovery failed", code)
	}
	if len(e2e.LogLines(logs, "ERROR", "discovery failed", "forbidden", "--discovery=false")) == 0 {
		t.Errorf("no ERROR naming the failed discovery, the denial and the remedy:\n%s", logs)
	}
	if got := e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")]; got != digest {
		t.Errorf("the configured group did not get its pass: record %q, want %s", got, digest)
	}
}

// TestTick_D1_ALabelRemovedLetsTheWorkloadGoItsPinStaysAndAConfiguredGroupKeepsItsAnchor:
// a tick lets go of a discovered workload whose label was removed, as run
// does: its pin stays, its state annotations go, and the log says so. A
// workload that was discovered and is now named by a configured group
// keeps its state (configured groups win, D2).
func TestTick_D1_ALabelRemovedLetsTheWorkloadGoItsPinStaysAndAConfiguredGroupKeepsItsAnchor(t *testing.T) {
	e := &env{e2e.DiscoveryEnv(t)}
	digest := e.Push("api", "prod")
	tag := e.Repo("api") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "api", testenv.WithContainer("api", tag))
	testenv.Deployment(t, e.C.Client, e.NS, "claimed", testenv.WithContainer("api", tag))
	e.Settle("Deployment", "api")
	e.Settle("Deployment", "claimed")
	e.Enable("Deployment", "api")
	e.Enable("Deployment", "claimed")
	cfg := e.settings()
	for i := range 2 {
		if code, _ := e.DiscoveryTick(cfg); code != 0 {
			t.Fatalf("tick %d exit %d, want 0", i+1, code)
		}
	}
	pinned := tag + "@" + digest
	for _, name := range []string{"api", "claimed"} {
		if got := e.Image(name, "api"); got != pinned {
			t.Fatalf("setup: %s runs %s, want %s", name, got, pinned)
		}
		if a := e.Annotations(name); a[e.Key("last-refreshed-api-digest")] != digest || a[e.Key("discovered-group")] == "" {
			t.Fatalf("setup: %s has no record or no discovered-group mark: %v", name, a)
		}
	}

	// Both labels go; a config now names "claimed" as its group's anchor.
	e.Label("Deployment", "api", map[string]*string{e.Key("enabled"): nil})
	e.Label("Deployment", "claimed", map[string]*string{e.Key("enabled"): nil})
	cfg = e.Config("groups:\n" + e2e.OneGroup("explicit", "api", "claimed", "api"))
	code, logs := e.DiscoveryTick(cfg)
	if code != 0 {
		t.Fatalf("tick after the labels went: exit %d, want 0", code)
	}
	for k := range e.Annotations("api") {
		if strings.HasPrefix(k, e.Prefix+"/") {
			t.Errorf("api was not let go: it still carries %s", k)
		}
	}
	if got := e.Image("api", "api"); got != pinned {
		t.Errorf("let go changed the image to %s, want the pin %s kept", got, pinned)
	}
	if n := len(e2e.LogLines(logs, "INFO", "let go", "state annotations were removed", "Deployment "+e.NS+"/api\"")); n != 1 {
		t.Errorf("let go of api logged %d times, want once", n)
	}
	// The configured group's pass would record again what a let-go
	// removed; the mark and the log show that nothing was removed.
	if n := len(e2e.LogLines(logs, "INFO", "let go", "Deployment "+e.NS+"/claimed\"")); n != 0 {
		t.Errorf("the configured group's anchor was let go (%d log lines): a configured group wins", n)
	}
	if a := e.Annotations("claimed"); a[e.Key("discovered-group")] == "" || a[e.Key("last-refreshed-api-digest")] != digest {
		t.Errorf("the configured group's anchor lost its state: %v", a)
	}
}

// TestWebhook_D1_B1_C3_AStandbyReplicasWebhookPinsADiscoveredTarget: the
// webhook of a replica that does not lead knows the discovered groups too
// (its discovery runs without leadership; only its writes wait for it), so
// a re-render of a labelled workload is stored pinned whichever replica the
// API server asks.
func TestWebhook_D1_B1_C3_AStandbyReplicasWebhookPinsADiscoveredTarget(t *testing.T) {
	e, tag, pinned, cfg := webhookedAPI(t)

	elect := []string{"--poll-interval", "1h", "--watch-namespaces", e.NS,
		"--leader-elect", "--leader-election-namespace", e.NS, "--leader-election-lease-duration", "3s"}
	leader := e.StartRun(cfg, elect...) // serves no webhook
	holder := func() string {
		l, err := e.C.Client.CoordinationV1().Leases(e.NS).Get(context.Background(), "image-refresh", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	e.UntilWatched(30*time.Second, "a leader", func(ctx context.Context) (watch.Interface, error) {
		return e.C.Client.CoordinationV1().Leases(e.NS).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=image-refresh"})
	}, func() bool { return holder() != "" })
	leader.WaitReady(t)
	first := holder()

	// The standby serves the webhook alone: whStartProbed returns once a
	// dry-run re-render of api comes back pinned through it.
	e.WhStartProbed(cfg, "api", map[string]string{"api": tag}, elect...)
	stored := e.WhWrite("helm", "api", map[string]string{"api": tag})
	if got := e2e.WhImages(stored)["api"]; got != pinned {
		t.Errorf("helm's re-render to %s was stored as %s through the standby's webhook, want %s", tag, got, pinned)
	}
	if h := holder(); h != first {
		t.Fatalf("the Lease moved from %q to %q: the webhook's replica was not a standby throughout", first, h)
	}
}

// C2, D1: once discovery lets go of the last group that uses an image,
// `run` stops asking the registry for it; the images other groups use are
// still polled.
func TestRun_C2_D1_AnImageNoGroupUsesAnyMoreIsNoLongerPolled(t *testing.T) {
	e := &env{e2e.DiscoveryEnv(t)}
	digests := map[string]string{}
	for _, name := range []string{"api", "web"} { // Deployment name = container = repo
		digests[name] = e.Push(name, "prod")
		testenv.Deployment(t, e.C.Client, e.NS, name, testenv.WithContainer(name, e.Repo(name)+":prod"))
		e.Settle("Deployment", name)
	}
	ctl := e.StartRun(e.settings(), "--poll-interval", "1s", "--watch-namespaces", e.NS)
	ctl.WaitReady(t)
	for name, digest := range digests {
		e.Enable("Deployment", name)
		e.UntilDeployments(20*time.Second, name+" recorded", func() bool {
			return e.Annotations(name)[e.Key("last-refreshed-"+name+"-digest")] == digest
		})
	}
	// asks counts the registry's manifest requests for repo:prod.
	asks := func(repo string) int {
		p := "/v2/acme/" + repo + "/manifests/prod"
		return e.Reg.Count("HEAD", p) + e.Reg.Count("GET", p)
	}
	// twoMorePolls waits until the poller asked for web twice more: a
	// poll of api that was already on its way has been answered by then.
	twoMorePolls := func(what string) {
		from := asks("web")
		e.Reg.Await(t, what, func() bool { return asks("web") >= from+2 })
	}
	twoMorePolls("web polled while api is managed")
	if asks("api") == 0 {
		t.Fatal("api was never polled while managed: the check below would prove nothing")
	}

	e.Label("Deployment", "api", map[string]*string{e.Key("enabled"): nil})
	e.UntilDeployments(20*time.Second, "api let go", func() bool {
		return e.Annotations("api")[e.Key("last-refreshed-api-digest")] == ""
	})
	twoMorePolls("web polled after the let-go")
	before := asks("api")
	twoMorePolls("web polled twice more")
	if after := asks("api"); after != before {
		t.Errorf("api was asked %d more times after its only group was let go, while web was polled twice; want none", after-before)
	}
}

// labelledAPI is a discovery env with Deployment api on acme/api:prod,
// settled and labelled for discovery; it returns the env, the digest of
// acme/api:prod and the tag.
func labelledAPI(t *testing.T) (e *env, digest, tag string) {
	e = &env{e2e.DiscoveryEnv(t)}
	digest = e.Push("api", "prod")
	tag = e.Repo("api") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "api", testenv.WithContainer("api", tag))
	e.Settle("Deployment", "api")
	e.Enable("Deployment", "api")
	return e, digest, tag
}

// webhookedAPI is labelledAPI pinned by two discovery ticks (the setup
// fails unless api runs the pinned reference) and labelled for the test's
// MutatingWebhookConfiguration; it returns the env, the tag, the pinned
// reference and the settings' config.
func webhookedAPI(t *testing.T) (e *env, tag, pinned, cfg string) {
	t.Helper()
	e, digest, tag := labelledAPI(t)
	pinned = tag + "@" + digest
	cfg = e.settings()
	e.DiscoveryTick(cfg)
	e.DiscoveryTick(cfg)
	if got := e.Image("api", "api"); got != pinned {
		t.Fatalf("setup: api runs %s, want %s", got, pinned)
	}
	e.WhLabel("api")
	return e, tag, pinned, cfg
}
