package run

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/running"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

// N1 on the local cluster, whose nodes keep an image cache like kubelets:
// the seed's incident. node-2 pulled :prod before the tag moved; a
// DaemonSet (one pod per node) on :prod runs the old build there.
var runningGroup = e2e.Groups(e2e.GroupOf("fleet", "DaemonSet", "agent",
	e2e.ImageOf("app", "app", "prod", e2e.Target("DaemonSet", "agent", "app"))))

// statusRow runs `status -o json` and returns the row of the agent's app.
func (e *env) agentRow(cfg string) map[string]any {
	e.T.Helper()
	r := e2e.Row(e.Status(cfg), "agent", "app")
	if r == nil {
		e.T.Fatal("status has no row for agent/app")
	}
	return r
}

func TestTick_N1_AStaleNodeIsRunningStaleUntilThePinRollsItOut(t *testing.T) {
	e := newEnv(t)
	old := e.Push("app", "prod")
	latest := e.Push("app", "prod")
	tag := e.Repo("app") + ":prod"
	if err := e.C.SetNodeImageCache("node-2", tag, old); err != nil {
		t.Fatal(err)
	}
	testenv.DaemonSet(t, e.C.Client, e.NS, "agent", testenv.WithContainer("app", tag), testenv.WithTolerateAll())
	e.Settle("DaemonSet", "agent")
	cfg := e.Config(runningGroup)
	metricsFile := filepath.Join(t.TempDir(), "metrics.prom")

	// First tick: the digest is recorded (R5), the target stays on its tag
	// and is compared with the record: node-2 runs the old build.
	code, logs := e.Tick(cfg, "--metrics-file", metricsFile)
	if code != 0 {
		t.Fatalf("first tick exit %d, want 0 (failOnRunningStale is off)\n%s", code, logs)
	}
	if got := e.DaemonSet("agent").Annotations[e.Key("last-refreshed-app-digest")]; got != latest {
		t.Fatalf("recorded %q, want %s", got, latest)
	}
	stale := e2e.LogLines(logs, "WARN", "runs another build than "+latest, "node-2", old)
	if len(stale) != 1 || !strings.Contains(stale[0], "remediation=") {
		t.Errorf("want one WARN naming node-2, the old and the recorded digest, with a remediation; got %q\n%s", stale, logs)
	}
	if v, _ := running.MetricValue(e2e.ReadFile(t, metricsFile), "image_refresh_pods_off_digest", map[string]string{"workload": "agent", "container": "app"}); v != "1" {
		t.Errorf("image_refresh_pods_off_digest = %q, want 1", v)
	}
	if !e2e.HasEvent(e.Events("agent"), "RunningStale", "node-2") {
		t.Errorf("no RunningStale Event naming node-2 on the anchor: %q", e.Events("agent"))
	}
	r := e.agentRow(cfg)
	// The cause first: the target is not on its pin yet (drifted); its
	// pods on the old build are beside it (O2).
	if !e2e.StatesAre(r, "drifted", "running-stale") || r["running"] != "2/3 (node-2: "+old+")" {
		t.Errorf("status row: states %v, running %v; want drifted (+running-stale), 2/3 (node-2: %s)", e2e.States(r), r["running"], old)
	}
	_, table, _ := e.Run("status", "--config", cfg, "--kubeconfig", e.Kubeconfig)
	if !strings.Contains(table, "RUNNING") || !strings.Contains(table, "2/3!") || !strings.Contains(table, "running: 2/3 (node-2:") {
		t.Errorf("status table does not show the RUNNING column and the pod off the digest:\n%s", table)
	}

	// An operator who wants it loud: the same state exits 1.
	strict := e.Config("failOnRunningStale: true\n" + runningGroup)
	if code, logs := e.Tick(strict, "--dry-run"); code != 1 {
		t.Errorf("tick --dry-run with failOnRunningStale: exit %d, want 1\n%s", code, logs)
	}

	// Second tick pins: the new pods ask for the digest, every node runs it.
	if code, logs := e.Tick(cfg, "--metrics-file", metricsFile); code != 0 {
		t.Fatalf("pinning tick exit %d\n%s", code, logs)
	}
	e.Settle("DaemonSet", "agent")
	r = e.agentRow(cfg)
	if r["state"] != "pinned" || r["running"] != "3/3" {
		t.Errorf("after the pin: state %v, running %v; want pinned, 3/3", r["state"], r["running"])
	}
	code, logs = e.Tick(cfg, "--metrics-file", metricsFile)
	if code != 0 || len(e2e.LogLines(logs, "WARN", "runs another build")) != 0 {
		t.Errorf("a tick after the pin: exit %d, still reports a stale pod:\n%s", code, logs)
	}
	if v, _ := running.MetricValue(e2e.ReadFile(t, metricsFile), "image_refresh_pods_off_digest", map[string]string{"workload": "agent", "container": "app"}); v != "0" {
		t.Errorf("image_refresh_pods_off_digest after the pin = %q, want 0", v)
	}
}

func TestTick_N1_APlatformManifestOfAPinnedIndexIsOnTheDigestAndARuntimeWithoutRepoDigestIsUnknown(t *testing.T) {
	e := newEnv(t)
	index := e.Reg.MustPushRandomIndex(t, "acme/app", "prod", 2)
	platforms := e2e.IndexChildren(t, e.Repo("app")+"@"+index)
	tag := e.Repo("app") + ":prod"
	pinned := tag + "@" + index
	// Every node runs the first platform manifest for the index.
	for _, node := range []string{"node-1", "node-2", "node-3"} {
		if err := e.C.SetNodeImageCache(node, e.Repo("app")+"@"+index, platforms[0]); err != nil {
			t.Fatal(err)
		}
	}
	testenv.DaemonSet(t, e.C.Client, e.NS, "agent", testenv.WithContainer("app", pinned), testenv.WithTolerateAll())
	e.Settle("DaemonSet", "agent")
	cfg := e.Config(runningGroup)
	e.Tick(cfg)
	r := e.agentRow(cfg)
	if r["state"] != "pinned" || r["running"] != "3/3" {
		t.Fatalf("a multi-arch pin whose pods report a platform manifest: state %v, running %v; want pinned, 3/3", r["state"], r["running"])
	}

	// A runtime that reports only an image ID: unknown, never a match.
	pods, err := e.C.Client.CoreV1().Pods(e.NS).List(context.Background(), metav1.ListOptions{LabelSelector: "app=agent"})
	if err != nil || len(pods.Items) != 3 {
		t.Fatalf("pods: %v, %d", err, len(pods.Items))
	}
	p := pods.Items[0]
	p.Status.ContainerStatuses[0].ImageID = "sha256:" + strings.Repeat("d", 64)
	if _, err := e.C.Client.CoreV1().Pods(e.NS).UpdateStatus(context.Background(), &p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	code, logs := e.Tick(cfg)
	r = e.agentRow(cfg)
	if code != 0 || r["state"] != "pinned" || r["running"] != "2/3 (1 unknown)" {
		t.Errorf("exit %d, state %v, running %v; want 0, pinned, 2/3 (1 unknown)", code, r["state"], r["running"])
	}
	if n := len(e2e.LogLines(logs, "INFO", "NOTE:", "without a repository digest")); n != 1 {
		t.Errorf("%d NOTE lines about the unknown pod, want 1:\n%s", n, logs)
	}
}

// In `run` the pods come from the informer cache (no LIST per pass): the
// stale node is reported on /metrics and as an Event, and the steady state
// stays free of API requests (TestRun_C6_SteadyStateMakesNoAPIRequest).
func TestRun_N1_AStaleNodeIsReportedFromTheCache(t *testing.T) {
	e := newEnv(t)
	old := e.Push("app", "prod")
	latest := e.Push("app", "prod")
	tag := e.Repo("app") + ":prod"
	if err := e.C.SetNodeImageCache("node-3", tag, old); err != nil {
		t.Fatal(err)
	}
	testenv.DaemonSet(t, e.C.Client, e.NS, "agent", testenv.WithContainer("app", tag), testenv.WithTolerateAll())
	e.Settle("DaemonSet", "agent")
	cfg := e.Config(runningGroup)
	e.Tick(cfg) // records latest; the target stays on its tag

	ctl := e.StartRun(cfg, "--poll-interval", "1h")
	ctl.WaitReady(t)
	ctl.WaitPasses(t, "fleet", 0, 1)
	off := func() string {
		_, body := running.Get("http://" + ctl.Metrics + "/metrics")
		v, _ := running.MetricValue(body, "image_refresh_pods_off_digest", map[string]string{"namespace": e.NS, "workload": "agent", "container": "app"})
		return v
	}
	// The first pass reports what runs and pins (the tick recorded the
	// digest): the Event names the stale node.
	e.UntilEvents(60*time.Second, "a RunningStale Event naming node-3", func() bool {
		return e2e.HasEvent(e.Events("agent"), "RunningStale", "node-3")
	})
	e.UntilWorkload("DaemonSet", "agent", 60*time.Second, "pinned", func() bool {
		return e.DaemonSet("agent").Spec.Template.Spec.Containers[0].Image == tag+"@"+latest
	})
	// The rollout's end is a watch event and a pass: no pod off the digest.
	e.Settle("DaemonSet", "agent")
	// A metric announces nothing: polled.
	testwait.Eventually(t, 60*time.Second, "image_refresh_pods_off_digest back to 0 once every pod runs the pin", func() bool {
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
	e.Push("app", "prod")
	tag := e.Repo("app") + ":prod"
	testenv.DaemonSet(t, e.C.Client, e.NS, "agent", testenv.WithContainer("app", tag), testenv.WithTolerateAll())
	e.Settle("DaemonSet", "agent")
	cfg := e.Config(runningGroup)
	e.PinAll(cfg)

	ctx := context.Background()
	if err := e.C.NodeDown(ctx, "node-3"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.C.NodeUp(context.Background(), "node-3") })
	e.UntilWorkload("DaemonSet", "agent", 2*time.Minute, "the DaemonSet counts node-3's pod unavailable", func() bool {
		ds := e.DaemonSet("agent")
		return ds.Status.NumberAvailable < ds.Status.DesiredNumberScheduled
	})
	next := e.Push("app", "prod")
	code, logs := e.Tick(cfg)
	if code != 0 || !strings.Contains(logs, "not settled") {
		t.Fatalf("tick with node-3 down: exit %d, want 0 and a not-settled skip:\n%s", code, logs)
	}
	if got := e.DaemonSet("agent").Annotations[e.Key("refresh-skip-streak")]; got != "1" {
		t.Errorf("skip streak %q, want 1", got)
	}

	if err := e.C.NodeUp(ctx, "node-3"); err != nil {
		t.Fatal(err)
	}
	e.Settle("DaemonSet", "agent")
	if code, logs := e.Tick(cfg); code != 0 {
		t.Fatalf("tick after node-3 came back: exit %d\n%s", code, logs)
	}
	ds := e.DaemonSet("agent")
	if got := ds.Spec.Template.Spec.Containers[0].Image; got != tag+"@"+next {
		t.Errorf("after node-3 came back the group did not move on by itself: %s, want %s@%s", got, tag, next)
	}
	if _, has := ds.Annotations[e.Key("refresh-skip-streak")]; has || ds.Annotations[e.Key("last-refreshed-app-digest")] != next {
		t.Errorf("skip streak %q left, record %q; want cleared and %s", ds.Annotations[e.Key("refresh-skip-streak")], ds.Annotations[e.Key("last-refreshed-app-digest")], next)
	}
}
