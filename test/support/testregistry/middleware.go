package testregistry

import (
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/testwait"
)

// Request is one request the server received, for accounting in tests.
type Request struct {
	Method string
	Path   string
	Status int // 0 while the request is still being answered, or if it never was
}

// Fault changes how manifest requests (/v2/<repo>/manifests/<ref>) and
// referrers requests (/v2/<repo>/referrers/<digest>) are answered. It can be switched while the server is serving.
type Fault struct {
	PathContains string        // only requests whose path contains this; "" = every manifest request
	Method       string        // only requests of this method ("HEAD", "GET"); "" = every method
	Status       int           // answer with this status instead of the registry's (0 = no change)
	RetryAfter   string        // Retry-After header value sent with Status
	Delay        time.Duration // answer late; a client that gives up stops the wait
	Hang         bool          // never answer until the client cancels or the server closes
	DigestHeader *string       // replace Docker-Content-Digest; "" drops the header
	Header       http.Header   // headers added to the answer, e.g. RateLimit-Remaining
}

// SetFault installs f, replacing any earlier fault.
func (s *Server) SetFault(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault = &f
}

// ClearFault removes the fault.
func (s *Server) ClearFault() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault = nil
}

// Requests returns a copy of every request received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Count counts the requests with this method whose path contains
// pathSubstring, e.g. Count("HEAD", "/v2/acme/api/manifests/prod").
func (s *Server) Count(method, pathSubstring string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.requests {
		if r.Method == method && strings.Contains(r.Path, pathSubstring) {
			n++
		}
	}
	return n
}

// ResetRequests forgets the requests received so far.
func (s *Server) ResetRequests() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = nil
	s.gen++
	s.changedLocked()
}

// Changed returns a channel that is closed the next time what Requests
// returns changes: a request arrives, is answered, or ResetRequests
// forgets them. Await waits on it.
func (s *Server) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// Await waits until cond (a check of Count or Requests) holds, checking
// it again on every change of the request list: the server's own signal,
// not a poll; the test's deadline bounds a hang.
func (s *Server) Await(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testwait.Until(t, what, s.Changed, cond)
}

// changedLocked wakes the waiters of Changed; s.mu is held.
func (s *Server) changedLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// ServeHTTP records the request on arrival (so Count is exact as soon as the
// client has sent it, even if it hangs), then applies auth and the fault.
func (s *Server) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	s.mu.Lock()
	i, gen := len(s.requests), s.gen
	s.requests = append(s.requests, Request{Method: req.Method, Path: req.URL.Path})
	s.changedLocked()
	fault := s.fault
	s.mu.Unlock()

	sw := &statusWriter{ResponseWriter: w}
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if gen == s.gen {
			s.requests[i].Status = sw.status
			s.changedLocked()
		}
	}()

	if s.token && req.URL.Path == TokenPath {
		s.serveToken(sw, req)
		return
	}
	if s.token && !s.tokens.ok(req) {
		s.challengeToken(sw, req)
		return
	}
	if !s.token && !s.authorized(req) {
		sw.Header().Set("WWW-Authenticate", `Basic realm="testregistry"`)
		writeError(sw, req, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
		return
	}
	if fault != nil && faultApplies(req.URL.Path) && strings.Contains(req.URL.Path, fault.PathContains) &&
		(fault.Method == "" || fault.Method == req.Method) {
		s.serveFault(sw, req, *fault)
		return
	}
	s.registry.ServeHTTP(sw, req)
}

func (s *Server) authorized(req *http.Request) bool {
	if s.user == "" && s.pass == "" {
		return true
	}
	return s.basicOK(req)
}

func (s *Server) basicOK(req *http.Request) bool {
	u, p, ok := req.BasicAuth()
	return ok &&
		subtle.ConstantTimeCompare([]byte(u), []byte(s.user)) == 1 &&
		subtle.ConstantTimeCompare([]byte(p), []byte(s.pass)) == 1
}

func (s *Server) serveFault(w http.ResponseWriter, req *http.Request, f Fault) {
	// A wait cut short drops the connection instead of answering, so a client
	// never mistakes a released hang for a reply.
	if f.Hang {
		s.wait(req.Context(), -1)
		panic(http.ErrAbortHandler)
	}
	if f.Delay > 0 && !s.wait(req.Context(), f.Delay) {
		panic(http.ErrAbortHandler)
	}
	for k, vs := range f.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	if f.Status != 0 {
		if f.RetryAfter != "" {
			w.Header().Set("Retry-After", f.RetryAfter)
		}
		writeError(w, req, f.Status, "UNKNOWN", "injected fault")
		return
	}
	if f.DigestHeader != nil {
		w = &digestWriter{ResponseWriter: w, digest: *f.DigestHeader}
	}
	s.registry.ServeHTTP(w, req)
}

func faultApplies(p string) bool {
	return strings.HasPrefix(p, "/v2/") && (strings.Contains(p, "/manifests/") || strings.Contains(p, "/referrers/"))
}

// writeError answers like a distribution registry: a JSON error body, none
// for HEAD.
func writeError(w http.ResponseWriter, req *http.Request, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if req.Method != http.MethodHead {
		fmt.Fprintf(w, `{"errors":[{"code":%q,"message":%q}]}`, code, msg)
	}
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// digestWriter replaces Docker-Content-Digest just before the header is sent.
type digestWriter struct {
	http.ResponseWriter
	digest  string
	written bool
}

func (w *digestWriter) WriteHeader(code int) {
	if !w.written {
		w.written = true
		if w.digest == "" {
			w.Header().Del("Docker-Content-Digest")
		} else {
			w.Header().Set("Docker-Content-Digest", w.digest)
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *digestWriter) Write(b []byte) (int, error) {
	if !w.written {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}
