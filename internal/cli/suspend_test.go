package cli

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/internal/testenv"
)

// O1 on the local cluster: suspend, resume, and the annotation P/suspend
// on the anchor (true or an RFC 3339 end), through tick, run, the webhook
// and render.

// annotateAs sets (nil: deletes) annotations on a Deployment as field
// manager manager, as `kubectl annotate` (kubectl-annotate) or a GitOps
// controller does.
func (e *env) annotateAs(manager, deploy string, kv map[string]*string) {
	e.t.Helper()
	var parts []string
	for k, v := range kv {
		if v == nil {
			parts = append(parts, fmt.Sprintf("%q:null", k))
		} else {
			parts = append(parts, fmt.Sprintf("%q:%q", k, *v))
		}
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%s}}}`, strings.Join(parts, ","))
	if _, err := e.c.Client.AppsV1().Deployments(e.ns).Patch(context.Background(), deploy, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: manager}); err != nil {
		e.t.Fatal(err)
	}
}

// suspendCmd runs suspend or resume with the env's kubeconfig.
func (e *env) suspendCmd(cfg string, args ...string) (int, string, string) {
	e.t.Helper()
	return e.run(append([]string{args[0], "--config", cfg, "--kubeconfig", e.kubeconfig}, args[1:]...)...)
}

// O1 through tick: bad input exits 2 naming it with nothing written;
// `suspend` holds a new digest and a helm revert (status: suspended, by
// image-refresh-suspend, the reason, until resumed); `resume` lets the next
// tick roll and re-pin.
func TestTick_O1_SuspendHoldsNewDigestsAndRevertsUntilResume(t *testing.T) {
	e := newEnv(t)
	e.clock = &testClock{now: time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)}
	a := e.seed()
	cfg := e.config(seedShape)
	e.pinAll(cfg)
	tag, pinA := e.repo("api")+":prod", e.repo("api")+":prod@"+a
	rv := e.deployment("jobs-manager").ResourceVersion

	for _, bad := range []struct {
		args []string
		name string
	}{
		{[]string{"suspend", "--group", "no-such-group"}, `"no-such-group"`},
		{[]string{"resume", "--group", "no-such-group"}, `"no-such-group"`},
		{[]string{"suspend", "--group", "control-plane", "--for", "a while"}, `--for: "a while"`},
		{[]string{"suspend", "--group", "control-plane", "--for", "-1h"}, `--for: "-1h"`},
		{[]string{"suspend", "--group", "control-plane", "--until", "tomorrow"}, `--until: "tomorrow"`},
		{[]string{"suspend", "--group", "control-plane", "--until", "2026-12-01T00:00:00Z"}, "has passed"},
		{[]string{"suspend", "--group", "control-plane", "--for", "1h", "--until", "2027-01-01T00:00:00Z"}, "--for and --until"},
		{[]string{"suspend"}, "--group is required"},
	} {
		code, _, stderr := e.suspendCmd(cfg, bad.args...)
		if code != 2 || !strings.Contains(stderr, bad.name) {
			t.Errorf("%v: exit %d, want 2 naming %s:\n%s", bad.args, code, bad.name, stderr)
		}
	}
	if got := e.deployment("jobs-manager").ResourceVersion; got != rv {
		t.Fatalf("the anchor changed (resourceVersion %s -> %s) though every command was refused", rv, got)
	}

	code, out, stderr := e.suspendCmd(cfg, "suspend", "--group", "control-plane", "--reason", "INC-42: rolled back by hand")
	if code != 0 || !strings.Contains(out, "suspended group control-plane until resumed") {
		t.Fatalf("suspend: exit %d:\n%s\n%s", code, out, stderr)
	}
	if v := e.annotations("jobs-manager")[e.key("suspend")]; v != "true" {
		t.Fatalf("%s = %q, want true", e.key("suspend"), v)
	}
	if !hasEvent(e.events("jobs-manager"), "Suspended", "INC-42") {
		t.Errorf("no Suspended Event naming the reason: %q", e.events("jobs-manager"))
	}

	b := e.push("api", "prod")
	e.setImageAs("helm", "Deployment", "requests-proxy", "proxy", tag) // a revert, as helm rollback writes it
	code, logs := e.tick(cfg)
	if code != 0 || len(logLines(logs, "INFO", "group control-plane is suspended by image-refresh-suspend until resumed: INC-42", "held back")) != 1 {
		t.Fatalf("suspended tick: exit %d, want 0 with one INFO line saying what is held back:\n%s", code, logs)
	}
	if got := e.image("jobs-manager", "api"); got != pinA {
		t.Errorf("jobs-manager on %s while suspended, want %s (no new digest)", got, pinA)
	}
	if got := e.image("requests-proxy", "proxy"); got != tag {
		t.Errorf("requests-proxy on %s while suspended, want the reverted %s (no re-pin)", got, tag)
	}
	if _, ok := e.annotations("jobs-manager")[e.key("suspended-since")]; !ok {
		t.Errorf("no %s on the anchor: the bookkeeping did not run", e.key("suspended-since"))
	}
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		r := row(e.status(cfg), w[0], w[1])
		msg, _ := r["message"].(string)
		if r["state"] != "suspended" || !strings.Contains(msg, "by image-refresh-suspend until resumed: INC-42: rolled back by hand") ||
			!strings.Contains(r["remediation"].(string), "resume --config "+cfg+" --group control-plane") {
			t.Errorf("status row of %s = %v, want suspended naming who, why, until when and resume", w[0], r)
		}
	}

	code, out, stderr = e.suspendCmd(cfg, "resume", "--group", "control-plane")
	if code != 0 || !strings.Contains(out, "resumed group control-plane") {
		t.Fatalf("resume: exit %d:\n%s\n%s", code, out, stderr)
	}
	code, logs = e.tick(cfg)
	if code != 0 || len(logLines(logs, "INFO", "no longer suspended")) != 1 {
		t.Fatalf("tick after resume: exit %d, want 0 with one INFO line saying so:\n%s", code, logs)
	}
	pinB := e.repo("api") + ":prod@" + b
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := e.image(w[0], w[1]); got != pinB {
			t.Errorf("after resume %s on %s, want %s", w[0], got, pinB)
		}
	}
	if code, out, _ := e.suspendCmd(cfg, "resume", "--group", "control-plane"); code != 0 || !strings.Contains(out, "not suspended") {
		t.Errorf("resume of a group not suspended: exit %d, %q", code, out)
	}
}

// O1, declaratively: P/suspend written by another field manager (as
// `kubectl annotate` or a GitOps controller writes it) with an RFC 3339 end
// holds a new digest until the end; status names that writer and the end;
// the first tick past the end rolls. A suspension without an end is a
// finding after 24 hours: WARN, Event, exit 1 and the metric.
func TestTick_O1_TheAnnotationSuspendsUntilItsEndAndWithoutOneIsAFindingAfter24h(t *testing.T) {
	e := newEnv(t)
	e.clock = &testClock{now: time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)}
	e.seed()
	cfg := e.config(seedShape)
	e.pinAll(cfg)
	e.annotateAs("kubectl-annotate", "jobs-manager", map[string]*string{e.key("suspend"): ptr("2026-12-02T13:00:00Z"), e.key("suspend-reason"): ptr("freeze for the sale")})
	b := e.push("api", "prod")
	if code, logs := e.tick(cfg); code != 0 || !strings.Contains(logs, "held back") {
		t.Fatalf("tick before the end: exit %d, want 0 holding the new digest back:\n%s", code, logs)
	}
	r := row(e.status(cfg), "requests-proxy", "proxy")
	if msg, _ := r["message"].(string); r["state"] != "suspended" || !strings.Contains(msg, "suspended by kubectl-annotate until 2026-12-02T13:00:00Z: freeze for the sale") {
		t.Errorf("status row %v, want suspended by kubectl-annotate until 13:00 with the reason", r)
	}
	e.clock.Add(time.Hour)
	if code, logs := e.tick(cfg); code != 0 || len(logLines(logs, "INFO", "no longer suspended")) != 1 {
		t.Fatalf("tick at the end: exit %d, want 0 saying the suspension ended:\n%s", code, logs)
	}
	if got, want := e.image("requests-proxy", "proxy"), e.repo("api")+":prod@"+b; got != want {
		t.Errorf("after the end requests-proxy on %s, want %s", got, want)
	}

	// Without an end: benign for 24 hours, then a finding.
	e.annotateAs("kubectl-annotate", "jobs-manager", map[string]*string{e.key("suspend"): ptr("true")})
	if code, logs := e.tick(cfg); code != 0 || strings.Contains(logs, "SuspendedWithoutEnd") {
		t.Fatalf("tick of a fresh suspension: exit %d, want 0 and no finding:\n%s", code, logs)
	}
	e.clock.Add(24 * time.Hour)
	path := filepath.Join(t.TempDir(), "m.prom")
	code, logs := e.tick(cfg, "--metrics-file", path)
	if code != 1 || len(logLines(logs, "WARN", "suspended without an end since 2026-12-02T13:00:00Z", "resume --config")) != 1 {
		t.Fatalf("tick 24 h later: exit %d, want 1 with a WARN naming since when and resume:\n%s", code, logs)
	}
	if v, _ := metricValue(readFile(t, path), "image_refresh_group_needs_attention", map[string]string{"group": "control-plane", "reason": "SuspendedWithoutEnd"}); v != "1" {
		t.Errorf("needs_attention{SuspendedWithoutEnd} = %q, want 1", v)
	}
	if !hasEvent(e.events("jobs-manager"), "SuspendedWithoutEnd", "resume") {
		t.Errorf("no SuspendedWithoutEnd Event naming resume: %q", e.events("jobs-manager"))
	}
}

// O1 through run: a suspension holds a new digest and a revert over
// passes the test proves ran; `resume` acts at once (its removal starts a
// pass, the poll interval is an hour); a suspension's end acts at once
// too: the controller requeues the group for it, with nothing else to
// start a pass.
func TestRun_O1_SuspendHoldsAndResumeAndTheEndActAtOnce(t *testing.T) {
	e := newEnv(t)
	e.clock = &testClock{now: time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)}
	a := e.seed()
	cfg := e.config(seedShape)
	e.pinAll(cfg)
	tag, pinA := e.repo("api")+":prod", e.repo("api")+":prod@"+a
	if code, out, stderr := e.suspendCmd(cfg, "suspend", "--group", "control-plane", "--reason", "INC-7"); code != 0 {
		t.Fatalf("suspend: exit %d\n%s\n%s", code, out, stderr)
	}
	b := e.push("api", "prod")
	pinB := e.repo("api") + ":prod@" + b
	ctl := e.startRun(cfg, "--poll-interval", "1h", "--poll-jitter", "0")
	ctl.waitReady(t)
	heldBack := func(what string) int {
		return len(logLines(ctl.Logs(), "INFO", "is suspended by image-refresh-suspend", what))
	}
	eventually(t, 60*time.Second, "the new digest held back", func() bool { return heldBack(pinB) > 0 })
	e.writeImageAs("helm", "Deployment", "requests-proxy", "proxy", tag)
	ctl.kickedPasses(t, e, "control-plane", "requests-proxy")
	if got := e.image("requests-proxy", "proxy"); got != tag {
		t.Errorf("requests-proxy on %s after passes while suspended, want the reverted %s", got, tag)
	}
	if got := e.image("jobs-manager", "api"); got != pinA {
		t.Errorf("jobs-manager on %s while suspended, want %s", got, pinA)
	}
	if n := heldBack(pinB); n != 1 {
		t.Errorf("%d INFO lines saying the group is suspended, want 1 (once, not per pass)", n)
	}
	if r := row(e.status(cfg), "requests-proxy", "proxy"); r["state"] != "suspended" {
		t.Errorf("status row %v, want suspended", r)
	}

	if code, _, stderr := e.suspendCmd(cfg, "resume", "--group", "control-plane"); code != 0 {
		t.Fatalf("resume: exit %d\n%s", code, stderr)
	}
	eventually(t, 60*time.Second, "resume acted at once", func() bool {
		return e.image("requests-proxy", "proxy") == pinB && e.image("jobs-manager", "api") == pinB
	})
	eventually(t, 60*time.Second, "the rollout confirmed", func() bool {
		return e.annotations("jobs-manager")[e.key("refresh-attempt")] == "" && e.annotations("jobs-manager")[e.key("last-refreshed-api-digest")] == b
	})

	// An end: 2 s ahead on the engine's clock. The controller requeues the
	// group for it; the test moves the clock past it, and the requeued
	// pass re-pins the revert below without any event to start it.
	if code, _, stderr := e.suspendCmd(cfg, "suspend", "--group", "control-plane", "--for", "2s"); code != 0 {
		t.Fatalf("suspend --for 2s: exit %d\n%s", code, stderr)
	}
	e.writeImageAs("helm", "Deployment", "requests-proxy", "proxy", tag)
	eventually(t, 60*time.Second, "the revert held back", func() bool {
		return heldBack("until 2026-12-02T12:00:02Z") > 0 && strings.Contains(ctl.Logs(), "requests-proxy container proxy "+tag)
	})
	// Every event the revert starts has had its pass: its rollout settled
	// and two kicked passes later nothing else is on its way.
	e.settle("Deployment", "requests-proxy")
	ctl.kickedPasses(t, e, "control-plane", "jobs-manager")
	if got := e.image("requests-proxy", "proxy"); got != tag {
		t.Fatalf("requests-proxy on %s before the end, want the reverted %s", got, tag)
	}
	e.clock.Add(3 * time.Second)
	eventually(t, 60*time.Second, "the end acted without an event or a resync", func() bool { return e.image("requests-proxy", "proxy") == pinB })
}

// O1 at admission: while the group is suspended the webhook stores a
// re-render as sent (and says so); resumed, the same write is pinned.
func TestWebhook_O1_ASuspendedGroupIsNotPinnedAtAdmission(t *testing.T) {
	e := newEnv(t)
	digest, cfg := e.pinned()
	tag, pinned := e.repo("api")+":prod", e.repo("api")+":prod@"+digest
	e.whLabel("jobs-manager", "requests-proxy")
	ctl := e.whStart(cfg, "--poll-interval", "1h")
	if code, _, stderr := e.suspendCmd(cfg, "suspend", "--group", "control-plane", "--reason", "hotfix by hand"); code != 0 {
		t.Fatalf("suspend: exit %d\n%s", code, stderr)
	}
	// The webhook reads the anchor from the manager's cache: wait for the
	// cache to hold the suspension (a dry-run write comes back unpinned,
	// and the webhook says why).
	eventually(t, 30*time.Second, "the webhook sees the suspension", func() bool {
		d, err := e.whTry("helm", "requests-proxy", map[string]string{"proxy": tag}, true)
		return err == nil && whImages(d)["proxy"] == tag
	})
	before := len(logLines(ctl.Logs(), "INFO", "admission: group suspended, left as sent (O1)"))
	stored := e.whWrite("helm", "requests-proxy", map[string]string{"proxy": tag})
	if got := whImages(stored)["proxy"]; got != tag {
		t.Errorf("helm's write while suspended was stored as %s, want it as sent: %s", got, tag)
	}
	if after := len(logLines(ctl.Logs(), "INFO", "admission: group suspended, left as sent (O1)", "hotfix by hand")); after <= before {
		t.Errorf("the webhook did not say it left the write as sent because the group is suspended:\n%s", ctl.Logs())
	}
	if code, _, stderr := e.suspendCmd(cfg, "resume", "--group", "control-plane"); code != 0 {
		t.Fatalf("resume: exit %d\n%s", code, stderr)
	}
	eventually(t, 30*time.Second, "the webhook pins again once resumed", func() bool {
		d, err := e.whTry("helm", "requests-proxy", map[string]string{"proxy": tag}, true)
		return err == nil && whImages(d)["proxy"] == pinned
	})
}

// O1 in render: a suspended group's images are left as rendered, with a
// note saying who suspended it and why; resumed, they are pinned.
func TestRender_O1_ASuspendedGroupIsLeftAsRendered(t *testing.T) {
	e := newEnv(t)
	digest := e.seed()
	cfg := e.config(renderConfig)
	if code, _ := e.tick(cfg); code != 0 {
		t.Fatalf("tick exit %d", code)
	}
	if code, _, stderr := e.suspendCmd(cfg, "suspend", "--group", "control-plane", "--reason", "INC-9"); code != 0 {
		t.Fatalf("suspend: exit %d\n%s", code, stderr)
	}
	in := e.seedManifests()
	code, out, logs, _ := e.render(in, "--config", cfg, "--kubeconfig", e.kubeconfig, "--namespace", e.ns)
	if code != 0 || out != in {
		t.Errorf("render of a suspended group: exit %d, output changed=%v, want 0 and the stream as rendered:\n%s", code, out != in, logs)
	}
	if n := len(logLines(logs, "INFO", "left as rendered: group control-plane is suspended by image-refresh-suspend until resumed: INC-9 (O1)")); n != 2 {
		t.Errorf("%d notes naming the suspension, want 2 (one per target):\n%s", n, logs)
	}
	if code, _, stderr := e.suspendCmd(cfg, "resume", "--group", "control-plane"); code != 0 {
		t.Fatalf("resume: exit %d\n%s", code, stderr)
	}
	code, out, logs, _ = e.render(in, "--config", cfg, "--kubeconfig", e.kubeconfig, "--namespace", e.ns)
	if want := e.pinnedSeedManifests(digest); code != 0 || out != want {
		t.Errorf("render after resume: exit %d, not pinned:\n%s", code, logs)
	}
}

// O1 for a discovered workload: it is its own anchor, so P/suspend on the
// workload itself suspends it; `suspend --group` takes its discovered
// group's name too.
func TestTick_O1_ADiscoveredWorkloadIsSuspendedOnItself(t *testing.T) {
	e := discoveryEnv(t)
	a := e.push("api", "prod")
	tag := e.repo("api") + ":prod"
	testenv.Deployment(t, e.c.Client, e.ns, "api", testenv.WithContainer("api", tag))
	e.settle("Deployment", "api")
	cfg := e.config("pinFormat: digest\n")
	e.enable("Deployment", "api")
	for range 2 {
		if code, _ := e.discoveryTick(cfg); code != 0 {
			t.Fatalf("setup tick exit %d", code)
		}
	}
	if got := e.image("api", "api"); got != tag+"@"+a {
		t.Fatalf("setup: api on %s, want %s", got, tag+"@"+a)
	}
	e.annotateAs("argocd-controller", "api", map[string]*string{e.key("suspend"): ptr("true")})
	b := e.push("api", "prod")
	if code, logs := e.discoveryTick(cfg); code != 0 || !strings.Contains(logs, "held back") {
		t.Fatalf("tick of the suspended workload: exit %d, want 0 holding the new digest back:\n%s", code, logs)
	}
	if got := e.image("api", "api"); got != tag+"@"+a {
		t.Errorf("a suspended discovered workload moved to %s", got)
	}
	code, out, stderr := e.run("status", "--config", cfg, "--kubeconfig", e.kubeconfig, "--watch-namespaces", e.ns, "-o", "json")
	if code != 0 || !strings.Contains(out, `"state": "suspended"`) || !strings.Contains(out, "suspended by argocd-controller until resumed") {
		t.Errorf("status: exit %d, want the discovered row suspended by argocd-controller:\n%s\n%s", code, out, stderr)
	}
	group := e.ns + "/deployment/api"
	if code, _, stderr := e.run("resume", "--config", cfg, "--kubeconfig", e.kubeconfig, "--watch-namespaces", e.ns, "--group", group); code != 0 {
		t.Fatalf("resume --group %s: exit %d\n%s", group, code, stderr)
	}
	if code, _ := e.discoveryTick(cfg); code != 0 {
		t.Fatalf("tick after resume exit %d", code)
	}
	if got := e.image("api", "api"); got != tag+"@"+b {
		t.Errorf("after resume api on %s, want %s", got, tag+"@"+b)
	}
}
