package refresh

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/internal/config"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// decideCase is one row of a rule's table: the settings, what the tick
// observed, and the plan it must produce.
type decideCase struct {
	settings []settingsOpt
	obs      Observation
	want     want
	also     func(t *testing.T, p *Plan)
}

func run(t *testing.T, cases map[string]decideCase) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		tc := cases[name]
		t.Run(name, func(t *testing.T) {
			p := decide(t, settings(tc.settings...), tc.obs, tc.want)
			// also indexes into the plan; it runs only on a plan whose
			// shape matched, so that a wrong plan fails instead of panicking.
			if tc.also != nil && !t.Failed() {
				tc.also(t, p)
			}
		})
	}
}

var (
	daemonsets  = schema.GroupResource{Group: "apps", Resource: "daemonsets"}
	notFound    = apierrors.NewNotFound(daemonsets, "agent")
	forbidden   = apierrors.NewForbidden(daemonsets, "agent", errors.New("RBAC: role image-refresh cannot get"))
	registry503 = errors.New("HEAD https://registry-1.docker.io/v2/acme/api/manifests/prod: 503 Service Unavailable")
)

// Rows and findings that recur.
const (
	lockoutFinding = "group: WARN RefreshLockedOut needs-human"
	apiError       = "group: ERROR RefreshError needs-human"
)

func TestDecide_R1_ResolveFailuresSkipTheImageAndCount(t *testing.T) {
	g := group(withImage("api", on(webAPI)))
	streak := k.ResolveFailures("api")
	// The target is on the tag, so any accepted digest would be pinned.
	base := func(opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{withAnchor(pinnedBefore("api", dA)), withLive(webAPI, onTag)}, opts...)...)
	}
	skipped := want{
		bookkeeping: kv{streak: "1"},
		findings:    []string{"api: WARN - benign"},
		rows:        []string{"api web/api: error"},
	}
	invalid := func(d string) decideCase {
		return decideCase{obs: base(withLatest("api", d)), want: skipped}
	}
	run(t, map[string]decideCase{
		"a registry error skips the image with a benign WARN and starts the resolve-failure streak": {
			obs:  base(resolveErr("api", registry503)),
			want: skipped,
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "503 Service Unavailable")
			},
		},
		"a streak below maxReadFailures stays a benign WARN": {
			obs: base(resolveErr("api", registry503), withAnchor(ann(streak, "1"))),
			want: want{
				bookkeeping: kv{streak: "2"},
				findings:    []string{"api: WARN - benign"},
				rows:        []string{"api web/api: error"},
			},
		},
		"a streak reaching maxReadFailures is an ERROR that needs a human": {
			obs: base(resolveErr("api", registry503), withAnchor(ann(streak, "2"))),
			want: want{
				bookkeeping: kv{streak: "3"},
				findings:    []string{"api: ERROR RefreshError needs-human"},
				rows:        []string{"api web/api: error"},
			},
			also: func(t *testing.T, p *Plan) {
				if p.Findings[0].Remediation == "" {
					t.Error("the ceiling finding has no remediation")
				}
			},
		},
		"an invalid stored streak counts as at its ceiling": {
			obs: base(resolveErr("api", registry503), withAnchor(ann(streak, "many"))),
			want: want{
				bookkeeping: kv{streak: "4"},
				findings:    []string{"api: ERROR RefreshError needs-human"},
				rows:        []string{"api web/api: error"},
			},
		},
		"a failed ask an earlier pass counted reports the stored streak and writes nothing": {
			obs: base(countedErr("api", registry503), withAnchor(ann(streak, "1"))),
			want: want{
				findings: []string{"api: WARN - benign"},
				rows:     []string{"api web/api: error"},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "failure 1 of 3")
			},
		},
		"a counted failed ask at maxReadFailures is still an ERROR that needs a human": {
			obs: base(countedErr("api", registry503), withAnchor(ann(streak, "3"))),
			want: want{
				findings: []string{"api: ERROR RefreshError needs-human"},
				rows:     []string{"api web/api: error"},
			},
		},
		"a counted failed ask whose streak is not stored is counted": {
			obs:  base(countedErr("api", registry503)),
			want: skipped,
		},
		"a digest with a short uppercase hex is never pinned":   invalid("sha256:ABC"),
		"a digest with 64 uppercase hex digits is never pinned": invalid("sha256:" + strings.Repeat("A", 64)),
		"a tag name in place of a digest is never pinned":       invalid("latest"),
		"an empty registry answer is never pinned":              invalid(""),
		"an unknown algorithm is never pinned":                  invalid("md5:" + strings.Repeat("a", 32)),
		"an invalid digest is never recorded on first observation": {
			obs:  observe(g, withLive(webAPI, onTag), withLatest("api", "sha256:ABC")),
			want: skipped,
		},
		"a successful resolve clears an existing streak": {
			obs: base(withLatest("api", dA), withLive(webAPI, pinned(dA)), withAnchor(ann(streak, "2"))),
			want: want{
				bookkeeping: kv{streak: deleted},
				rows:        []string{"api web/api: pinned"},
			},
		},
	})
}

func TestDecide_R2_OperatorPinIsCheckedNotRefreshed(t *testing.T) {
	stale := k.StalePin("api")
	pinnedTo := func(d string) config.Group { return group(withImage("api", on(webAPI), pinnedDigest(d))) }
	run(t, map[string]decideCase{
		"an operator pin equal to latest changes nothing, and says it is current (once in run)": {
			obs:  observe(pinnedTo(dB), withLatest("api", dB), withLive(webAPI, pinned(dB))),
			want: want{rows: []string{"api web/api: pinned"}, findings: []string{"api: INFO - benign"}},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "the operator pin "+dB+" of docker.io/acme/api:prod is the registry's latest")
				check(t, "Once", p.Findings[0].Once, "operator-pin-current api "+dB)
			},
		},
		"an operator pin equal to latest clears a stale-pin finding left from before": {
			obs: observe(pinnedTo(dB), withLatest("api", dB), withLive(webAPI, pinned(dB)), withAnchor(ann(stale, dA))),
			want: want{
				bookkeeping: kv{stale: deleted},
				findings:    []string{"api: INFO - benign", "api: INFO - benign"},
				rows:        []string{"api web/api: pinned"},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "the stale-pin finding of docker.io/acme/api:prod is cleared: the operator pin "+dB+" is the registry's latest now")
				check(t, "Once", p.Findings[0].Once, "stale-pin-cleared api")
			},
		},
		"an operator pin behind latest records the stale-pin finding with latest and re-pins nothing": {
			obs: observe(pinnedTo(dA), withLatest("api", dB), withLive(webAPI, pinned(dA))),
			want: want{
				bookkeeping: kv{stale: "<B>"},
				findings:    []string{"api: WARN StalePin needs-human"},
				rows:        []string{"api web/api: stale-pin"},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "remediation", p.Findings[0].Remediation, dB)
			},
		},
		"a stale-pin finding already holding latest is reported again but not rewritten": {
			obs: observe(pinnedTo(dA), withLatest("api", dB), withLive(webAPI, pinned(dA)), withAnchor(ann(stale, dB))),
			want: want{
				findings: []string{"api: WARN StalePin needs-human"},
				rows:     []string{"api web/api: stale-pin"},
			},
		},
		"a stale-pin finding for an older latest moves to the new latest": {
			obs: observe(pinnedTo(dA), withLatest("api", dB), withLive(webAPI, pinned(dA)), withAnchor(ann(stale, dC))),
			want: want{
				bookkeeping: kv{stale: "<B>"},
				findings:    []string{"api: WARN StalePin needs-human"},
				rows:        []string{"api web/api: stale-pin"},
			},
		},
		"an operator-pinned image is not re-pinned when its target runs the tag, and the target is not called pinned": {
			obs: observe(pinnedTo(dB), withLatest("api", dB), withLive(webAPI, onTag)),
			want: want{
				findings: []string{"api: INFO - benign", "api: NOTE - benign"},
				rows:     []string{"api web/api: inert"},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "row message", p.Rows[0].Message, "not the operator pin")
				contains(t, "remediation", p.Rows[0].Remediation, "pinnedDigest")
			},
		},
		"an operator-pinned target on another digest is not called pinned either": {
			obs: observe(pinnedTo(dB), withLatest("api", dB), withLive(webAPI, pinned(dA))),
			want: want{
				findings: []string{"api: INFO - benign", "api: NOTE - benign"},
				rows:     []string{"api web/api: inert"},
			},
		},
		"an operator-pinned target that cannot be read is an error row and counts a read failure, not pinned": {
			obs: observe(group(withImage("mon", on(agentMon), pinnedDigest(dB))), withLatest("mon", dB), readErr(agent, notFound)),
			want: want{
				bookkeeping: kv{k.ReadFailures("mon"): "1"},
				findings:    []string{apiError, "mon: INFO - benign", "mon: WARN - benign"},
				rows:        []string{"mon agent/monitor: error"},
			},
		},
		"removing the operator pin clears the stale-pin finding": {
			obs: observe(group(withImage("api", on(webAPI))), withLatest("api", dB), withLive(webAPI, pinned(dB)),
				withAnchor(pinnedBefore("api", dB)), withAnchor(ann(stale, dB))),
			want: want{
				bookkeeping: kv{stale: deleted},
				findings:    []string{"api: INFO - benign"},
				rows:        []string{"api web/api: pinned"},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "is cleared: its pinnedDigest was removed")
				check(t, "Once", p.Findings[0].Once, "stale-pin-cleared api")
			},
		},
	})
}

func TestDecide_R3_MirrorNeedsProofOfTheDigest(t *testing.T) {
	g := group(withImage("api", on(webAPI)))
	onMirror := func(opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{withAnchor(pinnedBefore("api", dB)), withLatest("api", dB), withLive(webAPI, mirror+":prod")}, opts...)...)
	}
	inert := want{
		findings: []string{"api: NOTE - benign"},
		rows:     []string{"api web/api: inert"},
	}
	run(t, map[string]decideCase{
		"a target on a mirror without proof is inert, a benign NOTE, and unchanged": {
			obs:  onMirror(),
			want: inert,
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "mirror.local:5000")
			},
		},
		"a mirror that holds no copy of the digest leaves the target inert": {
			obs:  onMirror(mirrorProof(webAPI, false, nil)),
			want: inert,
		},
		"a mirror that could not be asked leaves the target inert, not in error": {
			obs:  onMirror(mirrorProof(webAPI, false, errors.New("HEAD mirror.local:5000: timeout"))),
			want: inert,
		},
		"a mirror proven to hold the digest is pinned on the mirror's repository": {
			obs: onMirror(mirrorProof(webAPI, true, nil)),
			want: want{
				rows:  []string{"api web/api: drifted"},
				repin: firstRepin([]string{"web"}, "web: api mirror.local:5000/acme/api:prod -> mirror.local:5000/acme/api@<B> (revert, helm)"),
			},
		},
		"a mirror prefix rewrite that keeps the digest is no revert and needs no proof": {
			obs:  onMirror(withLive(webAPI, mirror+"@"+dB)),
			want: want{rows: []string{"api web/api: pinned"}},
		},
		"the short Docker Hub spelling of the configured repository needs no proof": {
			obs: onMirror(withLive(webAPI, "acme/api:prod")),
			want: want{
				rows:  []string{"api web/api: drifted"},
				repin: firstRepin([]string{"web"}, "web: api acme/api:prod -> acme/api@<B> (revert, helm)"),
			},
		},
	})
}

func TestDecide_R4_SettledGuard(t *testing.T) {
	// Two images on two workloads, so that one workload can fail alone.
	g := group(withImage("api", on(webAPI)), withImage("mon", fromRepo(monRepo), on(agentMon)))
	skip := k.SkipStreak()
	steady := func(opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{
			withAnchor(pinnedBefore("api", dB)), withAnchor(pinnedBefore("mon", dB)),
			withLatest("api", dB), withLatest("mon", dB),
			withLive(webAPI, onTag), withLive(agentMon, monRepo+"@"+dB),
		}, opts...)...)
	}
	skipped := func(streak string, finding string) want {
		return want{
			bookkeeping: kv{skip: streak},
			findings:    []string{finding},
			rows:        []string{"api web/api: not-settled", "mon agent/monitor: not-settled"},
		}
	}
	run(t, map[string]decideCase{
		"a workload not settled skips the tick with a benign NOTE and counts the skip streak": {
			obs:  steady(notSettled(agent, "2 of 3 pods updated")),
			want: skipped("1", "group: NOTE - benign"),
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "2 of 3 pods updated")
			},
		},
		"the anchor not settled skips the tick as well": {
			obs:  steady(notSettled(web, "observedGeneration behind")),
			want: skipped("1", "group: NOTE - benign"),
		},
		"a skip streak below maxSkipTicks stays benign": {
			obs:  steady(notSettled(agent, "rolling"), withAnchor(ann(skip, "1"))),
			want: skipped("2", "group: NOTE - benign"),
		},
		"a skip streak reaching maxSkipTicks freezes refresh loudly": {
			obs:  steady(notSettled(agent, "rolling"), withAnchor(ann(skip, "2"))),
			want: skipped("3", "group: ERROR RefreshFrozen needs-human"),
			also: func(t *testing.T, p *Plan) {
				if p.Findings[0].Remediation == "" {
					t.Error("RefreshFrozen has no remediation")
				}
			},
		},
		"an invalid skip streak counts as at its ceiling": {
			obs: steady(notSettled(agent, "rolling"), withAnchor(ann(skip, "x"))),
			want: want{
				bookkeeping: kv{skip: "4"},
				findings:    []string{"group: WARN - benign", "group: ERROR RefreshFrozen needs-human"},
				rows:        []string{"api web/api: not-settled", "mon agent/monitor: not-settled"},
			},
		},
		"a NotFound workload is an error naming the API error, never a benign skip": {
			obs: steady(readErr(agent, notFound)),
			want: want{
				bookkeeping: kv{k.ReadFailures("mon"): "1"},
				findings:    []string{apiError, "mon: WARN - benign"},
				rows:        []string{"api web/api: drifted", "mon agent/monitor: error"},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", findingWith(t, p, ReasonRefreshError).Message, `daemonsets.apps "agent" not found`)
			},
		},
		"an RBAC denial is an error naming the API error, never a benign skip": {
			obs: steady(readErr(agent, forbidden)),
			want: want{
				bookkeeping: kv{k.ReadFailures("mon"): "1"},
				findings:    []string{apiError, "mon: WARN - benign"},
				rows:        []string{"api web/api: drifted", "mon agent/monitor: error"},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", findingWith(t, p, ReasonRefreshError).Message, "RBAC: role image-refresh cannot get")
			},
		},
		"a workload read error still lands first-observation records (R13)": {
			obs: observe(g, withLatest("api", dB), withLatest("mon", dB), withLive(webAPI, onTag), readErr(agent, forbidden)),
			want: want{
				bookkeeping: kv{k.Record("api"): "<B>", k.Record("mon"): "<B>"},
				findings:    []string{apiError, "api: INFO - benign", "mon: INFO - benign"},
				rows:        []string{"api web/api: first-observed", "mon agent/monitor: first-observed"},
			},
		},
		"settled again clears the skip streak in its own write": {
			obs: steady(withLive(webAPI, pinned(dB)), withAnchor(ann(skip, "2"))),
			want: want{
				clearSkip: kv{skip: deleted},
				findings:  []string{"group: INFO - benign"},
				rows:      []string{"api web/api: pinned", "mon agent/monitor: pinned"},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "settled again after 2 skipped pass(es): its skip streak is cleared")
				check(t, "Once", p.Findings[0].Once, "skip-streak-cleared")
			},
		},
		"settled while locked out still clears the skip streak": {
			obs: steady(withLive(webAPI, pinned(dB)), withAnchor(ann(skip, "2", k.Attempt(), "3", k.Flap(), "3"))),
			want: want{
				bookkeeping: kv{k.LockedOn("api"): "<B>", k.LockedOn("mon"): "<B>"},
				clearSkip:   kv{skip: deleted},
				findings:    []string{"group: INFO - benign", lockoutFinding},
				rows:        []string{"api web/api: locked-out", "mon agent/monitor: locked-out"},
				lockedOut:   true,
			},
		},
	})
}

func TestDecide_R5_FirstObservation(t *testing.T) {
	g := group(withImage("api", on(webAPI)))
	run(t, map[string]decideCase{
		"no record: latest is recorded and the workload is not touched": {
			obs: observe(g, withLatest("api", dB), withLive(webAPI, onTag)),
			want: want{
				bookkeeping: kv{k.Record("api"): "<B>"},
				findings:    []string{"api: INFO - benign"},
				rows:        []string{"api web/api: first-observed"},
			},
		},
		"no record under only-after-ever-pinned: recorded the same way": {
			settings: []settingsOpt{onlyAfterEverPinned},
			obs:      observe(g, withLatest("api", dB), withLive(webAPI, onTag)),
			want: want{
				bookkeeping: kv{k.Record("api"): "<B>"},
				findings:    []string{"api: INFO - benign"},
				rows:        []string{"api web/api: first-observed"},
			},
		},
		"no record and every target already on the digest: the ever-pinned marker goes in the same write": {
			obs: observe(g, withLatest("api", dB), withLive(webAPI, pinned(dB))),
			want: want{
				bookkeeping: kv{k.Record("api"): "<B>", k.EverPinned("api"): "true"},
				findings:    []string{"api: INFO - benign"},
				rows:        []string{"api web/api: first-observed"},
			},
		},
		"no record and a target on another digest: no ever-pinned marker": {
			obs: observe(g, withLatest("api", dB), withLive(webAPI, pinned(dA))),
			want: want{
				bookkeeping: kv{k.Record("api"): "<B>"},
				findings:    []string{"api: INFO - benign"},
				rows:        []string{"api web/api: first-observed"},
			},
		},
		"the tick after first observation pins a target still on the tag": {
			obs: observe(g, withAnchor(ann(k.Record("api"), dB)), withLatest("api", dB), withLive(webAPI, onTag)),
			want: want{
				rows: []string{"api web/api: drifted"},
				repin: &wantRepin{
					attempt: 1, attemptSet: kv{k.Attempt(): "1"},
					changes: []string{"web: api docker.io/acme/api:prod -> docker.io/acme/api@<B> (first-install, helm)"},
					wait:    []string{"web"},
					clear:   kv{k.Attempt(): deleted},
					record:  kv{k.EverPinned("api"): "true"},
				},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "row message", p.Rows[0].Message, "fresh install, or a re-render reverted the pin")
			},
		},
		"only-after-ever-pinned leaves a never-pinned image on its tag": {
			settings: []settingsOpt{onlyAfterEverPinned},
			obs:      observe(g, withAnchor(ann(k.Record("api"), dB)), withLatest("api", dB), withLive(webAPI, onTag)),
			want:     want{rows: []string{"api web/api: first-observed"}},
		},
		"only-after-ever-pinned re-pins an image that carries the ever-pinned marker": {
			settings: []settingsOpt{onlyAfterEverPinned},
			obs:      observe(g, withAnchor(pinnedBefore("api", dB)), withLatest("api", dB), withLive(webAPI, onTag)),
			want: want{
				rows:  []string{"api web/api: drifted"},
				repin: repinsWebAPI("<B>"),
			},
		},
		"only-after-ever-pinned still pins a digest change": {
			settings: []settingsOpt{onlyAfterEverPinned},
			obs:      observe(g, withAnchor(ann(k.Record("api"), dA)), withLatest("api", dB), withLive(webAPI, onTag)),
			want: want{
				rows: []string{"api web/api: drifted"},
				repin: &wantRepin{
					attempt: 1, attemptSet: kv{k.Attempt(): "1"},
					changes: []string{"web: api docker.io/acme/api:prod -> docker.io/acme/api@<B> (digest-change, helm)"},
					wait:    []string{"web"},
					clear:   kv{k.Attempt(): deleted},
					record:  kv{k.Record("api"): "<B>", k.EverPinned("api"): "true"},
				},
			},
		},
	})
}

func TestDecide_R6_DigestChangeReimagesEveryTarget(t *testing.T) {
	g := group(withImage("api", on(webAPI, agentMon)))
	moved := func(opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{withAnchor(pinnedBefore("api", dA)), withLatest("api", dB)}, opts...)...)
	}
	run(t, map[string]decideCase{
		"a new digest re-images every target and is recorded only after the rollout": {
			obs: moved(withLive(webAPI, pinned(dA)), withLive(agentMon, pinned(dA))),
			want: want{
				rows: []string{"api web/api: drifted", "api agent/monitor: drifted"},
				repin: firstRepin([]string{"web", "agent"},
					"web: api docker.io/acme/api@<A> -> docker.io/acme/api@<B> (digest-change, helm)",
					"agent: monitor docker.io/acme/api@<A> -> docker.io/acme/api@<B> (digest-change, helm)",
				).recording("api", "<B>"),
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "row message", p.Rows[0].Message, "moved")
			},
		},
		"a target already on the new digest gets no change (R9)": {
			obs: moved(withLive(webAPI, pinned(dB)), withLive(agentMon, pinned(dA))),
			want: want{
				rows:  []string{"api web/api: pinned", "api agent/monitor: drifted"},
				repin: firstRepin([]string{"web", "agent"}, "agent: monitor docker.io/acme/api@<A> -> docker.io/acme/api@<B> (digest-change, helm)").recording("api", "<B>"),
			},
		},
		"a target on the tag is re-imaged by a digest change too": {
			obs: moved(withLive(webAPI, onTag), withLive(agentMon, pinned(dA))),
			want: want{
				rows: []string{"api web/api: drifted", "api agent/monitor: drifted"},
				repin: firstRepin([]string{"web", "agent"},
					"web: api docker.io/acme/api:prod -> docker.io/acme/api@<B> (digest-change, helm)",
					"agent: monitor docker.io/acme/api@<A> -> docker.io/acme/api@<B> (digest-change, helm)",
				).recording("api", "<B>"),
			},
		},
	})
}

func TestDecide_R7_RevertIsRepinned(t *testing.T) {
	g := group(withImage("api", on(webAPI)))
	recorded := func(opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{withAnchor(pinnedBefore("api", dB)), withLatest("api", dB)}, opts...)...)
	}
	repinned := func(change string) want {
		return want{
			rows:  []string{"api web/api: drifted"},
			repin: firstRepin([]string{"web"}, change),
		}
	}
	noop := want{rows: []string{"api web/api: pinned"}}
	reads := k.ReadFailures("api")
	run(t, map[string]decideCase{
		"a target reverted to the tag is re-pinned with cause revert, logged neutrally": {
			obs:  recorded(withLive(webAPI, onTag)),
			want: repinned("web: api docker.io/acme/api:prod -> docker.io/acme/api@<B> (revert, helm)"),
			also: func(t *testing.T, p *Plan) {
				contains(t, "row message", p.Rows[0].Message, "fresh install, or a re-render reverted the pin")
				if got := p.Repin.Changes[0].Images[0].WrittenBy(); got != "helm" {
					t.Errorf("WrittenBy() = %q, want helm", got)
				}
			},
		},
		"the writer of the revert is carried, whoever it is": {
			obs:  recorded(writtenBy(webAPI, onTag, "argocd-controller")),
			want: repinned("web: api docker.io/acme/api:prod -> docker.io/acme/api@<B> (revert, argocd-controller)"),
		},
		"a target on another digest (a rollback to an old pin) is re-pinned": {
			obs:  recorded(withLive(webAPI, pinned(dA))),
			want: repinned("web: api docker.io/acme/api@<A> -> docker.io/acme/api@<B> (revert, helm)"),
		},
		"pinFormat tag+digest keeps the tag readable": {
			settings: []settingsOpt{tagAndDigest},
			obs:      recorded(withLive(webAPI, onTag)),
			want:     repinned("web: api docker.io/acme/api:prod -> docker.io/acme/api:prod@<B> (revert, helm)"),
		},
		"pinFormat digest writes repo@digest": {
			obs:  recorded(withLive(webAPI, onTag)),
			want: repinned("web: api docker.io/acme/api:prod -> docker.io/acme/api@<B> (revert, helm)"),
		},
		"a target on the digest is a no-op":                    {obs: recorded(withLive(webAPI, pinned(dB))), want: noop},
		"a target on tag+digest is on the digest":              {obs: recorded(withLive(webAPI, onTag+"@"+dB)), want: noop},
		"a mirror rewrite of the prefix is not a revert":       {obs: recorded(withLive(webAPI, mirror+"@"+dB)), want: noop},
		"a mirror rewrite in tag+digest form is not a revert":  {obs: recorded(withLive(webAPI, mirror+":prod@"+dB)), want: noop},
		"pinFormat tag+digest on an already pinned target too": {settings: []settingsOpt{tagAndDigest}, obs: recorded(withLive(webAPI, pinned(dB))), want: noop},
		"an unreadable live image skips the image fail-closed and counts the read-failure streak": {
			obs: recorded(withLive(webAPI, "docker.io/acme/api@sha256:nothex")),
			want: want{
				bookkeeping: kv{reads: "1"},
				findings:    []string{"api: WARN - benign"},
				rows:        []string{"api web/api: unreadable"},
			},
		},
		"the read-failure streak at its ceiling fails loudly": {
			obs: recorded(withLive(webAPI, "docker.io/acme/api@sha256:nothex"), withAnchor(ann(reads, "2"))),
			want: want{
				bookkeeping: kv{reads: "3"},
				findings:    []string{"api: ERROR RefreshError needs-human"},
				rows:        []string{"api web/api: unreadable"},
			},
		},
		"a readable live image clears the read-failure streak": {
			obs: recorded(withLive(webAPI, pinned(dB)), withAnchor(ann(reads, "2"))),
			want: want{
				bookkeeping: kv{reads: deleted},
				rows:        []string{"api web/api: pinned"},
			},
		},
	})
}

func TestDecide_R8_TargetsAreCheckedOneByOne(t *testing.T) {
	g := group(withImage("api", on(webAPI, agentMon)))
	obs := func(web, mon string) Observation {
		return observe(g, withAnchor(pinnedBefore("api", dB)), withLatest("api", dB), withLive(webAPI, web), withLive(agentMon, mon))
	}
	run(t, map[string]decideCase{
		"the first target on the digest and the second on the tag: only the second is re-pinned": {
			obs: obs(pinned(dB), onTag),
			want: want{
				rows:  []string{"api web/api: pinned", "api agent/monitor: drifted"},
				repin: firstRepin([]string{"web", "agent"}, "agent: monitor docker.io/acme/api:prod -> docker.io/acme/api@<B> (revert, helm)"),
			},
		},
		"the first target on the tag and the second on the digest: only the first is re-pinned": {
			obs: obs(onTag, pinned(dB)),
			want: want{
				rows:  []string{"api web/api: drifted", "api agent/monitor: pinned"},
				repin: firstRepin([]string{"web", "agent"}, "web: api docker.io/acme/api:prod -> docker.io/acme/api@<B> (revert, helm)"),
			},
		},
	})
}

func TestDecide_R9_OneWritePerWorkload(t *testing.T) {
	oneImage := group(withImage("api", on(webAPI, webProxy)))
	twoImages := group(withImage("api", on(webAPI)), withImage("proxy", fromRepo(proxyRepo), on(webProxy)))
	oneWrite := func(t *testing.T, p *Plan) {
		if n := len(p.Repin.Changes); n != 1 {
			t.Fatalf("got %d WorkloadChanges, want 1 (one patch, one rollout)", n)
		}
		if n := len(p.Repin.Changes[0].Images); n != 2 {
			t.Errorf("the WorkloadChange carries %d ImageChanges, want 2", n)
		}
	}
	run(t, map[string]decideCase{
		"two containers of one workload running one image change in one write": {
			obs: observe(oneImage, withAnchor(pinnedBefore("api", dB)), withLatest("api", dB), withLive(webAPI, onTag), withLive(webProxy, onTag)),
			want: want{
				rows: []string{"api web/api: drifted", "api web/proxy: drifted"},
				repin: firstRepin([]string{"web"},
					"web: api docker.io/acme/api:prod -> docker.io/acme/api@<B> (revert, helm)",
					"web: proxy docker.io/acme/api:prod -> docker.io/acme/api@<B> (revert, helm)",
				),
			},
			also: oneWrite,
		},
		"two images in one workload change in one write": {
			obs: observe(twoImages, withAnchor(pinnedBefore("api", dB)), withAnchor(pinnedBefore("proxy", dA)),
				withLatest("api", dB), withLatest("proxy", dA), withLive(webAPI, onTag), withLive(webProxy, proxyRepo+":prod")),
			want: want{
				rows: []string{"api web/api: drifted", "proxy web/proxy: drifted"},
				repin: firstRepin([]string{"web"},
					"web: api docker.io/acme/api:prod -> docker.io/acme/api@<B> (revert, helm)",
					"web: proxy docker.io/acme/proxy:prod -> docker.io/acme/proxy@<A> (revert, helm)",
				),
			},
			also: oneWrite,
		},
		"a workload already on the wanted references gets no write at all": {
			obs:  observe(oneImage, withAnchor(pinnedBefore("api", dB)), withLatest("api", dB), withLive(webAPI, pinned(dB)), withLive(webProxy, pinned(dB))),
			want: want{rows: []string{"api web/api: pinned", "api web/proxy: pinned"}},
		},
	})
}

func TestDecide_R10_AttemptsAndLockout(t *testing.T) {
	g := group(withImage("api", on(webAPI)))
	reverted := func(anchor map[string]string) Observation {
		return observe(g, withAnchor(pinnedBefore("api", dB)), withAnchor(anchor), withLatest("api", dB), withLive(webAPI, onTag))
	}
	attempt := func(n string) wantRepin {
		return wantRepin{
			attemptSet: kv{k.Attempt(): n},
			changes:    []string{"web: api docker.io/acme/api:prod -> docker.io/acme/api@<B> (revert, helm)"},
			wait:       []string{"web"},
			clear:      kv{k.Attempt(): deleted},
		}
	}
	first, second := attempt("1"), attempt("2")
	first.attempt, second.attempt = 1, 2
	withFlap := attempt("2")
	withFlap.attempt, withFlap.clear = 2, kv{k.Attempt(): deleted, k.Flap(): deleted}
	locked := func(flap string) want {
		return want{
			bookkeeping: kv{k.Flap(): flap, k.LockedOn("api"): "<B>"},
			findings:    []string{lockoutFinding},
			rows:        []string{"api web/api: locked-out"},
			lockedOut:   true,
		}
	}
	invalid := func(v string) decideCase {
		return decideCase{
			obs: reverted(ann(k.Attempt(), v)),
			also: func(t *testing.T, p *Plan) {
				contains(t, "invalid-attempt remediation", findingWith(t, p, ReasonRefreshError).Remediation, rearm)
				contains(t, "lockout remediation", findingWith(t, p, ReasonRefreshLockedOut).Remediation, rearm)
			},
			want: want{
				bookkeeping: kv{k.Flap(): "3", k.LockedOn("api"): "<B>"},
				findings:    []string{apiError, lockoutFinding},
				rows:        []string{"api web/api: locked-out"},
				lockedOut:   true,
			},
		}
	}
	rearmed := func(t *testing.T, p *Plan) {
		contains(t, "lockout remediation", findingWith(t, p, ReasonRefreshLockedOut).Remediation, rearm)
		contains(t, "row remediation", p.Rows[0].Remediation, rearm)
	}
	run(t, map[string]decideCase{
		"the first attempt is persisted as 1 before re-imaging, expecting no attempt": {
			obs:  reverted(nil),
			want: want{rows: []string{"api web/api: drifted"}, repin: &first},
			also: func(t *testing.T, p *Plan) {
				if e, ok := p.Repin.AttemptWrite.Expect[k.Attempt()]; !ok || e != nil {
					t.Errorf("AttemptWrite expects %v, want the attempt absent", e)
				}
				if e := p.Repin.ClearWrite.Expect[k.Attempt()]; e == nil || *e != "1" {
					t.Errorf("ClearWrite expects %v, want the attempt it wrote (1)", e)
				}
			},
		},
		"a later attempt counts on from the stored one": {
			obs:  reverted(ann(k.Attempt(), "1")),
			want: want{rows: []string{"api web/api: drifted"}, repin: &second},
		},
		"clearing the attempt also clears a flap marker left from before": {
			obs:  reverted(ann(k.Attempt(), "1", k.Flap(), "3")),
			want: want{rows: []string{"api web/api: drifted"}, repin: &withFlap},
		},
		"at maxRefreshAttempts nothing is re-imaged and the flap marker holds the count": {
			obs:  reverted(ann(k.Attempt(), "3")),
			want: locked("3"),
			also: rearmed,
		},
		"above maxRefreshAttempts the flap marker holds the count": {
			obs:  reverted(ann(k.Attempt(), "5")),
			want: locked("5"),
			also: rearmed,
		},
		"a flap marker that already holds the count is not rewritten": {
			obs: reverted(ann(k.Attempt(), "3", k.Flap(), "3")),
			want: want{
				bookkeeping: kv{k.LockedOn("api"): "<B>"},
				findings:    []string{lockoutFinding},
				rows:        []string{"api web/api: locked-out"},
				lockedOut:   true,
			},
		},
		"an attempt that is not a number counts as locked out, never as 0": invalid("x"),
		"a negative attempt counts as locked out, never as 0":              invalid("-1"),
		"a fractional attempt counts as locked out, never as 0":            invalid("1.5"),
		"an empty attempt counts as locked out, never as 0":                invalid(""),
	})
}

func TestDecide_R11_UnfinishedAttemptIsWaitedFor(t *testing.T) {
	g := group(withImage("api", on(webAPI, agentMon)))
	onDigest := func(attempt string, opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{
			withAnchor(pinnedBefore("api", dB)), withAnchor(ann(k.Attempt(), attempt)),
			withLatest("api", dB), withLive(webAPI, pinned(dB)), withLive(agentMon, pinned(dB)),
		}, opts...)...)
	}
	rows := []string{"api web/api: pinned", "api agent/monitor: pinned"}
	waiting := "group: WARN - benign"
	run(t, map[string]decideCase{
		"an earlier rollout still not settled is waited for again under attempt+1": {
			obs: onDigest("1", notSettled(agent, "1 of 3 pods available")),
			want: want{
				findings: []string{waiting},
				rows:     rows,
				repin: &wantRepin{
					attempt: 2, attemptSet: kv{k.Attempt(): "2"},
					wait:       []string{"web", "agent"},
					clear:      kv{k.Attempt(): deleted},
					unfinished: true,
				},
			},
		},
		"the last attempt below max is spent on waiting too": {
			obs: onDigest("2", notSettled(agent, "1 of 3 pods available")),
			want: want{
				findings: []string{waiting},
				rows:     rows,
				repin: &wantRepin{
					attempt: 3, attemptSet: kv{k.Attempt(): "3"},
					wait:       []string{"web", "agent"},
					clear:      kv{k.Attempt(): deleted},
					unfinished: true,
				},
			},
		},
		"an earlier rollout that has settled since is confirmed without a new attempt": {
			obs: onDigest("1"),
			want: want{
				findings: []string{waiting},
				rows:     rows,
				repin: &wantRepin{
					attempt:    1,
					wait:       []string{"web", "agent"},
					clear:      kv{k.Attempt(): deleted},
					unfinished: true,
				},
			},
			also: func(t *testing.T, p *Plan) {
				if e := p.Repin.ClearWrite.Expect[k.Attempt()]; e == nil || *e != "1" {
					t.Errorf("ClearWrite expects %v, want the stored attempt 1", e)
				}
			},
		},
		"no attempt pending and every target on its digest is a true no-op": {
			obs:  onDigest("0"),
			want: want{rows: rows},
		},
		"an attempt at max is locked out, not waited for": {
			obs: onDigest("3"),
			want: want{
				bookkeeping: kv{k.Flap(): "3", k.LockedOn("api"): "<B>"},
				findings:    []string{lockoutFinding},
				rows:        []string{"api web/api: locked-out", "api agent/monitor: locked-out"},
				lockedOut:   true,
			},
		},
	})
}

func TestDecide_R12_LatchedIsLoud(t *testing.T) {
	g := group(withImage("api", on(webAPI)), withImage("mon", fromRepo(monRepo), on(agentMon)))
	latched := func(opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{
			withAnchor(pinnedBefore("api", dB)), withAnchor(pinnedBefore("mon", dB)), withAnchor(ann(k.Attempt(), "3", k.Flap(), "3")),
			withLatest("api", dB), withLatest("mon", dB), withLive(webAPI, pinned(dB)), withLive(agentMon, monRepo+"@"+dB),
		}, opts...)...)
	}
	loud := func(t *testing.T, p *Plan) {
		f := findingWith(t, p, ReasonRefreshLockedOut)
		contains(t, "lockout remediation", f.Remediation, rearm)
		if f.Severity != SeverityWarn && f.Severity != SeverityError {
			t.Errorf("lockout severity %s, want WARN or louder", f.Severity)
		}
	}
	run(t, map[string]decideCase{
		"locked out while every target is on its digest still says so": {
			obs: latched(),
			want: want{
				bookkeeping: kv{k.LockedOn("api"): "<B>", k.LockedOn("mon"): "<B>"},
				findings:    []string{lockoutFinding},
				rows:        []string{"api web/api: locked-out", "mon agent/monitor: locked-out"},
				lockedOut:   true,
			},
			also: loud,
		},
		"locked out while a rollout is not settled says locked out, not skipped": {
			obs: latched(notSettled(agent, "rolling")),
			want: want{
				bookkeeping: kv{k.LockedOn("api"): "<B>", k.LockedOn("mon"): "<B>"},
				findings:    []string{lockoutFinding},
				rows:        []string{"api web/api: locked-out", "mon agent/monitor: locked-out"},
				lockedOut:   true,
			},
			also: loud,
		},
		"locked out while a workload cannot be read still says locked out": {
			obs: latched(readErr(agent, forbidden)),
			want: want{
				bookkeeping: kv{k.ReadFailures("mon"): "1", k.LockedOn("api"): "<B>", k.LockedOn("mon"): "<B>"},
				findings:    []string{apiError, "mon: WARN - benign", lockoutFinding},
				rows:        []string{"api web/api: locked-out", "mon agent/monitor: error"},
				lockedOut:   true,
			},
		},
	})
}

func TestDecide_R13_BookkeepingAlwaysLands(t *testing.T) {
	// api is on first observation, pin is a stale operator pin, mon moved
	// from <A> to <B>.
	g := group(
		withImage("api", on(webAPI)),
		withImage("pin", fromRepo(proxyRepo), pinnedDigest(dA), on(webProxy)),
		withImage("mon", fromRepo(monRepo), on(agentMon)),
	)
	tick := func(opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{
			withAnchor(pinnedBefore("mon", dA)),
			withLatest("api", dB), withLatest("pin", dB), withLatest("mon", dB),
			withLive(webAPI, onTag), withLive(webProxy, proxyRepo+"@"+dA), withLive(agentMon, monRepo+"@"+dA),
		}, opts...)...)
	}
	noDigestRecord := func(t *testing.T, p *Plan) {
		if _, ok := p.Bookkeeping.Set[k.Record("mon")]; ok {
			t.Errorf("the digest record of mon is in Bookkeeping; it lands only after a rollout (R13)")
		}
	}
	run(t, map[string]decideCase{
		"locked out: the first observation and the stale pin land, the digest record does not": {
			obs: tick(withAnchor(ann(k.Attempt(), "3"))),
			want: want{
				bookkeeping: kv{k.Record("api"): "<B>", k.StalePin("pin"): "<B>", k.Flap(): "3", k.LockedOn("mon"): "<B>"},
				findings:    []string{"api: INFO - benign", "pin: WARN StalePin needs-human", lockoutFinding},
				rows:        []string{"api web/api: first-observed", "pin web/proxy: stale-pin", "mon agent/monitor: locked-out"},
				lockedOut:   true,
			},
			also: noDigestRecord,
		},
		"locked out: a digest change whose targets already run it is not recorded": {
			obs: tick(withAnchor(ann(k.Attempt(), "3")), withLive(agentMon, monRepo+"@"+dB)),
			want: want{
				bookkeeping: kv{k.Record("api"): "<B>", k.StalePin("pin"): "<B>", k.Flap(): "3", k.LockedOn("mon"): "<B>"},
				findings:    []string{"api: INFO - benign", "pin: WARN StalePin needs-human", lockoutFinding},
				rows:        []string{"api web/api: first-observed", "pin web/proxy: stale-pin", "mon agent/monitor: locked-out"},
				lockedOut:   true,
			},
			also: noDigestRecord,
		},
		"locked out: clearing a stale pin that matches again lands": {
			obs: observe(group(withImage("pin", fromRepo(proxyRepo), pinnedDigest(dB), on(webProxy))),
				withAnchor(ann(k.Attempt(), "3", k.StalePin("pin"), dA)), withLatest("pin", dB), withLive(webProxy, proxyRepo+"@"+dB)),
			want: want{
				bookkeeping: kv{k.StalePin("pin"): deleted, k.Flap(): "3"},
				findings:    []string{"pin: INFO - benign", "pin: INFO - benign", lockoutFinding},
				rows:        []string{"pin web/proxy: locked-out"},
				lockedOut:   true,
			},
		},
		"not settled: the first observation and the stale pin land with the skip streak": {
			obs: tick(notSettled(agent, "rolling")),
			want: want{
				bookkeeping: kv{k.Record("api"): "<B>", k.StalePin("pin"): "<B>", k.SkipStreak(): "1"},
				findings:    []string{"api: INFO - benign", "pin: WARN StalePin needs-human", "group: NOTE - benign"},
				rows:        []string{"api web/api: first-observed", "pin web/proxy: stale-pin", "mon agent/monitor: not-settled"},
			},
			also: noDigestRecord,
		},
		"a re-image tick: the first observation lands now, the digest record after the rollout": {
			obs: tick(),
			want: want{
				bookkeeping: kv{k.Record("api"): "<B>", k.StalePin("pin"): "<B>"},
				findings:    []string{"api: INFO - benign", "pin: WARN StalePin needs-human"},
				rows:        []string{"api web/api: first-observed", "pin web/proxy: stale-pin", "mon agent/monitor: drifted"},
				repin:       firstRepin([]string{"web", "agent"}, "agent: monitor docker.io/acme/monitor@<A> -> docker.io/acme/monitor@<B> (digest-change, helm)").recording("mon", "<B>"),
			},
			also: noDigestRecord,
		},
	})
}

func TestDecide_R19_MisconfigurationIsNotUnreadable(t *testing.T) {
	g := group(withImage("api", on(webAPI)))
	reads := k.ReadFailures("api")
	noContainer := func(opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{withAnchor(pinnedBefore("api", dB)), withLatest("api", dB), withLive(target(web, "sidecar"), onTag)}, opts...)...)
	}
	namesTarget := func(t *testing.T, p *Plan) {
		f := p.Findings[0]
		if f.Target == nil || *f.Target != webAPI {
			t.Errorf("finding target = %v, want %s", f.Target, webAPI)
		}
		contains(t, "finding", f.Message, "configuration error")
		contains(t, "finding", f.Message, webAPI.String())
		if f.Remediation == "" {
			t.Error("configuration error has no remediation")
		}
		for _, s := range []string{f.Message, p.Rows[0].Message} {
			if strings.Contains(s, "unreadable") {
				t.Errorf("%q calls a misconfiguration unreadable", s)
			}
		}
	}
	run(t, map[string]decideCase{
		"a container missing from its workload is a configuration error naming the target": {
			obs: noContainer(),
			want: want{
				bookkeeping: kv{reads: "1"},
				findings:    []string{"api: ERROR RefreshError needs-human", "api: WARN - benign"},
				rows:        []string{"api web/api: error"},
			},
			also: namesTarget,
		},
		"a missing container counts the read-failure streak up to its ceiling": {
			obs: noContainer(withAnchor(ann(reads, "2"))),
			want: want{
				bookkeeping: kv{reads: "3"},
				findings:    []string{"api: ERROR RefreshError needs-human", "api: ERROR RefreshError needs-human"},
				rows:        []string{"api web/api: error"},
			},
			also: namesTarget,
		},
		"a missing container skips only its own image": {
			obs: observe(group(withImage("api", on(webAPI)), withImage("proxy", fromRepo(proxyRepo), on(webProxy))),
				withAnchor(pinnedBefore("api", dB)), withAnchor(pinnedBefore("proxy", dB)),
				withLatest("api", dB), withLatest("proxy", dB), withLive(webProxy, proxyRepo+":prod")),
			want: want{
				bookkeeping: kv{reads: "1"},
				findings:    []string{"api: ERROR RefreshError needs-human", "api: WARN - benign"},
				rows:        []string{"api web/api: error", "proxy web/proxy: drifted"},
				repin:       firstRepin([]string{"web"}, "web: proxy docker.io/acme/proxy:prod -> docker.io/acme/proxy@<B> (revert, helm)"),
			},
		},
	})
}

// A workload of the configured kind that does not exist is a configuration
// error too (R19): some finding that needs a human names the target, not
// only its workload, and carries the API's error (R4).
func TestDecide_R19_MissingWorkloadNamesTheTarget(t *testing.T) {
	g := group(withImage("api", on(webAPI)), withImage("mon", fromRepo(monRepo), on(agentMon)))
	obs := observe(g, withAnchor(pinnedBefore("api", dB)), withAnchor(pinnedBefore("mon", dB)),
		withLatest("api", dB), withLatest("mon", dB), withLive(webAPI, pinned(dB)), readErr(agent, notFound))
	p := Decide(settings(), obs)
	checkCAS(t, obs.Anchor, p)
	if p.Repin != nil {
		t.Errorf("Repin = %s, want none", renderRepin(p.Repin))
	}
	var named bool
	for _, f := range p.Findings {
		if f.NeedsHuman && strings.Contains(f.Message, agentMon.String()) && strings.Contains(f.Message, "not found") {
			named = true
		}
	}
	if !named {
		t.Errorf("no finding names the target %q and the API error; findings: %q", agentMon, messages(p.Findings))
	}
	for _, r := range p.Rows {
		if r.State == StateUnreadable {
			t.Errorf("row %s is %s, want a configuration error", r.Target, r.State)
		}
	}
}

func messages(fs []Finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Message)
	}
	return out
}

func TestDecide_AnchorUnreadable_WritesNothing(t *testing.T) {
	// Everything that would write: a first observation, a stale pin, a
	// revert, a skip streak to clear.
	g := group(
		withImage("api", on(webAPI)),
		withImage("pin", fromRepo(proxyRepo), pinnedDigest(dA), on(webProxy)),
		withImage("mon", fromRepo(monRepo), on(agentMon)),
	)
	run(t, map[string]decideCase{
		"an anchor that cannot be read: no write at all, and a human is needed": {
			obs: observe(g, anchorErr(forbidden),
				withLatest("api", dB), withLatest("pin", dB), withLatest("mon", dB),
				withLive(webAPI, onTag), withLive(webProxy, proxyRepo+"@"+dA), withLive(agentMon, monRepo+":prod")),
			want: want{
				findings: []string{apiError},
				rows:     []string{"api web/api: error", "pin web/proxy: error", "mon agent/monitor: error"},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "forbidden")
			},
		},
	})
}

// CAS: every write expects, for every key it sets, the value the decision
// was based on (decide checks this for every case above; these cases make
// sure the expected values are not all absent).
func TestDecide_CAS_EveryWriteExpectsWhatWasRead(t *testing.T) {
	g := group(withImage("api", on(webAPI)), withImage("pin", fromRepo(proxyRepo), pinnedDigest(dA), on(webProxy)))
	cases := map[string]struct {
		obs Observation
		key string
		exp *string
	}{
		"the skip streak expects its old value": {
			obs: observe(g, withAnchor(pinnedBefore("api", dB)), withAnchor(ann(k.SkipStreak(), "1", k.StalePin("pin"), dB)),
				withLatest("api", dB), withLatest("pin", dB), withLive(webAPI, pinned(dB)), notSettled(web, "rolling")),
			key: k.SkipStreak(), exp: ptr("1"),
		},
		"a moved stale pin expects the old one": {
			obs: observe(g, withAnchor(pinnedBefore("api", dB)), withAnchor(ann(k.StalePin("pin"), dC)),
				withLatest("api", dB), withLatest("pin", dB), withLive(webAPI, pinned(dB))),
			key: k.StalePin("pin"), exp: ptr(dC),
		},
		"the flap marker expects the old count": {
			obs: observe(g, withAnchor(pinnedBefore("api", dB)), withAnchor(ann(k.Attempt(), "4", k.Flap(), "3", k.StalePin("pin"), dB)),
				withLatest("api", dB), withLatest("pin", dB), withLive(webAPI, pinned(dB))),
			key: k.Flap(), exp: ptr("3"),
		},
		"a first observation expects no record": {
			obs: observe(g, withAnchor(ann(k.StalePin("pin"), dB)), withLatest("api", dB), withLatest("pin", dB), withLive(webAPI, onTag)),
			key: k.Record("api"), exp: nil,
		},
	}
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		tc := cases[name]
		t.Run(name, func(t *testing.T) {
			p := Decide(settings(), tc.obs)
			checkCAS(t, tc.obs.Anchor, p)
			if _, ok := p.Bookkeeping.Set[tc.key]; !ok {
				t.Fatalf("Bookkeeping does not set %s: %v", tc.key, renderWrite(p.Bookkeeping))
			}
			got, ok := p.Bookkeeping.Expect[tc.key]
			switch {
			case !ok:
				t.Errorf("Bookkeeping sets %s without expecting a value", tc.key)
			case (got == nil) != (tc.exp == nil) || (got != nil && *got != *tc.exp):
				t.Errorf("Bookkeeping expects %s = %v, want %v", tc.key, deref(got), deref(tc.exp))
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "<absent>"
	}
	return *s
}

// R15: every non-benign state is told with its remediation and as an Event
// on the anchor (a finding with a Reason), never only by the exit code.
func TestDecide_R15_EveryLoudFindingNamesItsRemediation(t *testing.T) {
	g := group(withImage("api", on(webAPI)), withImage("mon", fromRepo(monRepo), on(agentMon)))
	steady := func(opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{
			withAnchor(pinnedBefore("api", dB)), withAnchor(pinnedBefore("mon", dB)),
			withLatest("api", dB), withLatest("mon", dB),
			withLive(webAPI, onTag), withLive(agentMon, monRepo+"@"+dB),
		}, opts...)...)
	}
	cases := map[string]Observation{
		"lockout":                        steady(withAnchor(ann(k.Attempt(), "3"))),
		"an invalid attempt":             steady(withAnchor(ann(k.Attempt(), "x"))),
		"the skip streak ceiling":        steady(notSettled(agent, "rolling"), withAnchor(ann(k.SkipStreak(), "2"))),
		"the read-failure ceiling":       steady(withLive(agentMon, "docker.io/acme/monitor@sha256:nothex"), withAnchor(ann(k.ReadFailures("mon"), "2"))),
		"the resolve-failure ceiling":    steady(resolveErr("mon", registry503), withAnchor(ann(k.ResolveFailures("mon"), "2"))),
		"a stale operator pin":           observe(group(withImage("api", on(webAPI), pinnedDigest(dA))), withLatest("api", dB), withLive(webAPI, pinned(dA))),
		"an API error":                   steady(readErr(agent, forbidden)),
		"a missing container":            steady(withLive(target(agent, "other"), onTag), func(o *Observation) { delete(o.Workloads[agent].Containers, "monitor") }),
		"an unreadable anchor":           steady(anchorErr(errors.New("timeout"))),
		"a workload the tick never read": steady(func(o *Observation) { delete(o.Workloads, agent) }),
	}
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		obs := cases[name]
		t.Run(name, func(t *testing.T) {
			p := Decide(settings(), obs)
			checkCAS(t, obs.Anchor, p)
			if !p.NeedsHuman() {
				t.Fatalf("NeedsHuman() = false, findings %v", renderFindings(p.Findings))
			}
			for _, f := range p.Findings {
				if !f.NeedsHuman {
					continue
				}
				if f.Remediation == "" {
					t.Errorf("%s finding %q has no remediation", f.Severity, f.Message)
				}
				if f.Reason == "" {
					t.Errorf("%s finding %q has no event reason", f.Severity, f.Message)
				}
			}
		})
	}
}

// R4: "before changing anything in a group, its workloads must be settled"
// when no attempt of image-refresh's own is pending.
func TestDecide_R4_NothingIsReimagedWhileAWorkloadIsNotSettled(t *testing.T) {
	g := group(withImage("api", on(webAPI)), withImage("mon", fromRepo(monRepo), on(agentMon)))
	cases := map[string]Observation{
		"a revert, no attempt pending": observe(g,
			withAnchor(pinnedBefore("api", dB)), withAnchor(pinnedBefore("mon", dB)), withLatest("api", dB), withLatest("mon", dB),
			withLive(webAPI, onTag), withLive(agentMon, monRepo+"@"+dB), notSettled(agent, "rolling")),
		"a digest change, no attempt pending": observe(g,
			withAnchor(pinnedBefore("api", dA)), withAnchor(pinnedBefore("mon", dB)), withLatest("api", dB), withLatest("mon", dB),
			withLive(webAPI, pinned(dA)), withLive(agentMon, monRepo+"@"+dB), notSettled(agent, "rolling")),
	}
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		obs := cases[name]
		t.Run(name, func(t *testing.T) {
			p := Decide(settings(), obs)
			checkCAS(t, obs.Anchor, p)
			if p.Repin != nil && len(p.Repin.Changes) > 0 {
				t.Errorf("re-images %v while DaemonSet tb/agent is not settled", renderChanges(p.Repin.Changes))
			}
		})
	}
}

// R11: a group unsettled while refresh-attempt > 0 is unsettled by
// image-refresh's own unconfirmed rollout. The tick waits for it again under
// the next attempt, and changes decided meanwhile ride along in that same
// attempt (the seed's forced retry did the same), instead of R4 skipping.
func TestDecide_R11_ChangesRideAlongAnUnfinishedAttempt(t *testing.T) {
	g := group(withImage("api", on(webAPI)), withImage("mon", fromRepo(monRepo), on(agentMon)))
	cases := map[string]Observation{
		"a revert while an earlier attempt is still rolling out": observe(g,
			withAnchor(pinnedBefore("api", dB)), withAnchor(pinnedBefore("mon", dB)), withAnchor(ann(k.Attempt(), "1")),
			withLatest("api", dB), withLatest("mon", dB),
			withLive(webAPI, onTag), withLive(agentMon, monRepo+"@"+dB), notSettled(agent, "1 of 3 pods updated")),
		"a digest change while an earlier attempt is still rolling out": observe(g,
			withAnchor(pinnedBefore("api", dA)), withAnchor(pinnedBefore("mon", dB)), withAnchor(ann(k.Attempt(), "1")),
			withLatest("api", dB), withLatest("mon", dB),
			withLive(webAPI, pinned(dA)), withLive(agentMon, monRepo+"@"+dB), notSettled(agent, "1 of 3 pods updated")),
	}
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		obs := cases[name]
		t.Run(name, func(t *testing.T) {
			p := Decide(settings(), obs)
			checkCAS(t, obs.Anchor, p)
			if p.Repin == nil || len(p.Repin.Changes) != 1 {
				t.Fatalf("want one re-image riding along the unfinished attempt, got %+v", p.Repin)
			}
			if got := p.Repin.AttemptWrite.Set[k.Attempt()]; got == nil || *got != "2" {
				t.Errorf("attempt written %v, want 2 (the next attempt)", got)
			}
			if p.Repin.Unfinished {
				t.Errorf("a repin with changes is not a wait-only retry")
			}
		})
	}
}
