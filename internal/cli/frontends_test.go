package cli

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The guards hold identically in both front ends: the same cases run
// through `tick` and through `run` (issue: "same table of cases, run
// through both front ends"), because both call one engine.
func TestFrontEnds_R4_R10_GuardsHoldInTickAndRun(t *testing.T) {
	frontEnds := map[string]func(e *env, cfg string) string{
		"tick": func(e *env, cfg string) string {
			_, logs := e.tick(cfg)
			return logs
		},
		"run": func(e *env, cfg string) string {
			ctl := e.startRun(cfg, "--poll-interval", "1s", "--poll-jitter", "0")
			ctl.waitPasses(e.t, "control-plane", 0, 3) // the first pass and two resyncs, each after the setup
			ctl.stop(e.t)
			return ctl.Logs()
		},
	}
	cases := []struct {
		name  string
		setup func(e *env)
		check func(e *env, logs string)
	}{
		{
			name: "a locked-out group is not re-imaged, and says so",
			setup: func(e *env) {
				e.setImageAs("helm", "Deployment", "requests-proxy", "proxy", e.repo("api")+":prod")
				e.annotate("jobs-manager", map[string]*string{e.key("refresh-attempt"): ptr("3")})
				e.settle("Deployment", "jobs-manager")
			},
			check: func(e *env, logs string) {
				if got := e.image("requests-proxy", "proxy"); strings.Contains(got, "@") {
					e.t.Errorf("re-imaged while locked out: %s", got)
				}
				if !strings.Contains(logs, "LOCKED OUT") || e.annotations("jobs-manager")[e.key("refresh-flap-detected")] != "3" {
					e.t.Errorf("lockout not reported (flap %q):\n%s", e.annotations("jobs-manager")[e.key("refresh-flap-detected")], logs)
				}
				if !hasEvent(e.events("jobs-manager"), "RefreshLockedOut", "rearm") {
					e.t.Errorf("no RefreshLockedOut event")
				}
			},
		},
		{
			name: "a group that is not settled is not re-imaged",
			setup: func(e *env) {
				// requests-proxy can never finish: no node matches.
				patch := `{"spec":{"template":{"spec":{"nodeSelector":{"no-such-node":"true"}}}}}`
				if _, err := e.c.Client.AppsV1().Deployments(e.ns).Patch(context.Background(), "requests-proxy", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
					e.t.Fatal(err)
				}
				e.wontSettle("requests-proxy")
				e.setImageAs("helm", "Deployment", "jobs-manager", "api", e.repo("api")+":prod")
			},
			check: func(e *env, logs string) {
				if got := e.image("jobs-manager", "api"); strings.Contains(got, "@") {
					e.t.Errorf("re-pinned while the group is not settled: %s", got)
				}
				if !strings.Contains(logs, "is not settled") {
					e.t.Errorf("the skip is not said:\n%s", logs)
				}
			},
		},
	}
	for _, fe := range []string{"tick", "run"} {
		for _, tc := range cases {
			t.Run(fe+": "+tc.name, func(t *testing.T) {
				e := newEnv(t)
				e.seed()
				cfg := e.config(seedShape)
				e.pinAll(cfg)
				tc.setup(e)
				tc.check(e, frontEnds[fe](e, cfg))
			})
		}
	}
}
