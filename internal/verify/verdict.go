package verify

import (
	"fmt"
	"strings"
)

// Format is how a signature is stored in the registry.
type Format string

const (
	// FormatBundle is a Sigstore bundle attached to the digest as an OCI
	// referrer (cosign v3), found through the referrers API or its
	// sha256-<hex> tag fallback.
	FormatBundle Format = "bundle"
	// FormatLegacy is a layer of the manifest at the tag sha256-<hex>.sig
	// (cosign before v3): a simple-signing payload and its signature.
	FormatLegacy Format = "legacy"
	// FormatNotation is a Notation signature (JWS or COSE envelope)
	// attached to the digest as an OCI referrer.
	FormatNotation Format = "notation"
)

// Reason says why a signature found did not verify the digest.
type Reason string

const (
	// WrongKey: the signature does not verify with any key of the policy
	// (or it was made with a certificate, keyless, and the policy has keys).
	WrongKey Reason = "wrong-key"
	// WrongIdentity: a keyless signature whose certificate names another
	// OIDC issuer or subject than the policy's identities.
	WrongIdentity Reason = "wrong-identity"
	// Untrusted: a keyless signature that does not chain to the trusted
	// root, or lacks the transparency log entry, timestamp or SCT it needs.
	Untrusted Reason = "untrusted"
	// OtherDigest: a valid-looking signature whose signed content names
	// another digest, e.g. copied from another image.
	OtherDigest Reason = "bound-to-another-digest"
	// NotASignature: a signed attestation that is not an image signature,
	// e.g. an SBOM; cosign v3 accepts any valid bundle, V1 does not.
	NotASignature Reason = "not-a-signature"
	// Unsupported: a signature in a form image-refresh does not verify
	// (a keyless legacy .sig: cosign v3's bundle carries the same).
	Unsupported Reason = "unsupported"
	// Malformed: the signature or its envelope cannot be read.
	Malformed Reason = "malformed"
	// BesideBundle: a legacy signature or attestation (.sig, .att) of a
	// digest that has Sigstore bundles among its referrers is not looked
	// at: then only bundles count, as with cosign verify and cosign
	// verify-attestation.
	BesideBundle Reason = "beside-a-bundle"
	// OtherPredicate: an attestation of another predicate type than the
	// one required (V5).
	OtherPredicate Reason = "other-predicate-type"
	// ConditionFailed: a signed attestation of the required type whose
	// predicate does not meet a condition of the policy (V5).
	ConditionFailed Reason = "condition-failed"
)

// FormatLegacyAttestation is a layer of the manifest at the tag
// sha256-<hex>.att (cosign before v3, or cosign attest
// --new-bundle-format=false): a DSSE envelope of an in-toto statement.
const FormatLegacyAttestation Format = "legacy-attestation"

// Attestation is what became of one attestation a policy requires (V5).
type Attestation struct {
	PredicateType string
	// Satisfied: a statement of PredicateType about the digest, signed
	// under the policy's trust, met every condition; By is it.
	Satisfied bool
	By        Signature
	// Rejected lists every statement looked at that did not count. Empty
	// with Satisfied false: none of this predicate type was found.
	Rejected []Signature
}

func (a Attestation) String() string {
	if a.Satisfied {
		return fmt.Sprintf("attestation %s: %s %s verified with %s", a.PredicateType, a.By.Format, a.By.Source, a.By.Key)
	}
	if len(a.Rejected) == 0 {
		return fmt.Sprintf("attestation %s: missing (none found)", a.PredicateType)
	}
	parts := make([]string, len(a.Rejected))
	for i, s := range a.Rejected {
		parts[i] = fmt.Sprintf("%s %s: %s (%s)", s.Format, s.Source, s.Reason, s.Detail)
	}
	return fmt.Sprintf("attestation %s: %d rejected: %s", a.PredicateType, len(a.Rejected), strings.Join(parts, "; "))
}

// Signature is one signature found for a digest, and what became of it.
type Signature struct {
	Format Format
	// Source says where it was found: "referrer sha256:…" or
	// "sha256-<hex>.sig layer 0".
	Source string
	// Key is the public key file that verified it, or "keyless ISSUER
	// SUBJECT" for a certificate; "" when rejected.
	Key string
	// Reason and Detail say why it was rejected; "" when it verified.
	Reason Reason
	Detail string
}

func (s Signature) String() string {
	if s.Reason == "" {
		return fmt.Sprintf("%s signature %s verified with %s", s.Format, s.Source, s.Key)
	}
	return fmt.Sprintf("%s signature %s: %s (%s)", s.Format, s.Source, s.Reason, s.Detail)
}

// Verdict is the outcome of verifying one digest against one policy. A
// registry that could not be read is not a verdict: Verify returns an error.
type Verdict struct {
	// Digest is "repository@sha256:…".
	Digest string
	Policy string
	// Verified: a signature bound to Digest verified with one of the
	// policy's keys; By is that signature.
	Verified bool
	By       Signature
	// Rejected lists every signature looked at that did not verify, in the
	// order found. Empty with Verified false: no signature was found.
	Rejected []Signature
	// Attestations are the policy's required attestations (V5), looked
	// up once the signature verified; Verified is false unless every one
	// is Satisfied.
	Attestations []Attestation
}

// Unsatisfied lists the predicate types of the required attestations that
// did not count (V5); nil when none did not, or when the signature itself
// did not verify (then the attestations were not looked at).
func (v Verdict) Unsatisfied() []string {
	var types []string
	for _, a := range v.Attestations {
		if !a.Satisfied {
			types = append(types, a.PredicateType)
		}
	}
	return types
}

// missing lists the required attestations not satisfied.
func (v Verdict) missing() (string, bool) {
	var parts []string
	for _, a := range v.Attestations {
		if !a.Satisfied {
			parts = append(parts, a.String())
		}
	}
	return strings.Join(parts, "; "), len(parts) > 0
}

// String is the verdict in one line for a log, an Event or a status row.
func (v Verdict) String() string {
	if a, ok := v.missing(); ok && v.By.Reason == "" && v.By.Key != "" {
		// The signature verified; an attestation is missing or failed.
		return fmt.Sprintf("%s unverified by policy %s: %s (its %s)", v.Digest, v.Policy, a, v.By)
	}
	if v.Verified {
		s := fmt.Sprintf("%s verified by policy %s: %s", v.Digest, v.Policy, v.By)
		for _, a := range v.Attestations {
			s += "; " + a.String()
		}
		return s
	}
	if len(v.Rejected) == 0 {
		return fmt.Sprintf("%s unverified by policy %s: no signature found", v.Digest, v.Policy)
	}
	parts := make([]string, len(v.Rejected))
	for i, s := range v.Rejected {
		parts[i] = s.String()
	}
	return fmt.Sprintf("%s unverified by policy %s: %d signature(s) rejected: %s",
		v.Digest, v.Policy, len(v.Rejected), strings.Join(parts, "; "))
}
