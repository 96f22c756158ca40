package cli

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/internal/testenv"
)

// N1 on the local cluster, whose nodes keep an image cache like kubelets:
// the seed's incident. node-2 pulled :prod before the tag moved; a
// DaemonSet (one pod per node) on :prod runs the old build there.
const runningGroup = `groups:
  - name: fleet
    anchor: {kind: DaemonSet, namespace: {{ns}}, name: agent}
    images:
      - name: app
        repository: {{reg}}/acme/app
        tag: prod
        targets:
          - {kind: DaemonSet, namespace: {{ns}}, name: agent, container: app}
`

// statusRow runs `status -o json` and returns the row of the agent's app.
func (e *env) agentRow(cfg string) map[string]any {
	e.t.Helper()
	r := row(e.status(cfg), "agent", "app")
	if r == nil {
		e.t.Fatal("status has no row for agent/app")
	}
	return r
}

func TestTick_N1_AStaleNodeIsRunningStaleUntilThePinRollsItOut(t *testing.T) {
	e := newEnv(t)
	old := e.push("app", "prod")
	latest := e.push("app", "prod")
	tag := e.repo("app") + ":prod"
	if err := e.c.SetNodeImageCache("node-2", tag, old); err != nil {
		t.Fatal(err)
	}
	testenv.DaemonSet(t, e.c.Client, e.ns, "agent", testenv.WithContainer("app", tag), testenv.WithTolerateAll())
	e.settle("DaemonSet", "agent")
	cfg := e.config(runningGroup)
	metricsFile := filepath.Join(t.TempDir(), "metrics.prom")

	// First tick: the digest is recorded (R5), the target stays on its tag
	// and is compared with the record: node-2 runs the old build.
	code, logs := e.tick(cfg, "--metrics-file", metricsFile)
	if code != 0 {
		t.Fatalf("first tick exit %d, want 0 (failOnRunningStale is off)\n%s", code, logs)
	}
	if got := e.daemonSet("agent").Annotations[e.key("last-refreshed-app-digest")]; got != latest {
		t.Fatalf("recorded %q, want %s", got, latest)
	}
	stale := logLines(logs, "WARN", "runs another build than "+latest, "node-2", old)
	if len(stale) != 1 || !strings.Contains(stale[0], "remediation=") {
		t.Errorf("want one WARN naming node-2, the old and the recorded digest, with a remediation; got %q\n%s", stale, logs)
	}
	if v, _ := metricValue(readFile(t, metricsFile), "image_refresh_pods_off_digest", map[string]string{"workload": "agent", "container": "app"}); v != "1" {
		t.Errorf("image_refresh_pods_off_digest = %q, want 1", v)
	}
	if !hasEvent(e.events("agent"), "RunningStale", "node-2") {
		t.Errorf("no RunningStale Event naming node-2 on the anchor: %q", e.events("agent"))
	}
	r := e.agentRow(cfg)
	if r["state"] != "running-stale" || r["running"] != "2/3 (node-2: "+old+")" {
		t.Errorf("status row: state %v, running %v; want running-stale, 2/3 (node-2: %s)", r["state"], r["running"], old)
	}
	_, table, _ := e.run("status", "--config", cfg, "--kubeconfig", e.kubeconfig)
	if !strings.Contains(table, "RUNNING") || !strings.Contains(table, "2/3!") || !strings.Contains(table, "running: 2/3 (node-2:") {
		t.Errorf("status table does not show the RUNNING column and the pod off the digest:\n%s", table)
	}

	// An operator who wants it loud: the same state exits 1.
	strict := e.config("failOnRunningStale: true\n" + runningGroup)
	if code, logs := e.tick(strict, "--dry-run"); code != 1 {
		t.Errorf("tick --dry-run with failOnRunningStale: exit %d, want 1\n%s", code, logs)
	}

	// Second tick pins: the new pods ask for the digest, every node runs it.
	if code, logs := e.tick(cfg, "--metrics-file", metricsFile); code != 0 {
		t.Fatalf("pinning tick exit %d\n%s", code, logs)
	}
	e.settle("DaemonSet", "agent")
	r = e.agentRow(cfg)
	if r["state"] != "pinned" || r["running"] != "3/3" {
		t.Errorf("after the pin: state %v, running %v; want pinned, 3/3", r["state"], r["running"])
	}
	code, logs = e.tick(cfg, "--metrics-file", metricsFile)
	if code != 0 || len(logLines(logs, "WARN", "runs another build")) != 0 {
		t.Errorf("a tick after the pin: exit %d, still reports a stale pod:\n%s", code, logs)
	}
	if v, _ := metricValue(readFile(t, metricsFile), "image_refresh_pods_off_digest", map[string]string{"workload": "agent", "container": "app"}); v != "0" {
		t.Errorf("image_refresh_pods_off_digest after the pin = %q, want 0", v)
	}
}

func TestTick_N1_APlatformManifestOfAPinnedIndexIsOnTheDigestAndARuntimeWithoutRepoDigestIsUnknown(t *testing.T) {
	e := newEnv(t)
	index := e.reg.MustPushRandomIndex(t, "acme/app", "prod", 2)
	platforms := indexPlatforms(t, e.repo("app")+"@"+index)
	tag := e.repo("app") + ":prod"
	pinned := tag + "@" + index
	// Every node runs the first platform manifest for the index.
	for _, node := range []string{"node-1", "node-2", "node-3"} {
		if err := e.c.SetNodeImageCache(node, e.repo("app")+"@"+index, platforms[0]); err != nil {
			t.Fatal(err)
		}
	}
	testenv.DaemonSet(t, e.c.Client, e.ns, "agent", testenv.WithContainer("app", pinned), testenv.WithTolerateAll())
	e.settle("DaemonSet", "agent")
	cfg := e.config(runningGroup)
	e.tick(cfg)
	r := e.agentRow(cfg)
	if r["state"] != "pinned" || r["running"] != "3/3" {
		t.Fatalf("a multi-arch pin whose pods report a platform manifest: state %v, running %v; want pinned, 3/3", r["state"], r["running"])
	}

	// A runtime that reports only an image ID: unknown, never a match.
	pods, err := e.c.Client.CoreV1().Pods(e.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=agent"})
	if err != nil || len(pods.Items) != 3 {
		t.Fatalf("pods: %v, %d", err, len(pods.Items))
	}
	p := pods.Items[0]
	p.Status.ContainerStatuses[0].ImageID = "sha256:" + strings.Repeat("d", 64)
	if _, err := e.c.Client.CoreV1().Pods(e.ns).UpdateStatus(context.Background(), &p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	code, logs := e.tick(cfg)
	r = e.agentRow(cfg)
	if code != 0 || r["state"] != "pinned" || r["running"] != "2/3 (1 unknown)" {
		t.Errorf("exit %d, state %v, running %v; want 0, pinned, 2/3 (1 unknown)", code, r["state"], r["running"])
	}
	if n := len(logLines(logs, "INFO", "NOTE:", "without a repository digest")); n != 1 {
		t.Errorf("%d NOTE lines about the unknown pod, want 1:\n%s", n, logs)
	}
}

// indexPlatforms lists the platform manifests of an image index.
func indexPlatforms(t *testing.T, ref string) []string {
	t.Helper()
	d, err := name.NewDigest(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(d)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, desc := range m.Manifests {
		out = append(out, desc.Digest.String())
	}
	return out
}

// In `run` the pods come from the informer cache (no LIST per pass): the
// stale node is reported on /metrics and as an Event, and the steady state
// stays free of API requests (TestRun_C6_SteadyStateMakesNoAPIRequest).
func TestRun_N1_AStaleNodeIsReportedFromTheCache(t *testing.T) {
	e := newEnv(t)
	old := e.push("app", "prod")
	latest := e.push("app", "prod")
	tag := e.repo("app") + ":prod"
	if err := e.c.SetNodeImageCache("node-3", tag, old); err != nil {
		t.Fatal(err)
	}
	testenv.DaemonSet(t, e.c.Client, e.ns, "agent", testenv.WithContainer("app", tag), testenv.WithTolerateAll())
	e.settle("DaemonSet", "agent")
	cfg := e.config(runningGroup)
	e.tick(cfg) // records latest; the target stays on its tag

	ctl := e.startRun(cfg, "--poll-interval", "1h")
	ctl.waitReady(t)
	ctl.waitPasses(t, "fleet", 0, 1)
	off := func() string {
		_, body := get("http://" + ctl.metrics + "/metrics")
		v, _ := metricValue(body, "image_refresh_pods_off_digest", map[string]string{"namespace": e.ns, "workload": "agent", "container": "app"})
		return v
	}
	// The first pass reports what runs and pins (the tick recorded the
	// digest): the Event names the stale node.
	eventually(t, 60*time.Second, "a RunningStale Event naming node-3", func() bool {
		return hasEvent(e.events("agent"), "RunningStale", "node-3")
	})
	eventually(t, 60*time.Second, "pinned", func() bool {
		return e.daemonSet("agent").Spec.Template.Spec.Containers[0].Image == tag+"@"+latest
	})
	// The rollout's end is a watch event and a pass: no pod off the digest.
	e.settle("DaemonSet", "agent")
	eventually(t, 60*time.Second, "image_refresh_pods_off_digest back to 0 once every pod runs the pin", func() bool {
		return off() == "0"
	})
	if v := off(); v != "0" {
		t.Errorf("image_refresh_pods_off_digest = %q", v)
	}
}

// A node that goes down and comes back: while it is NotReady the
// DaemonSet is not settled and the group skips (R4); once it is back the
// harness's node re-reports its pod Ready (a kubelet does), the DaemonSet
// settles again, and the next tick moves the group on by itself, with no
// rearm.
func TestTick_R4_N1_AGroupSkippingForANodeThatWasDownResumesByItself(t *testing.T) {
	e := newEnv(t)
	e.push("app", "prod")
	tag := e.repo("app") + ":prod"
	testenv.DaemonSet(t, e.c.Client, e.ns, "agent", testenv.WithContainer("app", tag), testenv.WithTolerateAll())
	e.settle("DaemonSet", "agent")
	cfg := e.config(runningGroup)
	e.pinAll(cfg)

	ctx := context.Background()
	if err := e.c.NodeDown(ctx, "node-3"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.NodeUp(context.Background(), "node-3") })
	eventually(t, 2*time.Minute, "the DaemonSet counts node-3's pod unavailable", func() bool {
		ds := e.daemonSet("agent")
		return ds.Status.NumberAvailable < ds.Status.DesiredNumberScheduled
	})
	next := e.push("app", "prod")
	code, logs := e.tick(cfg)
	if code != 0 || !strings.Contains(logs, "not settled") {
		t.Fatalf("tick with node-3 down: exit %d, want 0 and a not-settled skip:\n%s", code, logs)
	}
	if got := e.daemonSet("agent").Annotations[e.key("refresh-skip-streak")]; got != "1" {
		t.Errorf("skip streak %q, want 1", got)
	}

	if err := e.c.NodeUp(ctx, "node-3"); err != nil {
		t.Fatal(err)
	}
	e.settle("DaemonSet", "agent")
	if code, logs := e.tick(cfg); code != 0 {
		t.Fatalf("tick after node-3 came back: exit %d\n%s", code, logs)
	}
	ds := e.daemonSet("agent")
	if got := ds.Spec.Template.Spec.Containers[0].Image; got != tag+"@"+next {
		t.Errorf("after node-3 came back the group did not move on by itself: %s, want %s@%s", got, tag, next)
	}
	if _, has := ds.Annotations[e.key("refresh-skip-streak")]; has || ds.Annotations[e.key("last-refreshed-app-digest")] != next {
		t.Errorf("skip streak %q left, record %q; want cleared and %s", ds.Annotations[e.key("refresh-skip-streak")], ds.Annotations[e.key("last-refreshed-app-digest")], next)
	}
}
