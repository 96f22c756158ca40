package localcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// keyPair is a certificate and its private key, in memory and on disk.
type keyPair struct {
	cert     *x509.Certificate
	key      *ecdsa.PrivateKey
	certFile string
	keyFile  string
}

// pki holds every certificate the cluster needs, generated fresh at start:
// the cluster CA (serving, clients, and the controller-manager's signer),
// the front-proxy CA (requestheader authentication of aggregated APIs) and
// the service-account signing key.
type pki struct {
	ca, apiserver, admin, frontProxyCA, frontProxyClient keyPair
	// kubeletClient is the API server's client certificate towards a real
	// node's kubelet (logs, exec): system:masters, as kubeadm makes it.
	kubeletClient        keyPair
	saKeyFile, saPubFile string
}

// newPKI generates the cluster's certificates; extraIPs are more addresses
// the API server's certificate names (a real node's forward and the
// `kubernetes` Service's ClusterIP).
func newPKI(dir string, extraIPs ...net.IP) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pki{}
	var err error
	if p.ca, err = newCA(dir, "ca", "image-refresh-local-ca"); err != nil {
		return nil, err
	}
	if p.frontProxyCA, err = newCA(dir, "front-proxy-ca", "image-refresh-front-proxy-ca"); err != nil {
		return nil, err
	}
	if p.apiserver, err = p.ca.sign(dir, "apiserver", pkix.Name{CommonName: "kube-apiserver"},
		x509.ExtKeyUsageServerAuth,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		append([]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")}, extraIPs...)); err != nil {
		return nil, err
	}
	if p.kubeletClient, err = p.ca.sign(dir, "apiserver-kubelet-client", pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		x509.ExtKeyUsageClientAuth, nil, nil); err != nil {
		return nil, err
	}
	if p.admin, err = p.ca.sign(dir, "admin", pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		x509.ExtKeyUsageClientAuth, nil, nil); err != nil {
		return nil, err
	}
	if p.frontProxyClient, err = p.frontProxyCA.sign(dir, "front-proxy-client", pkix.Name{CommonName: "front-proxy-client"},
		x509.ExtKeyUsageClientAuth, nil, nil); err != nil {
		return nil, err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	p.saKeyFile, p.saPubFile = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.saKeyFile, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)); err != nil {
		return nil, err
	}
	if err := writePEM(p.saPubFile, "PUBLIC KEY", pub); err != nil {
		return nil, err
	}
	return p, nil
}

func newCA(dir, file, cn string) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return keyPair{}, fmt.Errorf("create CA %s: %w", cn, err)
	}
	return save(dir, file, der, key)
}

func (ca keyPair) sign(dir, file string, subject pkix.Name, usage x509.ExtKeyUsage, dns []string, ips []net.IP) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      subject,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return keyPair{}, fmt.Errorf("sign %s: %w", subject.CommonName, err)
	}
	return save(dir, file, der, key)
}

func save(dir, file string, der []byte, key *ecdsa.PrivateKey) (keyPair, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return keyPair{}, err
	}
	kp := keyPair{cert: cert, key: key, certFile: filepath.Join(dir, file+".crt"), keyFile: filepath.Join(dir, file+".key")}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return keyPair{}, err
	}
	if err := writePEM(kp.certFile, "CERTIFICATE", der); err != nil {
		return keyPair{}, err
	}
	if err := writePEM(kp.keyFile, "EC PRIVATE KEY", keyDER); err != nil {
		return keyPair{}, err
	}
	return kp, nil
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}
