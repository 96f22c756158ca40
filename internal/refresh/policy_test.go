package refresh

import (
	"strings"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/state"
)

// The rollout policy (SPEC R21–R23): the churn bound, the minimum age of
// a new digest, and the re-arm of a lockout by a new digest.

func TestDecide_R21_ChurnBoundIsPerImageAndCountsMovesBack(t *testing.T) {
	g := group(withImage("api", on(webAPI)), withImage("mon", fromRepo(monRepo), on(agentMon)))
	run(t, map[string]decideCase{
		"another image of the group is not held while one tag flaps": {
			settings: []settingsOpt{budget(2, time.Hour)},
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withAnchor(pinnedBefore("mon", dA)),
				withAnchor(ann(k.DigestChanges("api"), ago(30, 10))),
				withLatest("api", dB), withLatest("mon", dB), withLive(webAPI, pinned(dA)), withLive(agentMon, monRepo+"@"+dA)),
			want: want{
				rows:        []string{"api web/api: tag-flapping", "mon agent/monitor: drifted"},
				findings:    []string{"api: WARN TagFlapping needs-human"},
				bookkeeping: kv{k.TagFlapping("api"): later(30)},
				repin: &wantRepin{
					attempt: 1, attemptSet: kv{k.Attempt(): "1"},
					changes: []string{"agent: monitor docker.io/acme/monitor@<A> -> docker.io/acme/monitor@<B> (digest-change, helm)"},
					wait:    []string{"web", "agent"},
					clear:   kv{k.Attempt(): deleted},
					record:  kv{k.Record("mon"): "<B>", k.DigestChanges("mon"): ago(0)},
				},
			},
		},
		"a tag that moves back to a digest it served within the window counts as a change": {
			// <A> → <B> 10 minutes ago; the tag is back on <A>: a second move.
			settings: []settingsOpt{budget(1, time.Hour)},
			obs: observe(group(withImage("api", on(webAPI))), withAnchor(pinnedBefore("api", dB)),
				withAnchor(ann(k.DigestChanges("api"), ago(10))), withLatest("api", dA), withLive(webAPI, pinned(dB))),
			want: want{rows: []string{"api web/api: tag-flapping"}, findings: []string{"api: WARN TagFlapping needs-human"}, bookkeeping: kv{k.TagFlapping("api"): later(50)}},
		},
		"the hold ends by itself once the oldest counted move left the window": {
			settings: []settingsOpt{budget(2, time.Hour)},
			obs: observe(group(withImage("api", on(webAPI))), withAnchor(pinnedBefore("api", dA)),
				withAnchor(ann(k.DigestChanges("api"), ago(61, 10))), withLatest("api", dB), withLive(webAPI, pinned(dA))),
			want: want{
				rows: []string{"api web/api: drifted"},
				repin: &wantRepin{
					attempt: 1, attemptSet: kv{k.Attempt(): "1"},
					changes: []string{"web: api docker.io/acme/api@<A> -> docker.io/acme/api@<B> (digest-change, helm)"},
					wait:    []string{"web"},
					clear:   kv{k.Attempt(): deleted},
					record:  kv{k.Record("api"): "<B>", k.DigestChanges("api"): ago(10, 0)},
				},
			},
		},
	})
}

// minAge sets minDigestAge on the flap test's clock.
func minAge(d time.Duration) settingsOpt {
	return func(s *Settings) {
		s.MinDigestAge = d
		s.Now = func() time.Time { return flapNow }
	}
}

func seenAgo(d string, minutes int) string {
	return state.FirstSeenValue{Digest: d, At: flapNow.Add(-time.Duration(minutes) * time.Minute)}.String()
}

func TestDecide_R22_ANewDigestWaitsForMinDigestAge(t *testing.T) {
	g := group(withImage("api", on(webAPI)))
	moved := func(a map[string]string, live string) Observation {
		return observe(g, withAnchor(pinnedBefore("api", dA)), withAnchor(a), withLatest("api", dB), withLive(webAPI, live))
	}
	waiting := []string{"api web/api: waiting"}
	run(t, map[string]decideCase{
		"a new digest is first seen now and waits; nothing is written to the targets": {
			settings: []settingsOpt{minAge(10 * time.Minute)},
			obs:      moved(nil, pinned(dA)),
			want:     want{rows: waiting, findings: []string{"api: INFO - benign"}, bookkeeping: kv{k.FirstSeen("api"): seenAgo("<B>", 0)}},
			also: func(t *testing.T, p *Plan) {
				contains(t, "row", p.Rows[0].Message, "in 10m0s")
			},
		},
		"a digest younger than minDigestAge waits with the time left, and its first-seen time is kept": {
			settings: []settingsOpt{minAge(10 * time.Minute)},
			obs:      moved(ann(k.FirstSeen("api"), seenAgo(dB, 4)), pinned(dA)),
			want:     want{rows: waiting, findings: []string{"api: INFO - benign"}},
			also: func(t *testing.T, p *Plan) {
				contains(t, "row", p.Rows[0].Message, "in 6m0s")
				contains(t, "row", p.Rows[0].Message, "at 2026-12-02T12:06:00Z")
			},
		},
		"a digest seen for minDigestAge rolls, and its first-seen time goes with the record": {
			settings: []settingsOpt{minAge(10 * time.Minute)},
			obs:      moved(ann(k.FirstSeen("api"), seenAgo(dB, 10)), pinned(dA)),
			want: want{
				rows: []string{"api web/api: drifted"},
				repin: &wantRepin{
					attempt: 1, attemptSet: kv{k.Attempt(): "1"},
					changes: []string{"web: api docker.io/acme/api@<A> -> docker.io/acme/api@<B> (digest-change, helm)"},
					wait:    []string{"web"},
					clear:   kv{k.Attempt(): deleted},
					record:  kv{k.Record("api"): "<B>", k.FirstSeen("api"): deleted},
				},
			},
		},
		"another digest than the one first seen starts the wait over": {
			settings: []settingsOpt{minAge(10 * time.Minute)},
			obs:      moved(ann(k.FirstSeen("api"), seenAgo(dC, 30)), pinned(dA)),
			want:     want{rows: waiting, findings: []string{"api: INFO - benign"}, bookkeeping: kv{k.FirstSeen("api"): seenAgo("<B>", 0)}},
		},
		"a first-seen value that does not parse starts the wait over (fail-safe, never skipped)": {
			settings: []settingsOpt{minAge(10 * time.Minute)},
			obs:      moved(ann(k.FirstSeen("api"), "yesterday"), pinned(dA)),
			want:     want{rows: waiting, findings: []string{"api: WARN - benign", "api: INFO - benign"}, bookkeeping: kv{k.FirstSeen("api"): seenAgo("<B>", 0)}},
		},
		"while waiting, a target reverted to the tag is re-pinned to the recorded digest (R7)": {
			settings: []settingsOpt{minAge(10 * time.Minute)},
			obs:      moved(ann(k.FirstSeen("api"), seenAgo(dB, 4)), onTag),
			want: want{
				rows:     []string{"api web/api: drifted"},
				findings: []string{"api: INFO - benign"},
				repin:    repinsWebAPI("<A>"),
			},
		},
		"the tag back on the record deletes the first-seen time": {
			settings: []settingsOpt{minAge(10 * time.Minute)},
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withAnchor(ann(k.FirstSeen("api"), seenAgo(dB, 4))),
				withLatest("api", dA), withLive(webAPI, pinned(dA))),
			want: want{rows: []string{"api web/api: pinned"}, bookkeeping: kv{k.FirstSeen("api"): deleted}},
		},
	})
}

func TestDecide_R23_ANewDigestRearmsALockout(t *testing.T) {
	g := group(withImage("api", on(webAPI)))
	// locked: the group locked out trying <B> (recorded <A>).
	locked := func(lockedOn string, latest, live string) Observation {
		a := ann(k.Attempt(), "3", k.Flap(), "3", k.Holder(), "pod-a 2026-12-02T11:00:00Z")
		if lockedOn != "" {
			a[k.LockedOn("api")] = lockedOn
		}
		return observe(g, withAnchor(pinnedBefore("api", dA)), withAnchor(a), withLatest("api", latest), withLive(webAPI, live))
	}
	lockedOut := want{findings: []string{lockoutFinding}, rows: []string{"api web/api: locked-out"}, lockedOut: true}
	run(t, map[string]decideCase{
		"a lockout records the digest it locked on": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withAnchor(ann(k.Attempt(), "3")), withLatest("api", dB), withLive(webAPI, pinned(dA))),
			want: want{
				bookkeeping: kv{k.Flap(): "3", k.LockedOn("api"): "<B>"},
				findings:    []string{lockoutFinding}, rows: []string{"api web/api: locked-out"}, lockedOut: true,
			},
		},
		"a second lockout adds its digest to the first's": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withAnchor(ann(k.Attempt(), "3", k.LockedOn("api"), dC)), withLatest("api", dB), withLive(webAPI, pinned(dA))),
			want: want{
				bookkeeping: kv{k.Flap(): "3", k.LockedOn("api"): "<C>,<B>"},
				findings:    []string{lockoutFinding}, rows: []string{"api web/api: locked-out"}, lockedOut: true,
			},
		},
		"the registry still on the digest it locked on keeps the group locked out": {
			obs:  locked(dB, dB, pinned(dA)),
			want: lockedOut,
		},
		"a new digest re-arms the group once by itself (event) and is tried under attempt 1": {
			obs: locked(dB, dC, pinned(dA)),
			want: want{
				bookkeeping: kv{k.Attempt(): deleted, k.Flap(): deleted, k.Holder(): deleted},
				findings:    []string{"group: WARN RearmedByNewDigest benign"},
				rows:        []string{"api web/api: drifted"},
				repin:       rollsWebAPI("<A>", "<C>"),
			},
			also: func(t *testing.T, p *Plan) {
				f := findingWith(t, p, ReasonRearmedByNewDigest)
				if !f.Event {
					t.Errorf("RearmedByNewDigest finding has no Event")
				}
				contains(t, "finding", f.Message, dC)
			},
		},
		"a new digest re-arms a group still stuck rolling out the digest it locked on and is tried at once, not skipped as unsettled (R4)": {
			obs: func() Observation {
				o := locked(dB, dC, pinned(dB))
				notSettled(web, "0 of 1 updated replicas available")(&o)
				return o
			}(),
			want: want{
				bookkeeping: kv{k.Attempt(): deleted, k.Flap(): deleted, k.Holder(): deleted},
				findings:    []string{"group: WARN RearmedByNewDigest benign"},
				rows:        []string{"api web/api: drifted"},
				repin:       rollsWebAPI("<B>", "<C>"),
			},
		},
		"a group locked before it recorded its digests is not re-armed by a new one": {
			obs: locked("", dC, pinned(dA)),
			want: want{
				bookkeeping: kv{k.LockedOn("api"): "<C>"},
				findings:    []string{lockoutFinding}, rows: []string{"api web/api: locked-out"}, lockedOut: true,
			},
		},
		"a digest a lockout locked on is quarantined: held on the record, loudly, never tried": {
			obs: observe(g, withAnchor(pinnedBefore("api", dC)), withAnchor(ann(k.LockedOn("api"), dB)), withLatest("api", dB), withLive(webAPI, pinned(dC))),
			want: want{
				rows:     []string{"api web/api: quarantined"},
				findings: []string{"api: WARN DigestQuarantined needs-human"},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "row", p.Rows[0].Message, dB)
				contains(t, "remediation", p.Rows[0].Remediation, rearm)
			},
		},
		"while quarantined, a target reverted to the tag is re-pinned to the recorded digest (R7)": {
			obs: observe(g, withAnchor(pinnedBefore("api", dC)), withAnchor(ann(k.LockedOn("api"), dB)), withLatest("api", dB), withLive(webAPI, onTag)),
			want: want{
				rows:     []string{"api web/api: drifted"},
				findings: []string{"api: WARN DigestQuarantined needs-human"},
				repin:    repinsWebAPI("<C>"),
			},
		},
		"the list keeps the newest digests only": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)),
				withAnchor(ann(k.Attempt(), "3", k.LockedOn("api"), strings.Repeat(dC+",", state.MaxLockedOn-1)+dA)), withLatest("api", dB), withLive(webAPI, pinned(dA))),
			want: want{
				bookkeeping: kv{k.Flap(): "3", k.LockedOn("api"): strings.Repeat("<C>,", state.MaxLockedOn-2) + "<A>,<B>"},
				findings:    []string{lockoutFinding}, rows: []string{"api web/api: locked-out"}, lockedOut: true,
			},
		},
	})
}

// windows sets rolloutWindows on the flap test's clock (Wed 2026-12-02 12:00 UTC).
func windows(ws ...config.RolloutWindow) settingsOpt {
	return func(s *Settings) {
		s.RolloutWindows = ws
		s.Now = func() time.Time { return flapNow }
	}
}

func TestDecide_R24_DigestChangesStartOnlyInsideARolloutWindow(t *testing.T) {
	g := group(withImage("api", on(webAPI)))
	moved := func(live string) Observation {
		return observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dB), withLive(webAPI, live))
	}
	nights := config.RolloutWindow{Days: []string{"Mon", "Tue", "Wed", "Thu", "Fri"}, Start: "22:00", End: "06:00"}
	noon := config.RolloutWindow{Days: []string{"Wed"}, Start: "11:00", End: "13:00"}
	rolls := firstRepin([]string{"web"}, "web: api docker.io/acme/api@<A> -> docker.io/acme/api@<B> (digest-change, helm)").recording("api", "<B>")
	run(t, map[string]decideCase{
		"outside every window a digest change waits, benign, naming the next opening": {
			settings: []settingsOpt{windows(nights)},
			obs:      moved(pinned(dA)),
			want:     want{rows: []string{"api web/api: window-closed"}, findings: []string{"api: INFO - benign"}},
			also: func(t *testing.T, p *Plan) {
				contains(t, "row", p.Rows[0].Message, "opening 2026-12-02T22:00:00Z")
				contains(t, "row", p.Rows[0].Message, "Mon,Tue,Wed,Thu,Fri 22:00-06:00 UTC")
			},
		},
		"inside a window the digest change rolls": {
			settings: []settingsOpt{windows(nights, noon)},
			obs:      moved(pinned(dA)),
			want:     want{rows: []string{"api web/api: drifted"}, repin: rolls},
		},
		"no windows: any time": {
			settings: []settingsOpt{windows()},
			obs:      moved(pinned(dA)),
			want:     want{rows: []string{"api web/api: drifted"}, repin: rolls},
		},
		"outside every window a revert is still re-pinned to the recorded digest": {
			settings: []settingsOpt{windows(nights)},
			obs:      moved(onTag),
			want: want{
				rows:     []string{"api web/api: drifted"},
				findings: []string{"api: INFO - benign"},
				repin:    repinsWebAPI("<A>"),
			},
		},
	})
}

func TestDecide_R24_MaxConcurrentRolloutsQueuesADigestChange(t *testing.T) {
	g := group(withImage("api", on(webAPI)))
	moved := func(live string, rolling ...string) Observation {
		o := observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dB), withLive(webAPI, live))
		o.RollingElsewhere = rolling
		return o
	}
	slots := func(n int) settingsOpt { return func(s *Settings) { s.MaxConcurrentRollouts = n } }
	rolls := firstRepin([]string{"web"}, "web: api docker.io/acme/api@<A> -> docker.io/acme/api@<B> (digest-change, helm)").recording("api", "<B>")
	run(t, map[string]decideCase{
		"with every slot taken by other groups a digest change is queued, benign, nothing written": {
			settings: []settingsOpt{slots(1)},
			obs:      moved(pinned(dA), "edge-2"),
			want:     want{rows: []string{"api web/api: queued"}, findings: []string{"group: INFO - benign"}},
			also: func(t *testing.T, p *Plan) {
				if !p.Queued {
					t.Errorf("plan not marked Queued")
				}
				contains(t, "row", p.Rows[0].Message, "edge-2")
			},
		},
		"with a free slot it rolls": {
			settings: []settingsOpt{slots(2)},
			obs:      moved(pinned(dA), "edge-2"),
			want:     want{rows: []string{"api web/api: drifted"}, repin: rolls},
		},
		"0 is unlimited": {
			settings: []settingsOpt{slots(0)},
			obs:      moved(pinned(dA), "edge-2", "edge-3"),
			want:     want{rows: []string{"api web/api: drifted"}, repin: rolls},
		},
		"a revert re-pin is never queued": {
			settings: []settingsOpt{slots(1)},
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dA), withLive(webAPI, onTag),
				func(o *Observation) { o.RollingElsewhere = []string{"edge-2"} }),
			want: want{rows: []string{"api web/api: drifted"}, repin: repinsWebAPI("<A>")},
		},
	})
}
