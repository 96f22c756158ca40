package refresh

import (
	"strings"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/internal/state"
)

// C3: two image-refresh processes without leader election by mistake. The
// attempt holder says which process persisted the unfinished attempt and
// when; another process leaves the unsettled group to it, so that neither
// counts the other's rollout as its own unfinished attempt (R11), stacks
// attempts and locks the group out, nor re-images mid-rollout.

var holderNow = time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)

func asInstance(name string) settingsOpt {
	return func(s *Settings) {
		s.Instance, s.HolderTTL = name, 5*time.Minute
		s.Now = func() time.Time { return holderNow }
	}
}

func heldBy(instance string, ago time.Duration) string {
	return state.Holder{Instance: instance, Since: holderNow.Add(-ago)}.String()
}

func TestDecide_C3_AnotherInstancesUnsettledAttemptIsLeftToIt(t *testing.T) {
	g := group(withImage("api", on(webAPI, agentMon)))
	onDigest := func(holder string, opts ...obsOpt) Observation {
		a := ann(k.Attempt(), "1")
		if holder != "" {
			a[k.Holder()] = holder
		}
		return observe(g, append([]obsOpt{
			withAnchor(pinnedBefore("api", dB)), withAnchor(a),
			withLatest("api", dB), withLive(webAPI, pinned(dB)), withLive(agentMon, pinned(dB)),
		}, opts...)...)
	}
	mine := heldBy("me", 0)
	rolling := notSettled(agent, "1 of 3 pods updated")
	waitAgain := &wantRepin{
		attempt: 2, attemptSet: kv{k.Attempt(): "2", k.Holder(): mine},
		wait:       []string{"web", "agent"},
		clear:      kv{k.Attempt(): deleted, k.Holder(): deleted},
		unfinished: true,
	}
	leftAlone := want{
		findings: []string{"group: WARN - benign"},
		rows:     []string{"api web/api: not-settled", "api agent/monitor: not-settled"},
	}
	run(t, map[string]decideCase{
		"another instance's attempt rolling out within its time is left alone: no attempt, no skip streak, no write": {
			settings: []settingsOpt{asInstance("me")},
			obs:      onDigest(heldBy("pod-b-1234", time.Minute), rolling),
			want:     leftAlone,
			also: func(t *testing.T, p *Plan) {
				f := p.Findings[0]
				for _, s := range []string{"pod-b-1234", "attempt 1", "not settled", "1 of 3 pods updated", "me"} {
					contains(t, "the finding", f.Message, s)
				}
				contains(t, "the remediation", f.Remediation, "--leader-elect")
			},
		},
		"another instance's attempt on a settled group it has not re-imaged yet is left alone: no second attempt, no racing image write": {
			settings: []settingsOpt{asInstance("me")},
			obs:      onDigest(heldBy("pod-b-1234", time.Second), withLive(webAPI, onTag)), // a Helm revert both saw
			want:     leftAlone,
			also: func(t *testing.T, p *Plan) {
				for _, s := range []string{"pod-b-1234", "attempt 1", "not finished yet"} {
					contains(t, "the finding", p.Findings[0].Message, s)
				}
			},
		},
		"another instance's attempt on a settled group, older than the write grace (a holder killed before its image writes), is taken over at once": {
			settings: []settingsOpt{asInstance("me")},
			obs:      onDigest(heldBy("pod-b-1234", 3*time.Second), withLive(webAPI, onTag)),
			want: want{findings: []string{"group: WARN - benign"}, rows: []string{"api web/api: drifted", "api agent/monitor: pinned"}, repin: &wantRepin{
				attempt: 2, attemptSet: kv{k.Attempt(): "2", k.Holder(): mine},
				changes: []string{"web: api docker.io/acme/api:prod -> docker.io/acme/api@<B> (revert, helm)"},
				wait:    []string{"web", "agent"},
				clear:   kv{k.Attempt(): deleted, k.Holder(): deleted},
			}},
			also: func(t *testing.T, p *Plan) {
				contains(t, "the take-over finding", p.Findings[0].Message, "within 2s; taking it over")
			},
		},
		"the same settled group with a revert, under this instance's own attempt, is re-pinned under attempt+1": {
			settings: []settingsOpt{asInstance("me")},
			obs:      onDigest(heldBy("me", time.Second), withLive(webAPI, onTag)),
			want: want{rows: []string{"api web/api: drifted", "api agent/monitor: pinned"}, repin: &wantRepin{
				attempt: 2, attemptSet: kv{k.Attempt(): "2", k.Holder(): mine},
				changes: []string{"web: api docker.io/acme/api:prod -> docker.io/acme/api@<B> (revert, helm)"},
				wait:    []string{"web", "agent"},
				clear:   kv{k.Attempt(): deleted, k.Holder(): deleted},
			}},
		},
		"another instance's attempt past its time is taken over as unfinished": {
			settings: []settingsOpt{asInstance("me")},
			obs:      onDigest(heldBy("pod-b-1234", 6*time.Minute), rolling),
			want:     want{findings: []string{"group: WARN - benign", "group: WARN - benign"}, rows: []string{"api web/api: pinned", "api agent/monitor: pinned"}, repin: waitAgain},
			also: func(t *testing.T, p *Plan) {
				contains(t, "the take-over finding", p.Findings[0].Message, "taking it over")
			},
		},
		"this instance's own unfinished attempt is waited for again under attempt+1 (R11)": {
			settings: []settingsOpt{asInstance("me")},
			obs:      onDigest(heldBy("me", time.Minute), rolling),
			want:     want{findings: []string{"group: WARN - benign"}, rows: []string{"api web/api: pinned", "api agent/monitor: pinned"}, repin: waitAgain},
		},
		"an attempt without a holder (released, or written before holders) is waited for again at once": {
			settings: []settingsOpt{asInstance("me")},
			obs:      onDigest("", rolling),
			want:     want{findings: []string{"group: WARN - benign"}, rows: []string{"api web/api: pinned", "api agent/monitor: pinned"}, repin: waitAgain},
		},
		"a holder that does not parse is reported and its attempt treated as abandoned": {
			settings: []settingsOpt{asInstance("me")},
			obs:      onDigest("pod-b yesterday", rolling),
			want:     want{findings: []string{"group: WARN - benign", "group: WARN - benign"}, rows: []string{"api web/api: pinned", "api agent/monitor: pinned"}, repin: waitAgain},
			also: func(t *testing.T, p *Plan) {
				contains(t, "the finding", p.Findings[0].Message, k.Holder())
				contains(t, "the finding", p.Findings[0].Message, "pod-b yesterday")
			},
		},
		"another instance's attempt that settled is confirmed, expecting its holder": {
			settings: []settingsOpt{asInstance("me")},
			obs:      onDigest(heldBy("pod-b-1234", time.Minute)),
			want: want{findings: []string{"group: WARN - benign"}, rows: []string{"api web/api: pinned", "api agent/monitor: pinned"}, repin: &wantRepin{
				attempt: 1, wait: []string{"web", "agent"},
				clear:      kv{k.Attempt(): deleted, k.Holder(): deleted},
				unfinished: true,
			}},
			also: func(t *testing.T, p *Plan) {
				if e := p.Repin.ClearWrite.Expect[k.Holder()]; e == nil || *e != heldBy("pod-b-1234", time.Minute) {
					t.Errorf("ClearWrite expects holder %v, want the other instance's", e)
				}
				if !p.Repin.ReleaseWrite.Empty() {
					t.Errorf("a confirm wrote no holder, so it has none to release: %v", renderWrite(p.Repin.ReleaseWrite))
				}
			},
		},
		"without an instance name (a pure decision) no holder is written or heeded": {
			obs: onDigest(heldBy("pod-b-1234", time.Minute), rolling),
			want: want{findings: []string{"group: WARN - benign"}, rows: []string{"api web/api: pinned", "api agent/monitor: pinned"}, repin: &wantRepin{
				attempt: 2, attemptSet: kv{k.Attempt(): "2"},
				wait:       []string{"web", "agent"},
				clear:      kv{k.Attempt(): deleted, k.Holder(): deleted},
				unfinished: true,
			}},
		},
	})
}

func TestDecide_C3_AnAttemptNamesItsHolderAndReleasesItWhenItEndsUnsettled(t *testing.T) {
	g := group(withImage("api", on(webAPI, agentMon)))
	stale := heldBy("pod-gone", time.Hour) // left by an earlier attempt: overwritten, expected
	obs := observe(g, withAnchor(pinnedBefore("api", dA)), withAnchor(ann(k.Holder(), stale)),
		withLatest("api", dB), withLive(webAPI, pinned(dA)), withLive(agentMon, pinned(dA)))
	p := Decide(settings(asInstance("me")), obs)
	checkCAS(t, obs.Anchor, p)
	if p.Repin == nil || len(p.Repin.Changes) != 2 {
		t.Fatalf("a digest change re-images both targets, got %+v", p.Repin)
	}
	aw := p.Repin.AttemptWrite
	if got := aw.Set[k.Holder()]; got == nil || *got != heldBy("me", 0) {
		t.Errorf("attempt write sets holder %v, want %q", got, heldBy("me", 0))
	}
	if e := aw.Expect[k.Holder()]; e == nil || *e != stale {
		t.Errorf("attempt write expects holder %v, want the one read (%q)", e, stale)
	}
	rw := p.Repin.ReleaseWrite
	if got, ok := rw.Set[k.Holder()]; !ok || got != nil || len(rw.Set) != 1 {
		t.Errorf("release sets %v, want only the holder deleted", renderWrite(rw))
	}
	for key, want := range map[string]string{k.Attempt(): "1", k.Holder(): heldBy("me", 0)} {
		if e := rw.Expect[key]; e == nil || *e != want {
			t.Errorf("release expects %s=%v, want %q: it must not drop a holder another process wrote since", key, e, want)
		}
	}
	if !strings.Contains(renderWrite(p.Repin.ClearWrite)[k.Holder()], deleted) {
		t.Errorf("the clear after a settled rollout leaves the holder: %v", renderWrite(p.Repin.ClearWrite))
	}
}
