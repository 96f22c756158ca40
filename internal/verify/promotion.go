package verify

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	protocommon "github.com/sigstore/protobuf-specs/gen/pb-go/common/v1"
	"github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/sign"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"

	"github.com/image-refresh/image-refresh/internal/config"
)

// P2: promotion attestations. The installation that runs a group which
// publishes (config.Promotion.Publish) signs, once a digest soaked there,
// an in-toto statement about the digest of the project's predicate type
// (config.PromotionPredicateType) whose predicate names the installation,
// the group, the soak and the time, as a Sigstore bundle (sigstore-go),
// and attaches it to the digest as cosign v3 attaches an attestation: an
// OCI artifact among its referrers (go-containerregistry writes the
// sha256-<hex> tag's index for a registry without the referrers API). A
// group in another cluster (config.Promotion.AttestedBy) reads it with
// V5's reader under V1's trust rules (VerifyPromotion).

// PromotionPredicate is the predicate of a promotion attestation.
type PromotionPredicate struct {
	// Installation names the installation that ran the digest (the
	// config's installation); a follower's attestedBy.name.
	Installation string `json:"installation"`
	// Group and Image name the group and its image that ran it.
	Group string `json:"group"`
	Image string `json:"image"`
	// Repository is the image's repository, as the publisher's config
	// names it.
	Repository string `json:"repository"`
	// Soak is how long the group ran the digest settled and healthy
	// (promotion.publish.soak), as a Go duration ("30m0s"), and Since
	// when it began to.
	Soak  string    `json:"soak"`
	Since time.Time `json:"soakedSince"`
	// Time is when the soak ended and the attestation was made.
	Time time.Time `json:"time"`
}

// Promoter signs and publishes promotion attestations with the key of
// config.PromotionSigning.
type Promoter struct {
	kp   sign.Keypair
	hint string
}

// NewPromoter parses the signing key Load read (a PEM private key; an
// encrypted one, such as cosign's cosign.key, with its password).
func NewPromoter(s *config.PromotionSigning) (*Promoter, error) {
	if s == nil || len(s.Key) == 0 {
		return nil, errors.New("promotionSigning: no key loaded (config.Load reads keyFile)")
	}
	var pass cryptoutils.PassFunc
	if s.Password != nil {
		pw := s.Password
		pass = func(bool) ([]byte, error) { return pw, nil }
	} else {
		// cosign's encrypted key with an empty password (as `cosign
		// generate-key-pair` writes it with COSIGN_PASSWORD="").
		pass = func(bool) ([]byte, error) { return []byte{}, nil }
	}
	priv, err := cryptoutils.UnmarshalPEMToPrivateKey(s.Key, pass)
	if err != nil {
		return nil, fmt.Errorf("%s: not a private key this installation can sign with: %w", s.KeyFile, err)
	}
	signer, ok := priv.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: a %T cannot sign", s.KeyFile, priv)
	}
	alg, err := signature.GetDefaultAlgorithmDetails(signer.Public())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.KeyFile, err)
	}
	der, err := x509.MarshalPKIXPublicKey(signer.Public())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.KeyFile, err)
	}
	sum := sha256.Sum256(der)
	hint := base64.StdEncoding.EncodeToString(sum[:])
	return &Promoter{kp: &keypair{signer: signer, alg: alg, hint: []byte(hint)}, hint: hint}, nil
}

// CheckPromotion is CheckTrust's part for P2: the signing key parses, and
// each follower's trusted keys and trusted root do.
func CheckPromotion(c *config.Config, report func(named, plain, msg string)) {
	if s := c.PromotionSigning; s != nil && len(s.Key) > 0 {
		if _, err := NewPromoter(s); err != nil {
			report("promotionSigning.keyFile", "promotionSigning.keyFile", err.Error())
		}
	}
	for i, g := range c.Groups {
		if g.Promotion == nil || g.Promotion.AttestedBy == nil || g.Promotion.AttestedBy.Policy == nil {
			continue
		}
		p := g.Promotion.AttestedBy.Policy
		if _, _, err := newTrust(p); err != nil {
			path := fmt.Sprintf("groups[%d].promotion.attestedBy.cosign", i)
			report(path, path, err.Error())
		}
		if _, err := requirements(p); err != nil {
			path := fmt.Sprintf("groups[%d].promotion.attestedBy.name", i)
			report(path, path, err.Error())
		}
	}
}

// KeyHint is the signing key's id as a bundle names it: base64 of the
// SHA-256 of its PKIX DER (as cosign's).
func (p *Promoter) KeyHint() string { return p.hint }

// Bundle signs a promotion statement about subject as a Sigstore bundle
// (JSON): a DSSE envelope of an in-toto statement, signed by sigstore-go.
func (p *Promoter) Bundle(subject name.Digest, pred PromotionPredicate) ([]byte, error) {
	h, err := v1.NewHash(subject.DigestStr())
	if err != nil {
		return nil, err
	}
	st := map[string]any{
		"_type":         "https://in-toto.io/Statement/v1",
		"subject":       []any{map[string]any{"name": subject.Context().Name(), "digest": map[string]string{h.Algorithm: h.Hex}}},
		"predicateType": config.PromotionPredicateType,
		"predicate":     pred,
	}
	data, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	pb, err := sign.Bundle(&sign.DSSEData{Data: data, PayloadType: InTotoPayloadType}, p.kp, sign.BundleOptions{})
	if err != nil {
		return nil, fmt.Errorf("sign the promotion attestation of %s: %w", subject, err)
	}
	return (&bundle.Bundle{Bundle: pb}).MarshalJSON()
}

// Publish signs a promotion statement about subject and attaches it as
// cosign v3 attaches an attestation: an OCI 1.1 artifact of the bundle's
// media type, an empty config, the bundle as its one layer, subject as its
// subject. It returns the artifact's digest. opts reach the registry (auth
// with push rights on subject's repository, transport).
func (p *Promoter) Publish(ctx context.Context, subject name.Digest, pred PromotionPredicate, opts ...remote.Option) (v1.Hash, error) {
	data, err := p.Bundle(subject, pred)
	if err != nil {
		return v1.Hash{}, err
	}
	opts = append(opts[:len(opts):len(opts)], remote.WithContext(ctx))
	repo := subject.Context()
	subj, err := remote.Head(subject, opts...)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("read %s: %w", subject, err)
	}
	cfg := static.NewLayer([]byte("{}"), emptyMediaType)
	layer := static.NewLayer(data, types.MediaType(BundleMediaType))
	for _, l := range []v1.Layer{cfg, layer} {
		if err := remote.WriteLayer(repo, l, opts...); err != nil {
			return v1.Hash{}, fmt.Errorf("push the promotion attestation of %s: %w", subject, err)
		}
	}
	desc := func(l v1.Layer) v1.Descriptor {
		d, _ := l.Digest()
		n, _ := l.Size()
		mt, _ := l.MediaType()
		return v1.Descriptor{MediaType: mt, Digest: d, Size: n}
	}
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  BundleMediaType,
		Config:        desc(cfg),
		Layers:        []v1.Descriptor{desc(layer)},
		Subject:       &v1.Descriptor{MediaType: subj.MediaType, Digest: subj.Digest, Size: subj.Size},
		Annotations: map[string]string{
			"dev.sigstore.bundle.content":      "dsse-envelope",
			BundlePredicateAnnotation:          config.PromotionPredicateType,
			"org.opencontainers.image.created": pred.Time.UTC().Format(time.RFC3339),
		},
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return v1.Hash{}, err
	}
	h, _, err := v1.SHA256(strings.NewReader(string(raw)))
	if err != nil {
		return v1.Hash{}, err
	}
	if err := remote.Put(repo.Digest(h.String()), rawManifest{raw: raw, mt: types.OCIManifestSchema1}, opts...); err != nil {
		return v1.Hash{}, fmt.Errorf("push the promotion attestation of %s: %w", subject, err)
	}
	return h, nil
}

type rawManifest struct {
	raw []byte
	mt  types.MediaType
}

func (m rawManifest) RawManifest() ([]byte, error)        { return m.raw, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return m.mt, nil }

// keypair is sigstore-go's signing interface over a key of a file: what
// its EphemeralKeypair does with a key it made.
type keypair struct {
	signer crypto.Signer
	alg    signature.AlgorithmDetails
	hint   []byte
}

func (k *keypair) GetHashAlgorithm() protocommon.HashAlgorithm { return k.alg.GetProtoHashType() }
func (k *keypair) GetSigningAlgorithm() protocommon.PublicKeyDetails {
	return k.alg.GetSignatureAlgorithm()
}
func (k *keypair) GetHint() []byte                { return k.hint }
func (k *keypair) GetPublicKey() crypto.PublicKey { return k.signer.Public() }
func (k *keypair) GetKeyAlgorithm() string {
	switch k.alg.GetKeyType() {
	case signature.ECDSA:
		return "ECDSA"
	case signature.RSA:
		return "RSA"
	case signature.ED25519:
		return "ED25519"
	}
	return ""
}
func (k *keypair) GetPublicKeyPem() (string, error) {
	b, err := cryptoutils.MarshalPublicKeyToPEM(k.signer.Public())
	return string(b), err
}

// SignData signs data's digest (the whole data for pure Ed25519), as
// sigstore-go's EphemeralKeypair does.
func (k *keypair) SignData(_ context.Context, data []byte) ([]byte, []byte, error) {
	hf := k.alg.GetHashType()
	toSign := data
	if hf != crypto.Hash(0) {
		h := hf.New()
		h.Write(data)
		toSign = h.Sum(nil)
	}
	sig, err := k.signer.Sign(rand.Reader, toSign, hf)
	if err != nil {
		return nil, nil, err
	}
	return sig, toSign, nil
}

// PromotionVerdict is what a follower found of a digest's promotion
// attestation (P2).
type PromotionVerdict struct {
	// Digest is "repository@sha256:…"; Signer the attestedBy name.
	Digest string
	Signer string
	// Attestation is V5's answer for the promotion predicate type under
	// the signer's trust and the condition that the predicate names the
	// signer's installation.
	Attestation Attestation
	// Predicate is the satisfied attestation's predicate.
	Predicate PromotionPredicate
}

// Attested reports whether a valid promotion attestation was found.
func (v PromotionVerdict) Attested() bool { return v.Attestation.Satisfied }

// String is the verdict in one line.
func (v PromotionVerdict) String() string {
	a := v.Attestation
	switch {
	case a.Satisfied:
		return fmt.Sprintf("%s: promotion attestation of %s (group %s, soaked %s, at %s) verified with %s (%s)",
			v.Digest, v.Predicate.Installation, v.Predicate.Group, v.Predicate.Soak, v.Predicate.Time.UTC().Format(time.RFC3339), a.By.Key, a.By.Source)
	case len(a.Rejected) == 0:
		return fmt.Sprintf("%s: no promotion attestation of %s found among its referrers", v.Digest, v.Signer)
	}
	parts := make([]string, len(a.Rejected))
	for i, s := range a.Rejected {
		parts[i] = fmt.Sprintf("%s %s: %s (%s)", s.Format, s.Source, s.Reason, s.Detail)
	}
	return fmt.Sprintf("%s: %d promotion attestation(s) rejected, none valid from %s: %s", v.Digest, len(a.Rejected), v.Signer, strings.Join(parts, "; "))
}

// VerifyPromotion looks for a promotion attestation of ref's digest from
// the signer of a, with V5's reader: a DSSE in-toto statement of
// config.PromotionPredicateType about the digest, signed under the
// signer's trust (V1's rules: the keys, or the keyless identities against
// the trusted root), whose predicate names the installation a.Name. The
// image's own signature is not required (that is V1's policy, if any). The
// error is a registry read that failed; a missing or rejected attestation
// is the verdict.
func VerifyPromotion(ctx context.Context, ref name.Digest, a *config.AttestedBy, opts ...remote.Option) (PromotionVerdict, error) {
	v := PromotionVerdict{Digest: ref.String()}
	if a == nil || a.Policy == nil {
		return v, errors.New("verify promotion: no signer (config validation derives it from attestedBy)")
	}
	v.Signer = a.Name
	want, err := v1.NewHash(ref.DigestStr())
	if err != nil {
		return v, fmt.Errorf("verify %s: %w", ref, err)
	}
	keys, kl, err := newTrust(a.Policy)
	if err != nil {
		return v, err
	}
	reqs, err := requirements(a.Policy)
	if err != nil || len(reqs) != 1 {
		return v, fmt.Errorf("promotion signer %s: %v", a.Name, err)
	}
	opts = append(opts[:len(opts):len(opts)], remote.WithContext(ctx))
	var verdict Verdict
	l := &lookup{ctx: ctx, ref: ref, want: want, keys: keys, keyless: kl, opts: opts, verdict: &verdict}
	if l.index, err = l.referrers(); err != nil {
		return v, err
	}
	// The bundles among the referrers, read as V1 reads them, tell
	// whether the digest has any (then only bundles count, as with cosign
	// verify-attestation); their verdict is not this one's.
	if err := l.bundles(); err != nil {
		return v, err
	}
	if v.Attestation, err = l.attestation(reqs[0]); err != nil {
		return v, err
	}
	if !v.Attestation.Satisfied {
		return v, nil
	}
	raw, err := json.Marshal(l.predicate)
	if err == nil {
		err = json.Unmarshal(raw, &v.Predicate)
	}
	if err != nil || v.Predicate.Time.IsZero() {
		why := "it has no time"
		if err != nil {
			why = err.Error()
		}
		v.Attestation.Rejected = append(v.Attestation.Rejected, Signature{Format: v.Attestation.By.Format, Source: v.Attestation.By.Source,
			Reason: Malformed, Detail: "its promotion predicate does not read: " + why})
		v.Attestation.Satisfied, v.Attestation.By = false, Signature{}
	}
	return v, nil
}
