package config

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeKey writes a fresh ECDSA P-256 public key as cosign.pub does and
// returns its path.
func writeKey(t *testing.T, dir, name string) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func writeConfig(t *testing.T, dir, body string) string {
	t.Helper()
	p := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// V1: Load reads every key file of every policy, in order, as the DER of
// its PEM "PUBLIC KEY" block; internal/verify parses it
// (TestCheckTrust_V1_…).
func TestLoad_V1_ReadsEveryPolicysPublicKeys(t *testing.T) {
	dir := t.TempDir()
	k1, k2 := writeKey(t, dir, "old.pub"), writeKey(t, dir, "new.pub")
	edPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(edPub)
	k3 := filepath.Join(dir, "ed.pub")
	if err := os.WriteFile(k3, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(writeConfig(t, dir, `verification:
  - name: prod-keys
    repositories: ["registry.example.com/acme/**", "docker.io/acme/api"]
    cosign:
      publicKeys: [`+k1+`, `+k2+`]
  - name: lab
    repositories: ["127.0.0.1:5000/*"]
    cosign: {publicKeys: [`+k3+`]}
`+group))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Verification) != 2 {
		t.Fatalf("want 2 policies, got %+v", c.Verification)
	}
	keys := c.Verification[0].Cosign.Keys
	if len(keys) != 2 || keys[0].File != k1 || keys[1].File != k2 {
		t.Fatalf("prod-keys: want the keys of %s and %s in order, got %+v", k1, k2, keys)
	}
	if pub, err := x509.ParsePKIXPublicKey(keys[0].DER); err != nil {
		t.Errorf("the key read from %s is not its PKIX DER: %v", k1, err)
	} else if _, ok := pub.(*ecdsa.PublicKey); !ok {
		t.Errorf("want an ECDSA key, got %T", pub)
	}
	if k := c.Verification[1].Cosign.Keys; len(k) != 1 || !bytes.Equal(k[0].DER, der) {
		t.Errorf("lab: want the Ed25519 key's DER, got %+v", k)
	}
}

func TestLoad_V1_AnUnusableKeyFileNamesThePolicyAndFieldAndNothingApplies(t *testing.T) {
	dir := t.TempDir()
	good := writeKey(t, dir, "good.pub")
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	private := filepath.Join(dir, "cosign.key")
	if err := os.WriteFile(private, pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED SIGSTORE PRIVATE KEY", Bytes: []byte("x")}), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		key  string
		want []string
	}{
		{"a missing file is rejected", filepath.Join(dir, "missing.pub"),
			[]string{"verification[0] (prod-keys).cosign.publicKeys[1]: cannot read public key", "(line 5)"}},
		{"a file without PEM is rejected", notPEM,
			[]string{"verification[0] (prod-keys).cosign.publicKeys[1]:", "holds no PEM block"}},
		{"a private key is rejected", private,
			[]string{"verification[0] (prod-keys).cosign.publicKeys[1]:", `"ENCRYPTED SIGSTORE PRIVATE KEY", not a "PUBLIC KEY"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(writeConfig(t, dir, `verification:
  - name: prod-keys
    repositories: ["registry.example.com/acme/*"]
    cosign:
      publicKeys: [`+good+`, `+tt.key+`]
`+group))
			if c != nil || err == nil {
				t.Fatalf("want no config and an error, got %+v, %v", c, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Errorf("want a *FieldError, got %T", err)
			}
		})
	}
}

func TestParse_V1_RejectsEveryInvalidPolicyNamingThePolicyAndField(t *testing.T) {
	policy := func(body string) string { return "verification:\n  - name: prod-keys\n" + body + group }
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"a keyless identity without an issuer is rejected",
			policy("    repositories: [registry.example.com/acme/*]\n    cosign:\n      keyless: [{subject: me}]\n"),
			[]string{"verification[0] (prod-keys).cosign.keyless[0].issuer: missing"}},
		{"a keyless identity without a subject is rejected",
			policy("    repositories: [registry.example.com/acme/*]\n    cosign:\n      keyless: [{issuer: https://issuer}]\n"),
			[]string{"verification[0] (prod-keys).cosign.keyless[0]: give subject or subjectRegExp"}},
		{"a keyless identity with both subject forms is rejected",
			policy("    repositories: [registry.example.com/acme/*]\n    cosign:\n      keyless: [{issuer: https://issuer, subject: me, subjectRegExp: m.*}]\n"),
			[]string{"verification[0] (prod-keys).cosign.keyless[0]: give subject or subjectRegExp, not both"}},
		{"a subjectRegExp that does not compile is rejected",
			policy("    repositories: [registry.example.com/acme/*]\n    cosign:\n      keyless: [{issuer: https://issuer, subjectRegExp: \"a(\"}]\n"),
			[]string{"verification[0] (prod-keys).cosign.keyless[0].subjectRegExp: not a regular expression"}},
		{"a trusted root without keyless identities is rejected",
			policy("    repositories: [registry.example.com/acme/*]\n    cosign: {publicKeys: [a.pub], trustedRoot: root.json}\n"),
			[]string{"verification[0] (prod-keys).cosign.trustedRoot: a trusted root is for keyless signatures"}},
		{"a notation policy without certificates is rejected",
			policy("    repositories: [registry.example.com/acme/*]\n    notation: {certificates: []}\n"),
			[]string{"verification[0] (prod-keys).notation.certificates: at least one PEM certificate file"}},
		{"a policy with two verifiers is rejected",
			policy("    repositories: [registry.example.com/acme/*]\n    cosign: {publicKeys: [a.pub]}\n    notation: {certificates: [ca.pem]}\n"),
			[]string{"verification[0] (prod-keys): give exactly one of cosign, notation"}},
		{"a policy without a verifier is rejected",
			policy("    repositories: [registry.example.com/acme/*]\n"),
			[]string{"verification[0] (prod-keys): missing a verifier"}},
		{"a cosign policy without keys or identities is rejected",
			policy("    repositories: [registry.example.com/acme/*]\n    cosign: {}\n"),
			[]string{"verification[0] (prod-keys).cosign: give cosign.publicKeys (PEM public key files), cosign.keyless (OIDC identities), or both"}},
		{"a key listed twice is rejected",
			policy("    repositories: [registry.example.com/acme/*]\n    cosign: {publicKeys: [a.pub, a.pub]}\n"),
			[]string{"verification[0] (prod-keys).cosign.publicKeys[1]: a.pub is listed twice"}},
		{"a policy without repositories is rejected",
			policy("    cosign: {publicKeys: [a.pub]}\n"),
			[]string{"verification[0] (prod-keys).repositories: at least one glob"}},
		{"a glob with a tag is rejected",
			policy("    repositories: [registry.example.com/acme/api:prod]\n    cosign: {publicKeys: [a.pub]}\n"),
			[]string{"verification[0] (prod-keys).repositories[0]:", "no tag, no digest"}},
		{"a glob without a host is rejected",
			policy("    repositories: [acme/api]\n    cosign: {publicKeys: [a.pub]}\n"),
			[]string{"verification[0] (prod-keys).repositories[0]:", "does not start with a registry host"}},
		{"a malformed glob is rejected",
			policy("    repositories: [\"registry.example.com/acme/[\"]\n    cosign: {publicKeys: [a.pub]}\n"),
			[]string{"verification[0] (prod-keys).repositories[0]:", "not a valid glob"}},
		{"** inside a glob is rejected",
			policy("    repositories: [\"registry.example.com/**/api\"]\n    cosign: {publicKeys: [a.pub]}\n"),
			[]string{"verification[0] (prod-keys).repositories[0]:", `only allowed as the last path segment`}},
		{"an unknown key in a policy is rejected with its path",
			policy("    repositories: [registry.example.com/acme/*]\n    cosign: {publicKeys: [a.pub], key: a.pub}\n"),
			[]string{`verification[0].cosign: unknown key "key"`}},
		{"a policy without a name is rejected",
			"verification:\n  - repositories: [registry.example.com/acme/*]\n    cosign: {publicKeys: [a.pub]}\n" + group,
			[]string{"verification[0].name: missing"}},
		{"two policies with one name are rejected",
			"verification:\n" +
				"  - {name: p, repositories: [a.example/x], cosign: {publicKeys: [a.pub]}}\n" +
				"  - {name: p, repositories: [b.example/x], cosign: {publicKeys: [a.pub]}}\n" + group,
			[]string{"verification[1] (p).name: duplicate policy name (also verification[0])"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.yaml), "v1.yaml")
			if c != nil || err == nil {
				t.Fatalf("want no config and an error, got %+v, %v", c, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestVerificationFor_V1_MatchesGlobsOverHostAndPathFirstPolicyWins(t *testing.T) {
	c := &Config{Verification: []VerificationPolicy{
		{Name: "api", Repositories: []string{"registry.example.com/acme/api"}},
		{Name: "acme", Repositories: []string{"registry.example.com/acme/*"}},
		{Name: "deep", Repositories: []string{"registry.example.com/deep/**"}},
		{Name: "hub", Repositories: []string{"docker.io/library/*"}},
		{Name: "lab", Repositories: []string{"127.0.0.1:*/*"}},
	}}
	tests := []struct {
		repo string
		want string // "" for none
	}{
		{"registry.example.com/acme/api", "api"},
		{"registry.example.com/acme/web", "acme"},
		{"registry.example.com/acme/team/web", ""}, // * stays within a segment
		{"registry.example.com/deep/a", "deep"},
		{"registry.example.com/deep/a/b/c", "deep"},
		{"registry.example.com/deep", ""},
		{"nginx", "hub"},
		{"index.docker.io/library/nginx", "hub"},
		{"docker.io/acme/api", ""},
		{"127.0.0.1:5000/app", "lab"},
		{"other.example.com/acme/api", ""},
	}
	for _, tt := range tests {
		p, ok := c.VerificationFor(tt.repo)
		got := ""
		if ok {
			got = p.Name
		}
		if got != tt.want {
			t.Errorf("VerificationFor(%q) = %q, want %q", tt.repo, got, tt.want)
		}
	}
}

func TestLoad_V1_AKeylessPolicyReadsItsTrustedRootAndNamesABadOne(t *testing.T) {
	dir := t.TempDir()
	body := func(rootFile string) string {
		return `verification:
  - name: ci
    repositories: ["registry.example.com/acme/*"]
    cosign:
      keyless: [{issuer: "https://token.actions.githubusercontent.com", subjectRegExp: "^https://github.com/acme/"}]
      trustedRoot: ` + rootFile + "\n" + group
	}
	good, err := filepath.Abs(filepath.Join("..", "verify", "publicgood", "trusted_root.json"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Load(writeConfig(t, dir, body(good)))
	if err != nil {
		t.Fatalf("a valid trusted root: %v", err)
	}
	if p := c.Verification[0]; len(p.Cosign.TrustedRootJSON) == 0 || len(p.Cosign.Keyless) != 1 {
		t.Errorf("policy %+v: the trusted root or the identity was not read", p.Cosign)
	}
	notRoot := filepath.Join(dir, "not-a-root.json")
	if err := os.WriteFile(notRoot, []byte(`{"mediaType": "something else"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// That the file is a trusted root is checked by internal/verify's
	// config.Checker (TestCheckTrust_V1_…).
	for _, tc := range []struct{ file, want string }{
		{filepath.Join(dir, "missing.json"), "cannot read trusted root"},
	} {
		c, err := Load(writeConfig(t, dir, body(tc.file)))
		if c != nil || err == nil || !strings.Contains(err.Error(), "verification[0] (ci).cosign.trustedRoot: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("trusted root %s: got %v, %v; want an error at verification[0] (ci).cosign.trustedRoot saying %q", tc.file, c, err, tc.want)
		}
	}
}

func TestParse_V2_OnFailedRolloutIsHoldOrRollback(t *testing.T) {
	body := func(v string) string {
		return strings.Replace(group, "  - name: ", "  - onFailedRollout: "+v+"\n    name: ", 1)
	}
	for _, v := range []string{"hold", "rollback"} {
		c, err := Parse([]byte(body(v)), "config.yaml")
		if err != nil || string(c.Groups[0].OnFailedRollout) != v {
			t.Errorf("onFailedRollout %s: %v, %+v", v, err, c)
		}
	}
	if _, err := Parse([]byte(body("retry")), "config.yaml"); err == nil || !strings.Contains(err.Error(), `groups[0].onFailedRollout: "retry" is not one of hold, rollback`) {
		t.Errorf("onFailedRollout retry: got %v, want an error naming the field", err)
	}
}

func TestParse_V1_NotationRevocationIsOffUnlessTurnedOn(t *testing.T) {
	body := func(extra string) string {
		return "verification:\n  - name: notary\n    repositories: [registry.example.com/acme/*]\n    notation:\n      certificates: [ca.pem]\n" + extra + group
	}
	c, err := Parse([]byte(body("")), "config.yaml")
	if err != nil || c.Verification[0].Notation.Revocation {
		t.Errorf("default: %v, revocation %v; want off", err, c != nil && c.Verification[0].Notation.Revocation)
	}
	c, err = Parse([]byte(body("      revocation: true\n")), "config.yaml")
	if err != nil || !c.Verification[0].Notation.Revocation {
		t.Errorf("revocation: true: %v; want on", err)
	}
	if _, err := Parse([]byte(body("      revocation: maybe\n")), "config.yaml"); err == nil || !strings.Contains(err.Error(), "notation.revocation") {
		t.Errorf("revocation: maybe: got %v, want an error naming the field", err)
	}
}

// V5: what can be checked of a policy's attestations without CEL (the
// conditions compile in internal/verify's Checker,
// TestCheckTrust_V5_…): each names a predicate type, once, under a cosign
// policy, with no empty condition; a good one parses.
func TestParse_V5_RejectsEveryInvalidAttestationNamingThePolicyAndField(t *testing.T) {
	policy := func(body string) string {
		return "verification:\n  - name: release\n    repositories: [registry.example.com/acme/*]\n" + body + group
	}
	c, err := Parse([]byte(policy("    cosign: {publicKeys: [a.pub]}\n    attestations:\n"+
		"      - {predicateType: https://slsa.dev/provenance/v1, conditions: ['predicate.x == 1']}\n"+
		"      - {predicateType: https://cosign.sigstore.dev/attestation/vuln/v1}\n")), "v5.yaml")
	if err != nil {
		t.Fatalf("a good policy: %v", err)
	}
	if a := c.Verification[0].Attestations; len(a) != 2 || a[0].Conditions[0] != "predicate.x == 1" || a[1].PredicateType != "https://cosign.sigstore.dev/attestation/vuln/v1" {
		t.Fatalf("attestations not read: %+v", a)
	}
	tests := []struct {
		name string
		yaml string
		want string
	}{
		{"an attestation without a predicate type is rejected",
			policy("    cosign: {publicKeys: [a.pub]}\n    attestations: [{conditions: ['true']}]\n"),
			"verification[0] (release).attestations[0].predicateType: missing"},
		{"a predicate type required twice is rejected",
			policy("    cosign: {publicKeys: [a.pub]}\n    attestations: [{predicateType: x}, {predicateType: x}]\n"),
			"verification[0] (release).attestations[1].predicateType: x is required twice (also attestations[0])"},
		{"an empty condition is rejected",
			policy("    cosign: {publicKeys: [a.pub]}\n    attestations: [{predicateType: x, conditions: [' ']}]\n"),
			"verification[0] (release).attestations[0].conditions[0]: empty condition"},
		{"attestations under a notation policy are rejected",
			policy("    notation: {certificates: [ca.pem]}\n    attestations: [{predicateType: x}]\n"),
			"verification[0] (release).attestations: attestations are verified with the policy's cosign keys or keyless identities: give cosign"},
		{"an unknown key in an attestation is rejected with its path",
			policy("    cosign: {publicKeys: [a.pub]}\n    attestations: [{predicateType: x, condition: 'true'}]\n"),
			`verification[0].attestations[0]: unknown key "condition"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.yaml), "v5.yaml")
			if c != nil || err == nil {
				t.Fatalf("want no config and an error, got %+v, %v", c, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q lacks %q", err, tt.want)
			}
		})
	}
}
