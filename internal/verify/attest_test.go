package verify

import (
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/test/support/testsign"
)

// V5: attestations a policy requires, made with the tests' own signer in
// cosign's formats (testsign: a bundle referrer as cosign v3 attest
// attaches it, a DSSE envelope layer at sha256-<hex>.att as cosign attest
// --new-bundle-format=false pushes it) and read from a real registry.

const (
	slsa = testsign.SLSAProvenance1
	vuln = testsign.VulnPredicate
)

var (
	fromOurRepo = map[string]any{"buildDefinition": map[string]any{"externalParameters": map[string]any{
		"workflow": map[string]any{"repository": "https://github.com/acme/api"}}}}
	fromElsewhere = map[string]any{"buildDefinition": map[string]any{"externalParameters": map[string]any{
		"workflow": map[string]any{"repository": "https://github.com/mallory/api"}}}}
	scanClean    = map[string]any{"scanner": map[string]any{"result": map[string]any{"summary": map[string]any{"critical": 0}}}}
	scanCritical = map[string]any{"scanner": map[string]any{"result": map[string]any{"summary": map[string]any{"critical": 2}}}}
)

// isMissing is wantAttestation's reason for "none of this type found".
const isMissing Reason = "(missing)"

const (
	fromOurRepoCondition = `predicate.buildDefinition.externalParameters.workflow.repository == "https://github.com/acme/api"`
	noCriticalCondition  = `predicate.scanner.result.summary.critical == 0`
)

// attestPolicy is policyOf(signers) requiring SLSA provenance from our
// repository and a vulnerability scan without criticals.
func attestPolicy(signers ...signer) *config.VerificationPolicy {
	p := policyOf(signers...)
	p.Attestations = []config.AttestationPolicy{
		{PredicateType: slsa, Conditions: []string{fromOurRepoCondition}},
		{PredicateType: vuln, Conditions: []string{noCriticalCondition}},
	}
	return p
}

// wantAttestation checks the verdict's attestation of predicateType: its
// format and key when satisfied, else a rejection of reason whose detail
// holds detail (isMissing: none found; "" and "": satisfied). The signature must have
// verified first: the attestations were looked at.
func wantAttestation(t *testing.T, v Verdict, err error, predicateType string, format Format, reason Reason, detail string) {
	t.Helper()
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if v.By.Key == "" {
		t.Fatalf("the signature did not verify, so no attestation was looked at: %s", v)
	}
	for _, a := range v.Attestations {
		if a.PredicateType != predicateType {
			continue
		}
		switch {
		case reason == "" && detail == "":
			if !a.Satisfied || a.By.Format != format {
				t.Fatalf("want %s satisfied by a %s attestation, got %s", predicateType, format, v)
			}
			return
		case a.Satisfied:
			t.Fatalf("want %s not satisfied, got %s", predicateType, v)
		}
		if v.Verified {
			t.Fatalf("a digest lacking %s verified: %s", predicateType, v)
		}
		if reason == isMissing {
			if len(a.Rejected) != 0 || !strings.Contains(v.String(), predicateType+": missing") {
				t.Fatalf("want %s missing, got %s", predicateType, v)
			}
			return
		}
		for _, r := range a.Rejected {
			if r.Format == format && r.Reason == reason && strings.Contains(r.Detail, detail) {
				// The one line a log, an Event and status show names
				// the predicate type and why.
				if line := v.String(); !strings.Contains(line, "unverified") || !strings.Contains(line, predicateType) || !strings.Contains(line, detail) {
					t.Errorf("the verdict's line does not name %s and %q: %s", predicateType, detail, line)
				}
				return
			}
		}
		t.Fatalf("want a %s attestation %s rejected as %s (%q), got %s", format, predicateType, reason, detail, v)
	}
	t.Fatalf("no attestation %s in the verdict: %s", predicateType, v)
}

func TestVerify_V5_SignedAttestationsMeetingTheConditionsVerifyTheDigest(t *testing.T) {
	modes(t, func(t *testing.T, f *fixture) {
		key := newSigner(t, "cosign.pub")
		key.SignBundle(t, f.digest, f.opts...)
		key.Attest(t, f.digest, slsa, fromOurRepo, f.opts...)
		key.Attest(t, f.digest, vuln, scanClean, f.opts...)
		v, err := f.verify(attestPolicy(key))
		wantVerified(t, v, err, FormatBundle, "cosign.pub")
		wantAttestation(t, v, err, slsa, FormatBundle, "", "")
		wantAttestation(t, v, err, vuln, FormatBundle, "", "")
		if !strings.Contains(v.String(), "attestation "+vuln) {
			t.Errorf("the verdict's line does not name the attestations: %s", v)
		}
	})
}

func TestVerify_V5_LegacyAttestationsOfADigestWithoutBundlesVerify(t *testing.T) {
	f := newFixture(t, true)
	key := newSigner(t, "cosign.pub")
	f.attachLegacy(f.digest, key, legacyPayload(f.digest))
	key.AttachLegacyAttestation(t, f.digest, f.opts,
		testsign.AttestationStatement(f.digest, slsa, fromOurRepo),
		testsign.AttestationStatement(f.digest, vuln, scanClean))
	v, err := f.verify(attestPolicy(key))
	wantVerified(t, v, err, FormatLegacy, "cosign.pub")
	wantAttestation(t, v, err, slsa, FormatLegacyAttestation, "", "")
	wantAttestation(t, v, err, vuln, FormatLegacyAttestation, "", "")
}

func TestVerify_V5_ASignedDigestWithoutTheAttestationIsUnverifiedNamingIt(t *testing.T) {
	modes(t, func(t *testing.T, f *fixture) {
		key := newSigner(t, "cosign.pub")
		key.SignBundle(t, f.digest, f.opts...)
		key.Attest(t, f.digest, slsa, fromOurRepo, f.opts...)
		v, err := f.verify(attestPolicy(key))
		wantAttestation(t, v, err, slsa, FormatBundle, "", "")
		wantAttestation(t, v, err, vuln, "", isMissing, "")
		// Without a policy requiring attestations, the same digest verifies:
		// the attestation is what held it.
		v, err = f.verify(policyOf(key))
		wantVerified(t, v, err, FormatBundle, "cosign.pub")
	})
}

func TestVerify_V5_AnAttestationFailingAConditionIsRejectedNamingTheCondition(t *testing.T) {
	t.Run("bundle", func(t *testing.T) {
		f := newFixture(t, true)
		key := newSigner(t, "cosign.pub")
		key.SignBundle(t, f.digest, f.opts...)
		key.Attest(t, f.digest, slsa, fromElsewhere, f.opts...)
		key.Attest(t, f.digest, vuln, scanCritical, f.opts...)
		v, err := f.verify(attestPolicy(key))
		wantAttestation(t, v, err, slsa, FormatBundle, ConditionFailed, `condition "`+fromOurRepoCondition+`" is false`)
		wantAttestation(t, v, err, vuln, FormatBundle, ConditionFailed, `condition "`+noCriticalCondition+`" is false`)
	})
	t.Run("legacy", func(t *testing.T) {
		f := newFixture(t, true)
		key := newSigner(t, "cosign.pub")
		f.attachLegacy(f.digest, key, legacyPayload(f.digest))
		key.AttachLegacyAttestation(t, f.digest, f.opts,
			testsign.AttestationStatement(f.digest, slsa, fromOurRepo),
			testsign.AttestationStatement(f.digest, vuln, scanCritical))
		v, err := f.verify(attestPolicy(key))
		wantAttestation(t, v, err, slsa, FormatLegacyAttestation, "", "")
		wantAttestation(t, v, err, vuln, FormatLegacyAttestation, ConditionFailed, noCriticalCondition)
	})
	t.Run("a field the predicate lacks", func(t *testing.T) {
		f := newFixture(t, true)
		key := newSigner(t, "cosign.pub")
		key.SignBundle(t, f.digest, f.opts...)
		key.Attest(t, f.digest, vuln, map[string]any{"scanner": map[string]any{"uri": "trivy"}}, f.opts...)
		p := policyOf(key)
		p.Attestations = []config.AttestationPolicy{{PredicateType: vuln, Conditions: []string{noCriticalCondition}}}
		v, err := f.verify(p)
		wantAttestation(t, v, err, vuln, FormatBundle, ConditionFailed, "could not be evaluated: no such key: result")
	})
}

func TestVerify_V5_AnAttestationAboutAnotherDigestOrCopiedFromAnotherImageIsRejected(t *testing.T) {
	modes(t, func(t *testing.T, f *fixture) {
		key := newSigner(t, "cosign.pub")
		key.SignBundle(t, f.digest, f.opts...)
		other := f.pushImage("other")
		// A statement whose subject is another digest, signed and
		// attached here.
		f.attachBundle(f.digest, key.StatementBundle(t, testsign.AttestationStatement(other, slsa, fromOurRepo)), slsa)
		// A valid attestation of another image, its bundle copied onto
		// this digest.
		key.Attest(t, other, vuln, scanClean, f.opts...)
		f.attachBundle(f.digest, key.StatementBundle(t, testsign.AttestationStatement(other, vuln, scanClean)), vuln)
		v, err := f.verify(attestPolicy(key))
		wantAttestation(t, v, err, slsa, FormatBundle, OtherDigest, other.DigestStr())
		wantAttestation(t, v, err, vuln, FormatBundle, OtherDigest, other.DigestStr())
	})
	t.Run("legacy", func(t *testing.T) {
		f := newFixture(t, true)
		key := newSigner(t, "cosign.pub")
		f.attachLegacy(f.digest, key, legacyPayload(f.digest))
		other := f.pushImage("other")
		key.AttachLegacyAttestation(t, f.digest, f.opts, testsign.AttestationStatement(other, vuln, scanClean))
		p := policyOf(key)
		p.Attestations = []config.AttestationPolicy{{PredicateType: vuln}}
		v, err := f.verify(p)
		wantAttestation(t, v, err, vuln, FormatLegacyAttestation, OtherDigest, other.DigestStr())
	})
}

func TestVerify_V5_AnAttestationSignedWithAnotherKeyIsRejectedNamingBothKeys(t *testing.T) {
	key, stranger := newSigner(t, "cosign.pub"), newSigner(t, "stranger.pub")
	t.Run("bundle", func(t *testing.T) {
		f := newFixture(t, true)
		key.SignBundle(t, f.digest, f.opts...)
		stranger.Attest(t, f.digest, vuln, scanClean, f.opts...)
		p := policyOf(key)
		p.Attestations = []config.AttestationPolicy{{PredicateType: vuln, Conditions: []string{noCriticalCondition}}}
		v, err := f.verify(p)
		wantAttestation(t, v, err, vuln, FormatBundle, WrongKey, "signed by the key with hint "+stranger.KeyHint())
		wantAttestation(t, v, err, vuln, FormatBundle, WrongKey, "tried cosign.pub (key hint "+key.KeyHint()+")")
	})
	t.Run("legacy", func(t *testing.T) {
		f := newFixture(t, true)
		f.attachLegacy(f.digest, key, legacyPayload(f.digest))
		stranger.AttachLegacyAttestation(t, f.digest, f.opts, testsign.AttestationStatement(f.digest, vuln, scanClean))
		p := policyOf(key)
		p.Attestations = []config.AttestationPolicy{{PredicateType: vuln}}
		v, err := f.verify(p)
		wantAttestation(t, v, err, vuln, FormatLegacyAttestation, WrongKey, "tried cosign.pub (key hint "+key.KeyHint()+")")
	})
}

func TestVerify_V1_AWrongKeyReasonNamesTheKeyThatSignedAndTheKeysTried(t *testing.T) {
	f := newFixture(t, true)
	key, old, stranger := newSigner(t, "cosign.pub"), newSigner(t, "old.pub"), newSigner(t, "stranger.pub")
	stranger.SignBundle(t, f.digest, f.opts...)
	v, err := f.verify(policyOf(key, old))
	wantRejected(t, v, err, FormatBundle, WrongKey, "it was signed by the key with hint "+stranger.KeyHint()+"; tried cosign.pub (key hint "+key.KeyHint()+"), old.pub (key hint "+old.KeyHint()+")")
}

func TestVerify_V5_AStatementWithoutAPredicateIsRejected(t *testing.T) {
	f := newFixture(t, true)
	key := newSigner(t, "cosign.pub")
	key.SignBundle(t, f.digest, f.opts...)
	key.Attest(t, f.digest, vuln, nil, f.opts...)
	p := policyOf(key)
	p.Attestations = []config.AttestationPolicy{{PredicateType: vuln}}
	v, err := f.verify(p)
	wantAttestation(t, v, err, vuln, FormatBundle, Malformed, "no predicate")
}

func TestVerify_V5_OnlyTheRequiredPredicateTypeCountsAndASignatureIsNoAttestation(t *testing.T) {
	f := newFixture(t, true)
	key := newSigner(t, "cosign.pub")
	key.SignBundle(t, f.digest, f.opts...)
	// An SBOM, and a vuln statement attached without the predicate
	// annotation (read, then set aside by its own predicate type).
	key.Attest(t, f.digest, spdxPredicate, map[string]any{"spdxVersion": "SPDX-2.3"}, f.opts...)
	f.attachBundle(f.digest, key.StatementBundle(t, testsign.AttestationStatement(f.digest, spdxPredicate, map[string]any{})), "")
	p := policyOf(key)
	p.Attestations = []config.AttestationPolicy{{PredicateType: vuln}}
	v, err := f.verify(p)
	wantAttestation(t, v, err, vuln, "", isMissing, "")
	// A policy requiring the SBOM's type, with no condition, is met.
	p.Attestations = []config.AttestationPolicy{{PredicateType: spdxPredicate}}
	v, err = f.verify(p)
	wantAttestation(t, v, err, spdxPredicate, FormatBundle, "", "")
	if !v.Verified {
		t.Fatalf("want verified, got %s", v)
	}
}

func TestVerify_V5_ALegacyAttestationBesideBundlesIsNotLookedAt(t *testing.T) {
	f := newFixture(t, true)
	key := newSigner(t, "cosign.pub")
	key.SignBundle(t, f.digest, f.opts...)
	key.AttachLegacyAttestation(t, f.digest, f.opts, testsign.AttestationStatement(f.digest, vuln, scanClean))
	p := policyOf(key)
	p.Attestations = []config.AttestationPolicy{{PredicateType: vuln, Conditions: []string{noCriticalCondition}}}
	v, err := f.verify(p)
	wantAttestation(t, v, err, vuln, FormatLegacyAttestation, BesideBundle, "only bundles count")
	// The same attestation as a bundle counts.
	key.Attest(t, f.digest, vuln, scanClean, f.opts...)
	v, err = f.verify(p)
	wantAttestation(t, v, err, vuln, FormatBundle, "", "")
}

func TestVerify_V5_AKeylessAttestationOfThePolicysIdentityVerifies(t *testing.T) {
	f := newFixture(t, true)
	s := testsign.NewSigstore(t)
	const release = "release@example.com"
	s.SignKeyless(t, f.digest, ciIssuer, release, f.opts...)
	s.AttestKeyless(t, f.digest, vuln, scanClean, ciIssuer, release, f.opts...)
	p := keylessPolicy(t, s, config.KeylessIdentity{Issuer: ciIssuer, Subject: release})
	p.Attestations = []config.AttestationPolicy{{PredicateType: vuln, Conditions: []string{noCriticalCondition}}}
	v, err := f.verify(p)
	wantAttestation(t, v, err, vuln, FormatBundle, "", "")
	if !v.Verified || !strings.Contains(v.Attestations[0].By.Key, "keyless") {
		t.Fatalf("want verified by a keyless attestation, got %s", v)
	}
	// Another identity's attestation does not count.
	g := newFixture(t, true)
	s.SignKeyless(t, g.digest, ciIssuer, release, g.opts...)
	s.AttestKeyless(t, g.digest, vuln, scanClean, ciIssuer, "intruder@example.com", g.opts...)
	v, err = g.verify(p)
	wantAttestation(t, v, err, vuln, FormatBundle, WrongIdentity, "")
}

func TestFingerprint_V5_ConditionsArePartOfThePolicysFingerprint(t *testing.T) {
	key := newSigner(t, "cosign.pub")
	plain, strict, other := policyOf(key), attestPolicy(key), attestPolicy(key)
	other.Attestations[1].Conditions = []string{"predicate.scanner.result.summary.critical <= 1"}
	seen := map[string]string{}
	for name, p := range map[string]*config.VerificationPolicy{"no attestations": plain, "critical == 0": strict, "critical <= 1": other} {
		fp := p.Fingerprint()
		if prev, dup := seen[fp]; dup {
			t.Errorf("%s and %s share the fingerprint %s: a verdict under one would count under the other", name, prev, fp)
		}
		seen[fp] = name
	}
	if attestPolicy(key).Fingerprint() != strict.Fingerprint() {
		t.Error("the same policy has two fingerprints")
	}
}
