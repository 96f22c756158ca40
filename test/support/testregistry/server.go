// Package testregistry serves a real OCI distribution registry
// (go-containerregistry's pkg/registry) on loopback, wrapped in a middleware
// that counts requests, can require basic auth and injects faults. Tests use it
// so that every registry test is hermetic (no internet); a dev process can run
// it for a local cluster, so the core type does not need a testing.T.
package testregistry

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/image-refresh/image-refresh/test/support/content"
	"github.com/image-refresh/image-refresh/test/support/freeport"
)

// Server is an in-memory registry with request accounting and switchable
// faults. Create it with New, then Start or StartTLS it.
type Server struct {
	content.Store // Push, Tag, DeleteTag, …: in-process, past the middleware

	registry http.Handler // the unwrapped registry; content helpers talk to it in-process
	// referrers serves the OCI 1.1 referrers API; without it a client
	// falls back to the sha256-<hex> tag schema.
	referrers bool
	user      string
	pass      string
	token     bool // bearer tokens from /token instead of basic auth on /v2/

	tokens tokenIssuer
	conns  atomic.Int64 // TCP connections accepted

	mu       sync.Mutex
	requests []Request
	gen      int           // bumped by ResetRequests, so a late status lands in the right list
	changed  chan struct{} // closed and replaced when requests changes (Changed)
	fault    *Fault

	srv    *http.Server
	host   string
	closed chan struct{} // closed by Close: releases requests held by Hang or Delay
	once   sync.Once
}

// Option configures a Server.
type Option func(*Server)

// WithBasicAuth makes every /v2/ request answer 401 with
// "WWW-Authenticate: Basic" unless it carries these credentials.
func WithBasicAuth(user, pass string) Option {
	return func(s *Server) { s.user, s.pass = user, pass }
}

// WithReferrers serves the OCI 1.1 referrers API
// (GET /v2/<repo>/referrers/<digest>). Without it the server answers that
// endpoint 404, as a registry without the API does, and clients use the
// sha256-<hex> tag schema instead.
func WithReferrers() Option {
	return func(s *Server) { s.referrers = true }
}

// New returns a server that is not started yet.
func New(opts ...Option) *Server {
	s := &Server{closed: make(chan struct{}), changed: make(chan struct{})}
	s.Store = newContent(s)
	for _, o := range opts {
		o(s)
	}
	s.registry = registry.New(registry.Logger(log.New(io.Discard, "", 0)), registry.WithReferrersSupport(s.referrers))
	return s
}

// Start serves plain HTTP on addr; "127.0.0.1:0" picks a free port.
func (s *Server) Start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("testregistry: listen on %s: %w", addr, err)
	}
	s.serve(ln, nil)
	return nil
}

// StartTLS serves HTTPS on addr with a fresh self-signed certificate for
// 127.0.0.1 and localhost, and returns that certificate in PEM so a client
// can trust it (a CA file).
func (s *Server) StartTLS(addr string) (caPEM []byte, err error) {
	return s.StartTLSFor(addr)
}

// StartTLSFor is StartTLS with a certificate also valid for ips.
func (s *Server) StartTLSFor(addr string, ips ...net.IP) (caPEM []byte, err error) {
	cert, caPEM, err := selfSignedCert(ips...)
	if err != nil {
		return nil, fmt.Errorf("testregistry: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("testregistry: listen on %s: %w", addr, err)
	}
	s.serve(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	return caPEM, nil
}

func (s *Server) serve(ln net.Listener, tlsConfig *tls.Config) {
	s.host = ln.Addr().String()
	s.srv = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		// Handshake failures are expected in TLS tests; keep them off stderr.
		ErrorLog: log.New(io.Discard, "", 0),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				s.conns.Add(1)
			}
		},
	}
	if tlsConfig != nil {
		ln = tls.NewListener(ln, tlsConfig)
	}
	go func() { _ = s.srv.Serve(ln) }()
}

// Close stops the server and releases requests held by a Hang or Delay fault.
func (s *Server) Close() error {
	s.once.Do(func() { close(s.closed) })
	if s.srv == nil {
		return nil
	}
	err := s.srv.Close()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Conns is the number of TCP connections the server has accepted, so a test
// can prove that a client keeps its connections alive.
func (s *Server) Conns() int { return int(s.conns.Load()) }

// Host is the "127.0.0.1:PORT" the server listens on ("" before Start).
func (s *Server) Host() string { return s.host }

// Start starts a plain-HTTP server on a free loopback port and closes it when
// the test ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s := New(opts...)
	// On a loopback port this process never gave out before: the host
	// names every image the server holds, and a later test's registry on
	// a reused port would meet what the nodes' image caches (N1) kept for
	// the same repo:tag from an earlier test's pods — a stale tag no test
	// asked for. A port another process took between the pick and the
	// bind is picked again.
	var err error
	for range 5 {
		var addr string
		if addr, err = freeport.Addr(); err != nil {
			break
		}
		if err = s.Start(addr); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// wait blocks for d, or until the client gives up or the server closes;
// d < 0 waits for the latter only. It reports whether the full wait elapsed.
func (s *Server) wait(ctx context.Context, d time.Duration) bool {
	var timer <-chan time.Time
	if d >= 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-timer:
		return true
	case <-ctx.Done():
	case <-s.closed:
	}
	return false
}
