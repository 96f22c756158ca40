package realnode

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// initGroup pins the app container and its migration, an init container
// of the same image.
var initGroup = "groups:\n" + e2e.OneGroup("web", "api", "api", "api") +
	"          - {kind: Deployment, namespace: {{ns}}, name: api, container: migrate}\n"

// TestRealNode_K1_N1_TheSeedsIncidentInAnInitContainer is the seed's
// incident where it does the most damage, on a real kubelet and
// containerd: the migration runs as an init container from the app's own
// repo:prod. The node cached build A; the registry moved :prod to B; a
// new pod on that node runs the *old migration* (its own log says build
// A) before the app. image-refresh reports the init container
// running-stale from its finished status' imageID, and after the pin the
// next pod's migration says build B.
func TestRealNode_K1_N1_TheSeedsIncidentInAnInitContainer(t *testing.T) {
	w := newWorld(t)
	a := w.pushBuild("acme/api", "prod", "A")
	tag := w.host + "/acme/api:prod"
	testenv.Deployment(t, w.c.Client, w.ns, "api", testenv.WithContainer("api", tag), testenv.WithInitContainer("migrate", tag),
		testenv.WithReplicas(1), testenv.OnRealNode())
	// The migration exits 0 once it has said which build it is.
	patch := `{"spec":{"template":{"spec":{"initContainers":[{"name":"migrate","env":[{"name":"EXIT_CODE","value":"0"}]}]}}}}`
	if _, err := w.c.Client.AppsV1().Deployments(w.ns).Patch(context.Background(), "api", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	first := w.readyPod("api")
	if got := w.initLogs(first, "migrate"); !strings.Contains(got, "build A exits 0") {
		t.Fatalf("pod %s's migration says %q, want build A", first.Name, got)
	}

	b := w.pushBuild("acme/api", "prod", "B")
	if err := w.c.Client.CoreV1().Pods(w.ns).Delete(t.Context(), first.Name, deleteNow()); err != nil {
		t.Fatal(err)
	}
	stale := w.readyPod("api", first.Name)
	if got := w.initLogs(stale, "migrate"); !strings.Contains(got, "build A exits 0") {
		t.Fatalf("the new pod %s's migration says %q: the node's cached :prod should have run build A", stale.Name, got)
	}
	if got := initImageID(stale, "migrate"); !strings.HasSuffix(got, "@"+a) {
		t.Errorf("the migration's imageID is %q, want …@%s (build A)", got, a)
	}

	cfg := w.config(initGroup)
	logs := w.tick(cfg, "first tick")
	if !strings.Contains(logs, "init container migrate runs another build than "+b) || !strings.Contains(logs, stale.Name) {
		t.Errorf("the tick's log does not name the init container's stale pod %s and the digest %s", stale.Name, b)
	}
	row := w.statusRow(cfg, w.ns+"/api init container migrate")
	// The cause first: the init container is not on its pin yet
	// (drifted); its pod on the old build is beside it (O2).
	if want := "0/1 (" + w.c.RealNodeName() + ": " + a + ")"; !e2e.StatesAre(row, "drifted", "running-stale") || row["running"] != want {
		t.Errorf("status row of the init container %v; want drifted (+running-stale), running %s", row, want)
	}

	// The pin: the next pod on the same node runs the migration of B.
	w.tick(cfg, "pinning tick")
	pinned := w.readyPod("api", first.Name, stale.Name)
	if got := pinned.Spec.InitContainers[0].Image; got != tag+"@"+b {
		t.Errorf("the pinned pod's migration asks for %s, want %s@%s", got, tag, b)
	}
	if got := w.initLogs(pinned, "migrate"); !strings.Contains(got, "build B exits 0") {
		t.Errorf("the pinned pod %s's migration says %q, want build B", pinned.Name, got)
	}
	if got := initImageID(pinned, "migrate"); !strings.HasSuffix(got, "@"+b) {
		t.Errorf("the pinned migration's imageID is %q, want …@%s", got, b)
	}
}

// initLogs is an init container's own output, read through the kubelet.
func (w *world) initLogs(p *corev1.Pod, container string) string {
	w.t.Helper()
	b, err := w.c.Client.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: container}).DoRaw(context.Background())
	if err != nil {
		w.t.Fatalf("logs of init container %s of pod %s: %v", container, p.Name, err)
	}
	return string(b)
}

func initImageID(p *corev1.Pod, container string) string {
	for _, s := range p.Status.InitContainerStatuses {
		if s.Name == container {
			return s.ImageID
		}
	}
	return ""
}
