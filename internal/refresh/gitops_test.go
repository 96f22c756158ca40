package refresh

import (
	"github.com/image-refresh/image-refresh/internal/config"
	"testing"

	"github.com/image-refresh/image-refresh/internal/gitops"
)

// O2: a revert written by a GitOps controller names the tool and its
// application, and a fight with it ends with that tool's own setting.

func byGitOps(w gitops.Writer) obsOpt {
	return func(o *Observation) {
		c := o.Workloads[webAPI.Workload()].Containers[webAPI.Container]
		c.Image, c.Manager, c.GitOps = onTag, w.Manager, &w
		o.Workloads[webAPI.Workload()].Containers[webAPI.Container] = c
	}
}

func TestDecide_O2_AGitOpsRevertAndFightNameTheToolItsApplicationAndItsSetting(t *testing.T) {
	g := group(withImage("api", on(webAPI)))
	argo := gitops.Writer{Tool: gitops.ArgoCD, App: "Application shop", Manager: "argocd-controller"}
	base := func(opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{withAnchor(pinnedBefore("api", dB)), withLatest("api", dB), withLive(webAPI, onTag)}, opts...)...)
	}
	run(t, map[string]decideCase{
		"the revert's message and its change name Argo CD and the Application": {
			obs:  base(byGitOps(argo)),
			want: want{rows: []string{"api web/api: drifted"}, repin: firstRepin([]string{"web"}, "web: api docker.io/acme/api:prod -> docker.io/acme/api@<B> (revert, argocd-controller)")},
			also: func(t *testing.T, p *Plan) {
				contains(t, "row message", p.Rows[0].Message, "Argo CD (Application shop), field manager argocd-controller")
				contains(t, "WrittenBy", p.Repin.Changes[0].Images[0].WrittenBy(), "Argo CD (Application shop)")
				// status shows the row after C5 left it alone: the tool's
				// own setting is its fix.
				contains(t, "row remediation", p.Rows[0].Remediation, "RespectIgnoreDifferences=true")
			},
		},
		"a revert by another writer has no GitOps remediation": {
			obs:  base(),
			want: want{rows: []string{"api web/api: drifted"}, repin: firstRepin([]string{"web"}, "web: api docker.io/acme/api:prod -> docker.io/acme/api@<B> (revert, helm)")},
			also: func(t *testing.T, p *Plan) {
				if p.Rows[0].Remediation != "" {
					t.Errorf("row remediation %q, want none", p.Rows[0].Remediation)
				}
			},
		},
		"a fight with Argo CD names it and its setting that ends the fight (C5)": {
			obs:  base(byGitOps(argo), func(o *Observation) { o.Fights = map[config.Target]string{webAPI: "argocd-controller"} }),
			want: want{rows: []string{"api web/api: error"}, findings: []string{"api: WARN ImageRewriteFight needs-human"}},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "Argo CD syncs the bare tag back: Argo CD (Application shop)")
				contains(t, "remediation", p.Findings[0].Remediation, "RespectIgnoreDifferences=true")
				contains(t, "remediation", p.Findings[0].Remediation, "Application shop")
			},
		},
		"a fight with another writer keeps the generic remediation": {
			obs:  base(func(o *Observation) { o.Fights = map[config.Target]string{webAPI: "kyverno"} }),
			want: want{rows: []string{"api web/api: error"}, findings: []string{"api: WARN ImageRewriteFight needs-human"}},
			also: func(t *testing.T, p *Plan) {
				contains(t, "remediation", p.Findings[0].Remediation, "stop kyverno from rewriting")
			},
		},
	})
}

// O2, N1: Argo CD synced the bare tag back over the pin, and a node that
// had the tag cached runs an old build. The cause comes first: the row is
// drifted, naming Argo CD, its Application and its setting that ends the
// fight; running-stale is beside it with its own message and fix, and is
// still a finding (WARN, Event).
func TestDecide_O2_N1_ARevertIsShownFirstAndTheStalePodsItCausedBesideIt(t *testing.T) {
	g := group(withImage("api", on(webAPI)))
	argo := gitops.Writer{Tool: gitops.ArgoCD, App: "Application shop", Manager: "argocd-controller"}
	run(t, map[string]decideCase{
		"reverted by Argo CD, a pod on an old build": {
			obs: observe(g, withAnchor(pinnedBefore("api", dB)), withLatest("api", dB), withLive(webAPI, onTag), byGitOps(argo),
				withPods(web, "api", repo+"@"+dB, repo+"@"+dA)),
			want: want{rows: []string{"api web/api: drifted"}, findings: []string{"api: WARN RunningStale benign"}, repin: firstRepin([]string{"web"}, "web: api docker.io/acme/api:prod -> docker.io/acme/api@<B> (revert, argocd-controller)")},
			also: func(t *testing.T, p *Plan) {
				r := p.Rows[0]
				contains(t, "row message", r.Message, "Argo CD (Application shop)")
				contains(t, "row remediation", r.Remediation, "RespectIgnoreDifferences=true")
				if len(r.Also) != 1 || r.Also[0].State != StateRunningStale {
					t.Fatalf("beside the cause: %+v, want running-stale", r.Also)
				}
				contains(t, "running-stale's message", short.Replace(r.Also[0].Message), "pod web-b on node node-2 runs <A>")
				contains(t, "running-stale's fix", r.Also[0].Remediation, "delete the listed pods")
			},
		},
	})
}
