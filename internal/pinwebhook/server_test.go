package pinwebhook

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/testwait"
)

// startServer serves h as Setup does (newServer) on a free loopback port
// and returns host:port once it completes TLS handshakes. certs nil means
// o.CertDir holds the certificate.
func startServer(t *testing.T, o Options, certs *SelfSigned, h *Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.Host, o.Port = "127.0.0.1", l.Addr().(*net.TCPAddr).Port
	l.Close()
	srv := newServer(o, certs, h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("webhook server: %v", err)
		}
	})
	addr := net.JoinHostPort(o.Host, strconv.Itoa(o.Port))
	serving(t, addr, done)
	return addr
}

// serving waits until the server on addr completes a TLS handshake, and
// fails at once if it stopped (done). controller-runtime's webhook server
// opens its listener inside Start and announces nothing (its own
// StartedChecker dials too), so the handshake is probed; the timeout
// bounds a hang. done has room for the one result Start sends.
func serving(t testing.TB, addr string, done chan error) {
	t.Helper()
	var last error
	testwait.Eventually(t, 30*time.Second, "a TLS handshake with the webhook server on "+addr, func() bool {
		select {
		case err := <-done:
			done <- err // for the cleanup that waits for Start
			t.Fatalf("webhook server stopped: %v", err)
		default:
		}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			// Refused: not listening yet. Anything else is worth a line.
			if !errors.Is(err, syscall.ECONNREFUSED) && (last == nil || last.Error() != err.Error()) {
				t.Logf("webhook server on %s: %v", addr, err)
			}
			last = err
			return false
		}
		conn.Close()
		return true
	})
}

// selfSigned is the default TLS identity (an ECDSA CA and certificate made
// in the process) for 127.0.0.1.
func selfSigned(t *testing.T) *SelfSigned {
	t.Helper()
	s, err := NewSelfSigned([]string{"image-refresh.tb.svc", "127.0.0.1"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// rsaCertDir writes an RSA certificate for 127.0.0.1 as tls.crt and tls.key
// into a directory, as a mounted kubernetes.io/tls Secret (cert-manager's
// default key algorithm) provides them, and returns the directory and the
// certificate, which is its own CA.
func rsaCertDir(t *testing.T) (string, *x509.Certificate) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "image-refresh.tb.svc"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, typ string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("tls.crt", "CERTIFICATE", der)
	write("tls.key", "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key))
	return dir, cert
}

func pool(ca *x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca)
	return p
}

// modernSuite says whether the webhook must accept a TLS 1.2 cipher suite:
// ECDHE key exchange (forward secrecy) with an AEAD cipher (AES-GCM or
// ChaCha20-Poly1305), authenticated by the server's key type (auth is
// "ECDSA" or "RSA"). Decided from the suite's registered name, not from the
// server's list.
func modernSuite(name, auth string) bool {
	return strings.HasPrefix(name, "TLS_ECDHE_"+auth+"_WITH_") &&
		(strings.Contains(name, "_GCM_") || strings.Contains(name, "_CHACHA20_POLY1305"))
}

// refused says whether a handshake error is the server's TLS alert (not,
// say, a connection that could not be made).
func refused(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error"
}

func TestWebhook_B1_ServesModernTLSOnly(t *testing.T) {
	// Loosen every crypto/tls default that GODEBUG can loosen (TLS 1.0 and
	// 1.1 servers, RSA key exchange, 3DES), so that what this test sees is
	// the webhook's own TLS settings and not the defaults of this Go.
	t.Setenv("GODEBUG", "tls10server=1,tlsrsakex=1,tls3des=1")
	h, _ := newTestHandler(nil, nil, true)
	certs := selfSigned(t)
	rsaDir, rsaCA := rsaCertDir(t)
	servers := []struct {
		name, addr, auth string
		roots            *x509.CertPool
	}{
		{"self-signed ECDSA certificate", startServer(t, Options{}, certs, h), "ECDSA", pool(certs.CA())},
		{"mounted RSA certificate (--webhook-cert-dir)", startServer(t, Options{CertDir: rsaDir}, nil, h), "RSA", pool(rsaCA)},
	}
	// every TLS 1.2 suite crypto/tls implements, secure or not
	var suites12 []*tls.CipherSuite
	for _, cs := range slices.Concat(tls.CipherSuites(), tls.InsecureCipherSuites()) {
		if slices.Contains(cs.SupportedVersions, tls.VersionTLS12) {
			suites12 = append(suites12, cs)
		}
	}
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			handshake := func(c *tls.Config) (tls.ConnectionState, error) {
				c.RootCAs, c.ServerName = s.roots, "127.0.0.1"
				conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", s.addr, c)
				if err != nil {
					return tls.ConnectionState{}, err
				}
				defer conn.Close()
				return conn.ConnectionState(), nil
			}
			t.Run("TLS 1.3 is served", func(t *testing.T) {
				st, err := handshake(&tls.Config{MinVersion: tls.VersionTLS13})
				if err != nil || st.Version != tls.VersionTLS13 {
					t.Fatalf("TLS 1.3 handshake: %v, version %s", err, tls.VersionName(st.Version))
				}
			})
			for _, v := range []uint16{tls.VersionTLS10, tls.VersionTLS11} {
				t.Run(tls.VersionName(v)+" fails the handshake", func(t *testing.T) {
					st, err := handshake(&tls.Config{MinVersion: v, MaxVersion: v})
					if !refused(err) {
						t.Fatalf("a %s client: err %v, negotiated %s; want the server to refuse", tls.VersionName(v), err, tls.VersionName(st.Version))
					}
				})
			}
			var legacy []uint16 // every CBC, RC4, 3DES or RSA key exchange suite
			for _, cs := range suites12 {
				want := modernSuite(cs.Name, s.auth)
				if !strings.Contains(cs.Name, "_GCM_") && !strings.Contains(cs.Name, "_CHACHA20_POLY1305") || !strings.HasPrefix(cs.Name, "TLS_ECDHE_") {
					legacy = append(legacy, cs.ID)
				}
				t.Run("TLS 1.2 "+cs.Name, func(t *testing.T) {
					st, err := handshake(&tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{cs.ID}})
					switch {
					case want && (err != nil || st.CipherSuite != cs.ID):
						t.Errorf("an ECDHE AEAD suite for a %s key is refused: %v", s.auth, err)
					case !want && !refused(err):
						t.Errorf("accepted (err %v, negotiated %s %s); want the server to refuse it", err,
							tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite))
					}
				})
			}
			t.Run("TLS 1.2 client offering only CBC and RSA key exchange suites fails the handshake", func(t *testing.T) {
				st, err := handshake(&tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: legacy})
				if !refused(err) {
					t.Fatalf("accepted (err %v, negotiated %s); want the server to refuse it", err, tls.CipherSuiteName(st.CipherSuite))
				}
			})
		})
	}
}
