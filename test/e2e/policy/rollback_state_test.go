package policy

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/statestore"
	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// R25 on the local cluster with the real `kubectl rollout undo` (the
// cluster's own kubectl binary): the undo puts the previous ReplicaSet's
// pod template and annotations back on the Deployment, and with them an
// older copy of the group's state. (A discovered workload's copy:
// test/e2e/discovery.)

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
	e.Clock = e2e.NewClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	a := e.Seed()
	cfg := e.Config("maxDigestChanges: 3\ndigestChangeWindow: 1h\n" + e2e.SeedShape)
	e.PinAll(cfg)
	e.Clock.Add(time.Minute)
	b := e.Push("api", "prod")
	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("tick to the new digest: exit %d", code)
	}
	pinB := e.Repo("api") + ":prod@" + b
	before := e.Annotations("jobs-manager")
	record, changes, attempt, holder := e.Key("last-refreshed-api-digest"), e.Key("digest-changes-api"), e.Key("refresh-attempt"), e.Key("refresh-attempt-holder")
	if before[record] != b || before[changes] == "" || e.Image("jobs-manager", "api") != pinB {
		t.Fatalf("setup: record %q, churn history %q, jobs-manager on %s; want %s, a time, %s", before[record], before[changes], e.Image("jobs-manager", "api"), b, pinB)
	}
	if cp := e.StateCopy("jobs-manager"); cp["last-refreshed-api-digest"] != b || cp["state-generation"] != before[e.Key("state-generation")] {
		t.Fatalf("setup: the copy %v does not hold the anchor's state %v", cp, before)
	}

	e.RolloutUndo("jobs-manager")
	undone := e.Annotations("jobs-manager")
	t.Logf("the anchor's annotations after the undo: %v", undone)
	// A's ReplicaSet was created while the attempt that pinned A was on
	// the anchor, and the Deployment controller never deletes a key from a
	// ReplicaSet's copy: the undo brings that attempt and its holder back.
	if undone[record] != a || undone[changes] != "" || undone[attempt] != "1" || undone[holder] == "" {
		t.Fatalf("setup: the undo did not rewind the anchor's state (record %q, churn history %q, attempt %q, holder %q), so this test proves nothing",
			undone[record], undone[changes], undone[attempt], undone[holder])
	}
	if err := testenv.WaitSettled(context.Background(), e.C.Client, "Deployment", e.NS, "jobs-manager", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// status decides on the copy: requests-proxy, untouched on B, is pinned.
	if r := e2e.Row(e.Status(cfg), "requests-proxy", "proxy"); r["state"] != "pinned" {
		t.Errorf("status after the undo: requests-proxy row %v, want pinned (the record is B)", r)
	}

	code, logs := e.Tick(cfg)
	if code != 0 {
		t.Errorf("tick after the undo: exit %d, want 0", code)
	}
	if len(e2e.LogLines(logs, "INFO", "older than their copy", "rollout undo")) == 0 {
		t.Errorf("no INFO naming the rollback:\n%s", logs)
	}
	noRewindSigns(t, logs)
	after := e.Annotations("jobs-manager")
	if after[record] != b || after[changes] != before[changes] || after[attempt] != "" || after[holder] != "" {
		t.Errorf("after the tick: record %q, churn history %q, attempt %q, holder %q; want %s, %q, none, none",
			after[record], after[changes], after[attempt], after[holder], b, before[changes])
	}
	if got := e.Image("jobs-manager", "api"); got != pinB {
		t.Errorf("after the tick jobs-manager on %s, want the record %s (the undo is a revert, R7)", got, pinB)
	}
	if len(e2e.LogLines(logs, "INFO", "jobs-manager container api is not on the pinned digest", "image last written by kubectl")) == 0 {
		t.Errorf("the re-pin does not name kubectl as the writer of the image it replaced:\n%s", logs)
	}
	if cp := e.StateCopy("jobs-manager"); cp["last-refreshed-api-digest"] != b || cp["digest-changes-api"] != before[changes] || cp["state-generation"] != after[e.Key("state-generation")] {
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
	// No replicas: the anchor's own rollouts need no node while node-2 is
	// down.
	_, cfg, pin, dsImage := agentsGroup(t, e, testenv.WithReplicas(0))
	// A new revision of the anchor (its own image, not managed): the one
	// the undo goes back from.
	e.SetImageAs("kubectl-set", "Deployment", "anchor", "app", "registry.invalid/not-managed:2")
	e.Settle("Deployment", "anchor")

	if err := e.C.StopNodeAgent("node-2"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.C.NodeUp(context.Background(), "node-2") })
	b := e.Push("agent", "prod")
	for range 3 {
		e.Tick(cfg)
	}
	lockedOn, attempt, flap := e.Key("locked-on-agent"), e.Key("refresh-attempt"), e.Key("refresh-flap-detected")
	locked := e.Annotations("anchor")
	if locked[lockedOn] != b || locked[attempt] != "2" || locked[flap] == "" {
		t.Fatalf("setup: not locked out on %s: %v", b, locked)
	}

	e.RolloutUndo("anchor")
	undone := e.Annotations("anchor")
	t.Logf("the anchor's annotations after the undo: %v", undone)
	// (The Deployment controller copies annotations into a ReplicaSet but
	// never deletes one there: an attempt since cleared comes back too.)
	if undone[lockedOn] != "" || undone[attempt] == locked[attempt] || undone[flap] != "" {
		t.Fatalf("setup: the undo did not rewind the lockout (locked-on %q, attempt %q, flap %q), so this test proves nothing", undone[lockedOn], undone[attempt], undone[flap])
	}
	e.Settle("Deployment", "anchor")
	gen, img := e.DaemonSet("agent").Generation, dsImage()
	code, logs := e.Tick(cfg)
	if code != 1 || len(e2e.LogLines(logs, "WARN", "LOCKED OUT")) == 0 || len(e2e.LogLines(logs, "INFO", "older than their copy")) == 0 {
		t.Fatalf("tick after the undo: exit %d, want 1, still LOCKED OUT, with an INFO naming the rollback:\n%s", code, logs)
	}
	noRewindSigns(t, logs)
	if g := e.DaemonSet("agent").Generation; g != gen || dsImage() != img {
		t.Errorf("the locked-out group was re-imaged after the undo: agent on %s (generation %d -> %d)", dsImage(), gen, g)
	}
	restored := e.Annotations("anchor")
	if restored[lockedOn] != b || restored[attempt] != "2" || restored[flap] != locked[flap] {
		t.Errorf("after the tick the lockout is not back on the anchor: locked-on %q attempt %q flap %q, want %s, 2, %q",
			restored[lockedOn], restored[attempt], restored[flap], b, locked[flap])
	}

	// A new digest re-arms the group (R23) and rolls; the tag back on B:
	// B is still quarantined.
	c := e.Push("agent", "prod")
	if err := e.C.NodeUp(context.Background(), "node-2"); err != nil {
		t.Fatal(err)
	}
	e.Settle("DaemonSet", "agent")
	if code, logs := e.Tick(cfg); code != 0 || dsImage() != pin(c) {
		t.Fatalf("tick after a new digest: exit %d, agent on %s; want 0, %s:\n%s", code, dsImage(), pin(c), logs)
	}
	e.Reg.MustTag(t, "acme/agent", "prod", b)
	if code, logs := e.Tick(cfg); code != 1 || len(e2e.LogLines(logs, "WARN", "quarantined", b)) == 0 || dsImage() != pin(c) {
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
	e.Clock = e2e.NewClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	e.Seed()
	cfg := e.Config("maxDigestChanges: 3\ndigestChangeWindow: 1h\n" + e2e.SeedShape)
	e.PinAll(cfg)
	record, changes, attempt := e.Key("last-refreshed-api-digest"), e.Key("digest-changes-api"), e.Key("refresh-attempt")
	ctl := e.StartRun(cfg, "--poll-interval", "300ms", "--poll-jitter", "0")
	ctl.WaitReady(t)
	ctl.WaitPasses(t, "control-plane", 0, 1)

	e.Clock.Add(time.Minute)
	b := e.Push("api", "prod")
	pinB := e.Repo("api") + ":prod@" + b
	e.UntilDeployments(30*time.Second, "rolled to B and recorded", func() bool {
		an := e.Annotations("jobs-manager")
		return e.Image("jobs-manager", "api") == pinB && e.Image("requests-proxy", "proxy") == pinB && an[record] == b && an[attempt] == ""
	})
	before := e.Annotations("jobs-manager")
	if before[changes] == "" {
		t.Fatalf("setup: no churn history after the move: %v", before)
	}
	// A later clock: a churn history written again would differ.
	e.Clock.Add(time.Minute)

	e.RolloutUndo("jobs-manager")
	took := e.UntilDeployments(30*time.Second, "the state back on the anchor and the undo re-pinned", func() bool {
		an := e.Annotations("jobs-manager")
		return an[record] == b && an[changes] == before[changes] && an[attempt] == "" && e.Image("jobs-manager", "api") == pinB
	})
	t.Logf("state restored and re-pinned %s after the undo", took.Round(time.Millisecond))
	logs := ctl.Logs()
	if len(e2e.LogLines(logs, "INFO", "older than their copy", "rollout undo")) == 0 {
		t.Errorf("no INFO naming the rollback:\n%s", logs)
	}
	noRewindSigns(t, logs)
	if cp := e.StateCopy("jobs-manager"); cp["last-refreshed-api-digest"] != b || cp["digest-changes-api"] != before[changes] {
		t.Errorf("the copy %v does not hold the state", cp)
	}
}

// R25 migration: an installation from before the copies (the state only on
// the anchor, no generation, no ConfigMap) keeps all of it; the first write
// creates the copy from the anchor, and from then on an undo rewinds
// nothing.
func TestTick_R25_AnAnchorOnlyInstallationKeepsItsStateAndGainsACopy(t *testing.T) {
	e := newEnv(t)
	e.Clock = e2e.NewClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	a := e.Seed()
	cfg := e.Config("maxDigestChanges: 3\ndigestChangeWindow: 1h\n" + e2e.SeedShape)
	e.PinAll(cfg)
	// What an older release left: the anchor's annotations alone.
	name := statestore.Name(config.Workload{Kind: "Deployment", Namespace: e.NS, Name: "jobs-manager"})
	if err := e.C.Client.CoreV1().ConfigMaps(e.NS).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("setup: the first ticks wrote no copy to delete: %v", err)
	}
	e.Annotate("jobs-manager", map[string]*string{e.Key("state-generation"): nil, e.Key("digest-changes-api"): e2e.Ptr("2026-12-02T11:30:00Z")})
	record, changes := e.Key("last-refreshed-api-digest"), e.Key("digest-changes-api")

	// A steady state: nothing to write, the anchor's state stands.
	if code, logs := e.Tick(cfg); code != 0 || e.Annotations("jobs-manager")[record] != a {
		t.Fatalf("tick on the anchor-only state: exit %d, record %q; want 0, %s:\n%s", code, e.Annotations("jobs-manager")[record], a, logs)
	}
	// The next write creates the copy from the anchor, its history kept.
	e.Clock.Add(time.Minute)
	b := e.Push("api", "prod")
	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("tick to the new digest: exit %d", code)
	}
	an := e.Annotations("jobs-manager")
	if an[record] != b || !strings.HasPrefix(an[changes], "2026-12-02T11:30:00Z,") {
		t.Fatalf("after the move: record %q, churn history %q; want %s, the old entry kept and the move added", an[record], an[changes], b)
	}
	cp := e.StateCopy("jobs-manager")
	for key, v := range an {
		short, ok := strings.CutPrefix(key, e.Prefix+"/")
		if ok && cp[short] != v {
			t.Errorf("the copy %v lacks the anchor's %s=%q", cp, key, v)
		}
	}

	e.RolloutUndo("jobs-manager")
	if got := e.Annotations("jobs-manager")[record]; got != a {
		t.Fatalf("setup: the undo did not rewind the record (%q)", got)
	}
	if err := testenv.WaitSettled(context.Background(), e.C.Client, "Deployment", e.NS, "jobs-manager", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	code, logs := e.Tick(cfg)
	noRewindSigns(t, logs)
	if after := e.Annotations("jobs-manager"); code != 0 || after[record] != b || after[changes] != an[changes] {
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
	a := e.Push("web", "prod")
	tag := e.Repo("web") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "web", testenv.WithContainer("web", tag), testenv.WithReplicas(1),
		testenv.WithReadinessGate(gate), testenv.WithMinReadySeconds(4))
	groups := "groups:\n" + e2e.OneGroup("fixes", "web", "web", "web")
	lb := e.StartGateOwner("web", gate)
	e.Settle("Deployment", "web")
	e.PinAll(e.Config(groups))
	cfg := e.Config("rolloutTimeout: 4s\nmaxRefreshAttempts: 2\n" + groups)
	ctl := e.StartRun(cfg, "--poll-interval", "1s", "--poll-jitter", "0")
	ctl.WaitReady(t)

	b := e.Push("web", "prod")
	lb.Fail(b)
	flap, attempt, lockedOn, record := e.Key("refresh-flap-detected"), e.Key("refresh-attempt"), e.Key("locked-on-web"), e.Key("last-refreshed-web-digest")
	e.UntilDeployments(2*time.Minute, "locked out on B after 2 attempts", func() bool {
		st := e.StateOf("web")
		return st[flap] == "2" && st[lockedOn] == b
	})
	locked := e.StateOf("web")

	e.RolloutUndo("web")
	if undone := e.Annotations("web"); undone[lockedOn] == b && undone[flap] != "" {
		t.Logf("the undo left the lockout on the anchor (the controller restored it first?): %v", undone)
	}
	e.UntilDeployments(60*time.Second, "the lockout and the quarantine back on the anchor, web on the undo's A", func() bool {
		st := e.StateOf("web")
		return st[flap] == locked[flap] && st[lockedOn] == b && st[attempt] == locked[attempt] && e.Image("web", "web") == tag+"@"+a
	})
	e.Settle("Deployment", "web")
	ctl.KickedPasses(t, e.Env, "fixes", "web")
	logs := ctl.Logs()
	if len(e2e.LogLines(logs, "INFO", "older than their copy", "rollout undo")) == 0 {
		t.Errorf("no INFO naming the rollback:\n%s", logs)
	}
	noRewindSigns(t, logs)
	if got := e.Image("web", "web"); got != tag+"@"+a {
		t.Errorf("the locked-out group was re-imaged after the undo: web on %s, want the undo's %s", got, tag+"@"+a)
	}

	c := e.Push("web", "prod")
	e.UntilDeployments(60*time.Second, "C re-armed, rolled and recorded", func() bool {
		st := e.StateOf("web")
		return e.Image("web", "web") == tag+"@"+c && st[record] == c && st[flap] == "" && st[attempt] == ""
	})
	if got := e.StateOf("web")[lockedOn]; got != b {
		t.Errorf("%s = %q after the re-arm, want %s still quarantined", lockedOn, got, b)
	}
	e.Reg.MustTag(t, "acme/web", "prod", b)
	ctl.UntilLogged(t, "the quarantine WARN naming B", func(logs string) bool {
		return len(e2e.LogLines(logs, "WARN", "quarantined", b)) > 0
	})
	if got := e.Image("web", "web"); got != tag+"@"+c {
		t.Errorf("web on %s with the tag on the quarantined B, want %s", got, tag+"@"+c)
	}
}
