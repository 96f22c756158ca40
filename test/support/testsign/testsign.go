// Package testsign signs image digests in tests the way cosign does, with
// keys of the test's own, and pushes the signatures to a real registry: a
// Sigstore bundle as an OCI 1.1 referrer artifact (cosign v3) and a legacy
// simple-signing layer at the tag sha256-<hex>.sig (cosign before v3). The
// formats are written here from cosign's specification, independently of
// the code under test (internal/verify).
package testsign

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	"github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/sign"
)

// cosign's formats.
const (
	BundleMediaType = "application/vnd.dev.sigstore.bundle.v0.3+json"
	// SignPredicate is the predicate type of a cosign v3 image signature.
	SignPredicate = "https://sigstore.dev/cosign/sign/v1"
	// SPDXPredicate is an SBOM attestation's: signed, but not a signature.
	SPDXPredicate = "https://spdx.dev/Document/v2.3"

	inTotoPayloadType      = "application/vnd.in-toto+json"
	predicateAnnotation    = "dev.sigstore.bundle.predicateType"
	emptyMediaType         = "application/vnd.oci.empty.v1+json"
	simpleSigningMediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	signatureAnnotation    = "dev.cosignproject.cosign/signature"
	simpleSigningType      = "cosign container image signature"
)

// Signer is one key pair (ECDSA P-256 with SHA-256, cosign's default).
type Signer struct {
	kp *sign.EphemeralKeypair
	// File names the public key: the PEM file WritePublicKey wrote, or the
	// name the test gave.
	File string
}

// NewSigner makes a key pair; file names its public key.
func NewSigner(t testing.TB, file string) Signer {
	t.Helper()
	s, err := NewKeyPair(file)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// NewKeyPair is NewSigner for a caller without a testing.TB (make demo).
func NewKeyPair(file string) (Signer, error) {
	kp, err := sign.NewEphemeralKeypair(nil)
	if err != nil {
		return Signer{}, err
	}
	return Signer{kp: kp, File: file}, nil
}

// PublicKeyPEM is the public key as `cosign generate-key-pair` writes
// cosign.pub.
func (s Signer) PublicKeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(s.PublicKey())
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// PublicKey is the key a policy verifies with.
func (s Signer) PublicKey() crypto.PublicKey { return s.kp.GetPublicKey() }

// WritePublicKey writes the public key as PEM ("PUBLIC KEY", as `cosign
// generate-key-pair` writes cosign.pub) into dir and returns its path,
// which becomes s.File.
func (s *Signer) WritePublicKey(t testing.TB, dir string) string {
	t.Helper()
	data, err := s.PublicKeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, filepath.Base(s.File))
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	s.File = path
	return path
}

// Statement is an in-toto statement about d, as cosign v3 signs it.
func Statement(d name.Digest, predicateType string) []byte {
	hexPart := strings.TrimPrefix(d.DigestStr(), "sha256:")
	st := map[string]any{
		"_type":         "https://in-toto.io/Statement/v1",
		"subject":       []any{map[string]any{"name": d.Context().Name(), "digest": map[string]string{"sha256": hexPart}}},
		"predicateType": predicateType,
		"predicate":     map[string]any{},
	}
	b, _ := json.Marshal(st)
	return b
}

// DSSEBundle signs a statement about d as a Sigstore bundle v0.3 (JSON).
func (s Signer) DSSEBundle(t testing.TB, d name.Digest, predicateType string) []byte {
	t.Helper()
	return s.bundle(t, &sign.DSSEData{Data: Statement(d, predicateType), PayloadType: inTotoPayloadType})
}

// MessageBundle signs data itself (a message signature, e.g. over a
// manifest) as a Sigstore bundle.
func (s Signer) MessageBundle(t testing.TB, data []byte) []byte {
	t.Helper()
	return s.bundle(t, &sign.PlainData{Data: data})
}

func (s Signer) bundle(t testing.TB, content sign.Content) []byte {
	t.Helper()
	pb, err := sign.Bundle(content, s.kp, sign.BundleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := (&bundle.Bundle{Bundle: pb}).MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type rawManifest []byte

func (m rawManifest) RawManifest() ([]byte, error)        { return m, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// AttachBundle pushes bundleJSON as cosign v3 does: an OCI artifact whose
// subject is subject, with an empty config and the bundle as its layer.
// Without the referrers API, go-containerregistry's client adds it to the
// sha256-<hex> tag's index.
func AttachBundle(t testing.TB, subject name.Digest, bundleJSON []byte, predicateType string, opts ...remote.Option) {
	t.Helper()
	attach(t, subject, BundleMediaType, BundleMediaType, bundleJSON, map[string]string{
		"dev.sigstore.bundle.content":      "dsse-envelope",
		predicateAnnotation:                predicateType,
		"org.opencontainers.image.created": time.Now().UTC().Format(time.RFC3339),
	}, opts...)
}

// attach pushes data as an OCI 1.1 artifact of artifactType whose subject
// is subject: an empty config and data as its one layer of layerType.
// Without the referrers API, go-containerregistry's client adds it to the
// sha256-<hex> tag's index.
func attach(t testing.TB, subject name.Digest, artifactType, layerType string, data []byte, annotations map[string]string, opts ...remote.Option) {
	t.Helper()
	repo := subject.Context()
	cfg := static.NewLayer([]byte("{}"), emptyMediaType)
	layer := static.NewLayer(data, types.MediaType(layerType))
	for _, l := range []v1.Layer{cfg, layer} {
		if err := remote.WriteLayer(repo, l, opts...); err != nil {
			t.Fatal(err)
		}
	}
	subj, err := remote.Head(subject, opts...)
	if err != nil {
		t.Fatal(err)
	}
	desc := func(l v1.Layer, mt string) map[string]any {
		d, _ := l.Digest()
		n, _ := l.Size()
		return map[string]any{"mediaType": mt, "digest": d.String(), "size": n}
	}
	m := map[string]any{
		"schemaVersion": 2,
		"mediaType":     string(types.OCIManifestSchema1),
		"artifactType":  artifactType,
		"config":        desc(cfg, emptyMediaType),
		"layers":        []any{desc(layer, layerType)},
		"subject":       map[string]any{"mediaType": string(subj.MediaType), "digest": subj.Digest.String(), "size": subj.Size},
		"annotations":   annotations,
	}
	raw, _ := json.Marshal(m)
	h, _, _ := v1.SHA256(strings.NewReader(string(raw)))
	if err := remote.Put(repo.Digest(h.String()), rawManifest(raw), opts...); err != nil {
		t.Fatal(err)
	}
}

// SignBundle signs d (cosign v3's image signature) and attaches it.
func (s Signer) SignBundle(t testing.TB, d name.Digest, opts ...remote.Option) {
	t.Helper()
	AttachBundle(t, d, s.DSSEBundle(t, d, SignPredicate), SignPredicate, opts...)
}

// LegacyPayload is the simple-signing payload cosign signs for d.
func LegacyPayload(d name.Digest) []byte {
	p := map[string]any{
		"critical": map[string]any{
			"identity": map[string]string{"docker-reference": d.Context().Name()},
			"image":    map[string]string{"docker-manifest-digest": d.DigestStr()},
			"type":     simpleSigningType,
		},
		"optional": nil,
	}
	b, _ := json.Marshal(p)
	return b
}

// AttachLegacy pushes a cosign .sig manifest for onto: one simple-signing
// layer per payload, each signed by s.
func (s Signer) AttachLegacy(t testing.TB, onto name.Digest, opts []remote.Option, payloads ...[]byte) {
	t.Helper()
	s.AttachLegacyWith(t, onto, opts, nil, payloads...)
}

// AttachLegacyWith is AttachLegacy with more annotations on each layer
// (cosign v2's keyless signature carries its certificate in one).
func (s Signer) AttachLegacyWith(t testing.TB, onto name.Digest, opts []remote.Option, annotations map[string]string, payloads ...[]byte) {
	t.Helper()
	tag, img, err := s.LegacySignature(onto, annotations, payloads...)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img, opts...); err != nil {
		t.Fatal(err)
	}
}

// LegacySignature is the cosign .sig manifest for onto and the tag it goes
// to: one simple-signing layer per payload, each signed by s.
func (s Signer) LegacySignature(onto name.Digest, annotations map[string]string, payloads ...[]byte) (name.Tag, v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, p := range payloads {
		sig, _, err := s.kp.SignData(context.Background(), p)
		if err != nil {
			return name.Tag{}, nil, err
		}
		ann := map[string]string{signatureAnnotation: base64.StdEncoding.EncodeToString(sig)}
		maps.Copy(ann, annotations)
		img, err = mutate.Append(img, mutate.Addendum{Layer: static.NewLayer(p, simpleSigningMediaType), Annotations: ann})
		if err != nil {
			return name.Tag{}, nil, err
		}
	}
	return onto.Context().Tag(strings.Replace(onto.DigestStr(), ":", "-", 1) + ".sig"), img, nil
}

// Attestations (V5), as cosign attest writes them.
const (
	// SLSAProvenance1 is SLSA provenance v1's predicate type (cosign attest
	// --type slsaprovenance1).
	SLSAProvenance1 = "https://slsa.dev/provenance/v1"
	// VulnPredicate is cosign's vulnerability scan predicate type (cosign
	// attest --type vuln).
	VulnPredicate = "https://cosign.sigstore.dev/attestation/vuln/v1"

	dsseMediaType             = "application/vnd.dsse.envelope.v1+json"
	legacyPredicateAnnotation = "predicateType"
)

// AttestationStatement is an in-toto statement of predicateType whose
// subject is subject and whose predicate is predicate (marshalled as JSON;
// nil leaves the predicate out).
func AttestationStatement(subject name.Digest, predicateType string, predicate any) []byte {
	hexPart := strings.TrimPrefix(subject.DigestStr(), "sha256:")
	st := map[string]any{
		"_type":         "https://in-toto.io/Statement/v1",
		"subject":       []any{map[string]any{"name": subject.Context().Name(), "digest": map[string]string{"sha256": hexPart}}},
		"predicateType": predicateType,
	}
	if predicate != nil {
		st["predicate"] = predicate
	}
	b, _ := json.Marshal(st)
	return b
}

// StatementBundle signs statement (a DSSE envelope of an in-toto
// statement) as a Sigstore bundle v0.3 (JSON).
func (s Signer) StatementBundle(t testing.TB, statement []byte) []byte {
	t.Helper()
	return s.bundle(t, &sign.DSSEData{Data: statement, PayloadType: inTotoPayloadType})
}

// Attest signs a statement of predicateType about d with predicate and
// attaches it to d as cosign v3's attest does (a bundle referrer).
func (s Signer) Attest(t testing.TB, d name.Digest, predicateType string, predicate any, opts ...remote.Option) {
	t.Helper()
	AttachBundle(t, d, s.StatementBundle(t, AttestationStatement(d, predicateType, predicate)), predicateType, opts...)
}

// Envelope signs statement as a DSSE envelope (JSON), as cosign's legacy
// .att layer holds it: the signature is over the pre-authentication
// encoding of the payload type and the payload.
func (s Signer) Envelope(statement []byte) ([]byte, error) {
	sig, _, err := s.kp.SignData(context.Background(), dsse.PAE(inTotoPayloadType, statement))
	if err != nil {
		return nil, err
	}
	return json.Marshal(dsse.Envelope{
		PayloadType: inTotoPayloadType,
		Payload:     base64.StdEncoding.EncodeToString(statement),
		Signatures:  []dsse.Signature{{Sig: base64.StdEncoding.EncodeToString(sig)}},
	})
}

// AttachLegacyAttestation pushes a cosign .att manifest for onto: one DSSE
// envelope layer per statement, each signed by s and annotated with its
// predicate type (as cosign attest --new-bundle-format=false writes it).
func (s Signer) AttachLegacyAttestation(t testing.TB, onto name.Digest, opts []remote.Option, statements ...[]byte) {
	t.Helper()
	tag, img, err := s.LegacyAttestation(onto, statements...)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img, opts...); err != nil {
		t.Fatal(err)
	}
}

// LegacyAttestation is the cosign .att manifest for onto and the tag it
// goes to (AttachLegacyAttestation).
func (s Signer) LegacyAttestation(onto name.Digest, statements ...[]byte) (name.Tag, v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, st := range statements {
		env, err := s.Envelope(st)
		if err != nil {
			return name.Tag{}, nil, err
		}
		var head struct {
			PredicateType string `json:"predicateType"`
		}
		_ = json.Unmarshal(st, &head)
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:       static.NewLayer(env, dsseMediaType),
			Annotations: map[string]string{legacyPredicateAnnotation: head.PredicateType},
		})
		if err != nil {
			return name.Tag{}, nil, err
		}
	}
	return onto.Context().Tag(strings.Replace(onto.DigestStr(), ":", "-", 1) + ".att"), img, nil
}

// KeyHint is the public key's id as cosign writes it in a bundle: base64
// of the SHA-256 of its PKIX DER.
func (s Signer) KeyHint() string {
	return string(s.kp.GetHint())
}
