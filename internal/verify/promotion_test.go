package verify

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/sigstore/sigstore/pkg/cryptoutils"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/test/support/cosigncli"
)

// P2: promotion attestations published by a Promoter (sigstore-go's
// bundle, go-containerregistry's push) to a real registry, and read back
// with VerifyPromotion (V5's reader) under a follower's trust, loaded as
// config.Load loads it.

// writeKeyPair writes a fresh ECDSA P-256 key pair as PEM (PKCS#8, as
// `openssl genpkey` writes it) into dir.
func writeKeyPair(t *testing.T, dir, name string) (keyFile, pubFile string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	keyFile = writeP2File(t, dir, name+".key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	pubFile = writeP2File(t, dir, name+".pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
	return keyFile, pubFile
}

// p2Config loads a config of installation that signs with keyFile
// (password: passwordFile, "" none) and whose group prod follows signer,
// trusting trusted.
func p2Config(t *testing.T, installation, keyFile, passwordFile, signer, trusted string) *config.Config {
	t.Helper()
	signing := "promotionSigning: {keyFile: " + keyFile
	if passwordFile != "" {
		signing += ", passwordFile: " + passwordFile
	}
	body := "installation: " + installation + "\n" + signing + "}\n" + `groups:
  - name: staging
    anchor: {kind: Deployment, namespace: staging, name: api}
    promotion: {publish: {soak: 30m}}
    images:
      - name: api
        repository: registry.example.com/acme/api
        tag: prod
        targets: [{kind: Deployment, namespace: staging, name: api, container: api}]
  - name: prod
    anchor: {kind: Deployment, namespace: prod, name: api}
    promotion: {attestedBy: {name: ` + signer + `, cosign: {publicKeys: [` + trusted + `]}}}
    images:
      - name: api
        repository: registry.example.com/acme/api
        tag: prod
        targets: [{kind: Deployment, namespace: prod, name: api, container: api}]
`
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(path, CheckTrust)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func attestedBy(c *config.Config) *config.AttestedBy {
	g, _ := c.Group("prod")
	return g.Promotion.AttestedBy
}

func promoterOf(t *testing.T, c *config.Config) *Promoter {
	t.Helper()
	p, err := NewPromoter(c.PromotionSigning)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var soakedAt = time.Date(2026, 12, 7, 12, 30, 0, 0, time.UTC)

func predicateOf(installation string) PromotionPredicate {
	return PromotionPredicate{Installation: installation, Group: "staging", Image: "api", Repository: "registry.example.com/acme/api",
		Soak: "30m0s", Since: soakedAt.Add(-30 * time.Minute), Time: soakedAt}
}

func (f *fixture) verifyPromotion(t *testing.T, d name.Digest, a *config.AttestedBy) PromotionVerdict {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := VerifyPromotion(ctx, d, a, f.opts...)
	if err != nil {
		t.Fatalf("VerifyPromotion: %v", err)
	}
	return v
}

func (f *fixture) publish(t *testing.T, p *Promoter, d name.Digest, pred PromotionPredicate) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.Publish(ctx, d, pred, f.opts...); err != nil {
		t.Fatalf("Publish: %v", err)
	}
}

func wantPromotionRejected(t *testing.T, v PromotionVerdict, reason Reason, detail string) {
	t.Helper()
	if v.Attested() {
		t.Fatalf("want the promotion attestation rejected (%s), got %s", reason, v)
	}
	for _, r := range v.Attestation.Rejected {
		if r.Reason == reason && strings.Contains(r.Detail, detail) {
			return
		}
	}
	t.Fatalf("want a rejection %s containing %q, got %s", reason, detail, v)
}

func TestPromotion_P2_APublishedAttestationVerifiesUnderTheSignersTrustAndCarriesItsPredicate(t *testing.T) {
	modes(t, func(t *testing.T, f *fixture) {
		dir := t.TempDir()
		key, pub := writeKeyPair(t, dir, "staging")
		c := p2Config(t, "staging", key, "", "staging", pub)
		if v := f.verifyPromotion(t, f.digest, attestedBy(c)); v.Attested() || len(v.Attestation.Rejected) != 0 ||
			!strings.Contains(v.String(), "no promotion attestation of staging found") {
			t.Fatalf("before the publication: %s, want none found", v)
		}
		f.publish(t, promoterOf(t, c), f.digest, predicateOf("staging"))
		v := f.verifyPromotion(t, f.digest, attestedBy(c))
		if !v.Attested() || v.Attestation.By.Key != pub || v.Attestation.By.Format != FormatBundle {
			t.Fatalf("want attested with %s from a bundle, got %s", pub, v)
		}
		if want := predicateOf("staging"); v.Predicate != want {
			t.Errorf("predicate = %+v, want %+v", v.Predicate, want)
		}
	})
}

// A follower trusts one installation's key and name: an attestation
// signed with another key, one naming another installation, one made for
// another digest and attached to this one, and a forged one (its
// statement changed after signing) never count, and each says why.
func TestPromotion_P2_WrongKeyOtherInstallationOtherDigestAndForgedAttestationsAreRejected(t *testing.T) {
	modes(t, func(t *testing.T, f *fixture) {
		dir := t.TempDir()
		key, pub := writeKeyPair(t, dir, "staging")
		otherKey, _ := writeKeyPair(t, dir, "mallory")
		trusted := p2Config(t, "staging", key, "", "staging", pub)
		follower := attestedBy(trusted)

		t.Run("wrong key", func(t *testing.T) {
			d := f.pushImage("wrong-key")
			f.publish(t, promoterOf(t, p2Config(t, "staging", otherKey, "", "staging", pub)), d, predicateOf("staging"))
			wantPromotionRejected(t, f.verifyPromotion(t, d, follower), WrongKey, "no key of the policy verifies it")
		})
		t.Run("another installation", func(t *testing.T) {
			d := f.pushImage("other-installation")
			f.publish(t, promoterOf(t, p2Config(t, "dev", key, "", "staging", pub)), d, predicateOf("dev"))
			wantPromotionRejected(t, f.verifyPromotion(t, d, follower), ConditionFailed, `predicate.installation == "staging"`)
		})
		t.Run("another digest", func(t *testing.T) {
			good := f.pushImage("soaked")
			d := f.pushImage("never-ran")
			b, err := promoterOf(t, trusted).Bundle(good, predicateOf("staging"))
			if err != nil {
				t.Fatal(err)
			}
			f.attachBundle(d, b, config.PromotionPredicateType)
			wantPromotionRejected(t, f.verifyPromotion(t, d, follower), OtherDigest, good.DigestStr())
		})
		// The digest modes reads: none published, none found.
		if v := f.verifyPromotion(t, f.digest, follower); v.Attested() || len(v.Attestation.Rejected) != 0 {
			t.Errorf("a digest without attestations: %s, want none found", v)
		}
		t.Run("forged", func(t *testing.T) {
			d := f.pushImage("forged")
			b, err := promoterOf(t, trusted).Bundle(d, predicateOf("staging"))
			if err != nil {
				t.Fatal(err)
			}
			f.attachBundle(d, forge(t, b, `"soak":"30m0s"`, `"soak":"720h0m0s"`), config.PromotionPredicateType)
			v := f.verifyPromotion(t, d, follower)
			wantPromotionRejected(t, v, WrongKey, "does not verify")
		})
	})
}

// forge replaces old with new in a bundle's DSSE payload, keeping its
// signature.
func forge(t *testing.T, bundleJSON []byte, old, new string) []byte {
	t.Helper()
	var b map[string]any
	if err := json.Unmarshal(bundleJSON, &b); err != nil {
		t.Fatal(err)
	}
	env := b["dsseEnvelope"].(map[string]any)
	payload, err := base64.StdEncoding.DecodeString(env["payload"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(payload), old) {
		t.Fatalf("the statement %s does not hold %s", payload, old)
	}
	env["payload"] = base64.StdEncoding.EncodeToString([]byte(strings.Replace(string(payload), old, new, 1)))
	out, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The promoter signs with the key `cosign generate-key-pair` writes
// (encrypted, with its password), and the real cosign CLI's
// verify-attestation, offline as docs/states/unverified.md runs it,
// accepts what it published with the public key, and rejects it with
// another.
func TestCosignCLI_P2_CosignVerifiesThePublishedPromotionAttestation(t *testing.T) {
	f := newFixture(t, true)
	cli := cosigncli.New(t)
	key, pub := cli.GenerateKeyPair(t, "staging")
	_, otherPub := cli.GenerateKeyPair(t, "stranger")
	password := writeP2File(t, cli.Dir, "password", []byte(cli.Password+"\n"))
	c := p2Config(t, "staging", key, password, "staging", pub)
	f.publish(t, promoterOf(t, c), f.digest, predicateOf("staging"))
	if v := f.verifyPromotion(t, f.digest, attestedBy(c)); !v.Attested() {
		t.Fatalf("image-refresh does not verify its own attestation: %s", v)
	}
	args := func(pub string) []string {
		return append(append([]string{"verify-attestation", "--key", pub, "--type", config.PromotionPredicateType}, cosignVerifyFlags...), f.digest.String())
	}
	out, err := cli.Run(args(pub)...)
	if err != nil {
		t.Fatalf("cosign verify-attestation rejects the promotion attestation:\n%s", out)
	}
	// cosign prints the envelope it verified: its statement is ours.
	statement := ""
	for _, line := range strings.Split(out, "\n") {
		var env struct{ Payload []byte }
		if json.Unmarshal([]byte(line), &env) == nil && len(env.Payload) > 0 {
			statement = string(env.Payload)
		}
	}
	for _, want := range []string{`"predicateType":"` + config.PromotionPredicateType + `"`, `"installation":"staging"`, f.digest.DigestStr()[len("sha256:"):]} {
		if !strings.Contains(statement, want) {
			t.Errorf("the statement cosign verified, %q, does not hold %s", statement, want)
		}
	}
	out, err = cli.Run(args(otherPub)...)
	if err == nil || !cosignSaysUnverified(out) {
		t.Errorf("cosign verify-attestation with another key: err %v, want its verdict:\n%s", err, out)
	}
	// A wrong password is a config error at the key, not a silent failure.
	bad := writeP2File(t, cli.Dir, "wrong-password", []byte("nope"))
	c.PromotionSigning.Password, _ = os.ReadFile(bad)
	if _, err := NewPromoter(c.PromotionSigning); err == nil || !strings.Contains(err.Error(), key) {
		t.Errorf("NewPromoter with a wrong password = %v, want an error naming %s", err, key)
	}
}

func writeP2File(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A signing key that does not parse, or an encrypted one whose password
// is wrong, stops the config's load naming promotionSigning.keyFile; the
// right password loads.
func TestCheckTrust_P2_ASigningKeyThatDoesNotParseOrDecryptIsAConfigError(t *testing.T) {
	dir := t.TempDir()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := cryptoutils.MarshalPrivateKeyToEncryptedDER(k, func(bool) ([]byte, error) { return []byte("s3cret"), nil })
	if err != nil {
		t.Fatal(err)
	}
	encrypted := writeP2File(t, dir, "cosign.key", pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED SIGSTORE PRIVATE KEY", Bytes: der}))
	right := writeP2File(t, dir, "right", []byte("s3cret\n"))
	wrong := writeP2File(t, dir, "wrong", []byte("guess"))
	garbage := writeP2File(t, dir, "garbage.key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("not DER")}))
	load := func(key, password string) error {
		signing := "promotionSigning: {keyFile: " + key
		if password != "" {
			signing += ", passwordFile: " + password
		}
		path := writeP2File(t, t.TempDir(), "config.yaml", []byte("installation: staging\n"+signing+"}\ngroups: []\n"))
		_, err := config.Load(path, CheckTrust)
		return err
	}
	if err := load(encrypted, right); err != nil {
		t.Fatalf("the right password: %v", err)
	}
	for name, err := range map[string]error{"a wrong password": load(encrypted, wrong), "a key that does not parse": load(garbage, "")} {
		if err == nil || !strings.Contains(err.Error(), "promotionSigning.keyFile") {
			t.Errorf("%s: Load = %v, want an error at promotionSigning.keyFile", name, err)
		}
	}
}
