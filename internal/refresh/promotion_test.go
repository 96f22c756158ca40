package refresh

import (
	"errors"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/state"
)

// P1: a group that follows another moves to a new digest only once the
// leader ran it settled and healthy for the soak; the leader's pass keeps
// the soak clock its followers read.

// onClock puts the engine on the flap tests' clock.
func onClock(s *Settings) { s.Now = func() time.Time { return flapNow } }

// following makes the fixture group follow group "staging" with soak.
func following(soak time.Duration) groupOpt {
	return func(g *config.Group) {
		g.Promotion = &config.Promotion{After: "staging", Soak: soak, Images: map[string]string{}}
		for _, img := range g.Images {
			g.Promotion.Images[img.Name] = img.Name
		}
	}
}

func leaderSays(pairs ...string) obsOpt {
	return func(o *Observation) { o.Leader = &Leader{Group: "staging", Anchor: ann(pairs...)} }
}

func soakedFor(d string, minutes, restarts int) string {
	return state.SoakValue{Digest: d, Since: flapNow.Add(-time.Duration(minutes) * time.Minute), Restarts: restarts}.String()
}

// followerFixture is what the promotion tests share for group g (P1, P2):
// an observation of its image api moved from <A> to <B>, the outcomes
// "waits" and "rolls to <B>", and a check of the row's message.
func followerFixture(g config.Group) (moved func(...obsOpt) Observation, waiting, rolls want, message func(string) func(*testing.T, *Plan)) {
	moved = func(opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{withAnchor(pinnedBefore("api", dA)), withLatest("api", dB), withLive(webAPI, pinned(dA))}, opts...)...)
	}
	waiting = want{rows: []string{"api web/api: waiting"}, findings: []string{"api: INFO - benign"}}
	rolls = want{
		rows:  []string{"api web/api: drifted"},
		repin: rollsWebAPI("<A>", "<B>"),
	}
	message = func(sub string) func(t *testing.T, p *Plan) {
		return func(t *testing.T, p *Plan) { contains(t, "the row's message", short.Replace(p.Rows[0].Message), sub) }
	}
	return moved, waiting, rolls, message
}

func TestDecide_P1_AFollowerMovesOnlyToADigestItsLeaderSoaked(t *testing.T) {
	g := group(withImage("api", on(webAPI)), following(30*time.Minute))
	moved, waiting, rolls, message := followerFixture(g)
	run(t, map[string]decideCase{
		"the leader has not run the new digest: the follower waits, naming the leader": {
			settings: []settingsOpt{onClock},
			obs:      moved(leaderSays(k.Record("api"), dA, k.Soak("api"), soakedFor(dA, 600, 0))),
			want:     waiting,
			also:     message("group staging, which group edge follows, has not run <B> settled and healthy yet (its record is <A>)"),
		},
		"the leader moved to it but was not found healthy on it yet: the follower waits for the leader's soak clock to start": {
			settings: []settingsOpt{onClock},
			obs:      moved(leaderSays(k.Record("api"), dB)),
			want:     waiting,
			also:     message("group staging, which group edge follows, runs <B> but has not yet been found settled and healthy on it (its soak clock starts then)"),
		},
		"the leader soaks it, 10 of 30 minutes: the follower waits with the time left and wakes at the soak's end": {
			settings: []settingsOpt{onClock},
			obs:      moved(leaderSays(k.Record("api"), dB, k.Soak("api"), soakedFor(dB, 10, 2))),
			want:     waiting,
			also: func(t *testing.T, p *Plan) {
				message("in 20m0s (at 2026-12-02T12:20:00Z)")(t, p)
				if want := flapNow.Add(20 * time.Minute); !p.WakeAt.Equal(want) {
					t.Errorf("WakeAt = %s, want the soak's end %s", p.WakeAt, want)
				}
			},
		},
		"the soak is over: the follower rolls": {
			settings: []settingsOpt{onClock},
			obs:      moved(leaderSays(k.Record("api"), dB, k.Soak("api"), soakedFor(dB, 30, 0))),
			want:     rolls,
		},
		"a digest the leader rolled back never reaches the follower": {
			settings: []settingsOpt{onClock},
			obs:      moved(leaderSays(k.Record("api"), dA, k.RolledBack("api"), dB+" CrashLoopBackOff (last exit code 1)", k.LockedOn("api"), dB)),
			want:     want{rows: []string{"api web/api: quarantined"}, findings: []string{"api: WARN DigestQuarantined benign"}},
			also:     message("group staging, which group edge follows, rolled <B> back (CrashLoopBackOff (last exit code 1)): it never reaches this group"),
		},
		"a digest the leader quarantined never reaches the follower": {
			settings: []settingsOpt{onClock},
			obs:      moved(leaderSays(k.Record("api"), dA, k.LockedOn("api"), dC+","+dB)),
			want:     want{rows: []string{"api web/api: quarantined"}, findings: []string{"api: WARN DigestQuarantined benign"}},
			also:     message("quarantined <B>"),
		},
		"a suspended leader holds its followers": {
			settings: []settingsOpt{onClock},
			obs:      moved(leaderSays(k.Record("api"), dB, k.Soak("api"), soakedFor(dB, 60, 0), k.Suspend(), "true")),
			want:     waiting,
			also:     message("group staging, which group edge follows, is suspended"),
		},
		"a leader whose state cannot be read holds the follower (fail-safe)": {
			settings: []settingsOpt{onClock},
			obs: moved(func(o *Observation) {
				o.Leader = &Leader{Group: "staging", Err: errors.New("deployments.apps \"web\" not found")}
			}),
			want: want{rows: []string{"api web/api: waiting"}, findings: []string{"api: WARN - benign"}},
			also: message("the state of group staging, which group edge follows, cannot be read"),
		},
		"a soak value that does not parse is no soak": {
			settings: []settingsOpt{onClock},
			obs:      moved(leaderSays(k.Record("api"), dB, k.Soak("api"), dB+" yesterday 0")),
			want:     waiting,
		},
		"a revert is re-pinned to the record: promotion holds only digest changes": {
			settings: []settingsOpt{onClock},
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dA), withLive(webAPI, onTag),
				leaderSays(k.Record("api"), dA)),
			want: want{
				rows:  []string{"api web/api: drifted"},
				repin: repinsWebAPI("<A>"),
			},
		},
	})
}

// healthyPods gives w n Ready pods running d with restarts each.
func healthyPods(w config.Workload, container, d string, n, restarts int, ready bool) obsOpt {
	return func(o *Observation) {
		if o.Pods == nil {
			o.Pods = map[config.Workload]PodsRead{}
		}
		var pods []RunningPod
		for i := range n {
			pods = append(pods, RunningPod{Name: w.Name + "-" + string(rune('a'+i)), Node: "n1",
				ImageIDs: map[string]string{container: repo + "@" + d}, Ready: ready, Restarts: restarts})
		}
		o.Pods[w] = PodsRead{Pods: pods}
	}
}

func followed(o *Observation) { o.Followers = []string{"prod"} }

func TestDecide_P1_ALeaderKeepsTheSoakClockOfWhatItRunsHealthy(t *testing.T) {
	g := group(withImage("api", on(webAPI)))
	steady := func(opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{withAnchor(pinnedBefore("api", dA)), withLatest("api", dA), withLive(webAPI, pinned(dA))}, opts...)...)
	}
	pinnedRow := []string{"api web/api: pinned"}
	run(t, map[string]decideCase{
		"settled, on the record, every pod Ready: the clock starts now": {
			settings: []settingsOpt{onClock},
			obs:      steady(followed, healthyPods(web, "api", dA, 2, 1, true)),
			want:     want{rows: pinnedRow, bookkeeping: kv{k.Soak("api"): short.Replace(soakedFor(dA, 0, 2))}},
		},
		"a clock already running on the record is left alone": {
			settings: []settingsOpt{onClock},
			obs:      steady(followed, healthyPods(web, "api", dA, 2, 1, true), withAnchor(ann(k.Soak("api"), soakedFor(dA, 20, 2)))),
			want:     want{rows: pinnedRow},
		},
		"a restart in the window starts the clock over": {
			settings: []settingsOpt{onClock},
			obs:      steady(followed, healthyPods(web, "api", dA, 2, 2, true), withAnchor(ann(k.Soak("api"), soakedFor(dA, 20, 2)))),
			want:     want{rows: pinnedRow, findings: []string{"api: INFO - benign"}, bookkeeping: kv{k.Soak("api"): short.Replace(soakedFor(dA, 0, 4))}},
		},
		"pods replaced with fewer restarts keep the clock, from the new count": {
			settings: []settingsOpt{onClock},
			obs:      steady(followed, healthyPods(web, "api", dA, 1, 0, true), withAnchor(ann(k.Soak("api"), soakedFor(dA, 20, 2)))),
			want:     want{rows: pinnedRow, bookkeeping: kv{k.Soak("api"): short.Replace(soakedFor(dA, 20, 0))}},
		},
		"a pod that is not Ready stops the clock": {
			settings: []settingsOpt{onClock},
			obs:      steady(followed, healthyPods(web, "api", dA, 2, 0, false), withAnchor(ann(k.Soak("api"), soakedFor(dA, 20, 0)))),
			want:     want{rows: pinnedRow, findings: []string{"api: INFO - benign"}, bookkeeping: kv{k.Soak("api"): deleted}},
			also: func(t *testing.T, p *Plan) {
				if !p.SoakPending {
					t.Error("SoakPending is false: run would not look again until an event")
				}
			},
		},
		"a clock on another digest starts over on the record": {
			settings: []settingsOpt{onClock},
			obs:      steady(followed, healthyPods(web, "api", dA, 1, 0, true), withAnchor(ann(k.Soak("api"), soakedFor(dC, 20, 0)))),
			want:     want{rows: pinnedRow, bookkeeping: kv{k.Soak("api"): short.Replace(soakedFor(dA, 0, 0))}},
		},
		"pods on another digest do not soak the record": {
			settings: []settingsOpt{onClock},
			obs:      steady(followed, healthyPods(web, "api", dC, 1, 0, true)),
			want:     want{rows: []string{"api web/api: running-stale"}, findings: []string{"api: WARN RunningStale benign"}},
		},
		"pods not read do not soak": {
			settings: []settingsOpt{onClock},
			obs:      steady(followed),
			want:     want{rows: pinnedRow},
		},
		"a group no one follows keeps no clock": {
			settings: []settingsOpt{onClock},
			obs:      steady(healthyPods(web, "api", dA, 2, 0, true)),
			want:     want{rows: pinnedRow},
		},
	})
}
