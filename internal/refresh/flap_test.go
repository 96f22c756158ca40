package refresh

import (
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/internal/state"
)

// The digest-change budget: a tag that flips between digests every poll
// causes at most maxDigestChanges rollouts per digestChangeWindow (R6), and
// the hold beyond it is loud (R15) while R7 keeps the recorded digest pinned.

var flapNow = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func budget(max int, window time.Duration) settingsOpt {
	return func(s *Settings) {
		s.MaxDigestChanges, s.DigestChangeWindow = max, window
		s.Now = func() time.Time { return flapNow }
	}
}

// later renders the time that many minutes after flapNow, as the
// tag-flapping marker holds it.
func later(minutes int) string {
	return flapNow.Add(time.Duration(minutes) * time.Minute).Format(time.RFC3339)
}

// ago renders times that many minutes before flapNow, as the annotation holds them.
func ago(minutes ...int) string {
	var ts []time.Time
	for _, m := range minutes {
		ts = append(ts, flapNow.Add(-time.Duration(m)*time.Minute))
	}
	return state.FormatTimes(ts)
}

func TestDecide_R21_FlappingTagIsHeldOnTheRecordedDigest(t *testing.T) {
	g := group(withImage("api", on(webAPI, agentMon)))
	moved := func(changes *string, opts ...obsOpt) Observation {
		a := pinnedBefore("api", dA)
		if changes != nil {
			a[k.DigestChanges("api")] = *changes
		}
		return observe(g, append([]obsOpt{withAnchor(a), withLatest("api", dB)}, opts...)...)
	}
	onA := []obsOpt{withLive(webAPI, pinned(dA)), withLive(agentMon, pinned(dA))}
	rolls := func(changes string) *wantRepin {
		return &wantRepin{
			attempt: 1, attemptSet: kv{k.Attempt(): "1"},
			changes: []string{
				"web: api docker.io/acme/api@<A> -> docker.io/acme/api@<B> (digest-change, helm)",
				"agent: monitor docker.io/acme/api@<A> -> docker.io/acme/api@<B> (digest-change, helm)",
			},
			wait:   []string{"web", "agent"},
			clear:  kv{k.Attempt(): deleted},
			record: kv{k.Record("api"): "<B>", k.DigestChanges("api"): changes},
		}
	}
	heldRows := []string{"api web/api: tag-flapping", "api agent/monitor: tag-flapping"}
	run(t, map[string]decideCase{
		"the first move is rolled and its time recorded with the digest": {
			settings: []settingsOpt{budget(3, time.Hour)},
			obs:      moved(nil, onA...),
			want:     want{rows: []string{"api web/api: drifted", "api agent/monitor: drifted"}, repin: rolls(ago(0))},
		},
		"a move within the budget is rolled; the list keeps the last maxDigestChanges": {
			settings: []settingsOpt{budget(3, time.Hour)},
			obs:      moved(ptr(ago(50, 20)), onA...),
			want:     want{rows: []string{"api web/api: drifted", "api agent/monitor: drifted"}, repin: rolls(ago(50, 20, 0))},
		},
		"moves that left the window do not count": {
			settings: []settingsOpt{budget(3, time.Hour)},
			obs:      moved(ptr(ago(200, 90, 61)), onA...),
			want:     want{rows: []string{"api web/api: drifted", "api agent/monitor: drifted"}, repin: rolls(ago(0))},
		},
		"at the budget the image is held on its recorded digest, loudly, and nothing rolls": {
			settings: []settingsOpt{budget(3, time.Hour)},
			obs:      moved(ptr(ago(50, 20, 5)), onA...),
			want: want{
				rows:        heldRows,
				findings:    []string{"api: WARN TagFlapping needs-human"},
				bookkeeping: kv{k.TagFlapping("api"): later(10)},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "moved 3 times in the last 1h0m0s")
				contains(t, "finding", p.Findings[0].Message, "until 2026-12-02T12:10:00Z")
				contains(t, "remediation", p.Findings[0].Remediation, rearm)
				contains(t, "row", p.Rows[0].Remediation, rearm)
			},
		},
		"held, a target reverted to the tag is re-pinned to the recorded digest (R7)": {
			settings: []settingsOpt{budget(3, time.Hour)},
			obs:      moved(ptr(ago(50, 20, 5)), withLive(webAPI, onTag), withLive(agentMon, pinned(dA))),
			want: want{
				rows:        []string{"api web/api: drifted", "api agent/monitor: tag-flapping"},
				findings:    []string{"api: WARN TagFlapping needs-human"},
				bookkeeping: kv{k.TagFlapping("api"): later(10)},
				repin:       firstRepin([]string{"web", "agent"}, "web: api docker.io/acme/api:prod -> docker.io/acme/api@<A> (revert, helm)"),
			},
		},
		"held, a target someone moved to the registry's answer is not rolled back": {
			settings: []settingsOpt{budget(3, time.Hour)},
			obs:      moved(ptr(ago(50, 20, 5)), withLive(webAPI, pinned(dB)), withLive(agentMon, pinned(dA))),
			want:     want{rows: heldRows, findings: []string{"api: WARN TagFlapping needs-human"}, bookkeeping: kv{k.TagFlapping("api"): later(10)}},
		},
		"a budget value that does not parse holds the image (fail-safe, never as no moves)": {
			settings: []settingsOpt{budget(3, time.Hour)},
			obs:      moved(ptr("yesterday"), onA...),
			want:     want{rows: heldRows, findings: []string{"api: WARN TagFlapping needs-human"}, bookkeeping: kv{k.TagFlapping("api"): later(60)}},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, k.DigestChanges("api"))
				contains(t, "finding", p.Findings[0].Message, "fail-safe")
			},
		},
		"a time ahead of the clock still counts (fail-safe)": {
			settings: []settingsOpt{budget(1, time.Hour)},
			obs:      moved(ptr(ago(-30)), onA...),
			want:     want{rows: heldRows, findings: []string{"api: WARN TagFlapping needs-human"}, bookkeeping: kv{k.TagFlapping("api"): later(90)}},
		},
		"the tag back on the recorded digest is no hold: nothing to do": {
			settings: []settingsOpt{budget(3, time.Hour)},
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withAnchor(map[string]string{k.DigestChanges("api"): ago(50, 20, 5)}),
				withLatest("api", dA), withLive(webAPI, pinned(dA)), withLive(agentMon, pinned(dA))),
			want: want{rows: []string{"api web/api: pinned", "api agent/monitor: pinned"}},
		},
		"a list whose moves all left the window is deleted": {
			settings: []settingsOpt{budget(3, time.Hour)},
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withAnchor(map[string]string{k.DigestChanges("api"): ago(120, 90)}),
				withLatest("api", dA), withLive(webAPI, pinned(dA)), withLive(agentMon, pinned(dA))),
			want: want{
				rows:        []string{"api web/api: pinned", "api agent/monitor: pinned"},
				bookkeeping: kv{k.DigestChanges("api"): deleted},
			},
		},
		"a window of 0 turns the bound off: every move rolls, nothing is counted": {
			settings: []settingsOpt{budget(1, 0)},
			obs:      moved(ptr(ago(5, 1)), onA...),
			want: want{
				rows: []string{"api web/api: drifted", "api agent/monitor: drifted"},
				repin: func() *wantRepin {
					r := rolls("")
					r.record = kv{k.Record("api"): "<B>"}
					return r
				}(),
			},
		},
	})
}

// R21: the flapping state lasts its window. Once the spent budget held a
// move (the marker, written with the hold), the image is tag-flapping until
// the oldest counted move leaves the window, also while the tag sits on the
// held digest: the finding (and the alert on it) does not end and start
// again with each flip. Then the marker goes, with one INFO line.
func TestDecide_R21_TheFlappingStateLastsItsWindow(t *testing.T) {
	g := group(withImage("api", on(webAPI, agentMon)))
	onRecord := func(changes, marker *string, latest string, opts ...obsOpt) Observation {
		a := pinnedBefore("api", dA)
		if changes != nil {
			a[k.DigestChanges("api")] = *changes
		}
		if marker != nil {
			a[k.TagFlapping("api")] = *marker
		}
		return observe(g, append([]obsOpt{withAnchor(a), withLatest("api", latest)}, opts...)...)
	}
	onA := []obsOpt{withLive(webAPI, pinned(dA)), withLive(agentMon, pinned(dA))}
	held := []string{"api web/api: tag-flapping", "api agent/monitor: tag-flapping"}
	pinnedRows := []string{"api web/api: pinned", "api agent/monitor: pinned"}
	run(t, map[string]decideCase{
		"held before, the tag back on the held digest within the window: still tag-flapping, loudly": {
			settings: []settingsOpt{budget(2, time.Hour)},
			obs:      onRecord(ptr(ago(50, 20)), ptr(later(10)), dA, onA...),
			want:     want{rows: held, findings: []string{"api: WARN TagFlapping needs-human"}},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "is flapping")
				contains(t, "finding", p.Findings[0].Message, "back on the held digest "+dA)
				contains(t, "finding", p.Findings[0].Message, "until "+later(10))
				contains(t, "remediation", p.Findings[0].Remediation, rearm)
				contains(t, "row", p.Rows[0].Remediation, rearm)
			},
		},
		"held before, the next flip is held again and the marker is not rewritten": {
			settings: []settingsOpt{budget(2, time.Hour)},
			obs:      onRecord(ptr(ago(50, 20)), ptr(later(10)), dB, onA...),
			want:     want{rows: held, findings: []string{"api: WARN TagFlapping needs-human"}},
		},
		"never held: a spent budget with the tag on the record is no flap": {
			settings: []settingsOpt{budget(2, time.Hour)},
			obs:      onRecord(ptr(ago(50, 20)), nil, dA, onA...),
			want:     want{rows: pinnedRows},
		},
		"held before, the window has passed: the marker goes with one INFO line": {
			settings: []settingsOpt{budget(2, time.Hour)},
			obs:      onRecord(ptr(ago(70, 20)), ptr(later(-10)), dA, onA...),
			want: want{
				rows:        pinnedRows,
				findings:    []string{"api: INFO - benign"},
				bookkeeping: kv{k.TagFlapping("api"): deleted},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "no longer held as flapping")
			},
		},
		"held before, the window has passed and the tag on another digest: it rolls, the marker goes": {
			settings: []settingsOpt{budget(2, time.Hour)},
			obs:      onRecord(ptr(ago(70, 20)), ptr(later(-10)), dB, onA...),
			want: want{
				rows:        []string{"api web/api: drifted", "api agent/monitor: drifted"},
				findings:    []string{"api: INFO - benign"},
				bookkeeping: kv{k.TagFlapping("api"): deleted},
				repin: &wantRepin{
					attempt: 1, attemptSet: kv{k.Attempt(): "1"},
					changes: []string{
						"web: api docker.io/acme/api@<A> -> docker.io/acme/api@<B> (digest-change, helm)",
						"agent: monitor docker.io/acme/api@<A> -> docker.io/acme/api@<B> (digest-change, helm)",
					},
					wait:   []string{"web", "agent"},
					clear:  kv{k.Attempt(): deleted},
					record: kv{k.Record("api"): "<B>", k.DigestChanges("api"): ago(20, 0)},
				},
			},
		},
		"held before, a budget that does not parse keeps it tag-flapping (fail-safe)": {
			settings: []settingsOpt{budget(2, time.Hour)},
			obs:      onRecord(ptr("yesterday"), ptr(later(10)), dA, onA...),
			want:     want{rows: held, findings: []string{"api: WARN TagFlapping needs-human"}},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "fail-safe")
			},
		},
		"held before, the bound turned off (window 0): the marker goes": {
			settings: []settingsOpt{budget(2, 0)},
			obs:      onRecord(ptr(ago(50, 20)), ptr(later(10)), dA, onA...),
			want: want{
				rows:        pinnedRows,
				findings:    []string{"api: INFO - benign"},
				bookkeeping: kv{k.TagFlapping("api"): deleted},
			},
		},
		"held, on the held digest, a target reverted to the tag is re-pinned to it (R7); the other stays tag-flapping": {
			settings: []settingsOpt{budget(2, time.Hour)},
			obs:      onRecord(ptr(ago(50, 20)), ptr(later(10)), dA, withLive(webAPI, onTag), withLive(agentMon, pinned(dA))),
			want: want{
				rows:     []string{"api web/api: drifted", "api agent/monitor: tag-flapping"},
				findings: []string{"api: WARN TagFlapping needs-human"},
				repin:    firstRepin([]string{"web", "agent"}, "web: api docker.io/acme/api:prod -> docker.io/acme/api@<A> (revert, helm)"),
			},
		},
	})
}
