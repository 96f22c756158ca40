package tick

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/test/support/e2e"
)

// Logs an operator can trust (issue 32): N1's NOTE about an imageID
// without a repository digest speaks only of containers a pod has and
// runs, and each change of state the log used to be silent about gets one
// INFO line.

const noteUnknown = "without a repository digest"

// N1: a Pending pod (no node matches it) runs nothing yet, and a target
// whose container was renamed away has none in its pods: neither is
// "an imageID without a repository digest". R4: the group settled again,
// its skip streak cleared, is one INFO line, not repeated by the next tick.
func TestTick_N1_R4_NoNoteOfAContainerThePodsDoNotRunAndOneLineWhenTheSkipStreakClears(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg)

	patch := `{"spec":{"template":{"spec":{"nodeSelector":{"no-such-node":"true"}}}}}`
	if _, err := e.C.Client.AppsV1().Deployments(e.NS).Patch(context.Background(), "requests-proxy", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.WontSettle("requests-proxy")
	code, logs := e.Tick(cfg)
	if code != 0 || !strings.Contains(logs, "not settled") {
		t.Fatalf("tick over a Pending pod: exit %d, want 0 saying the group is not settled:\n%s", code, logs)
	}
	if strings.Contains(logs, noteUnknown) {
		t.Errorf("a Pending pod that runs nothing is reported as running an imageID without a repository digest:\n%s", logs)
	}
	if r := e2e.Row(e.Status(cfg), "requests-proxy", "proxy"); !strings.Contains(r["running"].(string), "1 not running") {
		t.Errorf("status row of the Pending pod's target: running %v, want it to say 1 not running", r["running"])
	}

	undo := `{"spec":{"template":{"spec":{"nodeSelector":null}}}}`
	if _, err := e.C.Client.AppsV1().Deployments(e.NS).Patch(context.Background(), "requests-proxy", types.StrategicMergePatchType, []byte(undo), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Settle("Deployment", "requests-proxy")
	code, logs = e.Tick(cfg)
	if n := len(e2e.LogLines(logs, "INFO", "group control-plane settled again after 1 skipped pass(es): its skip streak is cleared")); code != 0 || n != 1 {
		t.Errorf("tick after the group settled: exit %d, %d INFO lines saying the skip streak is cleared, want 0 and 1:\n%s", code, n, logs)
	}
	if code, logs = e.Tick(cfg); code != 0 || strings.Contains(logs, "skip streak is cleared") {
		t.Errorf("the tick after: exit %d, want 0 without the line again:\n%s", code, logs)
	}

	// The container renamed away: R19's configuration error, and no NOTE
	// about pods that have no such container.
	rename := `[{"op":"replace","path":"/spec/template/spec/containers/0/name","value":"proxy2"}]`
	if _, err := e.C.Client.AppsV1().Deployments(e.NS).Patch(context.Background(), "requests-proxy", types.JSONPatchType, []byte(rename), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Settle("Deployment", "requests-proxy")
	code, logs = e.Tick(cfg)
	if code != 1 || !strings.Contains(logs, `has no container \"proxy\"`) && !strings.Contains(logs, `has no container "proxy"`) {
		t.Fatalf("tick with the container renamed away: exit %d, want 1 with R19's configuration error:\n%s", code, logs)
	}
	if strings.Contains(logs, noteUnknown) {
		t.Errorf("a container the pods do not have is reported as running an imageID without a repository digest:\n%s", logs)
	}
}

// R2: a stale-pin finding cleared (the operator moved the pin to the
// registry's latest) is one INFO line, and a current operator pin is said
// (INFO) on each tick; neither is a WARN.
func TestTick_R2_AStalePinClearedAndACurrentPinAreSaid(t *testing.T) {
	e := newEnv(t)
	old := e.Seed()
	latest := e.Push("api", "prod")
	if code, logs := e.Tick(e.Config(withPin(old))); code != 1 || len(e2e.LogLines(logs, "WARN", "is not the registry's latest")) == 0 {
		t.Fatalf("stale pin tick: exit %d, want 1 with the StalePin WARN:\n%s", code, logs)
	}
	current := e.Config(withPin(latest))
	code, logs := e.Tick(current)
	cleared := e2e.LogLines(logs, "INFO", "the stale-pin finding of "+e.Repo("api")+":prod is cleared: the operator pin "+latest+" is the registry's latest now")
	if code != 0 || len(cleared) != 1 {
		t.Errorf("tick with the pin moved to latest: exit %d, %d INFO lines saying the stale pin is cleared, want 0 and 1:\n%s", code, len(cleared), logs)
	}
	if _, ok := e.Annotations("jobs-manager")[e.Key("stale-pin-api")]; ok {
		t.Errorf("the stale-pin finding is still on the anchor")
	}
	if n := len(e2e.LogLines(logs, "INFO", "the operator pin "+latest+" of "+e.Repo("api")+":prod is the registry's latest")); n != 1 {
		t.Errorf("%d INFO lines saying the operator pin is current, want 1:\n%s", n, logs)
	}
	code, logs = e.Tick(current)
	if code != 0 || strings.Contains(logs, "is cleared") || len(e2e.LogLines(logs, "INFO", "is the registry's latest: not refreshed")) != 1 {
		t.Errorf("the tick after: exit %d, want 0, the current pin said once and the cleared finding not again:\n%s", code, logs)
	}
}

// The same lines through `run` are said once, not on every pass: a stale
// pin finding left on the anchor is cleared by the first pass (one INFO
// line), a skip streak left on the anchor of a settled group likewise, and
// the current operator pin is said on the first pass only, while kicked
// passes go on.
func TestRun_R2_R4_StateChangesAreSaidOnceNotOnEveryPass(t *testing.T) {
	e := newEnv(t)
	old := e.Seed()
	cfg := e.Config(withPin(old))
	e.Annotate("jobs-manager", map[string]*string{e.Key("stale-pin-api"): e2e.Ptr("sha256:" + strings.Repeat("0", 64)), e.Key("refresh-skip-streak"): e2e.Ptr("3")})
	ctl := e.StartRun(cfg, "--poll-interval", "300ms", "--poll-jitter", "0")
	ctl.WaitReady(t)
	ctl.WaitPasses(t, "control-plane", 0, 1)
	e.UntilDeployments(30*time.Second, "the stale pin and the skip streak cleared", func() bool {
		a := e.Annotations("jobs-manager")
		_, stale := a[e.Key("stale-pin-api")]
		_, skip := a[e.Key("refresh-skip-streak")]
		return !stale && !skip
	})
	for range 3 {
		ctl.KickedPasses(t, e.Env, "control-plane", "jobs-manager")
	}
	logs := ctl.Logs()
	for _, line := range []string{
		"the stale-pin finding of " + e.Repo("api") + ":prod is cleared",
		"group control-plane settled again after 3 skipped pass(es): its skip streak is cleared",
		"the operator pin " + old + " of " + e.Repo("api") + ":prod is the registry's latest",
	} {
		if n := len(e2e.LogLines(logs, "INFO", line)); n != 1 {
			t.Errorf("%d INFO lines %q over 7 passes or more, want 1", n, line)
		}
	}
}
