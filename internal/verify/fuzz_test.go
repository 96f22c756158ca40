package verify

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/image-refresh/image-refresh/test/support/testsign"
)

var fuzzDigest = name.MustParseReference("registry.example.com/acme/api@sha256:abababababababababababababababababababababababababababababababab").(name.Digest)

var fuzzReasons = map[Reason]bool{WrongKey: true, OtherDigest: true, NotASignature: true, Malformed: true}

// FuzzParseBundle checks that a bundle from the registry, whatever it
// holds, is either accepted as an image signature bound to the digest or
// rejected with one of the reasons, and never panics (V1).
func FuzzParseBundle(f *testing.F) {
	key := newSigner(f, "cosign.pub")
	other := fuzzDigest.Context().Digest("sha256:" + strings.Repeat("cd", 32))
	f.Add(key.dsseBundle(f, fuzzDigest, SignPredicateType))
	f.Add(key.dsseBundle(f, fuzzDigest, spdxPredicate))
	f.Add(key.dsseBundle(f, other, SignPredicateType))
	f.Add(key.messageBundle(f, []byte("a manifest")))
	f.Add([]byte(`{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json"}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	want, err := v1.NewHash(fuzzDigest.DigestStr())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b, r := parseBundle(data, want)
		if (b == nil) == (r == nil) {
			t.Fatalf("want exactly one of a bundle and a rejection, got %v and %+v", b, r)
		}
		if r != nil {
			if !fuzzReasons[r.reason] || r.detail == "" {
				t.Fatalf("rejection without a known reason and a detail: %+v", r)
			}
			return
		}
		// Accepted: it must be bound to the digest, by its own content.
		if env := b.GetDsseEnvelope(); env != nil {
			var st statement
			if err := json.Unmarshal(env.GetPayload(), &st); err != nil || st.PredicateType != SignPredicateType {
				t.Fatalf("accepted a DSSE bundle that is not a cosign signature statement: %s", env.GetPayload())
			}
			bound := false
			for _, s := range st.Subject {
				bound = bound || strings.EqualFold(s.Digest["sha256"], want.Hex)
			}
			if !bound {
				t.Fatalf("accepted a statement about another digest: %s", env.GetPayload())
			}
			return
		}
		md := b.GetMessageSignature().GetMessageDigest()
		if got := messageDigest(md.GetAlgorithm(), md.GetDigest()); got != want.String() {
			t.Fatalf("accepted a message signature over %s", got)
		}
	})
}

// FuzzParseSimpleSigning checks that a legacy payload is accepted only when
// it is a cosign image signature naming the digest (V1), and never panics.
func FuzzParseSimpleSigning(f *testing.F) {
	other := fuzzDigest.Context().Digest("sha256:" + strings.Repeat("cd", 32))
	f.Add(legacyPayload(fuzzDigest))
	f.Add(legacyPayload(other))
	f.Add([]byte(`{"critical":{"image":{"docker-manifest-digest":"` + fuzzDigest.DigestStr() + `"},"type":"atomic container signature"}}`))
	f.Add([]byte(`{"critical":{"type":"cosign container image signature"}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"critical":{}} {"extra":1}`))
	want, err := v1.NewHash(fuzzDigest.DigestStr())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		r := parseSimpleSigning(payload, want)
		if r != nil {
			if !fuzzReasons[r.reason] || r.detail == "" {
				t.Fatalf("rejection without a known reason and a detail: %+v", r)
			}
			return
		}
		var p simpleSigning
		if err := json.Unmarshal(payload, &p); err != nil {
			t.Fatalf("accepted a payload that does not parse: %v", err)
		}
		if p.Critical.Type != SimpleSigningType || p.Critical.Image.DockerManifestDigest != want.String() {
			t.Fatalf("accepted a payload that is not a signature of %s: %s", want, payload)
		}
	})
}

// FuzzAttestationStatement checks that a statement from the registry,
// whatever it holds, is either read as one of the required predicate type
// about the digest, its predicate the CEL input, or rejected with a
// reason; and that the conditions over whatever predicate it holds give a
// verdict, never a panic (V5).
func FuzzAttestationStatement(f *testing.F) {
	const vulnType = "https://cosign.sigstore.dev/attestation/vuln/v1"
	other := fuzzDigest.Context().Digest("sha256:" + strings.Repeat("cd", 32))
	f.Add(testsign.AttestationStatement(fuzzDigest, vulnType, map[string]any{"scanner": map[string]any{"result": map[string]any{"summary": map[string]any{"critical": 0}}}}))
	f.Add(testsign.AttestationStatement(fuzzDigest, vulnType, map[string]any{"scanner": map[string]any{"result": []any{1, "x", nil}}}))
	f.Add(testsign.AttestationStatement(fuzzDigest, vulnType, nil))
	f.Add(testsign.AttestationStatement(fuzzDigest, vulnType, "a string"))
	f.Add(testsign.AttestationStatement(other, vulnType, map[string]any{}))
	f.Add(testsign.AttestationStatement(fuzzDigest, "https://slsa.dev/provenance/v1", map[string]any{}))
	f.Add([]byte(`{"_type":"https://in-toto.io/Statement/v1","predicate":{"a":1e400}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	want, err := v1.NewHash(fuzzDigest.DigestStr())
	if err != nil {
		f.Fatal(err)
	}
	req := requirement{predicateType: vulnType}
	for _, expr := range []string{
		`predicate.scanner.result.summary.critical == 0`,
		`has(predicate.scanner) && size(predicate.scanner) > 0`,
		`predicate.all(k, k != "")`,
	} {
		prg, err := compileCondition(expr)
		if err != nil {
			f.Fatal(err)
		}
		req.conditions = append(req.conditions, condition{expr: expr, program: prg})
	}
	reasons := map[Reason]bool{Malformed: true, OtherDigest: true, OtherPredicate: true}
	f.Fuzz(func(t *testing.T, payload []byte) {
		predicate, r := attestationPredicate(payload, want, vulnType)
		if r != nil {
			if !reasons[r.reason] || r.detail == "" {
				t.Fatalf("rejection without a known reason and a detail: %+v", r)
			}
			return
		}
		var st statement
		if err := json.Unmarshal(payload, &st); err != nil || st.PredicateType != vulnType || st.about(want) != nil {
			t.Fatalf("accepted a statement that is not a %s statement about %s: %s", vulnType, want, payload)
		}
		if predicate == nil {
			t.Fatalf("accepted a statement without a predicate: %s", payload)
		}
		if r := req.evaluate(predicate); r != nil && (r.reason != ConditionFailed || !strings.Contains(r.detail, "condition")) {
			t.Fatalf("a failed condition without its reason: %+v", r)
		}
	})
}
