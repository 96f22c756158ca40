package verify_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/verify"
)

const trustGroup = `groups:
  - name: web
    anchor: {kind: Deployment, namespace: shop, name: api}
    images:
      - name: api
        repository: registry.example.com/acme/api
        tag: prod
        targets:
          - {kind: Deployment, namespace: shop, name: api, container: api}
`

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// V1: config.Load reads the trust files, CheckTrust (its Checker) parses
// them: a good key, certificate and trusted root load; a PEM block that
// does not hold what its type says, a key of an unsupported type, and a
// JSON file that is not a Sigstore trusted root fail at start, each at its
// field and line, with every other problem of the file, and no config.
func TestCheckTrust_V1_ParsesEveryPolicysTrustMaterialAtItsField(t *testing.T) {
	dir := t.TempDir()
	good, key := writePublicKey(t, dir, "good.pub")
	garbage := writeFile(t, dir, "garbage.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte("not DER")}))
	badCert := writeFile(t, dir, "bad-ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not DER")}))
	notRoot := writeFile(t, dir, "not-a-root.json", []byte(`{"mediaType": "something else"}`))
	goodRoot, err := filepath.Abs(filepath.Join("publicgood", "trusted_root.json"))
	if err != nil {
		t.Fatal(err)
	}
	configFile := func(keys, root, cert string) string {
		return writeFile(t, dir, "config.yaml", []byte(`verification:
  - name: prod-keys
    repositories: ["registry.example.com/acme/*"]
    cosign:
      publicKeys: [`+keys+`]
      keyless: [{issuer: "https://token.actions.githubusercontent.com", subject: "x"}]
      trustedRoot: `+root+`
  - name: notary
    repositories: ["registry.example.com/other/*"]
    notation: {certificates: [`+cert+`]}
`+trustGroup))
	}
	// A real CA for the good case: the key's own self-signed certificate
	// is not needed, any X.509 certificate parses.
	tmpl := &x509.Certificate{SerialNumber: big1(), BasicConstraintsValid: true, IsCA: true}
	certDER, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	goodCert := writeFile(t, dir, "ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certDER}))

	c, err := config.Load(configFile(good, goodRoot, goodCert), verify.CheckTrust)
	if err != nil {
		t.Fatalf("good trust material: %v", err)
	}
	if len(c.Verification[0].Cosign.Keys) != 1 || len(c.Verification[1].Notation.Certs) != 1 {
		t.Fatalf("the trust material was not read: %+v", c.Verification)
	}

	c, err = config.Load(configFile(good+", "+garbage, notRoot, badCert), verify.CheckTrust)
	if c != nil || err == nil {
		t.Fatalf("bad trust material loaded: %+v, %v", c, err)
	}
	for _, want := range []string{
		"verification[0] (prod-keys).cosign.publicKeys[1]: " + garbage + ": not a public key",
		"verification[0] (prod-keys).cosign.trustedRoot: " + notRoot + ": not a Sigstore trusted root",
		"verification[1] (notary).notation.certificates[0]: " + badCert + ": not an X.509 certificate",
		"(line 5)", "(line 7)", "(line 10)",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	var fe *config.FieldError
	if !errors.As(err, &fe) {
		t.Errorf("want *config.FieldError, got %T", err)
	}
	// Without the checker, config alone reads the files and parses nothing.
	if _, err := config.Load(configFile(good+", "+garbage, notRoot, badCert)); err != nil {
		t.Errorf("config.Load without a Checker parsed trust material: %v", err)
	}
}

func big1() *big.Int { return big.NewInt(1) }

// V5: a policy's conditions compile at load (CheckTrust, config's
// Checker): a good one loads; one that is not CEL, one over an undeclared
// variable and one that is not a bool fail, each named by the policy, the
// attestation and the condition, with its line in the file and its column
// in the expression.
func TestCheckTrust_V5_ABadConditionIsAConfigErrorNamingThePolicyTheAttestationAndTheColumn(t *testing.T) {
	dir := t.TempDir()
	pub, _ := writePublicKey(t, dir, "release.pub")
	configFile := func(provenance, scan string) string {
		return writeFile(t, dir, "config.yaml", []byte(`verification:
  - name: release
    repositories: ["registry.example.com/acme/*"]
    cosign: {publicKeys: [`+pub+`]}
    attestations:
      - predicateType: https://slsa.dev/provenance/v1
        conditions:
          - '`+provenance+`'
      - predicateType: https://cosign.sigstore.dev/attestation/vuln/v1
        conditions: ['predicate.scanner.uri != ""', '`+scan+`']
`+trustGroup))
	}
	c, err := config.Load(configFile(`predicate.buildDefinition.externalParameters.workflow.repository == "https://github.com/acme/api"`,
		`predicate.scanner.result.summary.critical == 0`), verify.CheckTrust)
	if err != nil {
		t.Fatalf("good conditions: %v", err)
	}
	if got := c.Verification[0].Attestations; len(got) != 2 || len(got[1].Conditions) != 2 {
		t.Fatalf("the attestations were not read: %+v", got)
	}

	c, err = config.Load(configFile(`predicate.buildDefinition ==`, `predicat.scanner.result.summary.critical + 1`), verify.CheckTrust)
	if c != nil || err == nil {
		t.Fatalf("bad conditions loaded: %+v, %v", c, err)
	}
	for _, want := range []string{
		"verification[0] (release).attestations[0].conditions[0]: not a valid CEL condition over predicate (https://slsa.dev/provenance/v1): column 29: ",
		"(line 8)",
		"verification[0] (release).attestations[1].conditions[1]: not a valid CEL condition over predicate (https://cosign.sigstore.dev/attestation/vuln/v1): column 1: undeclared reference to 'predicat'",
		"(line 10)",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	_, err = config.Load(configFile(`predicate.buildDefinition.externalParameters.workflow.repository == "x"`, `size(predicate.scanner.result) + 1`), verify.CheckTrust)
	if err == nil || !strings.Contains(err.Error(), "attestations[1].conditions[1]: not a valid CEL condition over predicate (https://cosign.sigstore.dev/attestation/vuln/v1): column 1: the condition is of type int; it must be a bool") {
		t.Errorf("a condition that is not a bool: want its error, got %v", err)
	}
	// Without the checker, config alone compiles nothing.
	if _, err := config.Load(configFile(`predicate.buildDefinition ==`, `x`)); err != nil {
		t.Errorf("config.Load without a Checker compiled the conditions: %v", err)
	}
}

// writePublicKey writes a new ECDSA P-256 public key, PEM-encoded, to
// dir/name and returns its path and the private key.
func writePublicKey(t *testing.T, dir, name string) (string, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, dir, name, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})), key
}
