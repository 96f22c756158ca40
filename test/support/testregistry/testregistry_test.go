package testregistry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/testwait"
)

const manifestAccept = "application/vnd.docker.distribution.manifest.v2+json," +
	"application/vnd.docker.distribution.manifest.list.v2+json," +
	"application/vnd.oci.image.manifest.v1+json," +
	"application/vnd.oci.image.index.v1+json"

// do sends one request to the server and returns the response, body closed.
func do(t *testing.T, client *http.Client, method, url string, header http.Header) *http.Response {
	t.Helper()
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", manifestAccept)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

func manifestURL(s *Server, repo, ref string) string {
	return "http://" + s.Host() + "/v2/" + repo + "/manifests/" + ref
}

func TestHeadServesPushedDigestAndMediaType(t *testing.T) {
	s := Start(t)
	for _, tc := range []struct {
		name, tag, wantType string
		push                func(tag string) string
	}{
		{"docker v2 image", "docker", "application/vnd.docker.distribution.manifest.v2+json",
			func(tag string) string { return s.MustPushRandomImage(t, "acme/api", tag) }},
		{"oci image", "oci", "application/vnd.oci.image.manifest.v1+json",
			func(tag string) string { return s.MustPushRandomOCIImage(t, "acme/api", tag) }},
		{"oci index", "multi", "application/vnd.oci.image.index.v1+json",
			func(tag string) string { return s.MustPushRandomIndex(t, "acme/api", tag, 3) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.push(tc.tag)
			for _, ref := range []string{tc.tag, want} {
				resp := do(t, nil, http.MethodHead, manifestURL(s, "acme/api", ref), nil)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("HEAD %s: status %d", ref, resp.StatusCode)
				}
				if got := resp.Header.Get("Docker-Content-Digest"); got != want {
					t.Errorf("HEAD %s: Docker-Content-Digest %q, want %q", ref, got, want)
				}
				if got := resp.Header.Get("Content-Type"); got != tc.wantType {
					t.Errorf("HEAD %s: Content-Type %q, want %q", ref, got, tc.wantType)
				}
			}
		})
	}
}

func TestPushRandomIndexHasOnePlatformPerChild(t *testing.T) {
	s := Start(t)
	s.MustPushRandomIndex(t, "acme/api", "multi", 2)
	resp, err := http.Get(manifestURL(s, "acme/api", "multi"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var idx struct {
		Manifests []struct {
			MediaType string
			Platform  struct{ Architecture string }
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&idx); err != nil {
		t.Fatal(err)
	}
	if len(idx.Manifests) != 2 || idx.Manifests[0].Platform.Architecture != "amd64" || idx.Manifests[1].Platform.Architecture != "arm64" {
		t.Errorf("index manifests = %+v, want amd64 and arm64 children", idx.Manifests)
	}
}

func TestTagMovesAndDeleteTagRemoves(t *testing.T) {
	s := Start(t)
	old := s.MustPushRandomImage(t, "acme/api", "v1")
	s.MustPushRandomImage(t, "acme/api", "prod")
	s.MustTag(t, "acme/api", "prod", old)
	if got := do(t, nil, http.MethodHead, manifestURL(s, "acme/api", "prod"), nil).Header.Get("Docker-Content-Digest"); got != old {
		t.Errorf("after Tag: prod = %q, want %q", got, old)
	}
	s.MustDeleteTag(t, "acme/api", "prod")
	if got := do(t, nil, http.MethodHead, manifestURL(s, "acme/api", "prod"), nil).StatusCode; got != http.StatusNotFound {
		t.Errorf("after DeleteTag: HEAD prod status %d, want 404", got)
	}
	if got := do(t, nil, http.MethodHead, manifestURL(s, "acme/api", old), nil).StatusCode; got != http.StatusOK {
		t.Errorf("after DeleteTag: HEAD by digest status %d, want 200", got)
	}
}

func TestRequestAccounting(t *testing.T) {
	s := Start(t)
	s.MustPushRandomImage(t, "acme/api", "prod")
	if n := len(s.Requests()); n != 0 {
		t.Fatalf("content helpers were counted: %d requests", n)
	}
	do(t, nil, http.MethodHead, manifestURL(s, "acme/api", "prod"), nil)
	do(t, nil, http.MethodHead, manifestURL(s, "acme/api", "prod"), nil)
	do(t, nil, http.MethodHead, manifestURL(s, "acme/api", "dev"), nil)
	if n := s.Count("HEAD", "/v2/acme/api/manifests/prod"); n != 2 {
		t.Errorf("Count(prod) = %d, want 2", n)
	}
	if n := s.Count("GET", "/v2/acme/api/manifests/prod"); n != 0 {
		t.Errorf("Count(GET prod) = %d, want 0", n)
	}
	reqs := s.Requests()
	if len(reqs) != 3 || reqs[2].Status != http.StatusNotFound || reqs[0].Status != http.StatusOK {
		t.Errorf("Requests() = %+v, want 200, 200, 404", reqs)
	}
	s.ResetRequests()
	if n := s.Count("HEAD", ""); n != 0 {
		t.Errorf("after ResetRequests: Count = %d", n)
	}
}

func TestFaultStatusAndRetryAfter(t *testing.T) {
	s := Start(t)
	s.MustPushRandomImage(t, "acme/api", "prod")
	s.MustPushRandomImage(t, "acme/web", "prod")
	s.SetFault(Fault{PathContains: "/acme/api/", Status: http.StatusTooManyRequests, RetryAfter: "7"})
	resp := do(t, nil, http.MethodHead, manifestURL(s, "acme/api", "prod"), nil)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "7" {
		t.Errorf("faulted path: status %d Retry-After %q, want 429 and 7", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if got := do(t, nil, http.MethodHead, manifestURL(s, "acme/web", "prod"), nil).StatusCode; got != http.StatusOK {
		t.Errorf("path outside PathContains: status %d, want 200", got)
	}
	if got := do(t, nil, http.MethodGet, "http://"+s.Host()+"/v2/", nil).StatusCode; got != http.StatusOK {
		t.Errorf("non-manifest request: status %d, want 200", got)
	}
	s.ClearFault()
	if got := do(t, nil, http.MethodHead, manifestURL(s, "acme/api", "prod"), nil).StatusCode; got != http.StatusOK {
		t.Errorf("after ClearFault: status %d, want 200", got)
	}
}

func TestFaultDigestHeader(t *testing.T) {
	s := Start(t)
	s.MustPushRandomImage(t, "acme/api", "prod")
	for _, value := range []string{"", "sha256:ABC", "sha512:" + strings.Repeat("a", 128)} {
		s.SetFault(Fault{DigestHeader: &value})
		resp := do(t, nil, http.MethodHead, manifestURL(s, "acme/api", "prod"), nil)
		_, present := resp.Header["Docker-Content-Digest"]
		if got := resp.Header.Get("Docker-Content-Digest"); got != value || present != (value != "") {
			t.Errorf("DigestHeader %q: got %q (present %v)", value, got, present)
		}
	}
}

func TestFaultDelay(t *testing.T) {
	s := Start(t)
	s.MustPushRandomImage(t, "acme/api", "prod")
	s.SetFault(Fault{Delay: 200 * time.Millisecond})
	start := time.Now()
	if got := do(t, nil, http.MethodHead, manifestURL(s, "acme/api", "prod"), nil).StatusCode; got != http.StatusOK {
		t.Errorf("delayed: status %d, want 200", got)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("answered after %v, want at least the 200ms delay", d)
	}

	// A client that gives up ends the wait on the server too.
	s.SetFault(Fault{Delay: time.Hour})
	s.ResetRequests()
	client := &http.Client{Timeout: 100 * time.Millisecond}
	req, _ := http.NewRequest(http.MethodHead, manifestURL(s, "acme/api", "prod"), nil)
	if _, err := client.Do(req); err == nil {
		t.Fatal("an hour-long delay answered within 100ms")
	}
	waitForStatus(t, s, 0)
}

func TestFaultHangUntilClientCancelsOrServerCloses(t *testing.T) {
	s := Start(t)
	s.MustPushRandomImage(t, "acme/api", "prod")
	s.SetFault(Fault{Hang: true})

	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodHead, manifestURL(s, "acme/api", "prod"), nil)
	start := time.Now()
	_, err := http.DefaultClient.Do(req)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hung request: err %v, want the client's deadline", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("hung request returned after %v", d)
	}

	// Close releases a request that is still hanging.
	errc := make(chan error, 1)
	go func() {
		_, err := http.Head(manifestURL(s, "acme/api", "prod"))
		errc <- err
	}()
	s.Await(t, "the second HEAD to arrive", func() bool { return s.Count("HEAD", "/manifests/prod") >= 2 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := testwait.Recv(t, errc, "Close to release a hanging request"); err == nil {
		t.Error("request hanging at Close got an answer")
	}
}

// waitForStatus waits until the server finished the first request (a
// cancelled one keeps status 0).
func waitForStatus(t *testing.T, s *Server, want int) {
	t.Helper()
	s.Await(t, fmt.Sprintf("one request answered with status %d", want), func() bool {
		r := s.Requests()
		return len(r) == 1 && r[0].Status == want
	})
}

func TestBasicAuth(t *testing.T) {
	s := Start(t, WithBasicAuth("robot", "s3cret"))
	s.MustPushRandomImage(t, "acme/api", "prod")
	resp := do(t, nil, http.MethodHead, manifestURL(s, "acme/api", "prod"), nil)
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") {
		t.Errorf("no credentials: status %d WWW-Authenticate %q, want 401 Basic", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	for _, tc := range []struct {
		user, pass string
		want       int
	}{{"robot", "wrong", http.StatusUnauthorized}, {"robot", "s3cret", http.StatusOK}} {
		req, _ := http.NewRequest(http.MethodHead, manifestURL(s, "acme/api", "prod"), nil)
		req.SetBasicAuth(tc.user, tc.pass)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s:%s: status %d, want %d", tc.user, tc.pass, resp.StatusCode, tc.want)
		}
	}
}

func TestStartTLS(t *testing.T) {
	s := New()
	caPEM, err := s.StartTLS("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	s.MustPushRandomImage(t, "acme/api", "prod")
	url := "https://" + s.Host() + "/v2/acme/api/manifests/prod"

	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("caPEM holds no certificate")
	}
	trusting := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	if got := do(t, trusting, http.MethodHead, url, nil).StatusCode; got != http.StatusOK {
		t.Errorf("with the CA: status %d, want 200", got)
	}
	var unknown x509.UnknownAuthorityError
	if _, err := http.Head(url); !errors.As(err, &unknown) {
		t.Errorf("without the CA: err %v, want an unknown-authority error", err)
	}
}
