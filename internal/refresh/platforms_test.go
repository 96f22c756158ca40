package refresh

import (
	"strings"
	"testing"
	"time"
)

// V3: a digest is pinned or recorded only if it serves every platform the
// nodes its targets can run on need; otherwise the image holds its pin.

var (
	linuxAMD64 = Platform{OS: "linux", Architecture: "amd64"}
	linuxARM64 = Platform{OS: "linux", Architecture: "arm64"}
	linuxARMv7 = Platform{OS: "linux", Architecture: "arm", Variant: "v7"}
)

// needs says which platforms the nodes of image's targets need: one node
// each, named for its platform.
func needs(image string, ps ...Platform) obsOpt {
	return func(o *Observation) {
		if o.Needs == nil {
			o.Needs = map[string][]PlatformNeed{}
		}
		var out []PlatformNeed
		for _, p := range ps {
			node := "node-" + p.Architecture + p.Variant
			out = append(out, PlatformNeed{Platform: p, Node: node, Targets: o.Group.Images[0].Targets})
		}
		o.Needs[image] = out
	}
}

// serves says which platforms digest serves.
func serves(digest string, ps ...Platform) obsOpt {
	return func(o *Observation) {
		if o.Served == nil {
			o.Served = map[string][]Platform{}
		}
		o.Served[digest] = append([]Platform{}, ps...)
	}
}

func TestPlatform_V3_RunsAsContainerdMatchesANodesPlatform(t *testing.T) {
	for _, tc := range []struct {
		node, served Platform
		runs         bool
	}{
		{linuxAMD64, linuxAMD64, true},
		{linuxAMD64, linuxARM64, false},
		{linuxAMD64, Platform{OS: "windows", Architecture: "amd64"}, false},
		{linuxAMD64, Platform{OS: "linux", Architecture: "386"}, true}, // containerd runs 386 on amd64
		{linuxARM64, Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}, true},
		{linuxARM64, linuxARM64, true},
		{linuxARM64, linuxAMD64, false},
		{linuxARM64, linuxARMv7, true}, // 32-bit arm on arm64, as containerd
		// An "arm" node (no variant label) is containerd's default arm/v7.
		{Platform{OS: "linux", Architecture: "arm"}, linuxARMv7, true},
		{Platform{OS: "linux", Architecture: "arm"}, Platform{OS: "linux", Architecture: "arm", Variant: "v6"}, true},
		{Platform{OS: "linux", Architecture: "arm"}, Platform{OS: "linux", Architecture: "arm", Variant: "v8"}, false},
		{Platform{OS: "linux", Architecture: "arm"}, linuxARM64, false},
		{linuxAMD64, Platform{OS: "unknown", Architecture: "unknown"}, false}, // an attestation manifest of buildx
	} {
		if got := tc.node.Runs(tc.served); got != tc.runs {
			t.Errorf("node %s runs %s: %v, want %v", tc.node, tc.served, got, tc.runs)
		}
	}
}

func TestDecide_V3_ADigestLackingANeededPlatformIsNeitherRecordedNorPinned(t *testing.T) {
	g := group(withImage("api", on(webAPI)))
	missingRows := []string{"api web/api: platform-missing"}
	missingFinding := []string{"api: ERROR PlatformMissing needs-human"}
	run(t, map[string]decideCase{
		"a first observation of a digest the nodes cannot run records nothing": {
			obs: observe(g, withLatest("api", dB), withLive(webAPI, onTag),
				needs("api", linuxAMD64, linuxARM64), serves(dB, linuxARM64)),
			want: want{rows: missingRows, findings: missingFinding},
			also: func(t *testing.T, p *Plan) {
				f := p.Findings[0]
				contains(t, "finding", f.Message, "docker.io/acme/api:prod at "+dB)
				contains(t, "finding", f.Message, "linux/amd64 (node node-amd64, where Deployment tb/web container api can run)")
				contains(t, "finding", f.Message, "it serves linux/arm64")
				contains(t, "finding", f.Message, "nothing is recorded")
				contains(t, "remediation", f.Remediation, "for linux/amd64")
				if len(p.Findings) != 1 {
					t.Errorf("findings %q: want the one", renderFindings(p.Findings))
				}
			},
		},
		"a first observation of a digest serving every needed platform is recorded": {
			obs: observe(g, withLatest("api", dB), withLive(webAPI, onTag),
				needs("api", linuxAMD64, linuxARM64), serves(dB, linuxAMD64, Platform{OS: "linux", Architecture: "arm64", Variant: "v8"})),
			want: want{
				bookkeeping: kv{k.Record("api"): "<B>"},
				findings:    []string{"api: INFO - benign"},
				rows:        []string{"api web/api: first-observed"},
			},
		},
		"an arm64-only index over a pinned amd64+arm64 one, on amd64 nodes: held, nothing written": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dB), withLive(webAPI, pinned(dA)),
				needs("api", linuxAMD64), serves(dB, linuxARM64)),
			want: want{rows: missingRows, findings: missingFinding},
			also: func(t *testing.T, p *Plan) {
				contains(t, "row", p.Rows[0].Message, "held on the recorded digest "+dA)
				contains(t, "row", p.Rows[0].Message, "linux/amd64 (node node-amd64")
			},
		},
		"an arm64 digest on nodes of amd64, arm64 and arm/v7: held, naming amd64 and arm/v7, not arm64": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dB), withLive(webAPI, pinned(dA)),
				needs("api", linuxAMD64, linuxARM64, linuxARMv7), serves(dB, Platform{OS: "linux", Architecture: "arm64", Variant: "v8"})),
			want: want{rows: missingRows, findings: missingFinding},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "linux/amd64 (node node-amd64")
				contains(t, "finding", p.Findings[0].Message, "linux/arm/v7 (node node-armv7")
				if msg := p.Findings[0].Message; strings.Contains(msg, "linux/arm64 (node") {
					t.Errorf("finding %q names arm64 as missing, which the digest serves", msg)
				}
			},
		},
		"a single arm/v7 manifest serves an arm64 node too (containerd runs 32-bit arm there)": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dB), withLive(webAPI, pinned(dA)),
				needs("api", linuxARM64, linuxARMv7), serves(dB, linuxARMv7)),
			want: want{
				rows:  []string{"api web/api: drifted"},
				repin: rollsWebAPI("<A>", "<B>"),
			},
		},
		"a digest serving every needed platform rolls": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dB), withLive(webAPI, pinned(dA)),
				needs("api", linuxAMD64), serves(dB, linuxAMD64, linuxARM64)),
			want: want{
				rows:  []string{"api web/api: drifted"},
				repin: rollsWebAPI("<A>", "<B>"),
			},
		},
		"a digest whose platforms were not read is held (fail-closed)": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dB), withLive(webAPI, pinned(dA)),
				needs("api", linuxAMD64), serves(dC, linuxAMD64)),
			want: want{rows: missingRows, findings: missingFinding},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "no platform could be read")
			},
		},
		"a single manifest whose config names no platform is held": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dB), withLive(webAPI, pinned(dA)),
				needs("api", linuxAMD64), serves(dB)),
			want: want{rows: missingRows, findings: missingFinding},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "it names no platform")
			},
		},
		"no node needs anything (no node, or none labelled): the digest rolls": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dB), withLive(webAPI, pinned(dA)),
				needs("api"), serves(dB, linuxARM64)),
			want: want{
				rows:  []string{"api web/api: drifted"},
				repin: rollsWebAPI("<A>", "<B>"),
			},
		},
		"a held digest does not stop a revert re-pin to the recorded one": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dB), withLive(webAPI, onTag),
				needs("api", linuxAMD64), serves(dB, linuxARM64)),
			want: want{
				rows:     []string{"api web/api: drifted"},
				findings: missingFinding,
				repin:    repinsWebAPI("<A>"),
			},
		},
		"the record is not checked again: the tag back on it is pinned": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dA), withLive(webAPI, pinned(dA)),
				needs("api", linuxAMD64), serves(dA, linuxARM64)),
			want: want{rows: []string{"api web/api: pinned"}},
		},
		"a digest the nodes cannot run neither re-arms a locked-out group nor is quarantined by it (R23)": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withAnchor(ann(k.Flap(), "3", k.Attempt(), "3", k.LockedOn("api"), dC)),
				withLatest("api", dB), withLive(webAPI, pinned(dA)), needs("api", linuxAMD64), serves(dB, linuxARM64)),
			want: want{rows: []string{"api web/api: platform-missing"}, lockedOut: true,
				findings: []string{"api: ERROR PlatformMissing needs-human", "group: WARN RefreshLockedOut needs-human"}},
		},
	})
}

func TestDecide_V3_ARollbackTargetTheNodesCannotRunIsNotRolledBackTo(t *testing.T) {
	mine := heldBy("me", 0)
	// A digest change from A to B that crashes; an arm64 node joined since
	// A was recorded, and A serves only amd64.
	obs := func(opts ...obsOpt) Observation {
		base := []obsOpt{withAnchor(pinnedBefore("api", dA)), withAnchor(ann(k.Attempt(), "1")),
			withLatest("api", dB), withLive(webAPI, pinned(dB)), withLive(agentMon, pinned(dB)), notSettled(agent, "1 of 3 pods updated"),
			withAnchor(ann(k.Holder(), heldBy("me", time.Minute))),
			crashing(agent, "monitor", "CrashLoopBackOff (last exit code 1, Error)")}
		return observe(rollbackGroup(), append(base, opts...)...)
	}
	run(t, map[string]decideCase{
		"the record lacks a platform the nodes need: no rollback, platform-missing beside not-settled": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      obs(needs("api", linuxAMD64, linuxARM64), serves(dA, linuxAMD64), serves(dB, linuxAMD64, linuxARM64)),
			want: want{findings: []string{"api: ERROR PlatformMissing needs-human"},
				rows: []string{"api web/api: not-settled", "api agent/monitor: not-settled"}},
			also: func(t *testing.T, p *Plan) {
				f := p.Findings[0]
				contains(t, "finding", f.Message, "at "+dA)
				contains(t, "finding", f.Message, "linux/arm64 (node node-arm64")
				contains(t, "finding", f.Message, "the rollback does not retreat to it")
				if len(p.Rows[0].Also) != 1 || p.Rows[0].Also[0].State != StatePlatformMissing {
					t.Errorf("row %+v: want platform-missing beside it", p.Rows[0])
				}
			},
		},
		"the record serves every needed platform: rolled back": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      obs(needs("api", linuxAMD64, linuxARM64), serves(dA, linuxAMD64, linuxARM64), serves(dB, linuxAMD64, linuxARM64)),
			want: want{
				bookkeeping: kv{k.LockedOn("api"): "<B>", k.RolledBack("api"): "<B> pod agent-x container monitor: CrashLoopBackOff (last exit code 1, Error)"},
				findings:    []string{"api: ERROR RolledBack needs-human"},
				rows:        []string{"api web/api: rolled-back", "api agent/monitor: rolled-back"},
				repin: &wantRepin{attempt: 2, attemptSet: kv{k.Attempt(): "2", k.Holder(): mine},
					changes: []string{"web: api " + pinned("<B>") + " -> " + pinned("<A>") + " (rollback, helm)",
						"agent: monitor " + pinned("<B>") + " -> " + pinned("<A>") + " (rollback, helm)"},
					clear: kv{k.Attempt(): deleted, k.Holder(): deleted}},
			},
		},
	})
}
