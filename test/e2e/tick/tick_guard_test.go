package tick

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

func TestTick_R10_R12_LockedOutGroupIsLoudAndTouchesNothing(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg)
	e.SetImageAs("helm", "Deployment", "requests-proxy", "proxy", e.Repo("api")+":prod")
	e.Annotate("jobs-manager", map[string]*string{e.Key("refresh-attempt"): e2e.Ptr("3")})
	before := e.Image("requests-proxy", "proxy")

	code, logs := e.Tick(cfg)
	if code != 1 {
		t.Fatalf("locked-out tick exit %d, want 1", code)
	}
	if got := e.Image("requests-proxy", "proxy"); got != before {
		t.Errorf("a locked-out group was re-imaged: %s -> %s", before, got)
	}
	if got := e.Annotations("jobs-manager")[e.Key("refresh-flap-detected")]; got != "3" {
		t.Errorf("flap marker %q, want \"3\"", got)
	}
	if !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "image-refresh rearm --config "+cfg+" --group control-plane") {
		t.Errorf("lockout WARN does not name the exact rearm command:\n%s", logs)
	}
	if !e2e.HasEvent(e.Events("jobs-manager"), "RefreshLockedOut", "rearm") {
		t.Errorf("no RefreshLockedOut event: %q", e.Events("jobs-manager"))
	}

	// R12: still loud when every target is back on its digest.
	e.SetImageAs("someone", "Deployment", "requests-proxy", "proxy", e.Image("jobs-manager", "api"))
	if code, logs := e.Tick(cfg); code != 1 || !strings.Contains(logs, "LOCKED OUT") {
		t.Errorf("latched tick with every target on its digest: exit %d, want 1 and a LOCKED OUT line:\n%s", code, logs)
	}
}

func TestTick_R10_R18_RearmClearsLockoutAndNextTickActs(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg)
	e.SetImageAs("helm", "Deployment", "requests-proxy", "proxy", e.Repo("api")+":prod")
	e.Annotate("jobs-manager", map[string]*string{e.Key("refresh-attempt"): e2e.Ptr("5"), e.Key("refresh-flap-detected"): e2e.Ptr("5")})

	code, out, logs := e.Run("rearm", "--config", cfg, "--kubeconfig", e.Kubeconfig, "--group", "control-plane")
	if code != 0 {
		t.Fatalf("rearm exit %d: %s", code, logs)
	}
	a := e.Annotations("jobs-manager")
	if _, ok := a[e.Key("refresh-attempt")]; ok {
		t.Errorf("rearm left refresh-attempt=%q", a[e.Key("refresh-attempt")])
	}
	if _, ok := a[e.Key("refresh-flap-detected")]; ok {
		t.Errorf("rearm left the flap marker")
	}
	if !strings.Contains(out, "re-armed group control-plane") {
		t.Errorf("rearm output: %q", out)
	}
	e.Settle("Deployment", "jobs-manager")
	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("tick after rearm exit %d", code)
	}
	if got := e.Image("requests-proxy", "proxy"); got != e.Repo("api")+":prod@"+digest {
		t.Errorf("tick after rearm did not act: proxy on %s", got)
	}
	if code, _, _ := e.Run("rearm", "--config", cfg, "--kubeconfig", e.Kubeconfig, "--group", "nope"); code != 2 {
		t.Errorf("rearm of an unknown group exit %d, want 2", code)
	}
}

func TestTick_R10_InvalidAttemptCounterIsTreatedAsLockedOut(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg)
	e.SetImageAs("helm", "Deployment", "requests-proxy", "proxy", e.Repo("api")+":prod")
	e.Annotate("jobs-manager", map[string]*string{e.Key("refresh-attempt"): e2e.Ptr("-1")})
	before := e.Image("requests-proxy", "proxy")
	if code, _ := e.Tick(cfg); code != 1 {
		t.Errorf("tick with attempt=-1 exit %d, want 1", code)
	}
	if got := e.Image("requests-proxy", "proxy"); got != before {
		t.Errorf("a corrupted attempt counter was read as 0 and the target re-imaged")
	}
}

func TestTick_R11_UnfinishedAttemptIsWaitedOnAndCleared(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg)
	e.Annotate("jobs-manager", map[string]*string{e.Key("refresh-attempt"): e2e.Ptr("2")})
	e.Settle("Deployment", "jobs-manager")
	code, logs := e.Tick(cfg)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(logs, "never confirmed settling") {
		t.Errorf("an unfinished attempt was treated as a silent no-op:\n%s", logs)
	}
	if got, ok := e.Annotations("jobs-manager")[e.Key("refresh-attempt")]; ok {
		t.Errorf("attempt %q not cleared once the rollout was confirmed settled", got)
	}
}

func TestTick_R4_NotSettledSkipsThenFreezesLoudly(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	cfg := e.Config("maxSkipTicks: 2\n" + e2e.SeedShape)
	e.Tick(cfg) // first observation
	// A rollout that cannot finish: the proxy's new pods are never
	// scheduled (no node matches), so the Deployment never settles.
	patch := `{"spec":{"template":{"spec":{"nodeSelector":{"no-such-node":"true"}}}}}`
	if _, err := e.C.Client.AppsV1().Deployments(e.NS).Patch(context.Background(), "requests-proxy", "application/strategic-merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.WontSettle("requests-proxy")
	code, logs := e.Tick(cfg)
	if code != 0 || !strings.Contains(logs, "not settled") {
		t.Fatalf("first unsettled tick: exit %d, want 0 with a NOTE:\n%s", code, logs)
	}
	if got := e.Annotations("jobs-manager")[e.Key("refresh-skip-streak")]; got != "1" {
		t.Errorf("skip streak %q, want 1", got)
	}
	if strings.Contains(e.Image("requests-proxy", "proxy"), "@") {
		t.Errorf("an unsettled group was re-pinned")
	}
	code, _ = e.Tick(cfg)
	if code != 1 {
		t.Errorf("skip streak at its ceiling: exit %d, want 1", code)
	}
	if !e2e.HasEvent(e.Events("jobs-manager"), "RefreshFrozen", "not settled") {
		t.Errorf("no RefreshFrozen event: %q", e.Events("jobs-manager"))
	}
	// Settled again: the streak is cleared.
	undo := `{"spec":{"template":{"spec":{"nodeSelector":null}}}}`
	if _, err := e.C.Client.AppsV1().Deployments(e.NS).Patch(context.Background(), "requests-proxy", "application/strategic-merge-patch+json", []byte(undo), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Settle("Deployment", "requests-proxy")
	e.Tick(cfg)
	if got, ok := e.Annotations("jobs-manager")[e.Key("refresh-skip-streak")]; ok {
		t.Errorf("skip streak %q not cleared once settled", got)
	}
}

func TestTick_R4_MissingWorkloadFailsWithTheAPIError(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	cfg := e.Config(strings.Replace(e2e.SeedShape, "name: requests-proxy, container: proxy", "name: no-such-deploy, container: proxy", 1))
	code, logs := e.Tick(cfg)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if !strings.Contains(logs, `deployments.apps \"no-such-deploy\" not found`) && !strings.Contains(logs, `deployments.apps "no-such-deploy" not found`) {
		t.Errorf("the API's own NotFound text is missing:\n%s", logs)
	}
	// R13: the first observation still lands.
	if e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")] == "" {
		t.Errorf("first-observation record dropped on a failing tick")
	}
}

func TestTick_R4_RBACDenialFailsWithTheAPIError(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	kubeconfig, _ := e.LimitedKubeconfig("jobs-manager") // not requests-proxy
	cfg := e.Config(e2e.SeedShape)
	// The explicit form's RBAC, so no discovery (it needs list).
	code, _, logs := e.Run("tick", "--config", cfg, "--kubeconfig", kubeconfig, "--discovery=false")
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, logs)
	}
	if !strings.Contains(logs, "forbidden") || !strings.Contains(logs, "requests-proxy") {
		t.Errorf("the RBAC denial is not named with the API's text:\n%s", logs)
	}
}

// An RBAC denial on one workload blocks only its group (R4: an unreadable
// target is never a benign skip); every other group is reconciled as usual
// in the same tick, and the blocked group converges once the RBAC is fixed.
func TestTick_R4_RBACDenialOnOneWorkloadLeavesTheOtherGroupsWorking(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	tag := e.Repo("api") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "worker", testenv.WithContainer("app", tag), testenv.WithReplicas(1))
	e.Settle("Deployment", "worker")
	cfg := e.Config(e2e.SeedShape + `  - name: workers
    anchor: {kind: Deployment, namespace: {{ns}}, name: worker}
    images:
      - name: api
        repository: {{reg}}/acme/api
        tag: prod
        targets:
          - {kind: Deployment, namespace: {{ns}}, name: worker, container: app}
`)
	e.PinAll(cfg)
	pinned := tag + "@" + digest
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"worker", "app"}} {
		e.SetImageAs("helm", "Deployment", w[0], w[1], tag)
	}
	kubeconfig, allow := e.LimitedKubeconfig("jobs-manager", "worker") // not requests-proxy

	// The explicit form's RBAC (named workloads only) and so no discovery,
	// which needs list on namespaces and the workload kinds.
	code, _, logs := e.Run("tick", "--config", cfg, "--kubeconfig", kubeconfig, "--discovery=false")
	t.Logf("tick with requests-proxy forbidden: exit %d\n%s", code, logs)
	if code != 1 {
		t.Errorf("exit %d, want 1: a forbidden target needs a human", code)
	}
	if got := e.Image("worker", "app"); got != pinned {
		t.Errorf("the other group's revert was not re-pinned: worker runs %s, want %s", got, pinned)
	}
	if got := e.Image("jobs-manager", "api"); got != tag {
		t.Errorf("the blocked group was re-imaged: jobs-manager runs %s, want it left on %s", got, tag)
	}
	if len(e2e.LogLines(logs, "ERROR", "requests-proxy", "forbidden")) == 0 {
		t.Errorf("no ERROR naming requests-proxy and forbidden:\n%s", logs)
	}
	if !e2e.HasEvent(e.Events("jobs-manager"), "RefreshError", "forbidden") {
		t.Errorf("no RefreshError Event on the blocked group's anchor naming the denial: %q", e.Events("jobs-manager"))
	}
	if got := e.Annotations("worker")[e.Key("last-refreshed-api-digest")]; got != digest {
		t.Errorf("the other group's record %q, want %s", got, digest)
	}

	allow("jobs-manager", "worker", "requests-proxy") // the operator fixes the RBAC
	code, _, logs = e.Run("tick", "--config", cfg, "--kubeconfig", kubeconfig, "--discovery=false")
	if code != 0 || e.Image("jobs-manager", "api") != pinned {
		t.Errorf("after the RBAC fix: exit %d, jobs-manager %s; want 0 and %s\n%s", code, e.Image("jobs-manager", "api"), pinned, logs)
	}
}

func TestTick_R19_MissingContainerIsAConfigurationError(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	cfg := e.Config(strings.Replace(e2e.SeedShape, "container: proxy", "container: prxy", 1))
	e.Tick(cfg) // first observation
	code, logs := e.Tick(cfg)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if !strings.Contains(logs, "configuration error") || !strings.Contains(logs, `container \"prxy\"`) && !strings.Contains(logs, `"prxy"`) {
		t.Errorf("not reported as a configuration error naming the target:\n%s", logs)
	}
	if strings.Contains(e.Image("jobs-manager", "api"), "@") {
		t.Errorf("the image was not skipped: the readable target was pinned")
	}
	if got := e.Annotations("jobs-manager")[e.Key("live-read-failure-streak-api")]; got != "1" {
		t.Errorf("read-failure streak %q, want 1", got)
	}
}

func TestTick_R5_OnlyAfterEverPinnedNeverRollsAFreshInstall(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	cfg := e.Config("firstInstall: only-after-ever-pinned\n" + e2e.SeedShape)
	before := e.Rollouts("jobs-manager")
	for i := 0; i < 3; i++ {
		if code, _ := e.Tick(cfg); code != 0 {
			t.Fatalf("tick %d exit %d", i, code)
		}
	}
	if n := e.Rollouts("jobs-manager"); n != before || strings.Contains(e.Image("jobs-manager", "api"), "@") {
		t.Fatalf("a fresh install rolled under only-after-ever-pinned")
	}
	// The next digest change pins, and from then on reverts are re-pinned.
	next := e.Push("api", "prod")
	e.Tick(cfg)
	if got := e.Image("jobs-manager", "api"); got != e.Repo("api")+":prod@"+next {
		t.Fatalf("digest change did not pin: %s", got)
	}
	e.SetImageAs("helm", "Deployment", "jobs-manager", "api", e.Repo("api")+":prod")
	e.Tick(cfg)
	if got := e.Image("jobs-manager", "api"); got != e.Repo("api")+":prod@"+next {
		t.Errorf("revert after the first pin not re-pinned: %s", got)
	}
}

// The seed's production case: a DaemonSet that cannot finish because a node
// is NotReady. Attempts count up tick by tick to the lockout; first
// observations and stale-pin findings still land on the latched ticks.
func TestTick_R10_R13_NotReadyNodeCountsAttemptsToLockout(t *testing.T) {
	e := newEnv(t)
	digest := e.Push("agent", "prod")
	e.Push("tool", "prod")
	testenv.Deployment(t, e.C.Client, e.NS, "anchor", testenv.WithContainer("app", e.Repo("agent")+":prod"))
	testenv.DaemonSet(t, e.C.Client, e.NS, "agent", testenv.WithTolerateAll(), testenv.WithContainer("agent", e.Repo("agent")+":prod"))
	e.Settle("Deployment", "anchor")
	e.Settle("DaemonSet", "agent")
	body := "rolloutTimeout: 3s\nmaxRefreshAttempts: 2\n" + e2e.Groups(e2e.GroupOf("agents", "Deployment", "anchor", e2e.ImageOf("agent", "agent", "prod", e2e.Target("DaemonSet", "agent", "agent"))))
	cfg := e.Config(body)
	e.Tick(cfg) // first observation
	// node-2 dies now, in the middle of the rollout the next tick starts: it
	// still reads Ready, but the pod the re-pin sends it never runs.
	if err := e.C.StopNodeAgent("node-2"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.C.NodeUp(context.Background(), "node-2") })

	code, _ := e.Tick(cfg) // pins; the rollout cannot settle
	if code != 1 {
		t.Errorf("tick with a rollout that timed out: exit %d, want 1", code)
	}
	a := e.Annotations("anchor")
	if a[e.Key("refresh-attempt")] != "1" {
		t.Errorf("attempt %q after the first timed-out rollout, want 1", a[e.Key("refresh-attempt")])
	}
	if !strings.Contains(e.DaemonSet("agent").Spec.Template.Spec.Containers[0].Image, digest) {
		t.Fatalf("DaemonSet not re-imaged")
	}
	e.Tick(cfg) // R11: waits again, attempt 2, times out
	if got := e.Annotations("anchor")[e.Key("refresh-attempt")]; got != "2" {
		t.Errorf("attempt %q after the second tick, want 2", got)
	}

	// Latched: add a first-observation image and a stale operator pin; both
	// findings must still be written (R13).
	body2 := body + `      - name: tool
        repository: {{reg}}/acme/tool
        tag: prod
        pinnedDigest: sha256:0000000000000000000000000000000000000000000000000000000000000000
        targets:
          - {kind: Deployment, namespace: {{ns}}, name: anchor, container: app}
`
	cfg2 := e.Config(body2)
	code, logs := e.Tick(cfg2)
	if code != 1 || !strings.Contains(logs, "LOCKED OUT") {
		t.Errorf("latched tick: exit %d, want 1 and LOCKED OUT:\n%s", code, logs)
	}
	a = e.Annotations("anchor")
	if a[e.Key("refresh-flap-detected")] != "2" {
		t.Errorf("flap marker %q, want 2", a[e.Key("refresh-flap-detected")])
	}
	if a[e.Key("stale-pin-tool")] == "" {
		t.Errorf("stale-pin finding not written on a latched tick (R13)")
	}
	if a[e.Key("last-refreshed-agent-digest")] != digest {
		t.Errorf("record moved without a settled rollout: %q", a[e.Key("last-refreshed-agent-digest")])
	}
}
