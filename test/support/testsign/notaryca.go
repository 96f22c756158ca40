package testsign

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ocsp"
)

// NotaryCA is a certificate authority of the test's own whose
// certificates name an OCSP responder it serves on loopback, for Notation's
// revocation check.
type NotaryCA struct {
	root    *x509.Certificate
	key     *rsa.PrivateKey
	srv     *httptest.Server
	mu      sync.Mutex
	revoked map[string]bool // serial numbers
	asked   int
}

// NewNotaryCA makes the CA and starts its OCSP responder.
func NewNotaryCA(t testing.TB) *NotaryCA {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 3072)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "image-refresh test notary CA", Organization: []string{"acme"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	root, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &NotaryCA{root: root, key: key, revoked: map[string]bool{}}
	ca.srv = httptest.NewServer(http.HandlerFunc(ca.ocsp))
	t.Cleanup(ca.srv.Close)
	return ca
}

// Issue makes a code-signing certificate of the CA whose OCSP responder is
// the CA's, and a Notary that signs with it.
func (ca *NotaryCA) Issue(t testing.TB) *Notary {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 3072)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "release signer", Organization: []string{"acme"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(12 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning},
		BasicConstraintsValid: true, OCSPServer: []string{ca.srv.URL},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.root, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &Notary{root: ca.root, chain: []*x509.Certificate{leaf, ca.root}, key: key}
}

// Revoke makes the responder answer that n's certificate is revoked.
func (ca *NotaryCA) Revoke(n *Notary) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	ca.revoked[n.chain[0].SerialNumber.String()] = true
}

// Asked is how many OCSP requests the responder answered.
func (ca *NotaryCA) Asked() int {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	return ca.asked
}

func (ca *NotaryCA) ocsp(w http.ResponseWriter, r *http.Request) {
	var body []byte
	var err error
	if r.Method == http.MethodPost {
		body, err = io.ReadAll(r.Body)
	} else {
		body, err = base64.StdEncoding.DecodeString(strings.TrimPrefix(r.URL.Path, "/"))
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req, err := ocsp.ParseRequest(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ca.mu.Lock()
	ca.asked++
	revoked := ca.revoked[req.SerialNumber.String()]
	ca.mu.Unlock()
	resp := ocsp.Response{Status: ocsp.Good, SerialNumber: req.SerialNumber,
		ThisUpdate: time.Now().Add(-time.Minute), NextUpdate: time.Now().Add(time.Hour)}
	if revoked {
		resp.Status, resp.RevokedAt, resp.RevocationReason = ocsp.Revoked, time.Now().Add(-time.Minute), ocsp.KeyCompromise
	}
	der, err := ocsp.CreateResponse(ca.root, ca.root, resp, crypto.Signer(ca.key))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/ocsp-response")
	_, _ = w.Write(der)
}
