package verify

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/test/support/distribution"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
	"github.com/image-refresh/image-refresh/test/support/testsign"
)

// The tests sign with keys of their own, in cosign's own formats, and push
// the signatures to a real registry (go-containerregistry's, in process):
// a Sigstore bundle as an OCI 1.1 referrer artifact (cosign v3) and a
// legacy simple-signing layer at sha256-<hex>.sig.

const (
	spdxPredicate = testsign.SPDXPredicate
	repoName      = "acme/api"
)

// signer is one key pair, and the policy key of its public half.
type signer struct{ testsign.Signer }

func newSigner(t testing.TB, file string) signer { return signer{testsign.NewSigner(t, file)} }

func (s signer) dsseBundle(t testing.TB, d name.Digest, predicateType string) []byte {
	return s.DSSEBundle(t, d, predicateType)
}

func (s signer) messageBundle(t testing.TB, manifest []byte) []byte {
	return s.MessageBundle(t, manifest)
}

func policyOf(signers ...signer) *config.VerificationPolicy {
	p := &config.VerificationPolicy{Name: "prod-keys", Repositories: []string{"127.0.0.1:*/**"}, Cosign: &config.CosignPolicy{}}
	for _, s := range signers {
		p.Cosign.PublicKeys = append(p.Cosign.PublicKeys, s.File)
		der, err := x509.MarshalPKIXPublicKey(s.PublicKey())
		if err != nil {
			panic(err)
		}
		p.Cosign.Keys = append(p.Cosign.Keys, config.PublicKey{File: s.File, DER: der})
	}
	return p
}

// fixture is a registry with one image to sign.
type fixture struct {
	t      testing.TB
	reg    *testregistry.Server // nil for Distribution
	repo   name.Repository
	opts   []remote.Option // auth and transport, for the pushes and Verify
	push   func(tag string) string
	digest name.Digest
}

// noRetries are the registry package's options: a failure is reported at
// once, not retried inside go-containerregistry.
var noRetries = []remote.Option{
	remote.WithRetryBackoff(remote.Backoff{Steps: 1}),
	remote.WithRetryStatusCodes(),
	remote.WithRetryPredicate(func(error) bool { return false }),
}

func newFixture(t testing.TB, referrersAPI bool) *fixture {
	t.Helper()
	var opts []testregistry.Option
	if referrersAPI {
		opts = append(opts, testregistry.WithReferrers())
	}
	reg := testregistry.Start(t, opts...)
	repo, err := name.NewRepository(reg.Host()+"/"+repoName, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, reg: reg, repo: repo, opts: noRetries,
		push: func(tag string) string { return reg.MustPushRandomImage(t, repoName, tag) }}
	f.digest = f.pushImage("prod")
	return f
}

// newDistributionFixture is a fixture on the CNCF Distribution registry
// (TLS, basic auth), which has no referrers API: bundles are found through
// the sha256-<hex> tag.
func newDistributionFixture(t *testing.T) *fixture {
	t.Helper()
	reg := distribution.StartWithT(t, distribution.Options{})
	repo, err := name.NewRepository(reg.Host + "/" + repoName)
	if err != nil {
		t.Fatal(err)
	}
	opts := append([]remote.Option{
		remote.WithAuth(&authn.Basic{Username: reg.User, Password: reg.Password}),
		remote.WithTransport(reg.Transport()),
	}, noRetries...)
	f := &fixture{t: t, repo: repo, opts: opts,
		push: func(tag string) string { return reg.MustPushRandomImage(t, repoName, tag) }}
	f.digest = f.pushImage("prod")
	return f
}

func (f *fixture) pushImage(tag string) name.Digest {
	f.t.Helper()
	return f.repo.Digest(f.push(tag))
}

// attachBundle pushes bundleJSON as cosign v3 does (testsign.AttachBundle).
func (f *fixture) attachBundle(subject name.Digest, bundleJSON []byte, predicateType string) {
	f.t.Helper()
	testsign.AttachBundle(f.t, subject, bundleJSON, predicateType, f.opts...)
}

func legacyPayload(d name.Digest) []byte { return testsign.LegacyPayload(d) }

// attachLegacy pushes a cosign .sig manifest for onto (testsign.AttachLegacy).
func (f *fixture) attachLegacy(onto name.Digest, s signer, payloads ...[]byte) {
	f.t.Helper()
	s.AttachLegacy(f.t, onto, f.opts, payloads...)
}

func (f *fixture) verify(p *config.VerificationPolicy) (Verdict, error) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return Verify(ctx, f.digest, p, f.opts...)
}

// modes runs a test against a registry with the referrers API and one
// without it (the sha256-<hex> tag fallback).
func modes(t *testing.T, run func(t *testing.T, f *fixture)) {
	for _, m := range []struct {
		name string
		api  bool
	}{{"referrers API", true}, {"tag fallback", false}} {
		t.Run(m.name, func(t *testing.T) {
			f := newFixture(t, m.api)
			run(t, f)
			// Prove which way the bundles were found.
			fallback := "/manifests/" + strings.Replace(f.digest.DigestStr(), ":", "-", 1)
			n := 0
			for _, r := range f.reg.Requests() {
				if r.Method == http.MethodGet && strings.HasSuffix(r.Path, fallback) {
					n++
				}
			}
			if m.api && n > 0 {
				t.Errorf("with the referrers API, the fallback tag was read %d times", n)
			}
			if !m.api && n == 0 {
				t.Errorf("without the referrers API, the fallback tag was never read")
			}
		})
	}
}

func wantVerified(t *testing.T, v Verdict, err error, format Format, key string) {
	t.Helper()
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if !v.Verified || v.By.Format != format || v.By.Key != key {
		t.Fatalf("want verified by a %s signature with %s, got %s", format, key, v)
	}
}

func wantRejected(t *testing.T, v Verdict, err error, format Format, reason Reason, detail string) {
	t.Helper()
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if v.Verified {
		t.Fatalf("want unverified, got %s", v)
	}
	for _, s := range v.Rejected {
		if s.Format == format && s.Reason == reason && strings.Contains(s.Detail, detail) {
			if !strings.Contains(v.String(), string(reason)) {
				t.Errorf("the verdict's line does not say %s: %s", reason, v)
			}
			return
		}
	}
	t.Fatalf("want a %s signature rejected as %s (%q), got %s", format, reason, detail, v)
}

func TestVerify_V1_ABundleSignedWithThePolicysKeyVerifies(t *testing.T) {
	modes(t, func(t *testing.T, f *fixture) {
		key := newSigner(t, "cosign.pub")
		f.attachBundle(f.digest, key.dsseBundle(t, f.digest, SignPredicateType), SignPredicateType)
		v, err := f.verify(policyOf(key))
		wantVerified(t, v, err, FormatBundle, "cosign.pub")
		if !strings.HasPrefix(v.By.Source, "referrer sha256:") {
			t.Errorf("want the referrer named, got %q", v.By.Source)
		}
	})
}

func TestVerify_V1_AMessageSignatureBundleOverTheManifestVerifies(t *testing.T) {
	modes(t, func(t *testing.T, f *fixture) {
		key := newSigner(t, "cosign.pub")
		img, err := remote.Image(f.digest, f.opts...)
		if err != nil {
			t.Fatal(err)
		}
		manifest, _ := img.RawManifest()
		f.attachBundle(f.digest, key.messageBundle(t, manifest), SignPredicateType)
		v, err := f.verify(policyOf(key))
		wantVerified(t, v, err, FormatBundle, "cosign.pub")
	})
}

func TestVerify_V1_ALegacySignatureWithThePolicysKeyVerifies(t *testing.T) {
	f := newFixture(t, false)
	key := newSigner(t, "cosign.pub")
	f.attachLegacy(f.digest, key, legacyPayload(f.digest))
	v, err := f.verify(policyOf(key))
	wantVerified(t, v, err, FormatLegacy, "cosign.pub")
	if want := strings.Replace(f.digest.DigestStr(), ":", "-", 1) + ".sig layer 0"; v.By.Source != want {
		t.Errorf("want the source %q, got %q", want, v.By.Source)
	}
}

func TestVerify_V1_ASignatureWithTheSecondRotatedKeyVerifies(t *testing.T) {
	modes(t, func(t *testing.T, f *fixture) {
		old, rotated := newSigner(t, "old.pub"), newSigner(t, "new.pub")
		f.attachBundle(f.digest, rotated.dsseBundle(t, f.digest, SignPredicateType), SignPredicateType)
		v, err := f.verify(policyOf(old, rotated))
		wantVerified(t, v, err, FormatBundle, "new.pub")
	})
	t.Run("legacy", func(t *testing.T) {
		f := newFixture(t, false)
		old, rotated := newSigner(t, "old.pub"), newSigner(t, "new.pub")
		f.attachLegacy(f.digest, rotated, legacyPayload(f.digest))
		v, err := f.verify(policyOf(old, rotated))
		wantVerified(t, v, err, FormatLegacy, "new.pub")
	})
}

func TestVerify_V1_AnUnsignedDigestIsUnverifiedWithNoSignatureFound(t *testing.T) {
	modes(t, func(t *testing.T, f *fixture) {
		// Another digest of the repository is signed: not this one.
		key := newSigner(t, "cosign.pub")
		other := f.pushImage("other")
		f.attachBundle(other, key.dsseBundle(t, other, SignPredicateType), SignPredicateType)
		f.attachLegacy(other, key, legacyPayload(other))
		v, err := f.verify(policyOf(key))
		if err != nil {
			t.Fatal(err)
		}
		if v.Verified || len(v.Rejected) != 0 {
			t.Fatalf("want unverified with nothing found, got %s", v)
		}
		if !strings.Contains(v.String(), "no signature found") || !strings.Contains(v.String(), f.digest.String()) {
			t.Errorf("the verdict's line should name the digest and say no signature was found: %s", v)
		}
	})
}

func TestVerify_V1_ASignatureCopiedOntoAnotherDigestIsRejectedAsBoundToAnotherDigest(t *testing.T) {
	modes(t, func(t *testing.T, f *fixture) {
		key := newSigner(t, "cosign.pub")
		signed := f.pushImage("signed")
		// The bundle signed for another digest, attached to this one.
		f.attachBundle(f.digest, key.dsseBundle(t, signed, SignPredicateType), SignPredicateType)
		v, err := f.verify(policyOf(key))
		wantRejected(t, v, err, FormatBundle, OtherDigest, signed.DigestStr()[len("sha256:"):])
	})
	t.Run("legacy", func(t *testing.T) {
		f := newFixture(t, false)
		key := newSigner(t, "cosign.pub")
		signed := f.pushImage("signed")
		// The .sig of another digest, copied to this digest's .sig tag.
		f.attachLegacy(f.digest, key, legacyPayload(signed))
		v, err := f.verify(policyOf(key))
		wantRejected(t, v, err, FormatLegacy, OtherDigest, signed.DigestStr())
	})
}

func TestVerify_V1_AnSBOMOnlyAttestationIsRejectedAsNotASignature(t *testing.T) {
	modes(t, func(t *testing.T, f *fixture) {
		key := newSigner(t, "cosign.pub")
		// Signed by the policy's key and bound to this digest: cosign v3
		// would accept it.
		f.attachBundle(f.digest, key.dsseBundle(t, f.digest, spdxPredicate), spdxPredicate)
		v, err := f.verify(policyOf(key))
		wantRejected(t, v, err, FormatBundle, NotASignature, "SBOM")
	})
	t.Run("without the annotation, read from the statement", func(t *testing.T) {
		f := newFixture(t, true)
		key := newSigner(t, "cosign.pub")
		// The annotation lies; the signed statement tells.
		f.attachBundle(f.digest, key.dsseBundle(t, f.digest, spdxPredicate), SignPredicateType)
		v, err := f.verify(policyOf(key))
		wantRejected(t, v, err, FormatBundle, NotASignature, "SBOM attestation (SPDX")
	})
}

func TestVerify_V1_ASignatureWithAnotherKeyIsRejectedAsWrongKey(t *testing.T) {
	modes(t, func(t *testing.T, f *fixture) {
		key, stranger := newSigner(t, "cosign.pub"), newSigner(t, "stranger.pub")
		f.attachBundle(f.digest, stranger.dsseBundle(t, f.digest, SignPredicateType), SignPredicateType)
		v, err := f.verify(policyOf(key))
		wantRejected(t, v, err, FormatBundle, WrongKey, "cosign.pub")
	})
	t.Run("legacy", func(t *testing.T) {
		f := newFixture(t, false)
		key, stranger := newSigner(t, "cosign.pub"), newSigner(t, "stranger.pub")
		f.attachLegacy(f.digest, stranger, legacyPayload(f.digest))
		v, err := f.verify(policyOf(key))
		wantRejected(t, v, err, FormatLegacy, WrongKey, "no key of the policy")
	})
}

func TestVerify_V1_EachRejectedSignatureIsListedAndALegacySignatureBesideBundlesIsNotLookedAt(t *testing.T) {
	f := newFixture(t, true)
	key, stranger := newSigner(t, "cosign.pub"), newSigner(t, "stranger.pub")
	f.attachBundle(f.digest, key.dsseBundle(t, f.digest, spdxPredicate), spdxPredicate)
	f.attachBundle(f.digest, stranger.dsseBundle(t, f.digest, SignPredicateType), SignPredicateType)
	v, err := f.verify(policyOf(key))
	if err != nil {
		t.Fatal(err)
	}
	if v.Verified || len(v.Rejected) != 2 {
		t.Fatalf("want two rejected bundles, got %s", v)
	}
	// A legacy signature with the key does not count beside bundles: the
	// digest is judged by its bundles, as cosign verify judges it (it does
	// not fall back to .sig when a bundle exists). The same .sig verifies
	// a digest without bundles (TestVerify_V1_ALegacySignatureWithThePolicysKeyVerifies).
	f.attachLegacy(f.digest, key, legacyPayload(f.digest))
	v, err = f.verify(policyOf(key))
	wantRejected(t, v, err, FormatLegacy, BesideBundle, "only bundles count")
	if len(v.Rejected) != 3 {
		t.Errorf("want the two rejected bundles and the .sig not looked at, got %s", v)
	}
	// The good bundle verifies it, the .sig beside it changes nothing.
	f.attachBundle(f.digest, key.dsseBundle(t, f.digest, SignPredicateType), SignPredicateType)
	v, err = f.verify(policyOf(key))
	wantVerified(t, v, err, FormatBundle, "cosign.pub")
}

func TestVerify_V1_ARegistryErrorDuringLookupIsAnErrorNotAVerdict(t *testing.T) {
	tests := []struct {
		name  string
		api   bool
		fault testregistry.Fault
	}{
		{"a 5xx from the referrers API", true, testregistry.Fault{PathContains: "/referrers/", Status: http.StatusInternalServerError}},
		{"a 5xx from the referrers tag", false, testregistry.Fault{PathContains: "/manifests/sha256-", Status: http.StatusServiceUnavailable}},
		{"a 5xx from the legacy .sig tag", true, testregistry.Fault{PathContains: ".sig", Status: http.StatusBadGateway}},
		{"a 401 from the referrers API", true, testregistry.Fault{PathContains: "/referrers/", Status: http.StatusUnauthorized}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.api)
			key := newSigner(t, "cosign.pub")
			f.reg.SetFault(tt.fault)
			v, err := f.verify(policyOf(key))
			if err == nil {
				t.Fatalf("want an error, got the verdict %s", v)
			}
			if v.Verified || len(v.Rejected) != 0 {
				t.Errorf("want no verdict beside the error, got %s", v)
			}
			if n := f.reg.Count(http.MethodGet, tt.fault.PathContains); n == 0 {
				t.Errorf("the faulted path %q was never asked: the test did not test", tt.fault.PathContains)
			}
			t.Log(err)
		})
	}
	t.Run("a timeout", func(t *testing.T) {
		f := newFixture(t, true)
		f.reg.SetFault(testregistry.Fault{PathContains: "/referrers/", Hang: true})
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		v, err := Verify(ctx, f.digest, policyOf(newSigner(t, "cosign.pub")), f.opts...)
		if err == nil {
			t.Fatalf("want an error, got the verdict %s", v)
		}
	})
}

func TestVerify_V1_APolicyWithoutLoadedKeysIsAnError(t *testing.T) {
	f := newFixture(t, true)
	p := &config.VerificationPolicy{Name: "p", Cosign: &config.CosignPolicy{PublicKeys: []string{"cosign.pub"}}}
	if _, err := f.verify(p); err == nil || !strings.Contains(err.Error(), "no public keys loaded") {
		t.Fatalf("want an error about keys not loaded, got %v", err)
	}
}

func TestVerdict_V1_StringNamesTheDigestAndEachReason(t *testing.T) {
	v := Verdict{Digest: "r/a@sha256:ab", Policy: "p", Rejected: []Signature{
		{Format: FormatBundle, Source: "referrer sha256:01", Reason: NotASignature, Detail: "an SBOM"},
		{Format: FormatLegacy, Source: "sha256-ab.sig layer 0", Reason: WrongKey, Detail: "no key"},
	}}
	want := "r/a@sha256:ab unverified by policy p: 2 signature(s) rejected: " +
		"bundle signature referrer sha256:01: not-a-signature (an SBOM); " +
		"legacy signature sha256-ab.sig layer 0: wrong-key (no key)"
	if got := v.String(); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestVerify_V1_DistributionWithoutTheReferrersAPIFindsBundlesByTagAndLegacySignatures(t *testing.T) {
	f := newDistributionFixture(t)
	key := newSigner(t, "cosign.pub")

	v, err := f.verify(policyOf(key))
	if err != nil || v.Verified || len(v.Rejected) != 0 {
		t.Fatalf("unsigned: want unverified with nothing found, got %s, %v", v, err)
	}

	f.attachBundle(f.digest, key.dsseBundle(t, f.digest, spdxPredicate), spdxPredicate)
	v, err = f.verify(policyOf(key))
	wantRejected(t, v, err, FormatBundle, NotASignature, "SBOM")

	f.attachLegacy(f.digest, key, legacyPayload(f.digest))
	v, err = f.verify(policyOf(key))
	wantRejected(t, v, err, FormatLegacy, BesideBundle, "only bundles count")

	f.attachBundle(f.digest, key.dsseBundle(t, f.digest, SignPredicateType), SignPredicateType)
	v, err = f.verify(policyOf(key))
	wantVerified(t, v, err, FormatBundle, "cosign.pub")

	g := newDistributionFixture(t)
	g.attachLegacy(g.digest, key, legacyPayload(g.pushImage("other")))
	v, err = g.verify(policyOf(key))
	wantRejected(t, v, err, FormatLegacy, OtherDigest, "sha256:")
	g.attachLegacy(g.digest, key, legacyPayload(g.digest))
	v, err = g.verify(policyOf(key))
	wantVerified(t, v, err, FormatLegacy, "cosign.pub")
}

func TestVerify_V1_ALookupCostsAFewGETsAndNoWrite(t *testing.T) {
	count := func(f *fixture) (gets, other int) {
		for _, r := range f.reg.Requests() {
			switch {
			case r.Method == http.MethodGet && r.Path == "/v2/":
			case r.Method == http.MethodGet:
				gets++
			default:
				other++
			}
		}
		return gets, other
	}
	key := newSigner(t, "cosign.pub")
	t.Run("unsigned, without the referrers API: referrers, its tag, the .sig tag", func(t *testing.T) {
		f := newFixture(t, false)
		f.reg.ResetRequests()
		if v, err := f.verify(policyOf(key)); err != nil || v.Verified {
			t.Fatalf("got %s, %v", v, err)
		}
		if gets, other := count(f); gets != 3 || other != 0 {
			t.Errorf("want 3 GETs and nothing else, got %d GETs and %d other requests: %v", gets, other, f.reg.Requests())
		}
	})
	t.Run("a bundle with the referrers API: referrers, the artifact's manifest, its bundle blob", func(t *testing.T) {
		f := newFixture(t, true)
		f.attachBundle(f.digest, key.dsseBundle(t, f.digest, SignPredicateType), SignPredicateType)
		f.reg.ResetRequests()
		if v, err := f.verify(policyOf(key)); err != nil || !v.Verified {
			t.Fatalf("got %s, %v", v, err)
		}
		if gets, other := count(f); gets != 3 || other != 0 {
			t.Errorf("want 3 GETs and nothing else, got %d GETs and %d other requests: %v", gets, other, f.reg.Requests())
		}
	})
}

// keylessPolicy trusts identities of a virtual Sigstore's root.
func keylessPolicy(t testing.TB, s *testsign.Sigstore, ids ...config.KeylessIdentity) *config.VerificationPolicy {
	t.Helper()
	data, err := os.ReadFile(s.WriteTrustedRoot(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	return &config.VerificationPolicy{Name: "ci", Repositories: []string{"127.0.0.1:*/**"},
		Cosign: &config.CosignPolicy{Keyless: ids, TrustedRoot: "trusted_root.json", TrustedRootJSON: data}}
}

const ciIssuer = "https://token.actions.example"

func TestVerify_V1_AKeylessSignatureOfTheRightIdentityVerifies(t *testing.T) {
	modes(t, func(t *testing.T, f *fixture) {
		s := testsign.NewSigstore(t)
		s.SignKeyless(t, f.digest, ciIssuer, "https://ci.example/acme/api/.github/workflows/release.yml@refs/heads/main", f.opts...)
		for name, id := range map[string]config.KeylessIdentity{
			"exact subject":  {Issuer: ciIssuer, Subject: "https://ci.example/acme/api/.github/workflows/release.yml@refs/heads/main"},
			"subject regexp": {Issuer: ciIssuer, SubjectRegExp: `^https://ci\.example/acme/.*@refs/heads/main$`},
		} {
			t.Run(name, func(t *testing.T) {
				v, err := f.verify(keylessPolicy(t, s, id))
				if err != nil || !v.Verified || !strings.Contains(v.By.Key, "keyless") {
					t.Fatalf("want verified keyless, got %s, %v", v, err)
				}
			})
		}
	})
}

func TestVerify_V1_AKeylessSignatureIsRejectedForAWrongIdentityAnotherRootOrAKeyedPolicy(t *testing.T) {
	f := newFixture(t, true)
	s := testsign.NewSigstore(t)
	s.SignKeyless(t, f.digest, ciIssuer, "mallory@example.com", f.opts...)

	v, err := f.verify(keylessPolicy(t, s, config.KeylessIdentity{Issuer: ciIssuer, Subject: "release@example.com"}))
	wantRejected(t, v, err, FormatBundle, WrongIdentity, "mallory@example.com")
	v, err = f.verify(keylessPolicy(t, s, config.KeylessIdentity{Issuer: "https://other-issuer.example", Subject: "mallory@example.com"}))
	wantRejected(t, v, err, FormatBundle, WrongIdentity, "")

	other := testsign.NewSigstore(t)
	v, err = f.verify(keylessPolicy(t, other, config.KeylessIdentity{Issuer: ciIssuer, Subject: "mallory@example.com"}))
	wantRejected(t, v, err, FormatBundle, Untrusted, "")

	v, err = f.verify(policyOf(newSigner(t, "cosign.pub")))
	wantRejected(t, v, err, FormatBundle, WrongKey, "keyless")
}

func TestVerify_V1_AKeyedSignatureIsRejectedByAKeylessOnlyPolicy(t *testing.T) {
	f := newFixture(t, true)
	key := newSigner(t, "cosign.pub")
	key.SignBundle(t, f.digest, f.opts...)
	s := testsign.NewSigstore(t)
	v, err := f.verify(keylessPolicy(t, s, config.KeylessIdentity{Issuer: ciIssuer, Subject: "release@example.com"}))
	wantRejected(t, v, err, FormatBundle, WrongKey, "keyless identities only")
}

func TestVerify_V1_ThePublicGoodRootIsTheKeylessDefault(t *testing.T) {
	f := newFixture(t, true)
	s := testsign.NewSigstore(t)
	s.SignKeyless(t, f.digest, ciIssuer, "release@example.com", f.opts...)
	p := &config.VerificationPolicy{Name: "public", Repositories: []string{"127.0.0.1:*/**"},
		Cosign: &config.CosignPolicy{Keyless: []config.KeylessIdentity{{Issuer: ciIssuer, Subject: "release@example.com"}}}}
	// The virtual Sigstore's certificate does not chain to the public-good
	// Fulcio: proof that the default root, not the bundle, is trusted.
	v, err := f.verify(p)
	wantRejected(t, v, err, FormatBundle, Untrusted, "")
}

func TestVerify_V1_AKeylessLegacySignatureIsRejectedAsUnsupported(t *testing.T) {
	f := newFixture(t, false)
	key := newSigner(t, "cosign.pub")
	key.AttachLegacyWith(t, f.digest, f.opts, map[string]string{"dev.sigstore.cosign/certificate": "-----BEGIN CERTIFICATE-----"}, legacyPayload(f.digest))
	v, err := f.verify(policyOf(key))
	wantRejected(t, v, err, FormatLegacy, Unsupported, "cosign v3")
}

func notationPolicy(n *testsign.Notary, t testing.TB) *config.VerificationPolicy {
	t.Helper()
	certs, err := os.ReadFile(n.WriteRoot(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(certs)
	if block == nil {
		t.Fatal("the notary's CA is not PEM")
	}
	return &config.VerificationPolicy{Name: "notary", Repositories: []string{"127.0.0.1:*/**"},
		Notation: &config.NotationPolicy{Certificates: []string{"notation-ca.pem"}, Certs: [][]byte{block.Bytes}}}
}

func TestVerify_V1_ANotationSignatureChainingToTheTrustStoreVerifies(t *testing.T) {
	modes(t, func(t *testing.T, f *fixture) {
		n := testsign.NewNotary()
		v, err := f.verify(notationPolicy(n, t))
		if err != nil || v.Verified || len(v.Rejected) != 0 {
			t.Fatalf("unsigned: want unverified with nothing found, got %s, %v", v, err)
		}
		// A cosign signature does not count under a Notation policy.
		newSigner(t, "cosign.pub").SignBundle(t, f.digest, f.opts...)
		if v, err := f.verify(notationPolicy(n, t)); err != nil || v.Verified {
			t.Fatalf("a cosign bundle under a Notation policy: got %s, %v", v, err)
		}
		n.Sign(t, f.digest, f.digest, f.opts...)
		v, err = f.verify(notationPolicy(n, t))
		if err != nil || !v.Verified || v.By.Format != FormatNotation {
			t.Fatalf("want verified by a Notation signature, got %s, %v", v, err)
		}
	})
}

func TestVerify_V1_ANotationSignatureOfAnotherCAOrAnotherDigestIsRejected(t *testing.T) {
	f := newFixture(t, true)
	trusted := testsign.NewNotary()
	testsign.NewOtherNotary().Sign(t, f.digest, f.digest, f.opts...)
	v, err := f.verify(notationPolicy(trusted, t))
	wantRejected(t, v, err, FormatNotation, Untrusted, "")

	g := newFixture(t, true)
	other := g.pushImage("other")
	trusted.Sign(t, g.digest, other, g.opts...) // a signature of other, attached to g.digest
	v, err = g.verify(notationPolicy(trusted, t))
	wantRejected(t, v, err, FormatNotation, OtherDigest, "")
}

func TestVerify_V1_NotationRevocationIsCheckedOnlyWhenThePolicyTurnsItOn(t *testing.T) {
	f := newFixture(t, true)
	ca := testsign.NewNotaryCA(t)
	signer := ca.Issue(t)
	signer.Sign(t, f.digest, f.digest, f.opts...)
	policy := func(revocation bool) *config.VerificationPolicy {
		p := notationPolicy(signer, t)
		p.Notation.Revocation = revocation
		return p
	}

	v, err := f.verify(policy(true))
	if err != nil || !v.Verified || ca.Asked() == 0 {
		t.Fatalf("revocation on, certificate good: got %s, %v, %d OCSP requests; want verified after asking the responder", v, err, ca.Asked())
	}
	ca.Revoke(signer)
	v, err = f.verify(policy(true))
	wantRejected(t, v, err, FormatNotation, Untrusted, "revoked")

	asked := ca.Asked()
	v, err = f.verify(policy(false))
	if err != nil || !v.Verified || ca.Asked() != asked {
		t.Errorf("revocation off: got %s, %v, %d more OCSP requests; want verified without asking", v, err, ca.Asked()-asked)
	}
}

func TestVerify_V1_DistributionCarriesKeylessAndNotationSignaturesByTheTagFallback(t *testing.T) {
	f := newDistributionFixture(t)
	s := testsign.NewSigstore(t)
	s.SignKeyless(t, f.digest, ciIssuer, "release@example.com", f.opts...)
	v, err := f.verify(keylessPolicy(t, s, config.KeylessIdentity{Issuer: ciIssuer, Subject: "release@example.com"}))
	if err != nil || !v.Verified || !strings.Contains(v.By.Key, "keyless") {
		t.Errorf("keyless on Distribution: got %s, %v", v, err)
	}
	g := newDistributionFixture(t)
	n := testsign.NewNotary()
	n.Sign(t, g.digest, g.digest, g.opts...)
	v, err = g.verify(notationPolicy(n, t))
	if err != nil || !v.Verified || v.By.Format != FormatNotation {
		t.Errorf("Notation on Distribution: got %s, %v", v, err)
	}
}
