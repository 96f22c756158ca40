package refresh

import (
	"errors"
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/internal/config"
)

// N1: what the nodes run. Every target's pods of the current template are
// compared with the digest the target should run; a settled target with a
// pod on another digest is running-stale.

func withPods(w config.Workload, container string, imageIDs ...string) obsOpt {
	return func(o *Observation) {
		if o.Pods == nil {
			o.Pods = map[config.Workload]PodsRead{}
		}
		read := PodsRead{}
		for i, id := range imageIDs {
			read.Pods = append(read.Pods, RunningPod{Name: w.Name + "-" + string(rune('a'+i)), Node: "node-" + string(rune('1'+i)),
				ImageIDs: map[string]string{container: id}})
		}
		o.Pods[w] = read
	}
}

func podsErr(w config.Workload, err error) obsOpt {
	return func(o *Observation) { o.Pods = map[config.Workload]PodsRead{w: {Err: err}} }
}

func withPlatforms(index string, platforms ...string) obsOpt {
	return func(o *Observation) { o.Platforms = map[string][]string{index: platforms} }
}

func failOnRunningStale(s *Settings) { s.FailOnRunningStale = true }

// running checks the rows' Running column, in row order.
func running(want ...string) func(t *testing.T, p *Plan) {
	return func(t *testing.T, p *Plan) {
		var got []string
		for _, r := range p.Rows {
			got = append(got, short.Replace(r.Running))
		}
		check(t, "Rows' Running", got, want)
	}
}

func TestDecide_N1_WhatThePodsRunIsComparedWithThePin(t *testing.T) {
	g := group(withImage("api", on(webAPI)))
	steady := []obsOpt{withAnchor(pinnedBefore("api", dA)), withLatest("api", dA), withLive(webAPI, pinned(dA))}
	obs := func(opts ...obsOpt) Observation { return observe(g, append(append([]obsOpt{}, steady...), opts...)...) }
	staleFinding := "api: WARN RunningStale benign"
	run(t, map[string]decideCase{
		"every pod reports the pinned digest: pinned, 2/2": {
			obs:  obs(withPods(web, "api", repo+"@"+dA, "docker-pullable://"+repo+"@"+dA)),
			want: want{rows: []string{"api web/api: pinned"}},
			also: running("2/2"),
		},
		"a pod on another digest of a settled target is running-stale, naming pod, node and both digests, with an Event but exit 0": {
			obs:  obs(withPods(web, "api", repo+"@"+dA, repo+"@"+dB)),
			want: want{rows: []string{"api web/api: running-stale"}, findings: []string{staleFinding}},
			also: func(t *testing.T, p *Plan) {
				running("1/2 (node-2: <B>)")(t, p)
				f := p.Findings[0]
				if msg := short.Replace(f.Message); !strings.Contains(msg, "pod web-b on node node-2 runs <B>") || !strings.Contains(msg, "<A>") {
					t.Errorf("message %q does not name the pod, its node and both digests", msg)
				}
				if !f.Event || !strings.Contains(f.Remediation, "delete") {
					t.Errorf("finding %+v: want an Event and a remediation that says what to delete", f)
				}
			},
		},
		"with failOnRunningStale the same target needs a human (exit 1)": {
			settings: []settingsOpt{failOnRunningStale},
			obs:      obs(withPods(web, "api", repo+"@"+dB)),
			want:     want{rows: []string{"api web/api: running-stale"}, findings: []string{"api: WARN RunningStale needs-human"}},
		},
		"a platform manifest of a pinned index counts as on the digest": {
			obs:  obs(withPods(web, "api", repo+"@"+dC, repo+"@"+dC), withPlatforms(dA, dB, dC)),
			want: want{rows: []string{"api web/api: pinned"}},
			also: running("2/2"),
		},
		"an imageID without a repository digest is unknown, never a match, said once": {
			obs:  obs(withPods(web, "api", repo+"@"+dA, "sha256:"+strings.Repeat("d", 64), "sha256:"+strings.Repeat("e", 64))),
			want: want{rows: []string{"api web/api: pinned"}, findings: []string{"api: NOTE - benign"}},
			also: func(t *testing.T, p *Plan) {
				running("1/3 (2 unknown)")(t, p)
				contains(t, "finding", p.Findings[0].Message, "2 pod(s) of "+webAPI.String()+" report an imageID without a repository digest")
			},
		},
		"a target whose container was renamed away: its pods have none to check, no NOTE (N1, R19 says so)": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dA), withLive(target(web, "api2"), pinned(dA)),
				withPods(web, "api2", repo+"@"+dA)),
			want: want{
				rows:        []string{"api web/api: error"},
				findings:    []string{"api: ERROR RefreshError needs-human", "api: WARN - benign"},
				bookkeeping: kv{k.ReadFailures("api"): "1"},
			},
			also: running(""),
		},
		"a pod that does not run the container yet (Pending, no imageID) is not unknown: no NOTE (N1)": {
			obs:  obs(withPods(web, "api", repo+"@"+dA, "", "")),
			want: want{rows: []string{"api web/api: pinned"}},
			also: running("1/3 (2 not running)"),
		},
		"an unsettled target (a rollout under way) is not running-stale: R4 waits for it": {
			obs:  obs(withPods(web, "api", repo+"@"+dB), notSettled(web, "1 of 2 replicas updated")),
			want: want{rows: []string{"api web/api: not-settled"}, findings: []string{"group: NOTE - benign"}, bookkeeping: kv{k.SkipStreak(): "1"}},
			also: running("0/1 (node-1: <B>)"),
		},
		"a target on its tag is compared with the recorded digest": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dA), withLive(webAPI, onTag),
				withPods(web, "api", repo+"@"+dA)),
			want: want{rows: []string{"api web/api: drifted"}, repin: &wantRepin{attempt: 1,
				attemptSet: kv{k.Attempt(): "1"},
				changes:    []string{"web: api " + onTag + " -> " + pinned("<A>") + " (revert, helm)"},
				wait:       []string{"web"},
				clear:      kv{k.Attempt(): deleted},
				record:     kv{}}},
			also: running("1/1"),
		},
		"before the first pin a pod on another digest than the one this pass records is running-stale": {
			obs: observe(g, withLatest("api", dA), withLive(webAPI, onTag), withPods(web, "api", repo+"@"+dA, repo+"@"+dB)),
			want: want{rows: []string{"api web/api: running-stale"}, bookkeeping: kv{k.Record("api"): "<A>"},
				findings: []string{"api: INFO - benign", staleFinding}},
			also: running("1/2 (node-2: <B>)"),
		},
		"pods that cannot be read are unknown, with the RBAC to grant": {
			obs:  obs(podsErr(web, errors.New(`pods is forbidden`))),
			want: want{rows: []string{"api web/api: pinned"}, findings: []string{"api: WARN - benign"}},
			also: running("unknown"),
		},
		"pods not read (a CronJob, or a front end that does not read them): nothing checked": {
			obs:  obs(),
			want: want{rows: []string{"api web/api: pinned"}},
			also: running(""),
		},
	})
}

func TestRunningDigest_N1(t *testing.T) {
	for id, want := range map[string]string{
		repo + "@" + dA:                        dA,
		"docker-pullable://" + repo + "@" + dA: dA,
		"sha256:" + strings.Repeat("d", 64):    "",
		"":                                     "",
		repo + "@sha256:short":                 "",
	} {
		if got := RunningDigest(id); got != want {
			t.Errorf("RunningDigest(%q) = %q, want %q", id, got, want)
		}
	}
}
