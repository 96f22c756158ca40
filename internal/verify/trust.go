package verify

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"fmt"

	"github.com/sigstore/sigstore-go/pkg/root"

	"github.com/image-refresh/image-refresh/internal/config"
)

// CheckTrust is the config.Checker of the verification policies' trust
// material (V1): config.Load reads the key, certificate and trusted root
// files; this parses them, so that a key that is not one fails at start
// with its field and line, and config, with the engine that reads it, links
// no crypto.
func CheckTrust(c *config.Config, report func(named, plain, msg string)) {
	for i := range c.Verification {
		p := &c.Verification[i]
		if p.Notation != nil {
			for k, f := range p.Notation.Certificates {
				if k < len(p.Notation.Certs) {
					if _, err := x509.ParseCertificate(p.Notation.Certs[k]); err != nil {
						named, plain := config.PolicyPath(i, p.Name, fmt.Sprintf("notation.certificates[%d]", k))
						report(named, plain, fmt.Sprintf("%s: not an X.509 certificate: %v", f, err))
					}
				}
			}
		}
		checkAttestations(i, p, report)
		if p.Cosign == nil {
			continue
		}
		if data := p.Cosign.TrustedRootJSON; data != nil {
			if _, err := root.NewTrustedRootFromJSON(data); err != nil {
				named, plain := config.PolicyPath(i, p.Name, "cosign.trustedRoot")
				report(named, plain, fmt.Sprintf("%s: not a Sigstore trusted root: %v", p.Cosign.TrustedRoot, err))
			}
		}
		for k, key := range p.Cosign.Keys {
			if _, err := publicKey(key); err != nil {
				named, plain := config.PolicyPath(i, p.Name, fmt.Sprintf("cosign.publicKeys[%d]", keyIndex(p.Cosign, key.File, k)))
				report(named, plain, err.Error())
			}
		}
	}
	CheckPromotion(c, report)
}

// keyIndex is the index in publicKeys of the file a key was read from.
func keyIndex(c *config.CosignPolicy, file string, fallback int) int {
	for i, f := range c.PublicKeys {
		if f == file {
			return i
		}
	}
	return fallback
}

// publicKey parses a policy's key (PKIX DER) of ECDSA, RSA or Ed25519.
func publicKey(k config.PublicKey) (crypto.PublicKey, error) {
	key, err := x509.ParsePKIXPublicKey(k.DER)
	if err != nil {
		return nil, fmt.Errorf("%s: not a public key: %v", k.File, err)
	}
	switch key.(type) {
	case *ecdsa.PublicKey, *rsa.PublicKey, ed25519.PublicKey:
		return key, nil
	default:
		return nil, fmt.Errorf("%s: a %T is not supported (ECDSA, RSA or Ed25519)", k.File, key)
	}
}

// certificates parses a Notation policy's trust store.
func certificates(p *config.NotationPolicy) ([]*x509.Certificate, error) {
	out := make([]*x509.Certificate, 0, len(p.Certs))
	for _, der := range p.Certs {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("not an X.509 certificate: %w", err)
		}
		out = append(out, c)
	}
	return out, nil
}
