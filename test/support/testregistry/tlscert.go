package testregistry

import (
	"crypto/tls"
	"net"

	"github.com/image-refresh/image-refresh/test/support/testcert"
)

// selfSignedCert makes the registry's certificate (its own CA).
func selfSignedCert(ips ...net.IP) (tls.Certificate, []byte, error) {
	p, err := testcert.For("testregistry", ips...)
	return p.TLS, p.CertPEM, err
}
