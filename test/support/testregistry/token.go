package testregistry

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
)

// TokenPath is where a server started WithTokenAuth hands out bearer tokens.
const TokenPath = "/token"

// WithTokenAuth makes the server answer every /v2/ request without a valid
// bearer token with 401 and "WWW-Authenticate: Bearer realm=<server>/token",
// as Docker Hub, GHCR or Harbor do, and serve that token endpoint itself. The
// endpoint requires these basic credentials when user is not empty. Tokens
// stay valid until RevokeTokens, which stands in for their expiry.
func WithTokenAuth(user, pass string) Option {
	return func(s *Server) { s.token, s.user, s.pass = true, user, pass }
}

// tokenIssuer holds the tokens handed out and not revoked.
type tokenIssuer struct {
	mu    sync.Mutex
	valid map[string]bool
}

// RevokeTokens makes every token handed out so far invalid, as its expiry
// would: the next request with one is answered 401 with a fresh challenge.
func (s *Server) RevokeTokens() {
	s.tokens.mu.Lock()
	defer s.tokens.mu.Unlock()
	s.tokens.valid = nil
}

func (t *tokenIssuer) issue() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	tok := hex.EncodeToString(b)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.valid == nil {
		t.valid = map[string]bool{}
	}
	t.valid[tok] = true
	return tok
}

func (t *tokenIssuer) ok(req *http.Request) bool {
	tok, found := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	t.mu.Lock()
	defer t.mu.Unlock()
	return found && t.valid[tok]
}

// serveToken answers the token endpoint: basic credentials in, a token out.
func (s *Server) serveToken(w http.ResponseWriter, req *http.Request) {
	if s.user != "" || s.pass != "" {
		if !s.basicOK(req) {
			writeError(w, req, http.StatusUnauthorized, "UNAUTHORIZED", "bad credentials")
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"token": s.tokens.issue(), "expires_in": 300})
}

// challengeToken answers 401 with the bearer challenge for req.
func (s *Server) challengeToken(w http.ResponseWriter, req *http.Request) {
	scope := ""
	if repo, _, ok := strings.Cut(strings.TrimPrefix(req.URL.Path, "/v2/"), "/manifests/"); ok {
		scope = fmt.Sprintf(`,scope="repository:%s:pull"`, repo)
	}
	w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="http://%s%s",service="testregistry"%s`, req.Host, TokenPath, scope))
	writeError(w, req, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
}
