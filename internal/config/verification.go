package config

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/image-refresh/image-refresh/internal/imageref"
)

// VerificationPolicy says which signatures a digest of the matching
// repositories needs before it is pinned or recorded (V1).
type VerificationPolicy struct {
	Name string `yaml:"name"`
	// Repositories are globs over "host/path" (see MatchesRepository).
	Repositories []string        `yaml:"repositories"`
	Cosign       *CosignPolicy   `yaml:"cosign,omitempty"`
	Notation     *NotationPolicy `yaml:"notation,omitempty"`
	// Attestations are the in-toto attestations a digest needs besides
	// its signature (V5), each signed under the policy's cosign trust.
	Attestations []AttestationPolicy `yaml:"attestations,omitempty"`
}

// AttestationPolicy is one attestation a verification policy requires
// (V5): a DSSE in-toto statement of PredicateType about the digest, signed
// under the policy's cosign trust, whose predicate meets every condition.
type AttestationPolicy struct {
	// PredicateType is the statement's predicateType, exactly (e.g.
	// https://slsa.dev/provenance/v1).
	PredicateType string `yaml:"predicateType"`
	// Conditions are CEL expressions over the variable predicate (the
	// statement's predicate as JSON); each must evaluate to true. The
	// Checker of internal/verify compiles them at load (config links no
	// CEL).
	Conditions []string `yaml:"conditions,omitempty"`
}

// NotationPolicy is Notation verification: a digest is verified when a
// Notation signature of it (an OCI referrer) was made with a certificate
// that chains to one of the trust store's certificates. Revocation is not
// checked (no OCSP or CRL request leaves image-refresh).
type NotationPolicy struct {
	// Certificates are PEM files of the trust store (root or
	// intermediate CA certificates; a file may hold several).
	Certificates []string `yaml:"certificates"`
	// Revocation turns Notation's revocation check on: the signing
	// certificate's OCSP responder or CRL is asked (they must be
	// reachable from image-refresh); off, no such request leaves it.
	Revocation bool `yaml:"revocation,omitempty"`
	// Certs are the DER bytes of the CERTIFICATE blocks of Certificates,
	// in order; Load fills them, and its Checker internal/verify.CheckTrust
	// parses them (config itself links no crypto).
	Certs [][]byte `yaml:"-"`
}

// CosignPolicy is cosign verification with public keys, keyless
// identities, or both: a digest is verified when a signature bound to it
// verifies with any one of the keys (several keys: a rotation) or was made
// by any one of the identities.
type CosignPolicy struct {
	// PublicKeys are PEM files; a relative path is relative to the working
	// directory.
	PublicKeys []string `yaml:"publicKeys,omitempty"`
	// Keys are PublicKeys read, in the same order. Load fills them; Parse
	// cannot (it has no filesystem access); internal/verify parses them.
	Keys []PublicKey `yaml:"-"`
	// Keyless are the OIDC identities a keyless signature's certificate
	// must name (Fulcio's issuer and subject).
	Keyless []KeylessIdentity `yaml:"keyless,omitempty"`
	// TrustedRoot is a Sigstore trusted root JSON file (Fulcio CAs, Rekor
	// and CT logs, timestamp authorities); empty: the public-good
	// instance's, shipped with the binary.
	TrustedRoot string `yaml:"trustedRoot,omitempty"`
	// TrustedRootJSON is TrustedRoot read by Load (nil: the default);
	// internal/verify parses it.
	TrustedRootJSON []byte `yaml:"-"`
}

// KeylessIdentity is one signer a keyless policy trusts: the OIDC issuer
// of its certificate and its subject (an email or a workflow URI), exactly
// or by a regular expression.
type KeylessIdentity struct {
	Issuer        string `yaml:"issuer"`
	Subject       string `yaml:"subject,omitempty"`
	SubjectRegExp string `yaml:"subjectRegExp,omitempty"`
}

// PublicKey is one key of a policy, as read: the DER (PKIX) bytes of the
// file's PEM "PUBLIC KEY" block, and the file, which names it in a
// verdict. internal/verify parses it.
type PublicKey struct {
	File string
	DER  []byte
}

// Fingerprint names the policy's trust material in a few characters: a
// verification remembered under one fingerprint does not count once the
// keys changed (a compromised key removed), V1.
func (p *VerificationPolicy) Fingerprint() string {
	h := sha256.New()
	if p.Cosign != nil {
		for _, k := range p.Cosign.Keys {
			h.Write(k.DER)
			h.Write([]byte{0})
		}
		for _, id := range p.Cosign.Keyless {
			fmt.Fprintf(h, "%q %q %q\x00", id.Issuer, id.Subject, id.SubjectRegExp)
		}
		h.Write(p.Cosign.TrustedRootJSON)
	}
	if p.Notation != nil {
		for _, c := range p.Notation.Certs {
			h.Write(c)
		}
		if p.Notation.Revocation {
			h.Write([]byte("revocation"))
		}
	}
	// V5: a digest verified without an attestation, or under other
	// conditions, is looked up again once they change.
	for _, a := range p.Attestations {
		fmt.Fprintf(h, "attestation %q", a.PredicateType)
		for _, c := range a.Conditions {
			fmt.Fprintf(h, " %q", c)
		}
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// VerificationFor returns the policy of repository: the first one, in the
// order of the file, with a glob that matches it.
func (c *Config) VerificationFor(repository string) (*VerificationPolicy, bool) {
	for i := range c.Verification {
		if c.Verification[i].MatchesRepository(repository) {
			return &c.Verification[i], true
		}
	}
	return nil, false
}

// MatchesRepository reports whether one of the policy's globs matches
// repository. Both are compared as an image reference reads them
// ("docker.io/acme/api" is "index.docker.io/acme/api"). A glob is
// path.Match syntax, where "*" stays within one path segment; a glob that
// ends in "/**" also matches every repository below its prefix, at any
// depth.
func (p *VerificationPolicy) MatchesRepository(repository string) bool {
	repo, err := imageref.CanonicalRepository(repository)
	if err != nil {
		return false
	}
	for _, g := range p.Repositories {
		if matchRepository(canonicalGlob(g), repo) {
			return true
		}
	}
	return false
}

func matchRepository(glob, repo string) bool {
	if prefix, ok := strings.CutSuffix(glob, "/**"); ok {
		// The prefix matches the repository's leading segments.
		segs := strings.Split(repo, "/")
		n := strings.Count(prefix, "/") + 1
		if len(segs) <= n {
			return false
		}
		ok, err := path.Match(prefix, strings.Join(segs[:n], "/"))
		return ok && err == nil
	}
	ok, err := path.Match(glob, repo)
	return ok && err == nil
}

// canonicalGlob spells the host of glob as go-containerregistry does, so
// that "docker.io/acme/*" matches Docker Hub's "index.docker.io/acme/api".
func canonicalGlob(glob string) string {
	host, rest, _ := strings.Cut(glob, "/")
	if strings.EqualFold(host, "docker.io") {
		return "index.docker.io/" + rest
	}
	return glob
}

// checkGlob says what is wrong with a repositories glob, or "".
func checkGlob(glob string) string {
	if glob == "" {
		return "empty glob"
	}
	host, rest, ok := strings.Cut(glob, "/")
	if !ok || rest == "" {
		return fmt.Sprintf("%q names no path: write host/path, e.g. \"registry.example.com/acme/*\" or \"registry.example.com/acme/**\"", glob)
	}
	if strings.ContainsAny(glob, "@ \t\r\n") || strings.Contains(rest, ":") {
		return fmt.Sprintf("%q is not a glob over host/path (no tag, no digest)", glob)
	}
	if !strings.ContainsAny(host, ".:*?[") && host != "localhost" {
		return fmt.Sprintf("%q does not start with a registry host (with a dot, a port or \"localhost\"; Docker Hub is \"docker.io/…\")", glob)
	}
	body := strings.TrimSuffix(glob, "/**")
	if strings.Contains(body, "**") {
		return fmt.Sprintf("%q: \"**\" is only allowed as the last path segment (\"/**\")", glob)
	}
	if _, err := path.Match(body, ""); err != nil {
		return fmt.Sprintf("%q is not a valid glob: %v", glob, err)
	}
	return ""
}

// policyPath names a field of verification[i] with the policy's name, so
// that a message says which policy it is about.
// PolicyPath is the path of a field of verification policy i, plain
// (verification[0].cosign.publicKeys[1]) and named with the policy's name
// (verification[0] (release).cosign.publicKeys[1]), as errors give it.
func PolicyPath(i int, name, field string) (named, plain string) { return policyPath(i, name, field) }

func policyPath(i int, name, field string) (named, plain string) {
	plain = fmt.Sprintf("verification[%d]", i)
	named = plain
	if name != "" {
		named += " (" + name + ")"
	}
	if field != "" {
		plain += "." + field
		named += "." + field
	}
	return named, plain
}

// policyErrorf reports a problem at a field of verification[i].
func (v *validator) policyErrorf(i int, name, field, format string, args ...any) {
	named, plain := policyPath(i, name, field)
	for p := plain; p != ""; p = parent(p) {
		if v.failed[p] {
			return
		}
	}
	v.add(named, lineOf(v.lines, plain), fmt.Sprintf(format, args...))
}

func (v *validator) verification(policies []VerificationPolicy) {
	names := map[string]int{}
	for i, p := range policies {
		switch {
		case p.Name == "":
			v.policyErrorf(i, "", "name", "missing")
		case len(validation.IsDNS1123Label(p.Name)) > 0:
			v.policyErrorf(i, "", "name", "%q is not a valid policy name (DNS-1123 label): %s",
				p.Name, strings.Join(validation.IsDNS1123Label(p.Name), "; "))
		default:
			if j, dup := names[p.Name]; dup {
				v.policyErrorf(i, p.Name, "name", "duplicate policy name (also verification[%d])", j)
			}
			names[p.Name] = i
		}
		if len(p.Repositories) == 0 {
			v.policyErrorf(i, p.Name, "repositories", "at least one glob over host/path is required")
		}
		for k, g := range p.Repositories {
			if msg := checkGlob(g); msg != "" {
				v.policyErrorf(i, p.Name, fmt.Sprintf("repositories[%d]", k), "%s", msg)
			}
		}
		v.verifier(i, p)
		v.attestations(i, p)
	}
}

// attestations checks what can be checked of V5's requirements without
// CEL; internal/verify.CheckTrust compiles the conditions.
func (v *validator) attestations(i int, p VerificationPolicy) {
	if len(p.Attestations) > 0 && p.Cosign == nil {
		v.policyErrorf(i, p.Name, "attestations", "attestations are verified with the policy's cosign keys or keyless identities: give cosign")
	}
	types := map[string]int{}
	for k, a := range p.Attestations {
		field := fmt.Sprintf("attestations[%d]", k)
		if a.PredicateType == "" {
			v.policyErrorf(i, p.Name, field+".predicateType", "missing: the in-toto predicate type, e.g. https://slsa.dev/provenance/v1")
			continue
		}
		if j, dup := types[a.PredicateType]; dup {
			v.policyErrorf(i, p.Name, field+".predicateType", "%s is required twice (also attestations[%d]): put all its conditions in one", a.PredicateType, j)
		}
		types[a.PredicateType] = k
		for c, cond := range a.Conditions {
			if strings.TrimSpace(cond) == "" {
				v.policyErrorf(i, p.Name, fmt.Sprintf("%s.conditions[%d]", field, c), "empty condition")
			}
		}
	}
}

// verifier checks that the policy names exactly one verifier, and one that
// is supported.
func (v *validator) verifier(i int, p VerificationPolicy) {
	if p.Notation != nil {
		if p.Cosign != nil {
			v.policyErrorf(i, p.Name, "", "give exactly one of cosign, notation")
		}
		if len(p.Notation.Certificates) == 0 {
			v.policyErrorf(i, p.Name, "notation.certificates", "at least one PEM certificate file (the trust store) is required")
		}
		for k, f := range p.Notation.Certificates {
			if f == "" {
				v.policyErrorf(i, p.Name, fmt.Sprintf("notation.certificates[%d]", k), "empty file name")
			}
		}
		return
	}
	if p.Cosign == nil {
		v.policyErrorf(i, p.Name, "", "missing a verifier: give cosign.publicKeys, cosign.keyless or notation.certificates")
		return
	}
	if len(p.Cosign.PublicKeys) == 0 && len(p.Cosign.Keyless) == 0 {
		v.policyErrorf(i, p.Name, "cosign", "give cosign.publicKeys (PEM public key files), cosign.keyless (OIDC identities), or both")
	}
	if p.Cosign.TrustedRoot != "" && len(p.Cosign.Keyless) == 0 {
		v.policyErrorf(i, p.Name, "cosign.trustedRoot", "a trusted root is for keyless signatures: give cosign.keyless too")
	}
	for k, id := range p.Cosign.Keyless {
		field := fmt.Sprintf("cosign.keyless[%d]", k)
		if id.Issuer == "" {
			v.policyErrorf(i, p.Name, field+".issuer", "missing: the OIDC issuer of the signer's certificate, e.g. https://token.actions.githubusercontent.com")
		}
		switch {
		case id.Subject == "" && id.SubjectRegExp == "":
			v.policyErrorf(i, p.Name, field, "give subject or subjectRegExp: the signer's identity (an email, a workflow URI)")
		case id.Subject != "" && id.SubjectRegExp != "":
			v.policyErrorf(i, p.Name, field, "give subject or subjectRegExp, not both")
		case id.SubjectRegExp != "":
			if _, err := regexp.Compile(id.SubjectRegExp); err != nil {
				v.policyErrorf(i, p.Name, field+".subjectRegExp", "not a regular expression: %v", err)
			}
		}
	}
	files := map[string]int{}
	for k, f := range p.Cosign.PublicKeys {
		field := fmt.Sprintf("cosign.publicKeys[%d]", k)
		if f == "" {
			v.policyErrorf(i, p.Name, field, "empty file name")
			continue
		}
		if j, dup := files[f]; dup {
			v.policyErrorf(i, p.Name, field, "%s is listed twice (also publicKeys[%d])", f, j)
		}
		files[f] = k
	}
}

// loadKeys reads and parses every public key file of c's policies into
// CosignPolicy.Keys, and reports each one that fails at its field.
func (c *Config) loadKeys(lines map[string]int) []error {
	var errs []error
	for i := range c.Verification {
		p := &c.Verification[i]
		fail := func(field, msg string) {
			named, plain := policyPath(i, p.Name, field)
			errs = append(errs, &FieldError{Path: named, Line: lineOf(lines, plain), Msg: msg})
		}
		if p.Notation != nil {
			p.Notation.Certs = slices.Concat(readEach(p.Notation.Certificates, "notation.certificates", readCertificates, fail)...)
		}
		if p.Cosign == nil {
			continue
		}
		p.Cosign.TrustedRootJSON = nil
		if f := p.Cosign.TrustedRoot; f != "" {
			data, msg := readTrustedRoot(f)
			if msg != "" {
				fail("cosign.trustedRoot", msg)
			}
			p.Cosign.TrustedRootJSON = data
		}
		p.Cosign.Keys = readEach(p.Cosign.PublicKeys, "cosign.publicKeys", func(f string) (PublicKey, string) {
			der, msg := readPublicKey(f)
			return PublicKey{File: f, DER: der}, msg
		}, fail)
	}
	return errs
}

// readEach reads every file of files named (an empty one is reported by
// validation) and returns what was read; a file that fails is reported
// with fail at its field, field[k], and left out.
func readEach[T any](files []string, field string, read func(file string) (T, string), fail func(field, msg string)) []T {
	var out []T
	for k, f := range files {
		if f == "" {
			continue
		}
		v, msg := read(f)
		if msg != "" {
			fail(fmt.Sprintf("%s[%d]", field, k), msg)
			continue
		}
		out = append(out, v)
	}
	return out
}

// readCertificates reads the PEM CERTIFICATE blocks of a trust store file:
// their DER bytes (the Checker of internal/verify parses them).
func readCertificates(file string) ([][]byte, string) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Sprintf("cannot read certificates: %v", err)
	}
	var certs [][]byte
	for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Sprintf("%s holds a PEM %q, not a \"CERTIFICATE\"", file, block.Type)
		}
		certs = append(certs, block.Bytes)
	}
	if len(certs) == 0 {
		return nil, fmt.Sprintf("%s holds no PEM certificate", file)
	}
	return certs, ""
}

// readTrustedRoot reads a Sigstore trusted root (JSON, what `cosign
// trusted-root create` writes and the TUF repository serves as
// trusted_root.json); the Checker of internal/verify parses it.
func readTrustedRoot(file string) ([]byte, string) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Sprintf("cannot read trusted root: %v", err)
	}
	return data, ""
}

// readPublicKey reads a PEM "PUBLIC KEY" (PKIX: what cosign
// generate-key-pair writes as cosign.pub): its DER bytes (the Checker of
// internal/verify parses them).
func readPublicKey(file string) ([]byte, string) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Sprintf("cannot read public key: %v", err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, fmt.Sprintf("%s holds no PEM block", file)
	}
	if block.Type != "PUBLIC KEY" {
		return nil, fmt.Sprintf("%s holds a PEM %q, not a \"PUBLIC KEY\" (give the public half, e.g. cosign.pub)", file, block.Type)
	}
	return block.Bytes, ""
}
