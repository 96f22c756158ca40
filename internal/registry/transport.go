package registry

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
)

// newHostTransport builds the one transport a host config uses for all its
// calls, so connections are reused across ticks and polls.
func newHostTransport(hc HostConfig) (*http.Transport, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if !hc.Insecure && hc.CAFile == "" {
		return t, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if hc.CAFile != "" {
		pem, err := os.ReadFile(hc.CAFile)
		if err != nil {
			return nil, fmt.Errorf("host %s: read caFile: %w", hc.Host, err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("host %s: caFile %s holds no PEM certificate", hc.Host, hc.CAFile)
		}
		cfg.RootCAs = pool
	}
	// Insecure is the operator's explicit choice for this host (HostConfig).
	cfg.InsecureSkipVerify = hc.Insecure //nolint:gosec // opted in per host
	t.TLSClientConfig = cfg
	return t, nil
}

// observer sits under go-containerregistry's transport stack and sees each
// HTTP round trip. For manifest HEADs it reports the status to OnRequest and
// keeps the answer's headers for the call: ggcr's errors carry the status but
// not Retry-After (C2) nor the raw Docker-Content-Digest (R1).
type observer struct {
	inner http.RoundTripper
	*observed
}

// observed is what every host's observer reports to.
type observed struct {
	budgets     *budgets
	onRequest   func(host string, status int)
	onRateLimit func(host string, rl RateLimit)
}

func (o *observer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := o.inner.RoundTrip(req)
	if req.Method != http.MethodHead || !strings.Contains(req.URL.Path, "/manifests/") {
		return resp, err
	}
	status := 0
	if err == nil {
		status = resp.StatusCode
		// The rate-limit headers of a manifest HEAD's answer, a 429's too.
		if rl, ok := parseRateLimit(resp.Header); ok {
			o.budgets.record(req.URL.Host, rl)
			if o.onRateLimit != nil {
				o.onRateLimit(req.URL.Host, rl)
			}
		}
		if st, ok := req.Context().Value(callKey{}).(*callState); ok {
			st.record(resp)
		}
	}
	if o.onRequest != nil {
		o.onRequest(req.URL.Host, status)
	}
	return resp, err
}

// callKey carries a *callState in the context of one Latest or Has call.
type callKey struct{}

// headAnswer is what a manifest HEAD answered.
type headAnswer struct {
	answered   bool
	status     int
	retryAfter string
	digest     string
}

// callState holds the answer to the last manifest HEAD of one call.
type callState struct {
	mu   sync.Mutex
	last headAnswer
}

func (s *callState) record(resp *http.Response) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = headAnswer{
		answered:   true,
		status:     resp.StatusCode,
		retryAfter: resp.Header.Get("Retry-After"),
		digest:     resp.Header.Get("Docker-Content-Digest"),
	}
}

func (s *callState) answer() headAnswer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}
