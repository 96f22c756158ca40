package testregistry

import (
	"crypto/tls"

	"github.com/image-refresh/image-refresh/internal/testcert"
)

// selfSignedCert makes the registry's certificate (its own CA).
func selfSignedCert() (tls.Certificate, []byte, error) {
	p, err := testcert.Loopback("testregistry")
	return p.TLS, p.CertPEM, err
}
