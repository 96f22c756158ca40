package verify

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	sigdsse "github.com/sigstore/sigstore/pkg/signature/dsse"

	"github.com/image-refresh/image-refresh/internal/config"
)

// V5: the attestations a verification policy requires. Each is a DSSE
// in-toto statement of a predicate type about the digest, signed under the
// policy's cosign trust (the keys and keyless identities of V1), whose
// predicate meets the policy's CEL conditions. They are found where cosign
// writes them: Sigstore bundles among the digest's referrers (cosign v3,
// cosign attest), or, for a digest without bundles, the layers of the
// manifest at sha256-<hex>.att (cosign before v3, or
// --new-bundle-format=false).

const (
	// DSSEMediaType is the media type of a legacy .att layer: a DSSE
	// envelope (JSON).
	DSSEMediaType = "application/vnd.dsse.envelope.v1+json"
	// legacyPredicateAnnotation, on a legacy .att layer, names the
	// predicate type of the statement inside (only trusted to skip).
	legacyPredicateAnnotation = "predicateType"
	// celCostLimit bounds one condition's evaluation: a predicate is at
	// most a MiB of JSON, and a condition is a comparison or a few
	// macros over it.
	celCostLimit = 10_000_000
)

// requirement is one attestation of the policy, its conditions compiled.
type requirement struct {
	predicateType string
	conditions    []condition
}

type condition struct {
	expr    string
	program cel.Program
}

// celEnv is the CEL environment of the conditions: one variable,
// predicate, the statement's predicate as JSON (objects are maps, numbers
// doubles; CEL compares 0 and 0.0 as equal).
var celEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(cel.Variable("predicate", cel.DynType))
})

// compileCondition compiles one condition; the error names where in expr
// it is wrong (line and column, 1-based, as CEL reports them).
func compileCondition(expr string) (cel.Program, error) {
	env, err := celEnv()
	if err != nil {
		return nil, err
	}
	ast, iss := env.Compile(expr)
	if iss != nil && iss.Err() != nil {
		var msgs []string
		for _, e := range iss.Errors() {
			where := fmt.Sprintf("column %d", e.Location.Column()+1)
			if strings.Contains(expr, "\n") {
				where = fmt.Sprintf("line %d, column %d", e.Location.Line(), e.Location.Column()+1)
			}
			msgs = append(msgs, where+": "+e.Message)
		}
		return nil, fmt.Errorf("%s", strings.Join(msgs, "; "))
	}
	if t := ast.OutputType(); !t.IsExactType(cel.BoolType) && !t.IsExactType(cel.DynType) {
		return nil, fmt.Errorf("column 1: the condition is of type %s; it must be a bool (true: met)", t)
	}
	prg, err := env.Program(ast, cel.CostLimit(celCostLimit))
	if err != nil {
		return nil, err
	}
	return prg, nil
}

// programs caches compiled conditions by their text: a policy's
// conditions compile once per process, not once per digest (a cel.Program
// is safe for concurrent use).
var programs sync.Map // string → cel.Program

// requirements compiles the policy's attestations. CheckTrust compiled
// them at load, so an error here is a policy that did not go through
// config.Load.
func requirements(p *config.VerificationPolicy) ([]requirement, error) {
	var reqs []requirement
	for k, a := range p.Attestations {
		r := requirement{predicateType: a.PredicateType}
		for c, expr := range a.Conditions {
			var prg cel.Program
			if cached, ok := programs.Load(expr); ok {
				prg = cached.(cel.Program)
			} else {
				var err error
				if prg, err = compileCondition(expr); err != nil {
					return nil, fmt.Errorf("verification policy %s: attestations[%d].conditions[%d]: %w", p.Name, k, c, err)
				}
				programs.Store(expr, prg)
			}
			r.conditions = append(r.conditions, condition{expr: expr, program: prg})
		}
		reqs = append(reqs, r)
	}
	return reqs, nil
}

// checkAttestations is CheckTrust's part for V5: every condition compiles.
func checkAttestations(i int, p *config.VerificationPolicy, report func(named, plain, msg string)) {
	for k, a := range p.Attestations {
		for c, expr := range a.Conditions {
			if strings.TrimSpace(expr) == "" {
				continue // reported by validation
			}
			if _, err := compileCondition(expr); err != nil {
				named, plain := config.PolicyPath(i, p.Name, fmt.Sprintf("attestations[%d].conditions[%d]", k, c))
				report(named, plain, fmt.Sprintf("not a valid CEL condition over predicate (%s): %v", a.PredicateType, err))
			}
		}
	}
}

// predicateInput is a statement's predicate as the conditions read it.
// A statement without one (absent or null) has nothing to check: a
// rejection.
func predicateInput(st *statement) (any, *rejection) {
	raw := bytes.TrimSpace(st.Predicate)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, reject(Malformed, "its statement has no predicate")
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, reject(Malformed, "its predicate does not parse: %v", err)
	}
	return v, nil
}

// evaluate runs the requirement's conditions over predicate, in order; the
// rejection names the first one not met.
func (r requirement) evaluate(predicate any) *rejection {
	for _, c := range r.conditions {
		out, _, err := c.program.Eval(map[string]any{"predicate": predicate})
		if err != nil {
			return reject(ConditionFailed, "condition \"%s\" could not be evaluated: %v", c.expr, err)
		}
		ok, isBool := out.Value().(bool)
		switch {
		case !isBool:
			return reject(ConditionFailed, "condition \"%s\" gives %v, not a bool", c.expr, out.Value())
		case !ok:
			return reject(ConditionFailed, "condition \"%s\" is false", c.expr)
		}
	}
	return nil
}

// checkStatement says whether payload is an in-toto statement of
// r.predicateType about the lookup's digest, and returns its predicate.
func (l *lookup) checkStatement(payload []byte, r requirement) (any, *rejection) {
	return attestationPredicate(payload, l.want, r.predicateType)
}

// attestationPredicate reads payload as an in-toto statement of
// predicateType about want and returns its predicate as the conditions
// read it. It never trusts the statement: its signature is checked by the
// caller.
func attestationPredicate(payload []byte, want v1.Hash, predicateType string) (any, *rejection) {
	st, rej := decodeStatement(payload)
	if rej != nil {
		return nil, rej
	}
	if st.PredicateType != predicateType {
		return nil, reject(OtherPredicate, "a statement of predicate type %q", st.PredicateType)
	}
	if rej := st.about(want); rej != nil {
		return nil, rej
	}
	return predicateInput(st)
}

// attestation looks for one required attestation: among the bundles when
// the digest has any (then only they count, as with cosign
// verify-attestation), else in the legacy .att manifest.
func (l *lookup) attestation(r requirement) (Attestation, error) {
	a := Attestation{PredicateType: r.predicateType}
	var err error
	if l.sawBundle {
		err = l.bundleAttestations(r, &a)
	} else {
		err = l.legacyAttestations(r, &a)
	}
	return a, err
}

func (l *lookup) bundleAttestations(r requirement, a *Attestation) error {
	n := 0
	for _, d := range l.index.Manifests {
		if !bundleCandidate(d) {
			continue
		}
		source := "referrer " + d.Digest.String()
		if pt, ok := d.Annotations[BundlePredicateAnnotation]; ok && pt != r.predicateType {
			continue // another attestation, or the signature (by its annotation)
		}
		if n++; n > maxCandidates {
			a.Rejected = append(a.Rejected, Signature{Format: FormatBundle, Source: source, Reason: Malformed,
				Detail: fmt.Sprintf("not read: more than %d bundles are attached", maxCandidates)})
			return nil
		}
		data, rej, err := l.bundleBlob(d)
		if err != nil {
			return err
		}
		if data == nil && rej == nil {
			continue // not a bundle after all
		}
		var signer string
		if rej == nil {
			signer, rej = l.checkAttestationBundle(data, r)
		}
		if rej != nil {
			if rej.reason == OtherPredicate {
				continue // unannotated, of another type: not this requirement's
			}
			a.Rejected = append(a.Rejected, Signature{Format: FormatBundle, Source: source, Reason: rej.reason, Detail: rej.detail})
			continue
		}
		a.Satisfied, a.By = true, Signature{Format: FormatBundle, Source: source, Key: signer}
		return nil
	}
	return nil
}

// checkAttestationBundle verifies one bundle as an attestation of r:
// the statement first (type, subject), then the signature under the
// policy's trust (sigstore-go checks the DSSE signature and that the
// statement's subject is the digest), then the conditions.
func (l *lookup) checkAttestationBundle(data []byte, r requirement) (string, *rejection) {
	b, rej := decodeBundle(data)
	if rej != nil {
		return "", rej
	}
	env := b.GetDsseEnvelope()
	if env == nil {
		return "", reject(OtherPredicate, "a message signature, not an attestation")
	}
	if env.GetPayloadType() != InTotoPayloadType {
		return "", reject(Malformed, "its DSSE payload is %q, not an in-toto statement", env.GetPayloadType())
	}
	predicate, rej := l.checkStatement(env.GetPayload(), r)
	if rej != nil {
		return "", rej
	}
	signer, rej := l.bundleTrust(b)
	if rej != nil {
		return "", rej
	}
	l.predicate = predicate
	return signer, r.evaluate(predicate)
}

// legacyAttestations checks the layers of the manifest at
// sha256-<hex>.att.
func (l *lookup) legacyAttestations(r requirement, a *Attestation) error {
	tag := l.ref.Context().Tag(strings.Replace(l.ref.DigestStr(), ":", "-", 1) + ".att")
	if !l.attRead {
		// Read once for every requirement of the lookup.
		l.attRead = true
		img, err := remote.Image(tag, l.opts...)
		switch {
		case err == nil:
			l.att = img
		case !notFound(err):
			return fmt.Errorf("read the legacy attestations %s: %w", tag, err)
		}
	}
	img := l.att
	if img == nil {
		return nil // no legacy attestation
	}
	m, err := img.Manifest()
	if err != nil {
		a.Rejected = append(a.Rejected, Signature{Format: FormatLegacyAttestation, Source: tag.TagStr(), Reason: Malformed,
			Detail: fmt.Sprintf("its manifest does not parse: %v", err)})
		return nil
	}
	for i, layer := range m.Layers {
		source := fmt.Sprintf("%s layer %d", tag.TagStr(), i)
		rejected := func(rej *rejection) {
			a.Rejected = append(a.Rejected, Signature{Format: FormatLegacyAttestation, Source: source, Reason: rej.reason, Detail: rej.detail})
		}
		if i >= maxCandidates {
			rejected(reject(Malformed, "not read: more than %d attestations", maxCandidates))
			return nil
		}
		if pt, ok := layer.Annotations[legacyPredicateAnnotation]; ok && pt != r.predicateType {
			continue // another attestation (by its annotation)
		}
		if layer.MediaType != DSSEMediaType {
			rejected(reject(Malformed, "a layer of media type %q, not a DSSE envelope", layer.MediaType))
			continue
		}
		if layer.Annotations[legacyCertificateAnnotation] != "" {
			rejected(reject(Unsupported, "a keyless legacy attestation (certificate in %s): attest with cosign v3, which attaches a bundle", legacyCertificateAnnotation))
			continue
		}
		data, rej, err := readBlob(img, layer)
		if err != nil {
			return fmt.Errorf("read the legacy attestation %s: %w", source, err)
		}
		var signer string
		if rej == nil {
			signer, rej = l.checkLegacyAttestation(data, r)
		}
		if rej != nil {
			if rej.reason == OtherPredicate {
				continue
			}
			rejected(rej)
			continue
		}
		a.Satisfied, a.By = true, Signature{Format: FormatLegacyAttestation, Source: source, Key: signer}
		return nil
	}
	return nil
}

// checkLegacyAttestation verifies a DSSE envelope (a legacy .att layer) as
// an attestation of r: the statement, then the envelope's signature with
// the policy's keys (sigstore's DSSE verifier, over the pre-authentication
// encoding of the payload), then the conditions.
func (l *lookup) checkLegacyAttestation(data []byte, r requirement) (string, *rejection) {
	var env dsse.Envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return "", reject(Malformed, "not a DSSE envelope: %v", err)
	}
	if env.PayloadType != InTotoPayloadType {
		return "", reject(Malformed, "its DSSE payload is %q, not an in-toto statement", env.PayloadType)
	}
	payload, err := env.DecodeB64Payload()
	if err != nil {
		return "", reject(Malformed, "its DSSE payload is not base64: %v", err)
	}
	predicate, rej := l.checkStatement(payload, r)
	if rej != nil {
		return "", rej
	}
	if len(l.keys) == 0 {
		return "", reject(WrongKey, "it is signed with a key, and the policy trusts keyless identities only")
	}
	for _, k := range l.keys {
		v := sigdsse.WrapVerifier(k.legacy, sigdsse.WithExpectedPayloadType(InTotoPayloadType))
		if v.VerifySignature(bytes.NewReader(data), nil) == nil {
			l.predicate = predicate
			return k.file, r.evaluate(predicate)
		}
	}
	var ids []string
	for _, s := range env.Signatures {
		if s.KeyID != "" {
			ids = append(ids, s.KeyID)
		}
	}
	signedBy := "its envelope names no key id"
	if len(ids) > 0 {
		signedBy = "its envelope names the key id " + strings.Join(ids, ", ")
	}
	return "", reject(WrongKey, "no key of the policy verifies its signature (%s; tried %s)", signedBy, l.keyNames())
}
