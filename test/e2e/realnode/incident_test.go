package realnode

import (
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

var incidentGroup = "groups:\n" + e2e.OneGroup("web", "api", "api", "api")

// TestRealNode_N1_TheSeedsIncidentForReal is the seed's incident on a real
// kubelet and containerd: the node pulled REG/acme/api:prod at build A, the
// registry moved the tag to build B, and a new pod on that node with
// imagePullPolicy IfNotPresent still runs A — as its own output, what it
// serves and its imageID say. image-refresh reports it running-stale,
// naming the pod and the node; after the pin the new pod runs B.
func TestRealNode_N1_TheSeedsIncidentForReal(t *testing.T) {
	w := newWorld(t)
	a := w.pushBuild("acme/api", "prod", "A")
	tag := w.host + "/acme/api:prod"
	testenv.Deployment(t, w.c.Client, w.ns, "api", testenv.WithContainer("api", tag), testenv.WithReplicas(1), testenv.OnRealNode())
	first := w.readyPod("api")
	if first.Spec.NodeName != w.c.RealNodeName() {
		t.Fatalf("pod %s landed on %s, want the real node %s", first.Name, first.Spec.NodeName, w.c.RealNodeName())
	}
	if got := w.logs(first); !strings.Contains(got, "serving build A") {
		t.Fatalf("pod %s says %q, want build A", first.Name, got)
	}

	// The registry moves :prod to B; the node keeps A under the tag.
	b := w.pushBuild("acme/api", "prod", "B")
	if err := w.c.Client.CoreV1().Pods(w.ns).Delete(t.Context(), first.Name, deleteNow()); err != nil {
		t.Fatal(err)
	}
	stale := w.readyPod("api", first.Name)
	if stale.Spec.NodeName != w.c.RealNodeName() {
		t.Fatalf("new pod %s on %s, want %s", stale.Name, stale.Spec.NodeName, w.c.RealNodeName())
	}
	if got := w.logs(stale); !strings.Contains(got, "serving build A") {
		t.Errorf("the new pod %s says %q: the node's cached :prod should have run build A", stale.Name, got)
	}
	if got := w.served(stale); got != "build A" {
		t.Errorf("the new pod %s serves %q, want build A", stale.Name, got)
	}
	if got := imageID(stale, "api"); !strings.HasSuffix(got, "@"+a) {
		t.Errorf("the new pod's imageID is %q, want …@%s (build A)", got, a)
	}

	// image-refresh sees it: the first tick records B (R5) and reports
	// the pod on A, naming the pod and the node. The config's group only:
	// the other tests' labelled workloads are not this one's business.
	cfg := w.config(incidentGroup)
	logs := w.tick(cfg, "first tick")
	if !strings.Contains(logs, "runs another build than "+b) || !strings.Contains(logs, stale.Name) || !strings.Contains(logs, w.c.RealNodeName()) {
		t.Errorf("the tick's log does not name the stale pod %s on %s and the digest %s", stale.Name, w.c.RealNodeName(), b)
	}
	row := w.statusRow(cfg, w.ns+"/api container api")
	// The cause first: the target is not on its pin yet (drifted); its
	// pod on the old build is beside it (O2).
	if want := "0/1 (" + w.c.RealNodeName() + ": " + a + ")"; !e2e.StatesAre(row, "drifted", "running-stale") || row["running"] != want {
		t.Errorf("status row %v; want drifted (+running-stale), running %s", row, want)
	}
	_, table, _ := w.run("status", "--config", cfg, "--kubeconfig", w.c.Kubeconfig, "--discovery=false")
	if want := "pod " + stale.Name + " on node " + w.c.RealNodeName() + " runs " + a; !strings.Contains(strings.Join(strings.Fields(table), " "), want) {
		t.Errorf("status does not say %q:\n%s", want, table)
	}

	// The pin: the next tick moves the template to :prod@B, and the new pod
	// on the same node runs B.
	w.tick(cfg, "pinning tick")
	pinned := w.readyPod("api", first.Name, stale.Name)
	if got := pinned.Spec.Containers[0].Image; got != tag+"@"+b {
		t.Errorf("pinned pod asks for %s, want %s@%s", got, tag, b)
	}
	if pinned.Spec.NodeName != w.c.RealNodeName() {
		t.Errorf("pinned pod on %s, want %s", pinned.Spec.NodeName, w.c.RealNodeName())
	}
	if got := w.logs(pinned); !strings.Contains(got, "serving build B") {
		t.Errorf("the pinned pod %s says %q, want build B", pinned.Name, got)
	}
	if got := w.served(pinned); got != "build B" {
		t.Errorf("the pinned pod serves %q, want build B", got)
	}
	if got := imageID(pinned, "api"); !strings.HasSuffix(got, "@"+b) {
		t.Errorf("the pinned pod's imageID is %q, want …@%s", got, b)
	}
}
