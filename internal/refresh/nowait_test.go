package refresh

import (
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
)

// C6: in `run` a worker never blocks on a rollout. A pass writes the
// attempt and the images and returns; the pass that sees the group settled
// confirms the attempt, and a rollout not settled rolloutTimeout after its
// write (the holder's time on the anchor) counts as a failed attempt, as
// in a tick.

const rolloutTimeout = 5 * time.Minute

func noWait(s *Settings) { s.NoWait, s.RolloutTimeout = true, rolloutTimeout }

func TestDecide_C6_AWorkerNeverWaitsForARollout(t *testing.T) {
	g := group(withImage("api", on(webAPI, agentMon)))
	mine := heldBy("me", 0)
	// A digest change from A to B that this instance wrote under attempt n
	// at `ago` before now: the targets run B, the record still says A.
	rolled := func(attempt string, ago time.Duration, opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{
			withAnchor(pinnedBefore("api", dA)), withAnchor(ann(k.Attempt(), attempt, k.Holder(), heldBy("me", ago))),
			withLatest("api", dB), withLive(webAPI, pinned(dB)), withLive(agentMon, pinned(dB)),
		}, opts...)...)
	}
	rolling := notSettled(agent, "1 of 3 pods updated")
	inFlight := want{rows: []string{"api web/api: not-settled", "api agent/monitor: not-settled"}}
	confirm := func(attempt string, ago time.Duration) *wantRepin {
		n := map[string]int{"1": 1, "3": 3}[attempt]
		return &wantRepin{attempt: n,
			clear:      kv{k.Attempt(): deleted, k.Holder(): deleted},
			record:     kv{k.Record("api"): "<B>"},
			unfinished: true}
	}
	async := func(want bool) func(t *testing.T, p *Plan) {
		return func(t *testing.T, p *Plan) {
			if p.Repin.Async != want {
				t.Errorf("Repin.Async = %v, want %v", p.Repin.Async, want)
			}
		}
	}
	run(t, map[string]decideCase{
		"a new digest is written under attempt 1 and the pass does not wait: no workload to wait for, the rollout is a later pass's": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dB),
				withLive(webAPI, pinned(dA)), withLive(agentMon, pinned(dA))),
			want: want{rows: []string{"api web/api: drifted", "api agent/monitor: drifted"}, repin: &wantRepin{
				attempt: 1, attemptSet: kv{k.Attempt(): "1", k.Holder(): mine},
				changes: []string{"web: api " + pinned("<A>") + " -> " + pinned("<B>") + " (digest-change, helm)",
					"agent: monitor " + pinned("<A>") + " -> " + pinned("<B>") + " (digest-change, helm)"},
				clear:  kv{k.Attempt(): deleted, k.Holder(): deleted},
				record: kv{k.Record("api"): "<B>"},
			}},
			also: async(true),
		},
		"its own attempt still rolling within rolloutTimeout: nothing written, no skip, no WARN; the plan says when the deadline comes": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      rolled("1", time.Minute, rolling),
			want:     inFlight,
			also: func(t *testing.T, p *Plan) {
				if want := holderNow.Add(rolloutTimeout - time.Minute); !p.WaitUntil.Equal(want) {
					t.Errorf("WaitUntil = %s, want %s", p.WaitUntil, want)
				}
				contains(t, "the row", p.Rows[0].Message, "attempt 1 of 3")
			},
		},
		"its own attempt settled within rolloutTimeout: confirmed (clear, then record), with no WARN about an unconfirmed rollout": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      rolled("1", time.Minute),
			want:     want{rows: []string{"api web/api: pinned", "api agent/monitor: pinned"}, repin: confirm("1", time.Minute)},
			also:     async(false),
		},
		"its own attempt not settled rolloutTimeout after its write: an ERROR, and attempt 2 is written and not waited for either": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      rolled("1", rolloutTimeout+time.Second, rolling),
			want: want{findings: []string{"group: ERROR RefreshError needs-human"},
				rows: []string{"api web/api: pinned", "api agent/monitor: pinned"},
				repin: &wantRepin{attempt: 2, attemptSet: kv{k.Attempt(): "2", k.Holder(): mine},
					clear:      kv{k.Attempt(): deleted, k.Holder(): deleted},
					record:     kv{k.Record("api"): "<B>"},
					unfinished: true}},
			also: func(t *testing.T, p *Plan) {
				async(true)(t, p)
				for _, s := range []string{"rollout not settled within rolloutTimeout 5m0s", "1 of 3 pods updated", "attempt 1 of 3"} {
					contains(t, "the finding", p.Findings[0].Message, s)
				}
			},
		},
		"the last attempt still rolling within its deadline is not a lockout yet": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      rolled("3", time.Minute, rolling),
			want:     inFlight,
		},
		"the last attempt settled within its deadline is confirmed, as a tick's wait would have: no lockout": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      rolled("3", time.Minute),
			want:     want{rows: []string{"api web/api: pinned", "api agent/monitor: pinned"}, repin: confirm("3", time.Minute)},
		},
		"the last attempt past its deadline locks the group out, with the ERROR told once": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      rolled("3", rolloutTimeout+time.Second, rolling),
			want: want{lockedOut: true, bookkeeping: kv{k.Flap(): "3", k.LockedOn("api"): "<B>"},
				findings: []string{"group: ERROR RefreshError needs-human", "group: WARN RefreshLockedOut needs-human"},
				rows:     []string{"api web/api: locked-out", "api agent/monitor: locked-out"}},
		},
		"a locked group whose marker says it was told gets no second ERROR": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      rolled("3", rolloutTimeout+time.Hour, rolling, withAnchor(ann(k.Flap(), "3"))),
			want: want{lockedOut: true, bookkeeping: kv{k.LockedOn("api"): "<B>"}, findings: []string{"group: WARN RefreshLockedOut needs-human"},
				rows: []string{"api web/api: locked-out", "api agent/monitor: locked-out"}},
		},
		"another instance's attempt rolling within its deadline is left to it without a WARN": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      rolled("1", time.Minute, rolling, withAnchor(ann(k.Holder(), heldBy("pod-b", time.Minute)))),
			want:     inFlight,
		},
		"without NoWait (tick) the same rolling attempt is waited for again under attempt 2, as R11 says": {
			settings: []settingsOpt{asInstance("me")},
			obs:      rolled("1", time.Minute, rolling),
			want: want{findings: []string{"group: WARN - benign"},
				rows: []string{"api web/api: pinned", "api agent/monitor: pinned"},
				repin: &wantRepin{attempt: 2, attemptSet: kv{k.Attempt(): "2", k.Holder(): mine},
					wait:       []string{"web", "agent"},
					clear:      kv{k.Attempt(): deleted, k.Holder(): deleted},
					record:     kv{k.Record("api"): "<B>"},
					unfinished: true}},
			also: async(false),
		},
	})
}

// C6: a write that takes a target off its pin while its workload was
// settled on the pin is re-pinned in the same pass; the rollout the revert
// started is not waited for. Every other unsettled state waits (R4).
func TestDecide_C6_ARevertOfASettledPinIsSupersededAtOnce(t *testing.T) {
	g := group(withImage("api", on(webAPI, agentMon)))
	mine := heldBy("me", 0)
	// Helm reverted agent's monitor to the tag; the revert's own rollout
	// runs (agent unsettled).
	reverted := func(opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{
			withAnchor(pinnedBefore("api", dA)), withLatest("api", dA),
			withLive(webAPI, pinned(dA)), withLive(agentMon, onTag),
			notSettled(agent, "1 of 3 scheduled pods updated"),
		}, opts...)...)
	}
	seen := func(beforeSettled bool, before, after string) obsOpt {
		return func(o *Observation) {
			o.Reverted = map[config.Workload]Revert{agent: {BeforeSettled: beforeSettled,
				Before: map[string]string{"monitor": before}, After: map[string]string{"monitor": after}}}
		}
	}
	repinNow := want{findings: []string{"group: INFO - benign"},
		rows: []string{"api web/api: pinned", "api agent/monitor: drifted"},
		repin: &wantRepin{attempt: 1, attemptSet: kv{k.Attempt(): "1", k.Holder(): mine},
			changes: []string{"agent: monitor " + onTag + " -> " + pinned("<A>") + " (revert, helm)"},
			clear:   kv{k.Attempt(): deleted, k.Holder(): deleted}}}
	waits := want{findings: []string{"group: NOTE - benign"}, bookkeeping: kv{k.SkipStreak(): "1"},
		rows: []string{"api web/api: not-settled", "api agent/monitor: not-settled"}}
	run(t, map[string]decideCase{
		"the revert of a workload that was settled on its pin is re-pinned in the same pass, told as C6": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      reverted(seen(true, pinned(dA), onTag)),
			want:     repinNow,
			also: func(t *testing.T, p *Plan) {
				for _, s := range []string{"DaemonSet tb/agent", "taken off its pin while settled", "1 of 3 scheduled pods updated", "re-pinning now instead of waiting"} {
					contains(t, "the finding", p.Findings[0].Message, s)
				}
			},
		},
		"no revert seen (a tick, or a restart): R4 waits": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      reverted(),
			want:     waits,
		},
		"the workload was not settled before the write: R4 waits": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      reverted(seen(false, pinned(dA), onTag)),
			want:     waits,
		},
		"the workload was not on the recorded digest before the write: R4 waits": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      reverted(seen(true, pinned(dB), onTag)),
			want:     waits,
		},
		"the images were written again since the revert was seen: R4 waits": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      reverted(seen(true, pinned(dA), repo+":canary")),
			want:     waits,
		},
		"another workload of the group is unsettled too: R4 waits for it": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      reverted(seen(true, pinned(dA), onTag), notSettled(web, "1 of 2 replicas updated")),
			want: want{findings: []string{"group: INFO - benign", "group: NOTE - benign"}, bookkeeping: kv{k.SkipStreak(): "1"},
				rows: []string{"api web/api: not-settled", "api agent/monitor: not-settled"}},
		},
	})
}
