package refresh

import (
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
)

// V2: with onFailedRollout: rollback, a failed digest-change rollout is
// put back on the recorded digest and the failed digest quarantined.

func rollbackGroup() config.Group {
	g := group(withImage("api", on(webAPI, agentMon)))
	g.OnFailedRollout = config.OnFailedRolloutRollback
	return g
}

func crashing(w config.Workload, container, why string) obsOpt {
	return func(o *Observation) {
		if o.Pods == nil {
			o.Pods = map[config.Workload]PodsRead{}
		}
		o.Pods[w] = PodsRead{Pods: []RunningPod{{Name: w.Name + "-x", Node: "node-1", ImageIDs: map[string]string{container: pinned(dB)},
			Failing: map[string]string{container: why}}}}
	}
}

func TestDecide_V2_AFailedDigestChangeIsRolledBackAndQuarantined(t *testing.T) {
	mine := heldBy("me", 0)
	// A digest change from A to B under attempt n, `ago` before now: the
	// targets run B (agent only partly), the record still says A.
	rolled := func(g config.Group, attempt string, holder string, opts ...obsOpt) Observation {
		base := []obsOpt{withAnchor(pinnedBefore("api", dA)), withAnchor(ann(k.Attempt(), attempt)),
			withLatest("api", dB), withLive(webAPI, pinned(dB)), withLive(agentMon, pinned(dB)), notSettled(agent, "1 of 3 pods updated")}
		if holder != "" {
			base = append(base, withAnchor(ann(k.Holder(), holder)))
		}
		return observe(g, append(base, opts...)...)
	}
	rolledBack := func(attempt int, reason string) want {
		return want{
			bookkeeping: kv{k.LockedOn("api"): "<B>", k.RolledBack("api"): "<B> " + reason},
			findings:    []string{"api: ERROR RolledBack needs-human"},
			rows:        []string{"api web/api: rolled-back", "api agent/monitor: rolled-back"},
			repin: &wantRepin{attempt: attempt, attemptSet: kv{k.Attempt(): itoa(attempt), k.Holder(): mine},
				changes: []string{"web: api " + pinned("<B>") + " -> " + pinned("<A>") + " (rollback, helm)",
					"agent: monitor " + pinned("<B>") + " -> " + pinned("<A>") + " (rollback, helm)"},
				clear: kv{k.Attempt(): deleted, k.Holder(): deleted}},
		}
	}
	timeoutWhy := "not settled within rolloutTimeout 5m0s of the write (DaemonSet tb/agent: 1 of 3 pods updated)"
	run(t, map[string]decideCase{
		"run: pods that crash roll the group back at once, before the deadline": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      rolled(rollbackGroup(), "1", heldBy("me", time.Minute), crashing(agent, "monitor", "CrashLoopBackOff (last exit code 1, Error)")),
			want:     rolledBack(2, "pod agent-x container monitor: CrashLoopBackOff (last exit code 1, Error)"),
			also: func(t *testing.T, p *Plan) {
				if !p.Repin.Rollback || !p.Repin.Async || !p.WaitUntil.IsZero() {
					t.Errorf("Repin.Rollback %v, Async %v, WaitUntil %s: want a rollback not waited for", p.Repin.Rollback, p.Repin.Async, p.WaitUntil)
				}
			},
		},
		"run: a Deployment past its progress deadline is rolled back": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs: rolled(rollbackGroup(), "1", heldBy("me", time.Minute), func(o *Observation) {
				w := o.Workloads[web]
				w.Settled, w.Failed = false, "ProgressDeadlineExceeded: ReplicaSet web-2 has timed out progressing."
				o.Workloads[web] = w
			}),
			want: rolledBack(2, "Deployment tb/web: ProgressDeadlineExceeded: ReplicaSet web-2 has timed out progressing."),
		},
		"run: past rolloutTimeout without a signal, rolled back": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      rolled(rollbackGroup(), "1", heldBy("me", rolloutTimeout+time.Second)),
			want:     rolledBack(2, timeoutWhy),
		},
		"run: still rolling within its deadline and nothing failing: left alone": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      rolled(rollbackGroup(), "1", heldBy("me", time.Minute)),
			want:     want{rows: []string{"api web/api: not-settled", "api agent/monitor: not-settled"}},
		},
		"tick: the attempt the last tick waited for and released is rolled back": {
			settings: []settingsOpt{asInstance("me")},
			obs:      rolled(rollbackGroup(), "1", ""),
			want: func() want {
				w := rolledBack(2, "not settled within rolloutTimeout 0s of the write (DaemonSet tb/agent: 1 of 3 pods updated)")
				w.repin.wait = []string{"web", "agent"}
				return w
			}(),
		},
		"tick: a wait that ended on a crash names it, although the pods read since show none": {
			settings: []settingsOpt{asInstance("me")},
			obs: rolled(rollbackGroup(), "1", "", func(o *Observation) {
				o.WaitFailure = "pod agent-x container monitor: CrashLoopBackOff (last exit code 1, Error)"
			}),
			want: func() want {
				w := rolledBack(2, "pod agent-x container monitor: CrashLoopBackOff (last exit code 1, Error)")
				w.repin.wait = []string{"web", "agent"}
				return w
			}(),
		},
		"tick: pods that crash now are named before what the wait saw": {
			settings: []settingsOpt{asInstance("me")},
			obs: rolled(rollbackGroup(), "1", "", crashing(agent, "monitor", "ImagePullBackOff"), func(o *Observation) {
				o.WaitFailure = "pod agent-y container monitor: CrashLoopBackOff (last exit code 1, Error)"
			}),
			want: func() want {
				w := rolledBack(2, "pod agent-x container monitor: ImagePullBackOff")
				w.repin.wait = []string{"web", "agent"}
				return w
			}(),
		},
		"tick: another live process's attempt is left to it": {
			settings: []settingsOpt{asInstance("me")},
			obs:      rolled(rollbackGroup(), "1", heldBy("pod-b", time.Minute)),
			want: want{findings: []string{"group: WARN - benign"},
				rows: []string{"api web/api: not-settled", "api agent/monitor: not-settled"}},
		},
		"hold (the default) still waits again under the next attempt (R10, R11)": {
			settings: []settingsOpt{asInstance("me")},
			obs:      rolled(group(withImage("api", on(webAPI, agentMon))), "1", ""),
			want: want{findings: []string{"group: WARN - benign"},
				rows: []string{"api web/api: pinned", "api agent/monitor: pinned"},
				repin: &wantRepin{attempt: 2, attemptSet: kv{k.Attempt(): "2", k.Holder(): mine},
					wait:       []string{"web", "agent"},
					clear:      kv{k.Attempt(): deleted, k.Holder(): deleted},
					record:     kv{k.Record("api"): "<B>"},
					unfinished: true}},
		},
		"no attempt left: the lockout, as R10 bounds the rollback too": {
			settings: []settingsOpt{asInstance("me"), noWait},
			obs:      rolled(rollbackGroup(), "3", heldBy("me", rolloutTimeout+time.Second)),
			want: want{lockedOut: true, bookkeeping: kv{k.Flap(): "3", k.LockedOn("api"): "<B>"},
				findings: []string{"group: ERROR RefreshError needs-human", "group: WARN RefreshLockedOut needs-human"},
				rows:     []string{"api web/api: locked-out", "api agent/monitor: locked-out"}},
		},
	})
}

func TestDecide_V2_ARolledBackDigestIsHeldWithItsReasonAndANewDigestRolls(t *testing.T) {
	g := rollbackGroup()
	after := func(latest string) Observation {
		return observe(g, withAnchor(pinnedBefore("api", dA)),
			withAnchor(ann(k.LockedOn("api"), dB, k.RolledBack("api"), dB+" pod web-x container api: CrashLoopBackOff (last exit code 1, Error)")),
			withLatest("api", latest), withLive(webAPI, pinned(dA)), withLive(agentMon, pinned(dA)))
	}
	run(t, map[string]decideCase{
		"the registry still serves the failed digest: rolled-back, held on the record, nothing written": {
			obs: after(dB),
			want: want{findings: []string{"api: WARN RolledBack needs-human"},
				rows: []string{"api web/api: rolled-back", "api agent/monitor: rolled-back"}},
			also: func(t *testing.T, p *Plan) {
				contains(t, "the row", p.Rows[0].Message, "CrashLoopBackOff (last exit code 1, Error)")
			},
		},
		"a new digest is tried by itself, and the note goes (R23's quarantine stays)": {
			obs: after(dC),
			want: want{bookkeeping: kv{k.RolledBack("api"): deleted},
				rows: []string{"api web/api: drifted", "api agent/monitor: drifted"},
				repin: firstRepin([]string{"web", "agent"},
					"web: api "+pinned("<A>")+" -> "+pinned("<C>")+" (digest-change, helm)",
					"agent: monitor "+pinned("<A>")+" -> "+pinned("<C>")+" (digest-change, helm)",
				).recording("api", "<C>")},
		},
	})
}

func itoa(n int) string { return string(rune('0' + n)) }
