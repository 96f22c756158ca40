package refresh

import (
	"strings"
	"testing"
	"time"
)

// O1: a suspended group gets no write to its targets — no new digest, no
// revert re-pin — while its bookkeeping, records and findings go on, and
// its rows say suspended, by whom, why and until when.

var suspendNow = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func atSuspendNow(s *Settings) { s.Now = func() time.Time { return suspendNow } }

func suspendedBy(manager string) obsOpt { return func(o *Observation) { o.SuspendedBy = manager } }

func TestDecide_O1_ASuspendedGroupGetsNoWriteToItsTargets(t *testing.T) {
	g := group(withImage("api", on(webAPI, agentMon)))
	sus, reason, since := k.Suspend(), k.SuspendReason(), k.SuspendedSince()
	nowText := suspendNow.Format(time.RFC3339)
	hoursAgo := func(h int) string { return suspendNow.Add(-time.Duration(h) * time.Hour).Format(time.RFC3339) }
	// newDigest: the record is A, the registry answers B, both targets on A.
	newDigest := func(ann map[string]string, opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{withAnchor(pinnedBefore("api", dA)), withAnchor(ann), withLatest("api", dB),
			withLive(webAPI, pinned(dA)), withLive(agentMon, pinned(dA))}, opts...)...)
	}
	held := []string{"api web/api: suspended", "api agent/monitor: suspended"}
	rolls := firstRepin([]string{"web", "agent"},
		"web: api docker.io/acme/api@<A> -> docker.io/acme/api@<B> (digest-change, helm)",
		"agent: monitor docker.io/acme/api@<A> -> docker.io/acme/api@<B> (digest-change, helm)",
	).recording("api", "<B>")
	run(t, map[string]decideCase{
		"suspended until resumed: a new digest is not rolled; the rows say by whom and why; the start is kept": {
			settings: []settingsOpt{atSuspendNow},
			obs:      newDigest(map[string]string{sus: "true", reason: "rolled back by hand, INC-42"}, suspendedBy("kubectl-annotate")),
			want: want{
				rows:        held,
				findings:    []string{"group: INFO - benign"},
				bookkeeping: kv{since: nowText, k.SuspendedBy(): "kubectl-annotate"},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "row", p.Rows[0].Message, "suspended by kubectl-annotate until resumed: rolled back by hand, INC-42")
				contains(t, "row", p.Rows[0].Message, "not re-imaged meanwhile")
				contains(t, "remediation", p.Rows[0].Remediation, "image-refresh resume --group edge")
				contains(t, "finding", p.Findings[0].Message, "held back: Deployment tb/web container api docker.io/acme/api@"+dA+" -> docker.io/acme/api@"+dB)
				if p.Suspended == nil || !p.Suspended.Until.IsZero() || p.Suspended.By != "kubectl-annotate" {
					t.Errorf("Plan.Suspended = %+v, want until resumed by kubectl-annotate", p.Suspended)
				}
			},
		},
		"put back after a rollback took it off (R25): image-refresh wrote P/suspend, P/suspended-by still says who": {
			settings: []settingsOpt{atSuspendNow},
			obs:      newDigest(map[string]string{sus: "true", reason: "INC-77", since: hoursAgo(1), k.SuspendedBy(): "image-refresh-suspend"}),
			want:     want{rows: held, findings: []string{"group: INFO - benign"}},
			also: func(t *testing.T, p *Plan) {
				contains(t, "row", p.Rows[0].Message, "suspended by image-refresh-suspend until resumed: INC-77")
			},
		},
		"suspended until a time: a revert is not re-pinned either": {
			settings: []settingsOpt{atSuspendNow},
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withAnchor(map[string]string{sus: "2026-12-02T13:00:00Z", since: hoursAgo(1)}),
				withAnchor(map[string]string{k.EverPinned("api"): "true"}), withLatest("api", dA),
				withLive(webAPI, onTag), withLive(agentMon, pinned(dA))),
			want: want{rows: held, findings: []string{"group: INFO - benign"}},
			also: func(t *testing.T, p *Plan) {
				contains(t, "row", p.Rows[0].Message, "suspended until 2026-12-02T13:00:00Z")
				if p.Suspended == nil || !p.Suspended.Until.Equal(time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC)) {
					t.Errorf("Plan.Suspended = %+v, want until 13:00", p.Suspended)
				}
			},
		},
		"a suspension whose end passed holds nothing: the digest rolls and the mark goes with one INFO line": {
			settings: []settingsOpt{atSuspendNow},
			obs:      newDigest(map[string]string{sus: "2026-12-02T12:00:00Z", since: hoursAgo(2)}),
			want: want{
				rows:        []string{"api web/api: drifted", "api agent/monitor: drifted"},
				findings:    []string{"group: INFO - benign"},
				bookkeeping: kv{since: deleted},
				repin:       rolls,
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "is no longer suspended")
				check(t, "Once", p.Findings[0].Once, "suspension-ended")
			},
		},
		"resumed (the annotation removed): the mark goes and the digest rolls": {
			settings: []settingsOpt{atSuspendNow},
			obs:      newDigest(map[string]string{since: hoursAgo(2), k.SuspendedBy(): "kubectl-annotate"}),
			want: want{
				rows:        []string{"api web/api: drifted", "api agent/monitor: drifted"},
				findings:    []string{"group: INFO - benign"},
				bookkeeping: kv{since: deleted, k.SuspendedBy(): deleted},
				repin:       rolls,
			},
		},
		`"false" is not suspended`: {
			settings: []settingsOpt{atSuspendNow},
			obs:      newDigest(map[string]string{sus: "false"}),
			want:     want{rows: []string{"api web/api: drifted", "api agent/monitor: drifted"}, repin: rolls},
		},
		"suspended without an end for 24 hours is a finding naming resume": {
			settings: []settingsOpt{atSuspendNow},
			obs:      newDigest(map[string]string{sus: "true", since: hoursAgo(24)}),
			want: want{
				rows:     held,
				findings: []string{"group: INFO - benign", "group: WARN SuspendedWithoutEnd needs-human"},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[1].Message, "suspended without an end since "+hoursAgo(24))
				contains(t, "remediation", p.Findings[1].Remediation, "image-refresh resume --group edge")
				contains(t, "remediation", p.Findings[1].Remediation, "image-refresh suspend --group edge --for DURATION")
			},
		},
		"suspended without an end for 23 hours is no finding yet": {
			settings: []settingsOpt{atSuspendNow},
			obs:      newDigest(map[string]string{sus: "true", since: hoursAgo(23)}),
			want:     want{rows: held, findings: []string{"group: INFO - benign"}},
		},
		"a suspension with an end is no finding however long": {
			settings: []settingsOpt{atSuspendNow},
			obs:      newDigest(map[string]string{sus: "2027-01-01T00:00:00Z", since: hoursAgo(100)}),
			want:     want{rows: held, findings: []string{"group: INFO - benign"}},
		},
		"a value that does not parse holds the group (fail-safe), loudly": {
			settings: []settingsOpt{atSuspendNow},
			obs:      newDigest(map[string]string{sus: "tomorrow", since: nowText}),
			want: want{
				rows:     held,
				findings: []string{"group: WARN RefreshError needs-human", "group: INFO - benign"},
			},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, `invalid suspend value "tomorrow"`)
				contains(t, "finding", p.Findings[0].Message, sus)
			},
		},
		"records still update: a first observation is recorded while suspended": {
			settings: []settingsOpt{atSuspendNow},
			obs: observe(g, withAnchor(map[string]string{sus: "true", since: nowText}), withLatest("api", dA),
				withLive(webAPI, onTag), withLive(agentMon, onTag)),
			want: want{
				rows:        held,
				findings:    []string{"api: INFO - benign", "group: INFO - benign"},
				bookkeeping: kv{k.Record("api"): "<A>"},
			},
		},
		"a state that needs attention keeps its row: an error stays an error": {
			settings: []settingsOpt{atSuspendNow},
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withAnchor(map[string]string{sus: "true", since: nowText}), withLatest("api", dA),
				withLive(webAPI, pinned(dA)), readErr(agent, notFound)),
			want: want{
				rows:        []string{"api agent/monitor: error"},
				findings:    []string{"group: ERROR RefreshError needs-human", "api: WARN - benign", "group: INFO - benign"},
				bookkeeping: kv{k.ReadFailures("api"): "1"},
			},
		},
	})
}

func TestSuspensionOf_O1(t *testing.T) {
	now := suspendNow
	for name, tc := range map[string]struct {
		ann         map[string]string
		want        bool
		until       string
		invalid     string
		reason, who string
	}{
		"no annotation: not suspended":                  {ann: map[string]string{}},
		`"false": not suspended`:                        {ann: map[string]string{k.Suspend(): "false"}},
		`"true": until resumed`:                         {ann: map[string]string{k.Suspend(): "true", k.SuspendReason(): "INC-42"}, want: true, reason: "INC-42", who: "kubectl-annotate"},
		"an end ahead: until it":                        {ann: map[string]string{k.Suspend(): "2026-12-02T12:00:01Z"}, want: true, until: "2026-12-02T12:00:01Z"},
		"an end in another zone counts as that instant": {ann: map[string]string{k.Suspend(): "2026-12-02T13:30:00+01:00"}, want: true, until: "2026-12-02T12:30:00Z"},
		"an end now: over":                              {ann: map[string]string{k.Suspend(): "2026-12-02T12:00:00Z"}},
		"garbage: held, fail-safe":                      {ann: map[string]string{k.Suspend(): "yes please"}, want: true, invalid: `invalid suspend value "yes please"`},
	} {
		t.Run(name, func(t *testing.T) {
			s := SuspensionOf(k.Prefix, tc.ann, "kubectl-annotate", now)
			if (s != nil) != tc.want {
				t.Fatalf("SuspensionOf = %+v, want suspended %v", s, tc.want)
			}
			if s == nil {
				return
			}
			gotUntil := ""
			if !s.Until.IsZero() {
				gotUntil = s.Until.UTC().Format(time.RFC3339)
			}
			check(t, "Until", gotUntil, tc.until)
			gotInvalid := ""
			if s.Invalid != nil {
				gotInvalid = s.Invalid.Error()
			}
			if !strings.Contains(gotInvalid, tc.invalid) || (tc.invalid == "") != (gotInvalid == "") {
				t.Errorf("Invalid = %q, want %q", gotInvalid, tc.invalid)
			}
			if tc.reason != "" {
				check(t, "Reason", s.Reason, tc.reason)
				check(t, "By", s.By, tc.who)
			}
		})
	}
}
