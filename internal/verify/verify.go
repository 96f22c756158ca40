// Package verify checks that an image digest is signed before it is pinned
// or recorded (V1). A digest verifies against a policy when a cosign
// signature made with one of the policy's public keys or by one of its
// keyless identities (against its trusted root) is bound to it, found
// either as a Sigstore bundle among its OCI referrers (cosign v3; the
// referrers API, or the sha256-<hex> tag for a registry without it) or as a
// legacy signature at the tag sha256-<hex>.sig; or, under a Notation
// policy, when a Notation signature among its referrers chains to the
// policy's certificates (notation.go). A signature counts only when
// its signed content names this digest and it is an image signature: cosign
// v3 accepts any valid bundle, an SBOM attestation included; V1 does not.
//
// The registry is read with go-containerregistry and the caller's remote
// options (auth, the host's transport). A registry that cannot be read is an
// error, never a verdict: a read failure (R1), not "unverified".
//
// A lookup is a few GETs, no write: the referrers list (and its tag on a
// registry without the API), the manifest and the blob of each bundle, the
// .sig manifest and its payloads when no bundle verified. An unsigned digest
// costs three, a bundle found through the referrers API three. Callers look
// once per new digest and policy (digests are immutable), never per poll.
package verify

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/notaryproject/notation-go"
	"github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/root"
	sgverify "github.com/sigstore/sigstore-go/pkg/verify"
	"github.com/sigstore/sigstore/pkg/signature"

	"github.com/image-refresh/image-refresh/internal/config"
)

const (
	// maxBlobSize bounds a bundle or a legacy payload read: a signature is
	// a few KiB, and an SBOM is not read past this.
	maxBlobSize = 1 << 20
	// maxCandidates bounds the signatures looked at per format, so that a
	// repository with many attachments costs a bounded number of requests.
	maxCandidates = 32
	// emptyMediaType is the config of an OCI artifact without one.
	emptyMediaType = "application/vnd.oci.empty.v1+json"
)

// Verify looks for the signatures of ref's digest and checks them against
// policy's keys (config.Load read them). opts reach the registry (auth,
// transport); ctx bounds every call. It stops at the first signature that
// verifies, bundles first. The error is a registry read that failed (5xx,
// timeout, 401, a network error: wrapped, for registry.Classify) or a policy
// without keys; a missing or invalid signature is a Verdict.
func Verify(ctx context.Context, ref name.Digest, policy *config.VerificationPolicy, opts ...remote.Option) (Verdict, error) {
	v := Verdict{Digest: ref.String()}
	if policy == nil {
		return v, errors.New("verify: no policy")
	}
	v.Policy = policy.Name
	want, err := v1.NewHash(ref.DigestStr())
	if err != nil {
		return v, fmt.Errorf("verify %s: %w", ref, err)
	}
	opts = append(opts[:len(opts):len(opts)], remote.WithContext(ctx))
	if policy.Notation != nil {
		nv, err := newNotary(policy)
		if err != nil {
			return v, err
		}
		l := &lookup{ctx: ctx, ref: ref, want: want, notary: nv, opts: opts, verdict: &v}
		return v, l.notations()
	}
	keys, kl, err := newTrust(policy)
	if err != nil {
		return v, err
	}
	reqs, err := requirements(policy)
	if err != nil {
		return v, err
	}
	l := &lookup{ctx: ctx, ref: ref, want: want, keys: keys, keyless: kl, opts: opts, verdict: &v}
	if l.index, err = l.referrers(); err != nil {
		return v, err
	}
	if err := l.bundles(); err != nil {
		return v, err
	}
	switch {
	case v.Verified:
	case l.sawBundle:
		// One rule for both formats, cosign's: a digest with bundles is
		// judged by its bundles; a legacy .sig beside them is not looked
		// at (cosign verify does not fall back to it either).
		if err := l.legacyBesideBundle(".sig", FormatLegacy); err != nil {
			return v, err
		}
	default:
		if err := l.legacy(); err != nil {
			return v, err
		}
	}
	if !v.Verified || len(reqs) == 0 {
		return v, nil
	}
	// V5: the signature verified; every required attestation must too.
	for _, r := range reqs {
		a, err := l.attestation(r)
		if err != nil {
			return v, err
		}
		v.Attestations = append(v.Attestations, a)
		if !a.Satisfied {
			v.Verified = false
		}
	}
	if _, missing := v.missing(); missing && l.sawBundle {
		if err := l.legacyBesideBundle(".att", FormatLegacyAttestation); err != nil {
			return v, err
		}
	}
	return v, nil
}

// legacyBesideBundle notes a legacy manifest (suffix .sig or .att) that
// is not looked at because the digest has bundles: a HEAD, so that the
// verdict says why a legacy signature that cosign would also ignore did
// not count.
func (l *lookup) legacyBesideBundle(suffix string, f Format) error {
	tag := l.ref.Context().Tag(strings.Replace(l.ref.DigestStr(), ":", "-", 1) + suffix)
	if _, err := remote.Head(tag, l.opts...); err != nil {
		if notFound(err) {
			return nil
		}
		return fmt.Errorf("look for the legacy manifest %s: %w", tag, err)
	}
	r := reject(BesideBundle, "not looked at: the digest has Sigstore bundles among its referrers, and then only bundles count (as with cosign verify and cosign verify-attestation)")
	if f == FormatLegacy {
		l.rejected(f, tag.TagStr(), r)
		return nil
	}
	for i := range l.verdict.Attestations {
		a := &l.verdict.Attestations[i]
		if !a.Satisfied {
			a.Rejected = append(a.Rejected, Signature{Format: f, Source: tag.TagStr(), Reason: r.reason, Detail: r.detail})
		}
	}
	return nil
}

// key is one public key of the policy, ready for both formats.
type key struct {
	file string
	// hint is the key's id as cosign writes it in a bundle's key hint:
	// base64 of the SHA-256 of its PKIX DER.
	hint string
	// bundles verifies Sigstore bundles: the key is the only trusted
	// material, whatever key hint a bundle carries.
	bundles *sgverify.Verifier
	// legacy verifies a legacy payload's signature as cosign does (SHA-256).
	legacy signature.Verifier
}

// keyless is the policy's keyless trust: a verifier over its trusted root,
// which requires a transparency log entry and an observer timestamp (and
// an SCT when the root lists a CT log, as the public-good one does), and
// the identities a certificate must name.
type keyless struct {
	verifier   *sgverify.Verifier
	identities []sgverify.CertificateIdentity
}

// publicGoodRoot is the trusted root of Sigstore's public-good instance
// (its TUF repository's trusted_root.json), the default of a keyless
// policy without cosign.trustedRoot; docs/config.md says how to refresh it.
//
//go:embed publicgood/trusted_root.json
var publicGoodRoot []byte

func newTrust(policy *config.VerificationPolicy) ([]key, *keyless, error) {
	if policy.Cosign == nil || (len(policy.Cosign.Keys) == 0 && len(policy.Cosign.Keyless) == 0) {
		return nil, nil, fmt.Errorf("verification policy %s has no public keys loaded (config.Load reads them) and no keyless identities", policy.Name)
	}
	keys := make([]key, 0, len(policy.Cosign.Keys))
	for _, k := range policy.Cosign.Keys {
		pub, err := publicKey(k)
		if err != nil {
			return nil, nil, fmt.Errorf("verification policy %s: %w", policy.Name, err)
		}
		byDefault, err := signature.LoadDefaultVerifier(pub)
		if err != nil {
			return nil, nil, fmt.Errorf("verification policy %s: key %s: %w", policy.Name, k.File, err)
		}
		material := root.NewTrustedPublicKeyMaterial(func(string) (root.TimeConstrainedVerifier, error) {
			// No validity period: the policy lists the keys it trusts.
			return root.NewExpiringKey(byDefault, time.Time{}, time.Time{}), nil
		})
		// No transparency log or timestamp is required: the key is the
		// trust, as with cosign verify --key --insecure-ignore-tlog.
		bv, err := sgverify.NewVerifier(material, sgverify.WithNoObserverTimestamps())
		if err != nil {
			return nil, nil, fmt.Errorf("verification policy %s: key %s: %w", policy.Name, k.File, err)
		}
		lv, err := signature.LoadVerifier(pub, crypto.SHA256)
		if err != nil {
			return nil, nil, fmt.Errorf("verification policy %s: key %s: %w", policy.Name, k.File, err)
		}
		sum := sha256.Sum256(k.DER)
		keys = append(keys, key{file: k.File, hint: base64.StdEncoding.EncodeToString(sum[:]), bundles: bv, legacy: lv})
	}
	if len(policy.Cosign.Keyless) == 0 {
		return keys, nil, nil
	}
	kl, err := newKeyless(policy.Cosign)
	if err != nil {
		return nil, nil, fmt.Errorf("verification policy %s: cosign.keyless: %w", policy.Name, err)
	}
	return keys, kl, nil
}

func newKeyless(c *config.CosignPolicy) (*keyless, error) {
	data := c.TrustedRootJSON
	if len(data) == 0 {
		data = publicGoodRoot
	}
	tr, err := root.NewTrustedRootFromJSON(data)
	if err != nil {
		return nil, fmt.Errorf("trusted root: %w", err)
	}
	opts := []sgverify.VerifierOption{sgverify.WithTransparencyLog(1), sgverify.WithObserverTimestamps(1)}
	if len(tr.CTLogs()) > 0 {
		opts = append(opts, sgverify.WithSignedCertificateTimestamps(1))
	}
	v, err := sgverify.NewVerifier(tr, opts...)
	if err != nil {
		return nil, err
	}
	kl := &keyless{verifier: v}
	for _, id := range c.Keyless {
		ci, err := sgverify.NewShortCertificateIdentity(id.Issuer, "", id.Subject, id.SubjectRegExp)
		if err != nil {
			return nil, fmt.Errorf("identity %s %s%s: %w", id.Issuer, id.Subject, id.SubjectRegExp, err)
		}
		kl.identities = append(kl.identities, ci)
	}
	return kl, nil
}

// lookup is one Verify call.
type lookup struct {
	ctx     context.Context
	ref     name.Digest
	want    v1.Hash
	keys    []key
	keyless *keyless
	notary  notation.Verifier
	opts    []remote.Option
	verdict *Verdict
	// index is the digest's referrers, listed once for the signature and
	// the attestations.
	index *v1.IndexManifest
	// sawBundle: the digest has a Sigstore bundle among its referrers
	// (a signature or an attestation); then legacy manifests are not
	// looked at, as with cosign.
	sawBundle bool
	// att is the legacy .att manifest (nil: none), read once (attRead)
	// for every required attestation.
	att     v1.Image
	attRead bool
	// predicate is the predicate of the last attestation that satisfied
	// its requirement (VerifyPromotion reads it, P2).
	predicate any
}

// keyNames lists the policy's keys with their hints, for a wrong-key
// reason.
func (l *lookup) keyNames() string {
	names := make([]string, len(l.keys))
	for i, k := range l.keys {
		names[i] = fmt.Sprintf("%s (key hint %s)", k.file, k.hint)
	}
	return strings.Join(names, ", ")
}

// bundleCandidate says whether the referrer d may be a cosign bundle.
func bundleCandidate(d v1.Descriptor) bool {
	// Some registries name the config's media type (cosign's is the empty
	// one) instead of the manifest's artifactType: the manifest says what
	// it is.
	return strings.HasPrefix(d.ArtifactType, BundleMediaTypePrefix) || d.ArtifactType == "" || d.ArtifactType == emptyMediaType
}

func (l *lookup) rejected(f Format, source string, r *rejection) {
	l.verdict.Rejected = append(l.verdict.Rejected, Signature{Format: f, Source: source, Reason: r.reason, Detail: r.detail})
}

func (l *lookup) verified(f Format, source, keyFile string) {
	l.verdict.Verified = true
	l.verdict.By = Signature{Format: f, Source: source, Key: keyFile}
}

// referrers lists the digest's referrers: the referrers API, or the
// sha256-<hex> tag for a registry without it (go-containerregistry).
func (l *lookup) referrers() (*v1.IndexManifest, error) {
	idx, err := remote.Referrers(l.ref, l.opts...)
	if err != nil {
		return nil, fmt.Errorf("list the referrers of %s: %w", l.ref, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("list the referrers of %s: %w", l.ref, err)
	}
	return m, nil
}

// bundles checks the Sigstore bundles among the digest's referrers.
func (l *lookup) bundles() error {
	n := 0
	for _, d := range l.index.Manifests {
		if !bundleCandidate(d) {
			continue // another artifact (an SBOM document, a Notation signature): not a cosign one
		}
		if strings.HasPrefix(d.ArtifactType, BundleMediaTypePrefix) {
			l.sawBundle = true
		}
		source := "referrer " + d.Digest.String()
		// The annotation is only trusted to refuse: an attestation that
		// says it is not a signature is not downloaded.
		if pt, ok := d.Annotations[BundlePredicateAnnotation]; ok && pt != SignPredicateType {
			l.sawBundle = true
			l.rejected(FormatBundle, source, reject(NotASignature, "%s (by its annotation)", describePredicate(pt)))
			continue
		}
		if n++; n > maxCandidates {
			l.rejected(FormatBundle, source, reject(Malformed, "not read: more than %d bundles are attached", maxCandidates))
			return nil
		}
		data, r, err := l.bundleBlob(d)
		if err != nil {
			return err
		}
		if data == nil && r == nil {
			continue // not a bundle after all
		}
		l.sawBundle = true
		if r == nil {
			r = l.checkBundle(source, data)
		}
		if r != nil {
			l.rejected(FormatBundle, source, r)
			continue
		}
		return nil // verified
	}
	return nil
}

// bundleBlob reads the bundle layer of the referrer d; nil and no rejection
// when d is not a bundle.
func (l *lookup) bundleBlob(d v1.Descriptor) ([]byte, *rejection, error) {
	ref := l.ref.Context().Digest(d.Digest.String())
	img, err := remote.Image(ref, l.opts...)
	if err != nil {
		if notFound(err) {
			return nil, reject(Malformed, "listed, but its manifest is not found"), nil
		}
		return nil, nil, fmt.Errorf("read the signature bundle %s: %w", ref, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, reject(Malformed, "its manifest does not parse: %v", err), nil
	}
	for _, layer := range m.Layers {
		if !strings.HasPrefix(string(layer.MediaType), BundleMediaTypePrefix) {
			continue
		}
		data, r, err := readBlob(img, layer)
		if err != nil {
			return nil, nil, fmt.Errorf("read the signature bundle %s: %w", ref, err)
		}
		return data, r, nil
	}
	if strings.HasPrefix(m.ArtifactType, BundleMediaTypePrefix) {
		return nil, reject(Malformed, "its manifest has no %s layer", BundleMediaTypePrefix), nil
	}
	return nil, nil, nil
}

// checkBundle verifies one bundle as the digest's signature; nil when it
// verified.
func (l *lookup) checkBundle(source string, data []byte) *rejection {
	b, r := parseBundle(data, l.want)
	if r != nil {
		return r
	}
	signer, r := l.bundleTrust(b)
	if r != nil {
		return r
	}
	l.verified(FormatBundle, source, signer)
	return nil
}

// bundleTrust verifies a bundle's signature under the policy's trust, and
// that what it signs (its DSSE statement's subject, or its message digest)
// is the digest: the key file that verified it, or "keyless ISSUER
// SUBJECT".
func (l *lookup) bundleTrust(b *bundle.Bundle) (string, *rejection) {
	vc, err := b.VerificationContent()
	if err != nil {
		return "", reject(Malformed, "its verification material: %v", err)
	}
	digest, err := hex.DecodeString(l.want.Hex)
	if err != nil {
		return "", reject(Malformed, "digest %s: %v", l.want, err)
	}
	if cert := vc.Certificate(); cert != nil {
		return l.checkKeyless(b, digest, cert.Subject.String())
	}
	hint := ""
	if pk := b.GetVerificationMaterial().GetPublicKey(); pk != nil {
		hint = pk.GetHint()
	}
	if len(l.keys) == 0 {
		return "", reject(WrongKey, "it is signed with a key (key hint %q), and the policy trusts keyless identities only", hint)
	}
	var errs []string
	for _, k := range l.keys {
		policy := sgverify.NewPolicy(sgverify.WithArtifactDigest(l.want.Algorithm, digest), sgverify.WithKey())
		if _, err := k.bundles.Verify(b, policy); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", k.file, err))
			continue
		}
		return k.file, nil
	}
	signedBy := "it names no key hint"
	if hint != "" {
		signedBy = fmt.Sprintf("it was signed by the key with hint %s", hint)
		for _, k := range l.keys {
			if k.hint == hint {
				signedBy = fmt.Sprintf("it names the hint of %s, but does not verify with it", k.file)
			}
		}
	}
	return "", reject(WrongKey, "no key of the policy verifies it: %s; tried %s: %s", signedBy, l.keyNames(), strings.Join(errs, "; "))
}

// checkKeyless verifies a bundle signed with a certificate against the
// policy's trusted root and identities.
func (l *lookup) checkKeyless(b *bundle.Bundle, digest []byte, subject string) (string, *rejection) {
	if l.keyless == nil {
		return "", reject(WrongKey, "it is signed with a certificate (keyless, %s), and the policy trusts keys", subject)
	}
	opts := []sgverify.PolicyOption{}
	for _, id := range l.keyless.identities {
		opts = append(opts, sgverify.WithCertificateIdentity(id))
	}
	res, err := l.keyless.verifier.Verify(b, sgverify.NewPolicy(sgverify.WithArtifactDigest(l.want.Algorithm, digest), opts...))
	if err != nil {
		var mismatch *sgverify.ErrNoMatchingCertificateIdentity
		if errors.As(err, &mismatch) {
			return "", reject(WrongIdentity, "%v", err)
		}
		return "", reject(Untrusted, "%v", err)
	}
	signer := subject
	if res.Signature != nil && res.Signature.Certificate != nil {
		signer = res.Signature.Certificate.Issuer + " " + res.Signature.Certificate.SubjectAlternativeName
	}
	return "keyless " + signer, nil
}

// legacy checks the layers of the manifest at sha256-<hex>.sig.
func (l *lookup) legacy() error {
	tag := l.ref.Context().Tag(strings.Replace(l.ref.DigestStr(), ":", "-", 1) + ".sig")
	img, err := remote.Image(tag, l.opts...)
	if err != nil {
		if notFound(err) {
			return nil // no legacy signature
		}
		return fmt.Errorf("read the legacy signatures %s: %w", tag, err)
	}
	m, err := img.Manifest()
	if err != nil {
		l.rejected(FormatLegacy, tag.TagStr(), reject(Malformed, "its manifest does not parse: %v", err))
		return nil
	}
	for i, layer := range m.Layers {
		source := fmt.Sprintf("%s layer %d", tag.TagStr(), i)
		if i >= maxCandidates {
			l.rejected(FormatLegacy, source, reject(Malformed, "not read: more than %d signatures", maxCandidates))
			return nil
		}
		if layer.MediaType != SimpleSigningMediaType {
			l.rejected(FormatLegacy, source, reject(NotASignature, "a layer of media type %q", layer.MediaType))
			continue
		}
		if layer.Annotations[legacyCertificateAnnotation] != "" {
			// cosign before v3, keyless: the certificate and the Rekor
			// entry ride in annotations; only bundles carry them here.
			l.rejected(FormatLegacy, source, reject(Unsupported, "a keyless legacy signature (certificate in %s): sign with cosign v3, which attaches a bundle", legacyCertificateAnnotation))
			continue
		}
		sig, err := base64.StdEncoding.DecodeString(layer.Annotations[SignatureAnnotation])
		if err != nil || len(sig) == 0 {
			l.rejected(FormatLegacy, source, reject(Malformed, "no base64 signature in the %s annotation", SignatureAnnotation))
			continue
		}
		payload, r, err := readBlob(img, layer)
		if err != nil {
			return fmt.Errorf("read the legacy signature %s: %w", source, err)
		}
		if r == nil {
			r = parseSimpleSigning(payload, l.want)
		}
		if r == nil {
			r = l.checkLegacy(source, payload, sig)
		}
		if r != nil {
			l.rejected(FormatLegacy, source, r)
			continue
		}
		return nil // verified
	}
	return nil
}

func (l *lookup) checkLegacy(source string, payload, sig []byte) *rejection {
	for _, k := range l.keys {
		if k.legacy.VerifySignature(bytes.NewReader(sig), bytes.NewReader(payload)) == nil {
			l.verified(FormatLegacy, source, k.file)
			return nil
		}
	}
	return reject(WrongKey, "no key of the policy verifies its signature (a legacy signature names no key); tried %s", l.keyNames())
}

// readBlob reads one layer of img, at most maxBlobSize; go-containerregistry
// checks that the content matches its digest.
func readBlob(img v1.Image, d v1.Descriptor) ([]byte, *rejection, error) {
	if d.Size > maxBlobSize {
		return nil, reject(Malformed, "its %d bytes exceed the %d a signature may have", d.Size, maxBlobSize), nil
	}
	layer, err := img.LayerByDigest(d.Digest)
	if err != nil {
		return nil, reject(Malformed, "layer %s: %v", d.Digest, err), nil
	}
	rc, err := layer.Compressed()
	if err != nil {
		if notFound(err) {
			return nil, reject(Malformed, "its blob %s is not found", d.Digest), nil
		}
		return nil, nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, maxBlobSize+1))
	if err != nil {
		var terr *transport.Error
		if errors.As(err, &terr) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return nil, nil, err
		}
		// A content that does not hash to its digest, a short read.
		return nil, reject(Malformed, "its blob %s: %v", d.Digest, err), nil
	}
	if len(data) > maxBlobSize {
		return nil, reject(Malformed, "its blob exceeds the %d bytes a signature may have", maxBlobSize), nil
	}
	return data, nil, nil
}

func notFound(err error) bool {
	var terr *transport.Error
	return errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound
}
