package tick

import (
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// opsGroup is a group whose image api-db the operator pinned (R2).
const opsGroup = `  - name: ops
    anchor: {kind: Deployment, namespace: {{ns}}, name: legacy}
    images:
      - name: db
        repository: {{reg}}/acme/db
        tag: prod
        pinnedDigest: {{pin}}
        targets:
          - {kind: Deployment, namespace: {{ns}}, name: legacy, container: db}
`

// freshGroup is a group no tick has seen yet.
var freshGroup = e2e.OneGroup("fresh", "web", "web", "web")

func TestStatus_ShowsEveryStateWithRemediation(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	oldDB := e.Push("db", "prod")
	latestDB := e.Push("db", "prod")
	webDigest := e.Push("web", "prod")
	testenv.Deployment(t, e.C.Client, e.NS, "legacy", testenv.WithContainer("db", e.Repo("db")+":prod@"+oldDB), testenv.WithReplicas(1))
	testenv.Deployment(t, e.C.Client, e.NS, "web", testenv.WithContainer("web", e.Repo("web")+":prod"), testenv.WithReplicas(1))
	e.Settle("Deployment", "legacy")
	e.Settle("Deployment", "web")
	ops := strings.ReplaceAll(opsGroup, "{{pin}}", oldDB)
	tickCfg := e.Config(e2e.SeedShape + ops)
	statusCfg := e.Config(e2e.SeedShape + ops + freshGroup)

	// Before any tick every image is first observed (the stale pin is
	// already known: it needs no record).
	for _, r := range e.Status(statusCfg) {
		if r["group"] != "ops" && r["state"] != "first-observed" {
			t.Errorf("fresh install: row %v, want state first-observed", r)
		}
	}

	// --exit-code: without the stale operator pin nothing needs a human
	// yet (first observations are benign, a tick exits 0), so it exits 0.
	if code, out, errOut := e.Run("status", "--config", e.Config(e2e.SeedShape), "--kubeconfig", e.Kubeconfig, "--exit-code"); code != 0 {
		t.Errorf("status --exit-code before any tick (every row first-observed): exit %d, want 0:\n%s%s", code, out, errOut)
	}

	e.Tick(tickCfg)
	e.Tick(tickCfg)
	tag := e.Repo("api") + ":prod"
	e.SetImageAs("helm", "Deployment", "requests-proxy", "proxy", tag)
	rvs, events := e.ResourceVersions(), e.OwnEvents()

	rows := e.Status(statusCfg)
	if len(rows) != 4 {
		t.Fatalf("status -o json gave %d rows, want 4 (one per group, image and target): %v", len(rows), rows)
	}
	fields := []string{"group", "image", "repository", "tag", "latest", "recorded", "live", "state", "attempts", "skipStreak", "message"}
	for _, r := range rows {
		for _, f := range fields {
			if _, ok := r[f]; !ok {
				t.Errorf("row %v has no field %q", r, f)
			}
		}
	}
	for _, want := range []struct {
		workload, container, group, image, state, latest, recorded, live string
	}{
		{"jobs-manager", "api", "control-plane", "api", "pinned", digest, digest, tag + "@" + digest},
		{"requests-proxy", "proxy", "control-plane", "api", "drifted", digest, digest, tag},
		{"legacy", "db", "ops", "db", "stale-pin", latestDB, "", e.Repo("db") + ":prod@" + oldDB},
		{"web", "web", "fresh", "web", "first-observed", webDigest, "", e.Repo("web") + ":prod"},
	} {
		r := e2e.Row(rows, want.workload, want.container)
		if r == nil {
			t.Errorf("no row for %s/%s in %v", want.workload, want.container, rows)
			continue
		}
		check := map[string]string{"group": want.group, "image": want.image, "state": want.state,
			"latest": want.latest, "recorded": want.recorded, "live": want.live, "tag": "prod"}
		for f, v := range check {
			if r[f] != v {
				t.Errorf("%s/%s: %s = %v, want %q", want.workload, want.container, f, r[f], v)
			}
		}
		if msg, _ := r["message"].(string); msg == "" {
			t.Errorf("%s/%s: empty message", want.workload, want.container)
		}
		if want.state == "stale-pin" {
			if rem, _ := r["remediation"].(string); !strings.Contains(rem, latestDB) {
				t.Errorf("stale-pin row: remediation %q does not name the latest digest", rem)
			}
		}
	}

	// The table: no cell cut (the columns widen, D3), and every row not
	// pinned explained below it.
	code, out, errOut := e.Run("status", "--config", statusCfg, "--kubeconfig", e.Kubeconfig)
	t.Logf("status:\n%s", out)
	if code != 0 {
		t.Fatalf("status exit %d:\n%s", code, errOut)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for _, l := range lines {
		if strings.Contains(l, "…") {
			t.Errorf("a cut cell: %q", l)
		}
	}
	for _, st := range []string{"drifted", "stale-pin", "first-observed"} {
		explained := false
		for i, l := range lines {
			if strings.Contains(l, " "+st+": ") && i+1 < len(lines) && strings.HasPrefix(lines[i+1], "  ") && strings.TrimSpace(lines[i+1]) != "" {
				explained = true
			}
		}
		if !explained {
			t.Errorf("no explanation block (message or fix line) for the %s row:\n%s", st, out)
		}
	}
	if !strings.Contains(out, "  fix: ") {
		t.Errorf("no fix: line for the stale pin:\n%s", out)
	}
	// One table row per target, and the TARGET cell tells them apart.
	targets := map[string]string{} // state → target cell
	running := map[string]string{} // state → RUNNING cell (N1)
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) == 6 && (f[3] == "pinned" || f[3] == "drifted" || f[3] == "stale-pin" || f[3] == "first-observed") {
			targets[f[3]] = f[2]
			running[f[3]] = f[5]
		}
	}
	if len(targets) != 4 {
		t.Errorf("table has %d target rows, want 4:\n%s", len(targets), out)
	}
	for st, name := range map[string]string{"pinned": "jobs-manager", "drifted": "requests-proxy", "stale-pin": "legacy", "first-observed": "web"} {
		if cell := targets[st]; !strings.Contains(cell, name) {
			t.Errorf("the %s row's TARGET cell %q does not name its workload %s", st, cell, name)
		}
	}
	// Every pod reports a repository digest here: RUNNING counts them all.
	for st, want := range map[string]string{"pinned": "2/2", "drifted": "2/2", "stale-pin": "1/1", "first-observed": "1/1"} {
		if running[st] != want {
			t.Errorf("the %s row's RUNNING cell is %q, want %q", st, running[st], want)
		}
	}
	// --exit-code: the stale operator pin needs a human, as it makes a tick
	// exit 1; status still prints every row, and writes nothing.
	code, out, errOut = e.Run("status", "--config", statusCfg, "--kubeconfig", e.Kubeconfig, "--exit-code", "-o", "json")
	if code != 1 {
		t.Errorf("status --exit-code with a stale operator pin: exit %d, want 1:\n%s", code, errOut)
	}
	if n := strings.Count(out, `"state":`); n != 4 {
		t.Errorf("status --exit-code -o json printed %d rows, want all 4:\n%s", n, out)
	}
	if !strings.Contains(errOut, "needs attention") {
		t.Errorf("status --exit-code exit 1 without saying why on stderr: %q", errOut)
	}
	e.AssertUnchanged("status", rvs, events)
}
