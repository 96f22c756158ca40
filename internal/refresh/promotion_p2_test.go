package refresh

import (
	"errors"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
)

// P2: a group that publishes asks, once its soak of the recorded digest
// ended and nothing was published for it, for its promotion attestation;
// a group that follows a signer of another cluster moves only to a digest
// with a valid one, after the extra soak.

func publishing(soak time.Duration) groupOpt {
	return func(g *config.Group) { g.Promotion = &config.Promotion{Publish: &config.PromotionPublish{Soak: soak}} }
}

func TestDecide_P2_APublishingGroupPublishesOnceItsSoakEnded(t *testing.T) {
	g := group(withImage("api", on(webAPI)), publishing(30*time.Minute))
	steady := func(opts ...obsOpt) Observation {
		return observe(g, append([]obsOpt{withAnchor(pinnedBefore("api", dA)), withLatest("api", dA), withLive(webAPI, pinned(dA)), healthyPods(web, "api", dA, 2, 0, true)}, opts...)...)
	}
	pinnedRow := []string{"api web/api: pinned"}
	publishes := func(since time.Time) func(t *testing.T, p *Plan) {
		return func(t *testing.T, p *Plan) {
			if len(p.Publish) != 1 {
				t.Fatalf("Publish = %+v, want one publication", p.Publish)
			}
			want := Publication{Image: "api", Repository: repo, Digest: dA, Since: since, Soak: 30 * time.Minute}
			if got := p.Publish[0]; got.Image != want.Image || got.Digest != want.Digest || !got.Since.Equal(want.Since) || got.Soak != want.Soak || got.Repository != want.Repository {
				t.Errorf("Publish[0] = %+v, want %+v", got, want)
			}
		}
	}
	none := func(wake time.Time) func(t *testing.T, p *Plan) {
		return func(t *testing.T, p *Plan) {
			if len(p.Publish) != 0 {
				t.Errorf("Publish = %+v, want none", p.Publish)
			}
			if !p.WakeAt.Equal(wake) {
				t.Errorf("WakeAt = %s, want %s", p.WakeAt, wake)
			}
		}
	}
	run(t, map[string]decideCase{
		"the clock starts: nothing is published yet, run wakes at the soak's end": {
			settings: []settingsOpt{onClock},
			obs:      steady(),
			want:     want{rows: pinnedRow, bookkeeping: kv{k.Soak("api"): short.Replace(soakedFor(dA, 0, 0))}},
			also:     none(flapNow.Add(30 * time.Minute)),
		},
		"10 of 30 minutes: still nothing": {
			settings: []settingsOpt{onClock},
			obs:      steady(withAnchor(ann(k.Soak("api"), soakedFor(dA, 10, 0)))),
			want:     want{rows: pinnedRow},
			also:     none(flapNow.Add(20 * time.Minute)),
		},
		"the soak ended: the plan publishes": {
			settings: []settingsOpt{onClock},
			obs:      steady(withAnchor(ann(k.Soak("api"), soakedFor(dA, 30, 0)))),
			want:     want{rows: pinnedRow},
			also:     publishes(flapNow.Add(-30 * time.Minute)),
		},
		"published already for the record: never again": {
			settings: []settingsOpt{onClock},
			obs:      steady(withAnchor(ann(k.Soak("api"), soakedFor(dA, 90, 0), k.Published("api"), dA+" 2026-12-02T11:30:00Z"))),
			want:     want{rows: pinnedRow},
			also:     none(time.Time{}),
		},
		"published for an older digest: the record's is published": {
			settings: []settingsOpt{onClock},
			obs:      steady(withAnchor(ann(k.Soak("api"), soakedFor(dA, 90, 0), k.Published("api"), dC+" 2026-12-01T11:30:00Z"))),
			want:     want{rows: pinnedRow},
			also:     publishes(flapNow.Add(-90 * time.Minute)),
		},
		"a restart in the window starts the soak over: nothing is published": {
			settings: []settingsOpt{onClock},
			obs:      steady(healthyPods(web, "api", dA, 2, 1, true), withAnchor(ann(k.Soak("api"), soakedFor(dA, 40, 0)))),
			want:     want{rows: pinnedRow, findings: []string{"api: INFO - benign"}, bookkeeping: kv{k.Soak("api"): short.Replace(soakedFor(dA, 0, 2))}},
			also:     none(flapNow.Add(30 * time.Minute)),
		},
		"a pod not Ready stops the clock: nothing is published": {
			settings: []settingsOpt{onClock},
			obs:      steady(healthyPods(web, "api", dA, 2, 0, false), withAnchor(ann(k.Soak("api"), soakedFor(dA, 40, 0)))),
			want:     want{rows: pinnedRow, findings: []string{"api: INFO - benign"}, bookkeeping: kv{k.Soak("api"): deleted}},
			also:     none(time.Time{}),
		},
	})
}

func attestedByStaging(soak time.Duration) groupOpt {
	return func(g *config.Group) {
		g.Promotion = &config.Promotion{Soak: soak, AttestedBy: &config.AttestedBy{Name: "staging"}}
	}
}

func evidence(ev PromotionEvidence) obsOpt {
	return func(o *Observation) {
		o.Promotions = map[string]PromotionEvidence{"api": ev}
	}
}

func TestDecide_P2_AFollowerOfAnotherClusterMovesOnlyToAnAttestedDigest(t *testing.T) {
	g := group(withImage("api", on(webAPI)), attestedByStaging(15*time.Minute))
	moved, waiting, rolls, message := followerFixture(g)
	recheck := flapNow.Add(30 * time.Second)
	run(t, map[string]decideCase{
		"no attestation yet: waiting, naming the signer, and run looks again": {
			settings: []settingsOpt{onClock},
			obs:      moved(evidence(PromotionEvidence{Digest: dB, Signer: "staging", Verdict: "none found", Recheck: recheck})),
			want:     waiting,
			also: func(t *testing.T, p *Plan) {
				message("which carries no promotion attestation from staging yet")(t, p)
				if !p.WakeAt.Equal(recheck) {
					t.Errorf("WakeAt = %s, want the recheck %s", p.WakeAt, recheck)
				}
			},
		},
		"attested 5 of 15 minutes ago: waiting with the time left": {
			settings: []settingsOpt{onClock},
			obs:      moved(evidence(PromotionEvidence{Digest: dB, Signer: "staging", Attested: true, At: flapNow.Add(-5 * time.Minute)})),
			want:     waiting,
			also: func(t *testing.T, p *Plan) {
				message("staging attested docker.io/acme/api@<B> at 2026-12-02T11:55:00Z; it moves here after the soak of 15m0s, in 10m0s")(t, p)
				if want := flapNow.Add(10 * time.Minute); !p.WakeAt.Equal(want) {
					t.Errorf("WakeAt = %s, want %s", p.WakeAt, want)
				}
			},
		},
		"attested and soaked: the follower rolls": {
			settings: []settingsOpt{onClock},
			obs:      moved(evidence(PromotionEvidence{Digest: dB, Signer: "staging", Attested: true, At: flapNow.Add(-15 * time.Minute)})),
			want:     rolls,
		},
		"attestations found, none valid (forged, wrong key, another digest): unverified, the reason says why": {
			settings: []settingsOpt{onClock},
			obs: moved(evidence(PromotionEvidence{Digest: dB, Signer: "staging", Rejected: true,
				Verdict: "1 promotion attestation(s) rejected, none valid from staging: bundle referrer sha256:x: wrong-key (no key of the policy verifies it)"})),
			want: want{rows: []string{"api web/api: unverified"}, findings: []string{"api: WARN DigestUnverified needs-human"}},
			also: message("no promotion attestation of it from staging verified: 1 promotion attestation(s) rejected, none valid from staging: bundle referrer sha256:x: wrong-key"),
		},
		"an answer about another digest proves nothing (fail-closed)": {
			settings: []settingsOpt{onClock},
			obs:      moved(evidence(PromotionEvidence{Digest: dC, Signer: "staging", Attested: true, At: flapNow.Add(-time.Hour)})),
			want:     waiting,
			also:     message("whose promotion attestation from staging was not looked up"),
		},
		"a registry that cannot be read holds the follower (fail-safe)": {
			settings: []settingsOpt{onClock},
			obs:      moved(evidence(PromotionEvidence{Digest: dB, Signer: "staging", Err: errors.New("GET referrers: 503")})),
			want:     want{rows: []string{"api web/api: waiting"}, findings: []string{"api: WARN - benign"}},
			also:     message("cannot be read (GET referrers: 503)"),
		},
	})
}
