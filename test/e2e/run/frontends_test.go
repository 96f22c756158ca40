package run

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/test/support/e2e"
)

// The guards hold identically in both front ends: the same cases run
// through `tick` and through `run` (issue: "same table of cases, run
// through both front ends"), because both call one engine.
func TestFrontEnds_R4_R10_GuardsHoldInTickAndRun(t *testing.T) {
	frontEnds := map[string]func(e *env, cfg string) string{
		"tick": func(e *env, cfg string) string {
			_, logs := e.Tick(cfg)
			return logs
		},
		"run": func(e *env, cfg string) string {
			ctl := e.StartRun(cfg, "--poll-interval", "1s", "--poll-jitter", "0")
			ctl.WaitPasses(e.T, "control-plane", 0, 3) // the first pass and two resyncs, each after the setup
			ctl.Stop(e.T)
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
				e.SetImageAs("helm", "Deployment", "requests-proxy", "proxy", e.Repo("api")+":prod")
				e.Annotate("jobs-manager", map[string]*string{e.Key("refresh-attempt"): e2e.Ptr("3")})
				e.Settle("Deployment", "jobs-manager")
			},
			check: func(e *env, logs string) {
				if got := e.Image("requests-proxy", "proxy"); strings.Contains(got, "@") {
					e.T.Errorf("re-imaged while locked out: %s", got)
				}
				if !strings.Contains(logs, "LOCKED OUT") || e.Annotations("jobs-manager")[e.Key("refresh-flap-detected")] != "3" {
					e.T.Errorf("lockout not reported (flap %q):\n%s", e.Annotations("jobs-manager")[e.Key("refresh-flap-detected")], logs)
				}
				if !e2e.HasEvent(e.Events("jobs-manager"), "RefreshLockedOut", "rearm") {
					e.T.Errorf("no RefreshLockedOut event")
				}
			},
		},
		{
			name: "a group that is not settled is not re-imaged",
			setup: func(e *env) {
				// requests-proxy can never finish: no node matches.
				patch := `{"spec":{"template":{"spec":{"nodeSelector":{"no-such-node":"true"}}}}}`
				if _, err := e.C.Client.AppsV1().Deployments(e.NS).Patch(context.Background(), "requests-proxy", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
					e.T.Fatal(err)
				}
				e.WontSettle("requests-proxy")
				e.SetImageAs("helm", "Deployment", "jobs-manager", "api", e.Repo("api")+":prod")
			},
			check: func(e *env, logs string) {
				if got := e.Image("jobs-manager", "api"); strings.Contains(got, "@") {
					e.T.Errorf("re-pinned while the group is not settled: %s", got)
				}
				if !strings.Contains(logs, "is not settled") {
					e.T.Errorf("the skip is not said:\n%s", logs)
				}
			},
		},
	}
	for _, fe := range []string{"tick", "run"} {
		for _, tc := range cases {
			t.Run(fe+": "+tc.name, func(t *testing.T) {
				e := newEnv(t)
				e.Seed()
				cfg := e.Config(e2e.SeedShape)
				e.PinAll(cfg)
				tc.setup(e)
				tc.check(e, frontEnds[fe](e, cfg))
			})
		}
	}
}
