package testsign

import (
	"encoding/base64"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	protobundle "github.com/sigstore/protobuf-specs/gen/pb-go/bundle/v1"
	protocommon "github.com/sigstore/protobuf-specs/gen/pb-go/common/v1"
	protodsse "github.com/sigstore/protobuf-specs/gen/pb-go/dsse"
	protorekor "github.com/sigstore/protobuf-specs/gen/pb-go/rekor/v1"
	"github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/testing/ca"
)

// Sigstore is a Sigstore of the test's own (sigstore-go's virtual one): a
// Fulcio CA that issues short-lived certificates for an OIDC identity, a
// Rekor log and a timestamp authority, all in process. Keyless signatures
// are made with it as `cosign sign` makes them against the public-good
// instance.
type Sigstore struct {
	vs *ca.VirtualSigstore
}

// NewSigstore starts a virtual Sigstore.
func NewSigstore(t testing.TB) *Sigstore {
	t.Helper()
	vs, err := ca.NewVirtualSigstore()
	if err != nil {
		t.Fatal(err)
	}
	return &Sigstore{vs: vs}
}

// WriteTrustedRoot writes its trusted root (the JSON a policy's
// cosign.trustedRoot names) into dir and returns the path. The root lists
// no CT log: the virtual Fulcio embeds no SCTs.
func (s *Sigstore) WriteTrustedRoot(t testing.TB, dir string) string {
	t.Helper()
	// The virtual Sigstore keys its logs by the hex log ID but holds the
	// hex text as the ID; a trusted root file holds the raw ID.
	logs := map[string]*root.TransparencyLog{}
	for id, l := range s.vs.RekorLogs() {
		raw, err := hex.DecodeString(id)
		if err != nil {
			t.Fatal(err)
		}
		l.ID = raw
		logs[id] = l
	}
	tr, err := root.NewTrustedRoot(root.TrustedRootMediaType01, s.vs.FulcioCertificateAuthorities(), nil,
		s.vs.TimestampingAuthorities(), logs)
	if err != nil {
		t.Fatal(err)
	}
	data, err := tr.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "trusted_root.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// KeylessBundle signs a statement about d as identity subject of OIDC
// issuer issuer would with `cosign sign` v3: a certificate from the
// virtual Fulcio, a DSSE envelope, a Rekor entry with its inclusion proof
// and an RFC 3161 timestamp, as a Sigstore bundle v0.3 (JSON).
func (s *Sigstore) KeylessBundle(t testing.TB, d name.Digest, predicateType, issuer, subject string) []byte {
	t.Helper()
	return s.KeylessStatementBundle(t, Statement(d, predicateType), issuer, subject)
}

// KeylessStatementBundle is KeylessBundle for any in-toto statement (an
// attestation, V5).
func (s *Sigstore) KeylessStatementBundle(t testing.TB, statement []byte, issuer, subject string) []byte {
	t.Helper()
	e, err := s.vs.AttestAtTime(subject, issuer, statement, time.Now(), true)
	if err != nil {
		t.Fatal(err)
	}
	vc, err := e.VerificationContent()
	if err != nil {
		t.Fatal(err)
	}
	sc, err := e.SignatureContent()
	if err != nil {
		t.Fatal(err)
	}
	env := sc.EnvelopeContent().RawEnvelope()
	payload, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := base64.StdEncoding.DecodeString(env.Signatures[0].Sig)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := e.TlogEntries()
	if err != nil {
		t.Fatal(err)
	}
	var tles []*protorekor.TransparencyLogEntry
	for _, entry := range entries {
		tle := entry.TransparencyLogEntry()
		tle.KindVersion = &protorekor.KindVersion{Kind: "dsse", Version: "0.0.1"}
		tles = append(tles, tle)
	}
	stamps, err := e.Timestamps()
	if err != nil {
		t.Fatal(err)
	}
	var rfc3161 []*protocommon.RFC3161SignedTimestamp
	for _, ts := range stamps {
		rfc3161 = append(rfc3161, &protocommon.RFC3161SignedTimestamp{SignedTimestamp: ts})
	}
	pb := &protobundle.Bundle{
		MediaType: BundleMediaType,
		VerificationMaterial: &protobundle.VerificationMaterial{
			Content: &protobundle.VerificationMaterial_Certificate{
				Certificate: &protocommon.X509Certificate{RawBytes: vc.Certificate().Raw},
			},
			TlogEntries:               tles,
			TimestampVerificationData: &protobundle.TimestampVerificationData{Rfc3161Timestamps: rfc3161},
		},
		Content: &protobundle.Bundle_DsseEnvelope{DsseEnvelope: &protodsse.Envelope{
			Payload: payload, PayloadType: env.PayloadType,
			Signatures: []*protodsse.Signature{{Sig: sig, Keyid: env.Signatures[0].KeyID}},
		}},
	}
	b, err := (&bundle.Bundle{Bundle: pb}).MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// SignKeyless signs d (an image signature) as issuer/subject and attaches
// the bundle as cosign v3 does.
func (s *Sigstore) SignKeyless(t testing.TB, d name.Digest, issuer, subject string, opts ...remote.Option) {
	t.Helper()
	AttachBundle(t, d, s.KeylessBundle(t, d, SignPredicate, issuer, subject), SignPredicate, opts...)
}

// AttestKeyless signs an attestation of predicateType about d with
// predicate as issuer/subject and attaches it as cosign v3's attest does.
func (s *Sigstore) AttestKeyless(t testing.TB, d name.Digest, predicateType string, predicate any, issuer, subject string, opts ...remote.Option) {
	t.Helper()
	AttachBundle(t, d, s.KeylessStatementBundle(t, AttestationStatement(d, predicateType, predicate), issuer, subject), predicateType, opts...)
}
