package verify

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	protocommon "github.com/sigstore/protobuf-specs/gen/pb-go/common/v1"
	"github.com/sigstore/sigstore-go/pkg/bundle"
)

// The formats cosign writes.
const (
	// BundleMediaTypePrefix starts the artifactType of a bundle referrer
	// and the media type of its layer ("….v0.3+json").
	BundleMediaTypePrefix = "application/vnd.dev.sigstore.bundle"
	// BundleMediaType is the bundle version cosign v3 and sigstore-go
	// write, the one P2 publishes.
	BundleMediaType = "application/vnd.dev.sigstore.bundle.v0.3+json"
	// BundlePredicateAnnotation, on a bundle referrer, names the predicate
	// type of the statement inside.
	BundlePredicateAnnotation = "dev.sigstore.bundle.predicateType"
	// SignPredicateType is the predicate type of a cosign v3 image
	// signature: the only statement that counts as a signature.
	SignPredicateType = "https://sigstore.dev/cosign/sign/v1"
	// InTotoPayloadType is the DSSE payload type of an in-toto statement.
	InTotoPayloadType = "application/vnd.in-toto+json"
	// SimpleSigningMediaType is the media type of a legacy .sig layer.
	SimpleSigningMediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	// SignatureAnnotation holds a legacy layer's base64 signature.
	SignatureAnnotation = "dev.cosignproject.cosign/signature"
	// legacyCertificateAnnotation holds a keyless legacy signature's
	// certificate.
	legacyCertificateAnnotation = "dev.sigstore.cosign/certificate"
	// SimpleSigningType is critical.type of a legacy signature payload.
	SimpleSigningType = "cosign container image signature"
)

// rejection is why a signature does not count, before any key is tried.
type rejection struct {
	reason Reason
	detail string
}

func reject(r Reason, format string, args ...any) *rejection {
	return &rejection{reason: r, detail: fmt.Sprintf(format, args...)}
}

// statement is the part of an in-toto statement V1 reads.
type statement struct {
	Type          string `json:"_type"`
	PredicateType string `json:"predicateType"`
	Subject       []struct {
		Name   string            `json:"name"`
		Digest map[string]string `json:"digest"`
	} `json:"subject"`
	// Predicate is what V5's conditions read; V1 ignores it.
	Predicate json.RawMessage `json:"predicate"`
}

// parseBundle reads a Sigstore bundle (JSON) and says whether it is an
// image signature bound to want: a DSSE envelope of an in-toto statement of
// predicate type SignPredicateType whose subject is want, or a message
// signature over want. It never trusts the bundle: the signature is checked
// after, with the policy's keys.
func parseBundle(data []byte, want v1.Hash) (*bundle.Bundle, *rejection) {
	b, r := decodeBundle(data)
	if r != nil {
		return nil, r
	}
	if env := b.GetDsseEnvelope(); env != nil {
		if env.GetPayloadType() != InTotoPayloadType {
			return nil, reject(NotASignature, "its DSSE payload is %q, not an in-toto statement", env.GetPayloadType())
		}
		st, r := decodeStatement(env.GetPayload())
		if r != nil {
			return nil, r
		}
		if st.PredicateType != SignPredicateType {
			return nil, reject(NotASignature, "%s", describePredicate(st.PredicateType))
		}
		if r := st.about(want); r != nil {
			return nil, r
		}
		return b, nil
	}
	if ms := b.GetMessageSignature(); ms != nil {
		md := ms.GetMessageDigest()
		if md == nil || len(md.GetDigest()) == 0 {
			return nil, reject(Malformed, "its message signature has no digest")
		}
		got := messageDigest(md.GetAlgorithm(), md.GetDigest())
		if got != want.String() {
			return nil, reject(OtherDigest, "it signs the message digest %s", got)
		}
		return b, nil
	}
	return nil, reject(Malformed, "it holds neither a DSSE envelope nor a message signature")
}

func decodeBundle(data []byte) (*bundle.Bundle, *rejection) {
	var b bundle.Bundle
	if err := b.UnmarshalJSON(data); err != nil {
		return nil, reject(Malformed, "not a Sigstore bundle: %v", err)
	}
	return &b, nil
}

// decodeStatement reads an in-toto statement (a DSSE payload).
func decodeStatement(payload []byte) (*statement, *rejection) {
	var st statement
	if err := json.Unmarshal(payload, &st); err != nil {
		return nil, reject(Malformed, "its in-toto statement does not parse: %v", err)
	}
	if !strings.HasPrefix(st.Type, "https://in-toto.io/Statement/") {
		return nil, reject(Malformed, "its payload is not an in-toto statement (_type %q)", st.Type)
	}
	return &st, nil
}

// about says whether want is one of the statement's subjects.
func (st *statement) about(want v1.Hash) *rejection {
	var named []string
	for _, s := range st.Subject {
		for alg, h := range s.Digest {
			if alg == want.Algorithm && strings.EqualFold(h, want.Hex) {
				return nil
			}
			named = append(named, alg+":"+h)
		}
	}
	if len(named) == 0 {
		return reject(Malformed, "its statement has no subject digest")
	}
	slices.Sort(named)
	return reject(OtherDigest, "its statement's subject is %s", strings.Join(named, ", "))
}

// messageDigest spells a bundle's message digest as an OCI digest.
func messageDigest(alg protocommon.HashAlgorithm, d []byte) string {
	name := map[protocommon.HashAlgorithm]string{
		protocommon.HashAlgorithm_SHA2_256: "sha256",
		protocommon.HashAlgorithm_SHA2_384: "sha384",
		protocommon.HashAlgorithm_SHA2_512: "sha512",
	}[alg]
	if name == "" {
		name = strings.ToLower(alg.String())
	}
	return name + ":" + hex.EncodeToString(d)
}

// describePredicate names an attestation that is not a signature.
func describePredicate(t string) string {
	switch {
	case t == "":
		return "a statement without a predicate type is not a signature"
	case strings.HasPrefix(t, "https://spdx.dev/Document"):
		return fmt.Sprintf("an SBOM attestation (SPDX, %s), not a signature", t)
	case strings.HasPrefix(t, "https://cyclonedx.org/bom"):
		return fmt.Sprintf("an SBOM attestation (CycloneDX, %s), not a signature", t)
	case strings.HasPrefix(t, "https://slsa.dev/provenance/"):
		return fmt.Sprintf("a provenance attestation (%s), not a signature", t)
	default:
		return fmt.Sprintf("an attestation of predicate type %s, not a signature", t)
	}
}

// simpleSigning is the payload of a legacy cosign signature.
type simpleSigning struct {
	Critical struct {
		Identity struct {
			DockerReference string `json:"docker-reference"`
		} `json:"identity"`
		Image struct {
			DockerManifestDigest string `json:"docker-manifest-digest"`
		} `json:"image"`
		Type string `json:"type"`
	} `json:"critical"`
}

// parseSimpleSigning says whether a legacy payload is an image signature
// bound to want; the signature over it is checked after.
func parseSimpleSigning(payload []byte, want v1.Hash) *rejection {
	var p simpleSigning
	dec := json.NewDecoder(bytes.NewReader(payload))
	if err := dec.Decode(&p); err != nil {
		return reject(Malformed, "its simple-signing payload does not parse: %v", err)
	}
	if dec.More() {
		return reject(Malformed, "its simple-signing payload has data after the JSON object")
	}
	if p.Critical.Type != SimpleSigningType {
		return reject(NotASignature, "its payload's critical.type is %q, not %q", p.Critical.Type, SimpleSigningType)
	}
	got := p.Critical.Image.DockerManifestDigest
	if got == "" {
		return reject(Malformed, "its payload names no critical.image.docker-manifest-digest")
	}
	if got != want.String() {
		return reject(OtherDigest, "its payload names %s", got)
	}
	return nil
}
