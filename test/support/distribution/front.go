package distribution

import (
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"
)

// Front is a counting HTTPS front of a running registry: it terminates TLS
// with the registry's own certificate and forwards every request to it, so
// a client that trusts the registry trusts the front. A test points the
// client at Front.Host and reads exact counts of requests (as they arrive)
// and of TCP connections accepted, which the registry's access log, written
// after the answer, cannot give without waiting.
type Front struct {
	Host string // "127.0.0.1:PORT"

	srv *http.Server

	mu       sync.Mutex
	requests []FrontRequest
	conns    int
}

// FrontRequest is one request the front forwarded.
type FrontRequest struct{ Method, Path string }

// StartFront starts a front of r on a free loopback port; Stop stops it too.
func (r *Registry) StartFront() (*Front, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("distribution: front: %w", err)
	}
	target := &url.URL{Scheme: "https", Host: r.Host}
	proxy := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport: r.Transport(),
		ErrorLog:  log.New(io.Discard, "", 0),
	}
	f := &Front{Host: ln.Addr().String()}
	f.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			f.mu.Lock()
			f.requests = append(f.requests, FrontRequest{req.Method, req.URL.Path})
			f.mu.Unlock()
			proxy.ServeHTTP(w, req)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				f.mu.Lock()
				f.conns++
				f.mu.Unlock()
			}
		},
	}
	go func() {
		_ = f.srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{r.pair.TLS}, MinVersion: tls.VersionTLS12}))
	}()
	r.fronts = append(r.fronts, f)
	return f, nil
}

// Requests returns a copy of the requests forwarded so far.
func (f *Front) Requests() []FrontRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]FrontRequest(nil), f.requests...)
}

// Conns is the number of TCP connections the front accepted.
func (f *Front) Conns() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conns
}
