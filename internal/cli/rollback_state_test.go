package cli

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/internal/statestore"
	"github.com/image-refresh/image-refresh/internal/testenv"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// R25 on the local cluster with the real `kubectl rollout undo` (the
// cluster's own kubectl binary): the undo puts the previous ReplicaSet's
// pod template and annotations back on the Deployment, and with them an
// older copy of the group's state.

// rolloutUndo runs `kubectl rollout undo deployment/NAME` and fails the
// test when it fails.
func (e *env) rolloutUndo(name string) {
	e.t.Helper()
	cmd := exec.Command(filepath.Join(e.c.BinDir, "kubectl"), "--kubeconfig", e.kubeconfig, "-n", e.ns, "rollout", "undo", "deployment/"+name)
	out, err := cmd.CombinedOutput()
	if err != nil {
		e.t.Fatalf("kubectl rollout undo deployment/%s: %v\n%s", name, err, out)
	}
	e.t.Logf("kubectl rollout undo deployment/%s: %s", name, strings.TrimSpace(string(out)))
}

// stateCopy returns the data of the copy of the state of the Deployment
// anchor (nil: there is none).
func (e *env) stateCopy(anchor string) map[string]string {
	e.t.Helper()
	name := statestore.Name(workload.Ref{Kind: "Deployment", Namespace: e.ns, Name: anchor})
	cm, err := e.c.Client.CoreV1().ConfigMaps(e.ns).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return cm.Data
}

// rewindSigns are log lines that would show the pass decided on a rewound
// anchor: the attempt the undo brought back taken for another instance's.
var rewindSigns = []string{"leaves it alone", "not finished yet", "took it over", "unfinished"}

func noRewindSigns(t *testing.T, logs string) {
	t.Helper()
	for _, s := range rewindSigns {
		if strings.Contains(logs, s) {
			t.Errorf("the pass took the state the undo put back for current (%q):\n%s", s, logs)
		}
	}
}

// R25: anchor and target jobs-manager pinned to A, then moved to B by a new
// digest; `kubectl rollout undo` puts A's ReplicaSet's annotations back
// (record A, the attempt that pinned A, no churn history). The next tick
// says so, decides on the copy: the record stays B, the churn history
// (R21) is kept, no attempt or holder of another instance is taken over,
// and the image the undo wrote is a revert like any other (R7), re-pinned
// to the record. status reads the copy too.
func TestTick_R25_RolloutUndoRewindsNoRecordAttemptOrChurnHistory(t *testing.T) {
	e := newEnv(t)
	e.clock = &testClock{now: time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)}
	a := e.seed()
	cfg := e.config("maxDigestChanges: 3\ndigestChangeWindow: 1h\n" + seedShape)
	e.pinAll(cfg)
	e.clock.Add(time.Minute)
	b := e.push("api", "prod")
	if code, _ := e.tick(cfg); code != 0 {
		t.Fatalf("tick to the new digest: exit %d", code)
	}
	pinB := e.repo("api") + ":prod@" + b
	before := e.annotations("jobs-manager")
	record, changes, attempt, holder := e.key("last-refreshed-api-digest"), e.key("digest-changes-api"), e.key("refresh-attempt"), e.key("refresh-attempt-holder")
	if before[record] != b || before[changes] == "" || e.image("jobs-manager", "api") != pinB {
		t.Fatalf("setup: record %q, churn history %q, jobs-manager on %s; want %s, a time, %s", before[record], before[changes], e.image("jobs-manager", "api"), b, pinB)
	}
	if cp := e.stateCopy("jobs-manager"); cp["last-refreshed-api-digest"] != b || cp["state-generation"] != before[e.key("state-generation")] {
		t.Fatalf("setup: the copy %v does not hold the anchor's state %v", cp, before)
	}

	e.rolloutUndo("jobs-manager")
	undone := e.annotations("jobs-manager")
	t.Logf("the anchor's annotations after the undo: %v", undone)
	// A's ReplicaSet was created while the attempt that pinned A was on
	// the anchor, and the Deployment controller never deletes a key from a
	// ReplicaSet's copy: the undo brings that attempt and its holder back.
	if undone[record] != a || undone[changes] != "" || undone[attempt] != "1" || undone[holder] == "" {
		t.Fatalf("setup: the undo did not rewind the anchor's state (record %q, churn history %q, attempt %q, holder %q), so this test proves nothing",
			undone[record], undone[changes], undone[attempt], undone[holder])
	}
	if err := testenv.WaitSettled(context.Background(), e.c.Client, "Deployment", e.ns, "jobs-manager", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// status decides on the copy: requests-proxy, untouched on B, is pinned.
	if r := row(e.status(cfg), "requests-proxy", "proxy"); r["state"] != "pinned" {
		t.Errorf("status after the undo: requests-proxy row %v, want pinned (the record is B)", r)
	}

	code, logs := e.tick(cfg)
	if code != 0 {
		t.Errorf("tick after the undo: exit %d, want 0", code)
	}
	if len(logLines(logs, "INFO", "older than their copy", "rollout undo")) == 0 {
		t.Errorf("no INFO naming the rollback:\n%s", logs)
	}
	noRewindSigns(t, logs)
	after := e.annotations("jobs-manager")
	if after[record] != b || after[changes] != before[changes] || after[attempt] != "" || after[holder] != "" {
		t.Errorf("after the tick: record %q, churn history %q, attempt %q, holder %q; want %s, %q, none, none",
			after[record], after[changes], after[attempt], after[holder], b, before[changes])
	}
	if got := e.image("jobs-manager", "api"); got != pinB {
		t.Errorf("after the tick jobs-manager on %s, want the record %s (the undo is a revert, R7)", got, pinB)
	}
	if len(logLines(logs, "INFO", "jobs-manager container api is not on the pinned digest", "image last written by kubectl")) == 0 {
		t.Errorf("the re-pin does not name kubectl as the writer of the image it replaced:\n%s", logs)
	}
	if cp := e.stateCopy("jobs-manager"); cp["last-refreshed-api-digest"] != b || cp["digest-changes-api"] != before[changes] || cp["state-generation"] != after[e.key("state-generation")] {
		t.Errorf("the copy after the tick %v does not hold the anchor's state %v", cp, after)
	}
}

// R25 for R10's lockout and R23's quarantine: a group locked out on B
// (a DaemonSet rollout that cannot finish) whose anchor Deployment is
// rolled back to a revision from before the lockout stays locked out, with
// B on its locked-on list; once a new digest re-arms it, B stays
// quarantined.
func TestTick_R25_RolloutUndoKeepsTheLockoutAndTheQuarantine(t *testing.T) {
	e := newEnv(t)
	a := e.push("agent", "prod")
	// No replicas: the anchor's own rollouts need no node while node-2 is
	// down.
	testenv.Deployment(t, e.c.Client, e.ns, "anchor", testenv.WithReplicas(0), testenv.WithContainer("app", "registry.invalid/not-managed:1"))
	testenv.DaemonSet(t, e.c.Client, e.ns, "agent", testenv.WithTolerateAll(), testenv.WithContainer("agent", e.repo("agent")+":prod"))
	e.settle("Deployment", "anchor")
	e.settle("DaemonSet", "agent")
	cfg := e.config(`rolloutTimeout: 2s
maxRefreshAttempts: 2
groups:
  - name: agents
    anchor: {kind: Deployment, namespace: {{ns}}, name: anchor}
    images:
      - name: agent
        repository: {{reg}}/acme/agent
        tag: prod
        targets:
          - {kind: DaemonSet, namespace: {{ns}}, name: agent, container: agent}
`)
	for range 2 {
		if code, _ := e.tick(cfg); code != 0 {
			t.Fatalf("setup tick exit %d", code)
		}
	}
	pin := func(d string) string { return e.repo("agent") + ":prod@" + d }
	dsImage := func() string { return e.daemonSet("agent").Spec.Template.Spec.Containers[0].Image }
	if got := dsImage(); got != pin(a) {
		t.Fatalf("setup: agent on %s, want %s", got, pin(a))
	}
	// A new revision of the anchor (its own image, not managed): the one
	// the undo goes back from.
	e.setImageAs("kubectl-set", "Deployment", "anchor", "app", "registry.invalid/not-managed:2")
	e.settle("Deployment", "anchor")

	if err := e.c.StopNodeAgent("node-2"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.NodeUp(context.Background(), "node-2") })
	b := e.push("agent", "prod")
	for range 3 {
		e.tick(cfg)
	}
	lockedOn, attempt, flap := e.key("locked-on-agent"), e.key("refresh-attempt"), e.key("refresh-flap-detected")
	locked := e.annotations("anchor")
	if locked[lockedOn] != b || locked[attempt] != "2" || locked[flap] == "" {
		t.Fatalf("setup: not locked out on %s: %v", b, locked)
	}

	e.rolloutUndo("anchor")
	undone := e.annotations("anchor")
	t.Logf("the anchor's annotations after the undo: %v", undone)
	// (The Deployment controller copies annotations into a ReplicaSet but
	// never deletes one there: an attempt since cleared comes back too.)
	if undone[lockedOn] != "" || undone[attempt] == locked[attempt] || undone[flap] != "" {
		t.Fatalf("setup: the undo did not rewind the lockout (locked-on %q, attempt %q, flap %q), so this test proves nothing", undone[lockedOn], undone[attempt], undone[flap])
	}
	e.settle("Deployment", "anchor")
	gen, img := e.daemonSet("agent").Generation, dsImage()
	code, logs := e.tick(cfg)
	if code != 1 || len(logLines(logs, "WARN", "LOCKED OUT")) == 0 || len(logLines(logs, "INFO", "older than their copy")) == 0 {
		t.Fatalf("tick after the undo: exit %d, want 1, still LOCKED OUT, with an INFO naming the rollback:\n%s", code, logs)
	}
	noRewindSigns(t, logs)
	if g := e.daemonSet("agent").Generation; g != gen || dsImage() != img {
		t.Errorf("the locked-out group was re-imaged after the undo: agent on %s (generation %d -> %d)", dsImage(), gen, g)
	}
	restored := e.annotations("anchor")
	if restored[lockedOn] != b || restored[attempt] != "2" || restored[flap] != locked[flap] {
		t.Errorf("after the tick the lockout is not back on the anchor: locked-on %q attempt %q flap %q, want %s, 2, %q",
			restored[lockedOn], restored[attempt], restored[flap], b, locked[flap])
	}

	// A new digest re-arms the group (R23) and rolls; the tag back on B:
	// B is still quarantined.
	c := e.push("agent", "prod")
	if err := e.c.NodeUp(context.Background(), "node-2"); err != nil {
		t.Fatal(err)
	}
	e.settle("DaemonSet", "agent")
	if code, logs := e.tick(cfg); code != 0 || dsImage() != pin(c) {
		t.Fatalf("tick after a new digest: exit %d, agent on %s; want 0, %s:\n%s", code, dsImage(), pin(c), logs)
	}
	e.reg.MustTag(t, "acme/agent", "prod", b)
	if code, logs := e.tick(cfg); code != 1 || len(logLines(logs, "WARN", "quarantined", b)) == 0 || dsImage() != pin(c) {
		t.Errorf("tick with the tag on %s: exit %d, agent on %s; want 1, quarantined, %s:\n%s", b, code, dsImage(), pin(c), logs)
	}
}

// R25 in `run`: the controller rolls a new digest B; `kubectl rollout undo`
// of the anchor brings A's annotations back. The controller's pass on the
// undo's watch event decides on the copy: the record B, the churn history
// and no attempt are back on the anchor at once, the undo's image is
// re-pinned to B, and nothing the undo brought back is taken for another
// instance's attempt.
func TestRun_R25_RolloutUndoRewindsNoRecordAttemptOrChurnHistory(t *testing.T) {
	e := newEnv(t)
	e.clock = &testClock{now: time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)}
	e.seed()
	cfg := e.config("maxDigestChanges: 3\ndigestChangeWindow: 1h\n" + seedShape)
	e.pinAll(cfg)
	record, changes, attempt := e.key("last-refreshed-api-digest"), e.key("digest-changes-api"), e.key("refresh-attempt")
	ctl := e.startRun(cfg, "--poll-interval", "300ms", "--poll-jitter", "0")
	ctl.waitReady(t)
	ctl.waitPasses(t, "control-plane", 0, 1)

	e.clock.Add(time.Minute)
	b := e.push("api", "prod")
	pinB := e.repo("api") + ":prod@" + b
	eventually(t, 30*time.Second, "rolled to B and recorded", func() bool {
		an := e.annotations("jobs-manager")
		return e.image("jobs-manager", "api") == pinB && e.image("requests-proxy", "proxy") == pinB && an[record] == b && an[attempt] == ""
	})
	before := e.annotations("jobs-manager")
	if before[changes] == "" {
		t.Fatalf("setup: no churn history after the move: %v", before)
	}
	// A later clock: a churn history written again would differ.
	e.clock.Add(time.Minute)

	e.rolloutUndo("jobs-manager")
	took := eventually(t, 30*time.Second, "the state back on the anchor and the undo re-pinned", func() bool {
		an := e.annotations("jobs-manager")
		return an[record] == b && an[changes] == before[changes] && an[attempt] == "" && e.image("jobs-manager", "api") == pinB
	})
	t.Logf("state restored and re-pinned %s after the undo", took.Round(time.Millisecond))
	logs := ctl.Logs()
	if len(logLines(logs, "INFO", "older than their copy", "rollout undo")) == 0 {
		t.Errorf("no INFO naming the rollback:\n%s", logs)
	}
	noRewindSigns(t, logs)
	if cp := e.stateCopy("jobs-manager"); cp["last-refreshed-api-digest"] != b || cp["digest-changes-api"] != before[changes] {
		t.Errorf("the copy %v does not hold the state", cp)
	}
}

// R25 migration: an installation from before the copies (the state only on
// the anchor, no generation, no ConfigMap) keeps all of it; the first write
// creates the copy from the anchor, and from then on an undo rewinds
// nothing.
func TestTick_R25_AnAnchorOnlyInstallationKeepsItsStateAndGainsACopy(t *testing.T) {
	e := newEnv(t)
	e.clock = &testClock{now: time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)}
	a := e.seed()
	cfg := e.config("maxDigestChanges: 3\ndigestChangeWindow: 1h\n" + seedShape)
	e.pinAll(cfg)
	// What an older release left: the anchor's annotations alone.
	name := statestore.Name(workload.Ref{Kind: "Deployment", Namespace: e.ns, Name: "jobs-manager"})
	if err := e.c.Client.CoreV1().ConfigMaps(e.ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("setup: the first ticks wrote no copy to delete: %v", err)
	}
	e.annotate("jobs-manager", map[string]*string{e.key("state-generation"): nil, e.key("digest-changes-api"): ptr("2026-12-02T11:30:00Z")})
	record, changes := e.key("last-refreshed-api-digest"), e.key("digest-changes-api")

	// A steady state: nothing to write, the anchor's state stands.
	if code, logs := e.tick(cfg); code != 0 || e.annotations("jobs-manager")[record] != a {
		t.Fatalf("tick on the anchor-only state: exit %d, record %q; want 0, %s:\n%s", code, e.annotations("jobs-manager")[record], a, logs)
	}
	// The next write creates the copy from the anchor, its history kept.
	e.clock.Add(time.Minute)
	b := e.push("api", "prod")
	if code, _ := e.tick(cfg); code != 0 {
		t.Fatalf("tick to the new digest: exit %d", code)
	}
	an := e.annotations("jobs-manager")
	if an[record] != b || !strings.HasPrefix(an[changes], "2026-12-02T11:30:00Z,") {
		t.Fatalf("after the move: record %q, churn history %q; want %s, the old entry kept and the move added", an[record], an[changes], b)
	}
	cp := e.stateCopy("jobs-manager")
	for key, v := range an {
		short, ok := strings.CutPrefix(key, e.prefix+"/")
		if ok && cp[short] != v {
			t.Errorf("the copy %v lacks the anchor's %s=%q", cp, key, v)
		}
	}

	e.rolloutUndo("jobs-manager")
	if got := e.annotations("jobs-manager")[record]; got != a {
		t.Fatalf("setup: the undo did not rewind the record (%q)", got)
	}
	if err := testenv.WaitSettled(context.Background(), e.c.Client, "Deployment", e.ns, "jobs-manager", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	code, logs := e.tick(cfg)
	noRewindSigns(t, logs)
	if after := e.annotations("jobs-manager"); code != 0 || after[record] != b || after[changes] != an[changes] {
		t.Errorf("tick after the undo: exit %d, record %q, churn history %q; want 0, %s, %q:\n%s", code, after[record], after[changes], b, an[changes], logs)
	}
}

// R25 in `run` for R10's lockout and R23's quarantine, with the anchor its
// own target: the controller locks the group out on B (its pods never
// become Ready); the operator rolls web back with `kubectl rollout undo`,
// which also puts A's annotations back (no lockout, no locked-on list).
// The controller's pass on the undo decides on the copy: the lockout and
// B's quarantine are back on the anchor, and the undo's image stays (a
// locked-out group is not re-imaged). A new digest C re-arms the group and
// rolls; the tag back on B is quarantined.
func TestRun_R25_RolloutUndoKeepsTheLockoutAndTheQuarantine(t *testing.T) {
	const gate = "lb.acme.example/target-healthy"
	e := newEnv(t)
	a := e.push("web", "prod")
	tag := e.repo("web") + ":prod"
	testenv.Deployment(t, e.c.Client, e.ns, "web", testenv.WithContainer("web", tag), testenv.WithReplicas(1),
		testenv.WithReadinessGate(gate), testenv.WithMinReadySeconds(4))
	groups := "groups:\n" + oneGroup("fixes", "web", "web", "web")
	lb := e.startGateOwner("web", gate)
	e.settle("Deployment", "web")
	e.pinAll(e.config(groups))
	cfg := e.config("rolloutTimeout: 4s\nmaxRefreshAttempts: 2\n" + groups)
	ctl := e.startRun(cfg, "--poll-interval", "1s", "--poll-jitter", "0")
	ctl.waitReady(t)

	b := e.push("web", "prod")
	lb.fail(b)
	flap, attempt, lockedOn, record := e.key("refresh-flap-detected"), e.key("refresh-attempt"), e.key("locked-on-web"), e.key("last-refreshed-web-digest")
	eventually(t, 2*time.Minute, "locked out on B after 2 attempts", func() bool {
		st := e.stateOf("web")
		return st[flap] == "2" && st[lockedOn] == b
	})
	locked := e.stateOf("web")

	e.rolloutUndo("web")
	if undone := e.annotations("web"); undone[lockedOn] == b && undone[flap] != "" {
		t.Logf("the undo left the lockout on the anchor (the controller restored it first?): %v", undone)
	}
	eventually(t, 60*time.Second, "the lockout and the quarantine back on the anchor, web on the undo's A", func() bool {
		st := e.stateOf("web")
		return st[flap] == locked[flap] && st[lockedOn] == b && st[attempt] == locked[attempt] && e.image("web", "web") == tag+"@"+a
	})
	e.settle("Deployment", "web")
	ctl.kickedPasses(t, e, "fixes", "web")
	logs := ctl.Logs()
	if len(logLines(logs, "INFO", "older than their copy", "rollout undo")) == 0 {
		t.Errorf("no INFO naming the rollback:\n%s", logs)
	}
	noRewindSigns(t, logs)
	if got := e.image("web", "web"); got != tag+"@"+a {
		t.Errorf("the locked-out group was re-imaged after the undo: web on %s, want the undo's %s", got, tag+"@"+a)
	}

	c := e.push("web", "prod")
	eventually(t, 60*time.Second, "C re-armed, rolled and recorded", func() bool {
		st := e.stateOf("web")
		return e.image("web", "web") == tag+"@"+c && st[record] == c && st[flap] == "" && st[attempt] == ""
	})
	if got := e.stateOf("web")[lockedOn]; got != b {
		t.Errorf("%s = %q after the re-arm, want %s still quarantined", lockedOn, got, b)
	}
	e.reg.MustTag(t, "acme/web", "prod", b)
	eventually(t, 60*time.Second, "the quarantine WARN naming B", func() bool {
		return len(logLines(ctl.Logs(), "WARN", "quarantined", b)) > 0
	})
	if got := e.image("web", "web"); got != tag+"@"+c {
		t.Errorf("web on %s with the tag on the quarantined B, want %s", got, tag+"@"+c)
	}
}

// R25 with D1: a labelled workload's copy of its state is written with
// its annotations, and deleted when the workload is let go, so that the
// workload, labelled again, starts over from first observation rather
// than from the state the copy would bring back.
func TestTick_R25_D1_ALetGoWorkloadLosesTheCopyOfItsState(t *testing.T) {
	e := discoveryEnv(t)
	digest := e.push("api", "prod")
	tag := e.repo("api") + ":prod"
	testenv.Deployment(t, e.c.Client, e.ns, "api", testenv.WithContainer("api", tag))
	e.settle("Deployment", "api")
	e.enable("Deployment", "api")
	cfg := e.settings()
	for i := range 2 {
		if code, _ := e.discoveryTick(cfg); code != 0 {
			t.Fatalf("tick %d exit %d, want 0", i+1, code)
		}
	}
	if cp := e.stateCopy("api"); cp["last-refreshed-api-digest"] != digest || cp["discovered-group"] == "" {
		t.Fatalf("setup: the copy %v lacks the record or the discovered-group mark", cp)
	}

	e.label("Deployment", "api", map[string]*string{e.key("enabled"): nil})
	if code, logs := e.discoveryTick(cfg); code != 0 || len(logLines(logs, "INFO", "let go", "state annotations were removed")) != 1 {
		t.Fatalf("tick after the label went: exit %d, want 0 and the let-go logged:\n%s", code, logs)
	}
	if cp := e.stateCopy("api"); cp != nil {
		t.Errorf("the copy of a let-go workload's state is still there: %v", cp)
	}
	e.enable("Deployment", "api")
	code, logs := e.discoveryTick(cfg)
	if code != 0 || len(logLines(logs, "INFO", "first observation")) != 1 {
		t.Errorf("the workload labelled again: exit %d, want 0 and a first observation (its old state gone):\n%s", code, logs)
	}
}
