package distribution

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/image-refresh/image-refresh/test/support/testcert"
)

// Token auth: Distribution's auth.token needs a token server, the part that
// Docker Hub, GHCR or Harbor run beside their registry. TokenServer is a
// small one, in process: it checks the basic credentials (User, Password),
// grants every scope asked for, and signs an ES256 JWT that carries its
// certificate in x5c; the registry trusts that certificate through
// rootcertbundle. It serves HTTPS on localhost with the registry's own
// certificate, so a client that trusts the registry trusts it too, and the
// realm is a host name (go-containerregistry refuses a realm on a loopback
// IP literal other than the registry's own host:port).

const (
	tokenService = "image-refresh-test"
	tokenIssuer  = "image-refresh-test-issuer"
)

// TokenServer hands out bearer tokens for one registry.
type TokenServer struct {
	Realm string // "https://localhost:PORT/token"

	pair testcert.Pair
	srv  *http.Server

	mu         sync.Mutex
	requests   int
	expireNext int
	conns      int
}

// startTokenServer serves the token endpoint on a free loopback port.
func startTokenServer(pair testcert.Pair) (*TokenServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("token server: %w", err)
	}
	ts := &TokenServer{pair: pair}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ts.Realm = "https://localhost:" + port + "/token"
	ts.srv = &http.Server{
		Handler:           http.HandlerFunc(ts.serve),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				ts.mu.Lock()
				ts.conns++
				ts.mu.Unlock()
			}
		},
	}
	tlsLn := tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{pair.TLS}, MinVersion: tls.VersionTLS12})
	go func() { _ = ts.srv.Serve(tlsLn) }()
	return ts, nil
}

// Requests is the number of token requests answered so far.
func (ts *TokenServer) Requests() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.requests
}

// Conns is the number of TCP connections the token server accepted.
func (ts *TokenServer) Conns() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.conns
}

// ExpireNext makes the next n tokens expired when issued (past
// Distribution's 60 s leeway), so that a test sees how a client meets an
// expired token without waiting for one.
func (ts *TokenServer) ExpireNext(n int) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.expireNext = n
}

func (ts *TokenServer) close() {
	if ts != nil {
		_ = ts.srv.Close()
	}
}

func (ts *TokenServer) serve(w http.ResponseWriter, req *http.Request) {
	u, p, ok := req.BasicAuth()
	if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(User)) != 1 || subtle.ConstantTimeCompare([]byte(p), []byte(Password)) != 1 {
		w.Header().Set("WWW-Authenticate", `Basic realm="image-refresh-test"`)
		http.Error(w, `{"errors":[{"code":"UNAUTHORIZED"}]}`, http.StatusUnauthorized)
		return
	}
	now := time.Now()
	ts.mu.Lock()
	ts.requests++
	exp := now.Add(5 * time.Minute)
	if ts.expireNext > 0 {
		ts.expireNext--
		exp = now.Add(-5 * time.Minute)
	}
	ts.mu.Unlock()

	var access []map[string]any
	for _, scope := range req.URL.Query()["scope"] {
		// repository:acme/api:pull,push
		parts := strings.Split(scope, ":")
		if len(parts) != 3 {
			continue
		}
		access = append(access, map[string]any{"type": parts[0], "name": parts[1], "actions": strings.Split(parts[2], ",")})
	}
	tok, err := ts.sign(map[string]any{
		"iss": tokenIssuer, "sub": u, "aud": tokenService,
		"exp": exp.Unix(), "nbf": now.Add(-time.Minute).Unix(), "iat": now.Unix(),
		"jti": fmt.Sprintf("%d", now.UnixNano()), "access": access,
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"token": tok, "expires_in": int(time.Until(exp).Seconds()), "issued_at": now.Format(time.RFC3339)})
}

// sign makes a compact ES256 JWS of claims with the certificate in x5c.
func (ts *TokenServer) sign(claims map[string]any) (string, error) {
	header, err := json.Marshal(map[string]any{
		"typ": "JWT", "alg": "ES256",
		"x5c": []string{base64.StdEncoding.EncodeToString(ts.pair.TLS.Certificate[0])},
	})
	if err != nil {
		return "", err
	}
	body, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	enc := base64.RawURLEncoding
	signed := enc.EncodeToString(header) + "." + enc.EncodeToString(body)
	key, ok := ts.pair.TLS.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return "", fmt.Errorf("token server: key is %T, want ECDSA", ts.pair.TLS.PrivateKey)
	}
	sum := sha256.Sum256([]byte(signed))
	r, s, err := ecdsa.Sign(rand.Reader, key, sum[:])
	if err != nil {
		return "", err
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return signed + "." + enc.EncodeToString(sig), nil
}
