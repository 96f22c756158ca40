package testsign

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/notaryproject/notation-core-go/testhelper"
	"github.com/notaryproject/notation-go"
	"github.com/notaryproject/notation-go/signer"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// NotationArtifactType is a Notation signature's artifactType.
const NotationArtifactType = "application/vnd.cncf.notary.signature"

// Notary signs as `notation sign` does, with a certificate chain of
// notation-core-go's test CAs: RSA (the default) or EC (another CA).
type Notary struct {
	root  *x509.Certificate
	chain []*x509.Certificate
	key   crypto.PrivateKey
}

// NewNotary is a signer whose leaf chains to notation-core-go's RSA test
// root; NewOtherNotary's to its EC test root, a CA the first does not
// trust.
func NewNotary() *Notary {
	leaf, root := testhelper.GetRSALeafCertificate(), testhelper.GetRSARootCertificate()
	return &Notary{root: root.Cert, chain: []*x509.Certificate{leaf.Cert, root.Cert}, key: leaf.PrivateKey}
}

// NewOtherNotary: see NewNotary.
func NewOtherNotary() *Notary {
	leaf, root := testhelper.GetECLeafCertificate(), testhelper.GetECRootCertificate()
	return &Notary{root: root.Cert, chain: []*x509.Certificate{leaf.Cert, root.Cert}, key: leaf.PrivateKey}
}

// WriteRoot writes the root CA certificate (a policy's trust store) as PEM
// into dir and returns its path.
func (n *Notary) WriteRoot(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "notation-ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: n.root.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Sign signs d (a JWS envelope over its descriptor) and attaches the
// signature as Notation does: an OCI artifact of type
// application/vnd.cncf.notary.signature whose subject is d. signed is the
// digest the envelope names: d itself, or another one for a copied
// signature.
func (n *Notary) Sign(t testing.TB, d, signed name.Digest, opts ...remote.Option) {
	t.Helper()
	s, err := signer.NewGenericSigner(n.key, n.chain)
	if err != nil {
		t.Fatal(err)
	}
	target, err := remote.Head(signed, opts...)
	if err != nil {
		t.Fatal(err)
	}
	envelope, _, err := s.Sign(context.Background(),
		ocispec.Descriptor{MediaType: string(target.MediaType), Digest: digest.Digest(target.Digest.String()), Size: target.Size},
		notation.SignerSignOptions{SignatureMediaType: "application/jose+json"})
	if err != nil {
		t.Fatal(err)
	}
	attach(t, d, NotationArtifactType, "application/jose+json", envelope,
		map[string]string{"io.cncf.notary.x509chain.thumbprint#S256": "[]"}, opts...)
}
