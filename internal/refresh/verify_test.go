package refresh

import (
	"testing"
)

// V1: a digest a verification policy applies to is recorded and pinned only
// once verified; an unverified one holds the image on its current pin.

func verified(image, digest string) obsOpt {
	return func(o *Observation) {
		if o.Verification == nil {
			o.Verification = map[string]Verification{}
		}
		o.Verification[image] = Verification{Policy: "release", Digest: digest, Verified: true,
			Verdict: "verified", Memo: "release/k1@" + digest}
	}
}

func unverified(image, digest, why string) obsOpt {
	return func(o *Observation) {
		if o.Verification == nil {
			o.Verification = map[string]Verification{}
		}
		o.Verification[image] = Verification{Policy: "release", Digest: digest, Verdict: why}
	}
}

func TestDecide_V1_OnlyAVerifiedDigestIsRecordedOrPinned(t *testing.T) {
	g := group(withImage("api", on(webAPI)))
	unverifiedRows := []string{"api web/api: unverified"}
	unverifiedFinding := []string{"api: WARN DigestUnverified needs-human"}
	run(t, map[string]decideCase{
		"a first observation of an unverified digest records nothing": {
			obs:  observe(g, withLatest("api", dB), withLive(webAPI, onTag), unverified("api", dB, "no signature found")),
			want: want{rows: unverifiedRows, findings: unverifiedFinding},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "no signature found")
				contains(t, "finding", p.Findings[0].Message, "verification policy release")
				contains(t, "remediation", p.Findings[0].Remediation, "sign docker.io/acme/api@"+dB)
			},
		},
		"a first observation of a verified digest is recorded": {
			obs: observe(g, withLatest("api", dB), withLive(webAPI, onTag), verified("api", dB)),
			want: want{
				bookkeeping: kv{k.Record("api"): "<B>"},
				findings:    []string{"api: INFO - benign"},
				rows:        []string{"api web/api: first-observed"},
			},
		},
		"an unverified new digest holds the image on its pin: nothing is written": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dB), withLive(webAPI, pinned(dA)),
				unverified("api", dB, "1 signature(s) rejected: wrong-key")),
			want: want{rows: unverifiedRows, findings: unverifiedFinding},
			also: func(t *testing.T, p *Plan) {
				contains(t, "row", p.Rows[0].Message, "held on the recorded digest "+dA)
			},
		},
		"a verdict about another digest does not verify this one (fail-closed)": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dB), withLive(webAPI, pinned(dA)),
				verified("api", dC)),
			want: want{rows: unverifiedRows, findings: unverifiedFinding},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "not looked up")
			},
		},
		"an unverified digest does not stop a revert re-pin to the recorded one": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dB), withLive(webAPI, onTag),
				unverified("api", dB, "no signature found")),
			want: want{
				rows:     []string{"api web/api: drifted"},
				findings: unverifiedFinding,
				repin:    repinsWebAPI("<A>"),
			},
		},
		"a signed new digest lacking a required attestation holds, the remediation naming it (V5)": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dB), withLive(webAPI, pinned(dA)),
				func(o *Observation) {
					unverified("api", dB, "attestation https://cosign.sigstore.dev/attestation/vuln/v1: 1 rejected: condition-failed")(o)
					v := o.Verification["api"]
					v.Attestations = "https://cosign.sigstore.dev/attestation/vuln/v1"
					o.Verification["api"] = v
				}),
			want: want{rows: unverifiedRows, findings: unverifiedFinding},
			also: func(t *testing.T, p *Plan) {
				contains(t, "finding", p.Findings[0].Message, "condition-failed")
				contains(t, "remediation", p.Findings[0].Remediation, "attest docker.io/acme/api@"+dB+" with https://cosign.sigstore.dev/attestation/vuln/v1")
			},
		},
		"a verified new digest rolls, and the verification is kept on the anchor until the record moves": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withLatest("api", dB), withLive(webAPI, pinned(dA)), verified("api", dB)),
			want: want{
				bookkeeping: kv{k.Verified("api"): "release/k1@<B>"},
				rows:        []string{"api web/api: drifted"},
				repin:       rollsWebAPI("<A>", "<B>"),
			},
		},
		"once the record caught up, the kept verification goes": {
			obs: observe(g, withAnchor(pinnedBefore("api", dB)), withAnchor(ann(k.Verified("api"), "release/k1@"+dB)),
				withLatest("api", dB), withLive(webAPI, pinned(dB))),
			want: want{bookkeeping: kv{k.Verified("api"): deleted}, rows: []string{"api web/api: pinned"}},
		},
		"an unverified new digest neither re-arms a locked-out group nor is quarantined by it (R23)": {
			obs: observe(g, withAnchor(pinnedBefore("api", dA)), withAnchor(ann(k.Flap(), "3", k.Attempt(), "3", k.LockedOn("api"), dC)),
				withLatest("api", dB), withLive(webAPI, pinned(dA)), unverified("api", dB, "no signature found")),
			want: want{rows: []string{"api web/api: unverified"}, lockedOut: true,
				findings: []string{"api: WARN DigestUnverified needs-human", "group: WARN RefreshLockedOut needs-human"}},
		},
	})
}
