package refresh

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// V4: a pinned digest, or the digest V2 rolls back to, that the registry
// no longer holds is pin-missing; a read failure is not a verdict, and a
// digest no one pins is not checked.

func pinCheck(ref PinRef, missing bool, err error) obsOpt {
	return func(o *Observation) {
		if o.PinChecks == nil {
			o.PinChecks = map[PinRef]PinCheck{}
		}
		o.PinChecks[ref] = PinCheck{Missing: missing, Err: err}
	}
}

func TestDecide_V4_APinnedDigestTheRegistryNoLongerHoldsIsPinMissing(t *testing.T) {
	g := group(withImage("api", on(webAPI, agentMon)))
	steady := func(opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{withAnchor(pinnedBefore("api", dA)),
			withLive(webAPI, pinned(dA)), withLive(agentMon, pinned(dA))}, opts...)...)
	}
	onA := PinRef{Repository: repo, Digest: dA}
	run(t, map[string]decideCase{
		"gone: every target pinned to it is pin-missing, naming the digest, the targets, what fails and the fix": {
			obs: steady(withLatest("api", dA), pinCheck(onA, true, nil)),
			want: want{
				findings: []string{"api: ERROR PinMissing needs-human"},
				rows:     []string{"api web/api: pin-missing", "api agent/monitor: pin-missing"},
			},
			also: func(t *testing.T, p *Plan) {
				f := findingWith(t, p, ReasonPinMissing)
				contains(t, "message", f.Message, repo+"@"+dA)
				contains(t, "message", f.Message, "Deployment tb/web container api, DaemonSet tb/agent container monitor are pinned to it")
				contains(t, "message", f.Message, "a new pod, a reschedule or a scale-up cannot pull it")
				contains(t, "remediation", f.Remediation, "publish a build under "+repo+":"+tag)
				contains(t, "remediation", f.Remediation, "retention rule")
				if p.Rows[0].Message != f.Message || p.Rows[0].Remediation != f.Remediation {
					t.Errorf("row message %q / %q, want the finding's", p.Rows[0].Message, p.Rows[0].Remediation)
				}
			},
		},
		"there: pinned, nothing said": {
			obs:  steady(withLatest("api", dA), pinCheck(onA, false, nil)),
			want: want{rows: []string{"api web/api: pinned", "api agent/monitor: pinned"}},
		},
		"a registry that cannot tell (503) is not missing: a benign WARN, still pinned": {
			obs: steady(withLatest("api", dA), pinCheck(onA, false, errors.New("HEAD …: server-error (HTTP 503)"))),
			want: want{
				findings:    []string{"api: WARN - benign"},
				rows:        []string{"api web/api: pinned", "api agent/monitor: pinned"},
				bookkeeping: kv{k.PinCheckFailures("api"): "1"},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "message", p.Findings[0].Message, "not taken as missing")
				contains(t, "message", p.Findings[0].Message, "failure 1 of 3 in a row")
				if p.Findings[0].Once == "" {
					t.Error("the read failure has no Once key: `run` would say it on every pass")
				}
			},
		},
		"a registry that cannot tell maxReadFailures checks in a row needs a human (R1)": {
			obs: steady(withLatest("api", dA), withAnchor(ann(k.PinCheckFailures("api"), "2")), pinCheck(onA, false, errors.New("HEAD …: UNAUTHORIZED (HTTP 401)"))),
			want: want{
				findings:    []string{"api: ERROR RefreshError needs-human"},
				rows:        []string{"api web/api: pinned", "api agent/monitor: pinned"},
				bookkeeping: kv{k.PinCheckFailures("api"): "3"},
			},
			also: func(t *testing.T, p *Plan) { contains(t, "message", p.Findings[0].Message, "failure 3 of 3 in a row") },
		},
		"a check the registry answered ends the streak": {
			obs: steady(withLatest("api", dA), withAnchor(ann(k.PinCheckFailures("api"), "2")), pinCheck(onA, false, nil)),
			want: want{
				rows:        []string{"api web/api: pinned", "api agent/monitor: pinned"},
				bookkeeping: kv{k.PinCheckFailures("api"): deleted},
			},
		},
		"not checked this pass (no answers): nothing said": {
			obs:  steady(withLatest("api", dA)),
			want: want{rows: []string{"api web/api: pinned", "api agent/monitor: pinned"}},
		},
		"a digest no target is pinned to is ignored, even when the registry lost it": {
			obs:  steady(withLatest("api", dA), pinCheck(PinRef{Repository: repo, Digest: dC}, true, nil)),
			want: want{rows: []string{"api web/api: pinned", "api agent/monitor: pinned"}},
		},
		"a digest change moves every target off the lost digest in this pass: nothing said": {
			obs: steady(withLatest("api", dB), pinCheck(onA, true, nil)),
			want: want{
				rows: []string{"api web/api: drifted", "api agent/monitor: drifted"},
				repin: firstRepin([]string{"web", "agent"},
					"web: api "+pinned("<A>")+" -> "+pinned("<B>")+" (digest-change, helm)",
					"agent: monitor "+pinned("<A>")+" -> "+pinned("<B>")+" (digest-change, helm)",
				).recording("api", "<B>"),
			},
		},
		"a target on the tag is not pinned to the lost digest: it keeps its own state": {
			obs: steady(withLatest("api", dA), withLive(agentMon, onTag), pinCheck(onA, true, nil)),
			want: want{
				findings: []string{"api: ERROR PinMissing needs-human"},
				rows:     []string{"api web/api: pin-missing", "api agent/monitor: drifted"},
				repin:    firstRepin([]string{"web", "agent"}, "agent: monitor "+onTag+" -> "+pinned("<A>")+" (revert, helm)"),
			},
			also: func(t *testing.T, p *Plan) {
				// The drifted target is on the tag: it is not pinned to
				// the lost digest, so nothing is beside it.
				if len(p.Rows[1].Also) != 0 {
					t.Errorf("agent's row Also = %v, want none (on the tag, not pinned to it)", p.Rows[1].Also)
				}
				contains(t, "message", findingWith(t, p, ReasonPinMissing).Message, "Deployment tb/web container api is pinned to it")
			},
		},
	})
}

func TestDecide_V4_ALostRollbackTargetSaysTheRollbackCannotRetreat(t *testing.T) {
	g := rollbackGroup()
	onA := PinRef{Repository: repo, Digest: dA}
	run(t, map[string]decideCase{
		"a digest change in flight: the recorded digest it would roll back to is gone": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withAnchor(ann(k.Attempt(), "1", k.Holder(), heldBy("me", time.Minute))),
				withLatest("api", dB), withLive(webAPI, pinned(dB)), withLive(agentMon, pinned(dB)), notSettled(agent, "1 of 3 pods updated"),
				pinCheck(onA, true, nil)),
			want: want{
				findings: []string{"api: ERROR PinMissing needs-human"},
				rows:     []string{"api web/api: not-settled", "api agent/monitor: not-settled"},
			},
			also: func(t *testing.T, p *Plan) {
				f := findingWith(t, p, ReasonPinMissing)
				contains(t, "message", f.Message, "a failed rollout of Deployment tb/web container api, DaemonSet tb/agent container monitor rolls back to")
				contains(t, "message", f.Message, "cannot retreat")
				for _, r := range p.Rows {
					if !slices.ContainsFunc(r.Also, func(b Beside) bool { return b.State == StatePinMissing }) {
						t.Errorf("row %s: Also = %v, want pin-missing beside %s", r.Target, r.Also, r.State)
					}
				}
			},
		},
		"settled on the record: it is also where the next rollback retreats to": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dA),
				withLive(webAPI, pinned(dA)), withLive(agentMon, pinned(dA)), pinCheck(onA, true, nil)),
			want: want{
				findings: []string{"api: ERROR PinMissing needs-human"},
				rows:     []string{"api web/api: pin-missing", "api agent/monitor: pin-missing"},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "message", findingWith(t, p, ReasonPinMissing).Message, "the rollback cannot retreat to it")
			},
		},
	})
}

func TestDecide_V4_ALostOperatorPinIsPinMissingWithItsOwnFix(t *testing.T) {
	g := group(withImage("api", on(webAPI), pinnedDigest(dB)))
	onB := PinRef{Repository: repo, Digest: dB}
	run(t, map[string]decideCase{
		"an operator pin the registry lost: pin-missing, fixed by the pin": {
			obs: observe(g, withLatest("api", dB), withLive(webAPI, pinned(dB)), pinCheck(onB, true, nil)),
			want: want{
				findings: []string{"api: INFO - benign", "api: ERROR PinMissing needs-human"},
				rows:     []string{"api web/api: pin-missing"},
			},
			also: func(t *testing.T, p *Plan) {
				f := findingWith(t, p, ReasonPinMissing)
				contains(t, "remediation", f.Remediation, "set pinnedDigest of image api to a digest the registry holds")
				if strings.Contains(f.Message, "rollback") {
					t.Errorf("message %q speaks of a rollback: an operator pin is never rolled back to", f.Message)
				}
			},
		},
		"a stale operator pin the registry lost: stale-pin stays the state, pin-missing beside it": {
			obs: observe(g, withLatest("api", dC), withLive(webAPI, pinned(dB)), pinCheck(onB, true, nil)),
			want: want{
				bookkeeping: kv{k.StalePin("api"): "<C>"},
				findings:    []string{"api: WARN StalePin needs-human", "api: ERROR PinMissing needs-human"},
				rows:        []string{"api web/api: stale-pin"},
			},
			also: func(t *testing.T, p *Plan) {
				if len(p.Rows[0].Also) != 1 || p.Rows[0].Also[0].State != StatePinMissing {
					t.Errorf("Also = %v, want pin-missing beside stale-pin", p.Rows[0].Also)
				}
			},
		},
	})
}

func TestPinsToCheck_V4_ListsOnlyDigestsATargetIsPinnedToOrRollsBackTo(t *testing.T) {
	hold := group(withImage("api", on(webAPI, agentMon)))
	onMirror := func(d string) string { return mirror + "@" + d }
	for name, tc := range map[string]struct {
		obs  Observation
		want []PinRef
	}{
		"pinned targets: their digest, once": {
			obs:  observe(hold, withAnchor(pinnedBefore("api", dA)), withLive(webAPI, pinned(dA)), withLive(agentMon, pinned(dA))),
			want: []PinRef{{repo, dA}},
		},
		"a target on a mirror: checked where it pulls from": {
			obs:  observe(hold, withAnchor(pinnedBefore("api", dA)), withLive(webAPI, pinned(dA)), withLive(agentMon, onMirror(dA))),
			want: []PinRef{{repo, dA}, {mirror, dA}},
		},
		"targets on the tag: nothing is pinned, nothing checked": {
			obs: observe(hold, withAnchor(pinnedBefore("api", dA)), withLive(webAPI, onTag), withLive(agentMon, onTag)),
		},
		"no record: nothing checked": {
			obs: observe(hold, withLive(webAPI, pinned(dA)), withLive(agentMon, pinned(dA))),
		},
		"hold: a digest change in flight checks nothing it would roll back to": {
			obs: observe(hold, withAnchor(pinnedBefore("api", dA)), withLive(webAPI, pinned(dB)), withLive(agentMon, pinned(dB))),
		},
		"rollback: a digest change in flight checks the record it rolls back to": {
			obs:  observe(rollbackGroup(), withAnchor(pinnedBefore("api", dA)), withLive(webAPI, pinned(dB)), withLive(agentMon, pinned(dB))),
			want: []PinRef{{repo, dA}},
		},
		"an operator pin: its digest": {
			obs:  observe(group(withImage("api", on(webAPI), pinnedDigest(dC))), withLive(webAPI, pinned(dC))),
			want: []PinRef{{repo, dC}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			if got := PinsToCheck(prefix, tc.obs, tc.obs.Group.Images[0]); !slices.Equal(got, tc.want) {
				t.Errorf("PinsToCheck = %v, want %v", got, tc.want)
			}
		})
	}
}
