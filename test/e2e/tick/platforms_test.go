package tick

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// V3: a new digest is pinned or recorded only if it serves every platform
// the nodes its targets can run on need; otherwise the image holds its pin
// and the state is platform-missing.

var (
	amd64 = v1.Platform{OS: "linux", Architecture: "amd64"}
	arm64 = v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}
	armv7 = v1.Platform{OS: "linux", Architecture: "arm", Variant: "v7"}
)

// manifestGETs counts the GETs of repository acme/api's manifest by digest d.
func (e *env) manifestGETs(d string) int {
	return e.Reg.Count(http.MethodGet, "/v2/acme/api/manifests/"+d)
}

// addNode adds a node of another platform, by its labels, for the rest of
// the test: no kubelet plays it, and nothing schedules there (cordoned and
// tainted), but it is a node the targets can run on as far as their
// nodeSelector and node affinity tell, which is what V3 counts.
func (e *env) addNode(name, arch string) {
	e.T.Helper()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": arch}},
		Spec: corev1.NodeSpec{Unschedulable: true, Taints: []corev1.Taint{{Key: "image-refresh.test/no-kubelet", Effect: corev1.TaintEffectNoSchedule}}},
	}
	nodes := e.C.Client.CoreV1().Nodes()
	if _, err := nodes.Create(context.Background(), node, metav1.CreateOptions{}); err != nil {
		e.T.Fatalf("create node %s: %v", name, err)
	}
	e.T.Cleanup(func() { _ = nodes.Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

func TestTick_V3_AnArm64OnlyIndexOverAPinnedMultiArchIndexIsHeldOnAnAMD64Cluster(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	index := e.Reg.MustPushIndexFor(t, "acme/api", "prod", amd64, arm64)
	// The nodes (all linux/amd64) run the index's amd64 manifest, and
	// report its digest as the pods' imageID, as containerd does.
	children := e2e.IndexChildren(t, e.Repo("api")+"@"+index)
	for _, node := range e.C.NodeNames {
		if err := e.C.SetNodeImageCache(node, e.Repo("api")+"@"+index, children[0]); err != nil {
			t.Fatal(err)
		}
	}
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg)
	jobs, proxy := e.pinRows(cfg)
	for name, row := range map[string]map[string]any{"jobs-manager": jobs, "requests-proxy": proxy} {
		// N1: a pod that pulled the amd64 manifest of the pinned index runs it.
		if row["state"] != "pinned" || row["running"] != "2/2" {
			t.Fatalf("%s on the multi-arch index: state %v, running %v; want pinned, 2/2", name, row["state"], row["running"])
		}
	}

	next := e.Reg.MustPushIndexFor(t, "acme/api", "prod", arm64)
	metricsFile := filepath.Join(t.TempDir(), "metrics.prom")
	e.Reg.ResetRequests()
	code, logs := e.Tick(cfg, "--metrics-file", metricsFile)
	if code != 1 {
		t.Errorf("tick exit %d, want 1: an index without linux/amd64 on amd64 nodes needs a human", code)
	}
	if n := e.manifestGETs(next); n != 1 {
		t.Errorf("%d GETs of %s by digest in the tick, want 1: one lookup for its two targets", n, next)
	}
	lines := e2e.LogLines(logs, "ERROR", "the registry serves "+e.Repo("api")+":prod at "+next, "lacks platform(s) the nodes need: linux/amd64 (node node-",
		"jobs-manager", "requests-proxy", "it serves linux/arm64/v8", "held on the recorded digest "+index, "publish a build of "+e.Repo("api")+":prod for linux/amd64")
	if len(lines) != 1 {
		t.Errorf("want one ERROR line naming the digest, the missing platform, a node, the targets and the fix:\n%s", logs)
	}
	if !e2e.HasEvent(e.Events("jobs-manager"), "PlatformMissing", next) {
		t.Errorf("no PlatformMissing Event on the anchor naming %s: %v", next, e.Events("jobs-manager"))
	}
	prom, err := os.ReadFile(metricsFile)
	if err != nil {
		t.Fatal(err)
	}
	if want := `image_refresh_group_needs_attention{group="control-plane",reason="PlatformMissing"} 1`; !strings.Contains(string(prom), want) {
		t.Errorf("the metrics file lacks %s", want)
	}
	jobs, proxy = e.pinRows(cfg)
	for name, row := range map[string]map[string]any{"jobs-manager": jobs, "requests-proxy": proxy} {
		msg, _ := row["message"].(string)
		if row["state"] != "platform-missing" || !strings.Contains(msg, next) || !strings.Contains(msg, "linux/amd64 (node node-") {
			t.Errorf("%s: state %v (%v), want platform-missing naming %s, linux/amd64 and a node", name, row["state"], msg, next)
		}
	}
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got, want := e.Image(w[0], w[1]), e.Repo("api")+":prod@"+index; got != want {
			t.Errorf("%s runs %s, want it held on %s", w[0], got, want)
		}
	}
	if got := e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")]; got != index {
		t.Errorf("recorded %q, want the held %q", got, index)
	}

	// A build with linux/amd64 back is pinned, and its lookup is its own.
	fixed := e.Reg.MustPushIndexFor(t, "acme/api", "prod", amd64, arm64)
	e.Reg.ResetRequests()
	if code, logs := e.Tick(cfg); code != 0 || strings.Contains(logs, "lacks platform") {
		t.Errorf("tick with linux/amd64 back: exit %d, want 0 and nothing missing:\n%s", code, logs)
	}
	if n, m := e.manifestGETs(fixed), e.manifestGETs(next); n != 1 || m != 0 {
		t.Errorf("GETs by digest: %d of the fixed index, %d of the held one; want 1 and 0", n, m)
	}
	if got, want := e.Image("jobs-manager", "api"), e.Repo("api")+":prod@"+fixed; got != want {
		t.Errorf("jobs-manager runs %s, want the fixed index %s", got, want)
	}
	// The steady state looks nothing up.
	e.Reg.ResetRequests()
	if code, _ := e.Tick(cfg); code != 0 {
		t.Errorf("steady tick: exit %d, want 0", code)
	}
	if n := e.manifestGETs(fixed); n != 0 {
		t.Errorf("%d GETs of the pinned index in a steady tick, want 0", n)
	}
}

func TestTick_V3_NodesOfSeveralPlatformsAndANodeSelector(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	e.addNode("v3-arm64", "arm64")
	e.addNode("v3-arm", "arm") // containerd's default variant for it: v7
	// An index of amd64, arm64/v8 and arm/v7 serves every node.
	index := e.Reg.MustPushIndexFor(t, "acme/api", "prod", amd64, arm64, armv7)
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg)
	if got, want := e.Image("jobs-manager", "api"), e.Repo("api")+":prod@"+index; got != want {
		t.Fatalf("jobs-manager runs %s, want the index %s: it serves every node's platform", got, want)
	}

	// A single amd64 manifest (a laptop's build) is held, naming each
	// platform it lacks with its node.
	laptop := e.Reg.MustPushImageFor(t, "acme/api", "prod", amd64)
	code, logs := e.Tick(cfg)
	if code != 1 {
		t.Errorf("tick exit %d, want 1", code)
	}
	if len(e2e.LogLines(logs, "ERROR", "at "+laptop, "linux/arm64 (node v3-arm64,", "linux/arm (node v3-arm,", "it serves linux/amd64")) != 1 {
		t.Errorf("want one ERROR line naming linux/arm64 with v3-arm64 and linux/arm with v3-arm:\n%s", logs)
	}
	if got, want := e.Image("requests-proxy", "proxy"), e.Repo("api")+":prod@"+index; got != want {
		t.Errorf("requests-proxy runs %s, want it held on %s", got, want)
	}

	// Targets whose nodeSelector keeps them on amd64 nodes need only
	// linux/amd64: the same build is pinned.
	for _, name := range []string{"jobs-manager", "requests-proxy"} {
		patch := []byte(`{"spec":{"template":{"spec":{"nodeSelector":{"kubernetes.io/arch":"amd64"}}}}}`)
		if _, err := e.C.Client.AppsV1().Deployments(e.NS).Patch(context.Background(), name, "application/strategic-merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		e.Settle("Deployment", name)
	}
	if code, logs := e.Tick(cfg); code != 0 || strings.Contains(logs, "lacks platform") {
		t.Errorf("tick with the targets on amd64 nodes: exit %d, want 0 and nothing missing:\n%s", code, logs)
	}
	if got, want := e.Image("jobs-manager", "api"), e.Repo("api")+":prod@"+laptop; got != want {
		t.Errorf("jobs-manager runs %s, want the amd64 build %s", got, want)
	}
}

func TestTick_V3_ARegistryThatCannotTellThePlatformsIsAReadFailureNotAVerdict(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	index := e.Reg.MustPushIndexFor(t, "acme/api", "prod", amd64, arm64)
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg)
	next := e.Reg.MustPushIndexFor(t, "acme/api", "prod", amd64)
	for _, status := range []int{http.StatusInternalServerError, http.StatusUnauthorized} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			e := &env{e.WithT(t)}
			// Only the read of the new digest's platforms fails; the tag
			// resolves and verifies.
			e.Reg.SetFault(testregistry.Fault{PathContains: "/manifests/" + next, Method: http.MethodGet, Status: status})
			defer e.Reg.ClearFault()
			e.Reg.ResetRequests()
			code, logs := e.Tick(cfg)
			if n := e.manifestGETs(next); n != 1 {
				t.Fatalf("%d GETs of %s by digest, want 1: the lookup ran", n, next)
			}
			if code != 0 || strings.Contains(logs, "lacks platform") {
				t.Errorf("tick exit %d, want 0 and no platform-missing: HTTP %d is no verdict (a read failure below maxReadFailures)", code, status)
			}
			if len(e2e.LogLines(logs, "WARN", "read the platforms "+e.Repo("api")+"@"+next+" serves", "image skipped this tick")) != 1 {
				t.Errorf("want one WARN saying the platforms could not be read, counted as R1's:\n%s", logs)
			}
			if e2e.HasEvent(e.Events("jobs-manager"), "PlatformMissing", "") {
				t.Errorf("a PlatformMissing Event after HTTP %d", status)
			}
			if got, want := e.Image("jobs-manager", "api"), e.Repo("api")+":prod@"+index; got != want {
				t.Errorf("jobs-manager runs %s, want it still on %s", got, want)
			}
		})
	}
	// The registry answers again: the same digest is looked up and pinned.
	e.Reg.ResetRequests()
	if code, logs := e.Tick(cfg); code != 0 {
		t.Fatalf("tick after the registry recovered: exit %d:\n%s", code, logs)
	}
	if got, want := e.Image("jobs-manager", "api"), e.Repo("api")+":prod@"+next; got != want {
		t.Errorf("jobs-manager runs %s, want %s once its platforms were read", got, want)
	}
}
