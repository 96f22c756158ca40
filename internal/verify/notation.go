package verify

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/notaryproject/notation-go"
	"github.com/notaryproject/notation-go/verifier"
	"github.com/notaryproject/notation-go/verifier/trustpolicy"
	"github.com/notaryproject/notation-go/verifier/truststore"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/image-refresh/image-refresh/internal/config"
)

const (
	// NotationArtifactType is the artifactType of a Notation signature
	// (a referrer of the signed manifest).
	NotationArtifactType = "application/vnd.cncf.notary.signature"
	// The envelope formats of a Notation signature layer.
	notationJWS  = "application/jose+json"
	notationCOSE = "application/cose"
)

// trustStore is a policy's certificates as Notation's X.509 trust store.
type trustStore []*x509.Certificate

func (s trustStore) GetCertificates(_ context.Context, t truststore.Type, _ string) ([]*x509.Certificate, error) {
	if t != truststore.TypeCA {
		return nil, fmt.Errorf("no %s trust store", t)
	}
	return s, nil
}

// newNotary is Notation's verifier for a policy: a trust policy of one
// statement (any registry scope: the verification policy's repositories
// already chose the image), the policy's certificates as its CA store,
// any identity those certificates issued, strict verification; the
// revocation check is skipped (no OCSP or CRL request leaves image-refresh)
// unless the policy turns it on.
func newNotary(policy *config.VerificationPolicy) (notation.Verifier, error) {
	if len(policy.Notation.Certs) == 0 {
		return nil, fmt.Errorf("verification policy %s has no certificates loaded (config.Load reads them)", policy.Name)
	}
	sv := trustpolicy.SignatureVerification{VerificationLevel: trustpolicy.LevelStrict.Name}
	if !policy.Notation.Revocation {
		sv.Override = map[trustpolicy.ValidationType]trustpolicy.ValidationAction{trustpolicy.TypeRevocation: trustpolicy.ActionSkip}
	}
	doc := &trustpolicy.Document{
		Version: "1.0",
		TrustPolicies: []trustpolicy.TrustPolicy{{
			Name:                  policy.Name,
			RegistryScopes:        []string{"*"},
			SignatureVerification: sv,
			TrustStores:           []string{string(truststore.TypeCA) + ":" + policy.Name},
			TrustedIdentities:     []string{"*"},
		}},
	}
	certs, err := certificates(policy.Notation)
	if err != nil {
		return nil, fmt.Errorf("verification policy %s: notation: %w", policy.Name, err)
	}
	v, err := verifier.New(doc, trustStore(certs), nil)
	if err != nil {
		return nil, fmt.Errorf("verification policy %s: notation: %w", policy.Name, err)
	}
	return v, nil
}

// notations checks the Notation signatures among the digest's referrers.
func (l *lookup) notations() error {
	m, err := l.referrers()
	if err != nil {
		return err
	}
	var target *ocispec.Descriptor
	n := 0
	for _, d := range m.Manifests {
		switch d.ArtifactType {
		case NotationArtifactType:
		case "", emptyMediaType:
			// A registry that names the config's media type: the
			// manifest says what it is (notationEnvelope).
		default:
			continue // another artifact (a cosign bundle, an SBOM)
		}
		source := "referrer " + d.Digest.String()
		if n++; n > maxCandidates {
			l.rejected(FormatNotation, source, reject(Malformed, "not read: more than %d Notation signatures are attached", maxCandidates))
			return nil
		}
		if target == nil {
			desc, err := remote.Head(l.ref, l.opts...)
			if err != nil {
				return fmt.Errorf("read the descriptor of %s: %w", l.ref, err)
			}
			target = &ocispec.Descriptor{MediaType: string(desc.MediaType), Digest: digest.Digest(l.ref.DigestStr()), Size: desc.Size}
		}
		envelope, mediaType, r, err := l.notationEnvelope(d.Digest.String())
		if err != nil {
			return err
		}
		if envelope == nil && r == nil {
			n--
			continue // not a Notation signature after all
		}
		if r == nil {
			r = l.checkNotation(*target, envelope, mediaType)
		}
		if r != nil {
			l.rejected(FormatNotation, source, r)
			continue
		}
		l.verified(FormatNotation, source, "notation")
		return nil
	}
	return nil
}

// notationEnvelope reads the signature envelope layer of a Notation
// signature manifest.
func (l *lookup) notationEnvelope(digest string) ([]byte, string, *rejection, error) {
	ref := l.ref.Context().Digest(digest)
	img, err := remote.Image(ref, l.opts...)
	if err != nil {
		if notFound(err) {
			return nil, "", reject(Malformed, "listed, but its manifest is not found"), nil
		}
		return nil, "", nil, fmt.Errorf("read the Notation signature %s: %w", ref, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, "", reject(Malformed, "its manifest does not parse: %v", err), nil
	}
	if m.ArtifactType != NotationArtifactType && m.Config.MediaType != NotationArtifactType {
		return nil, "", nil, nil
	}
	if len(m.Layers) != 1 || (m.Layers[0].MediaType != notationJWS && m.Layers[0].MediaType != notationCOSE) {
		return nil, "", reject(Malformed, "want one %s or %s layer", notationJWS, notationCOSE), nil
	}
	if m.Subject == nil || m.Subject.Digest.String() != l.ref.DigestStr() {
		return nil, "", reject(OtherDigest, "its manifest's subject is not %s", l.ref.DigestStr()), nil
	}
	data, r, err := readBlob(img, m.Layers[0])
	if err != nil {
		return nil, "", nil, fmt.Errorf("read the Notation signature %s: %w", ref, err)
	}
	return data, string(m.Layers[0].MediaType), r, nil
}

// checkNotation verifies one envelope against target; nil when it
// verified. Notation checks that the signed payload names target.
func (l *lookup) checkNotation(target ocispec.Descriptor, envelope []byte, mediaType string) *rejection {
	_, err := l.notary.Verify(l.ctx, target, envelope, notation.VerifierVerifyOptions{
		ArtifactReference:  l.ref.String(),
		SignatureMediaType: mediaType,
	})
	if err == nil {
		return nil
	}
	if strings.Contains(err.Error(), "content descriptor mismatch") {
		// The envelope signs another artifact (notation-go says so only
		// in its message).
		return reject(OtherDigest, "%v", err)
	}
	return reject(Untrusted, "%v", err)
}
