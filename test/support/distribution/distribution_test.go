package distribution

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

func TestStart_ServesTLSWithBasicAuthAndDeletesByDigest(t *testing.T) {
	r := StartT(t)
	if !strings.HasPrefix(r.Host, "127.0.0.1:") {
		t.Fatalf("registry listens on %s, want loopback", r.Host)
	}
	// Without credentials: 401 with a Basic challenge.
	client := &http.Client{Transport: r.Transport()}
	resp, err := client.Get("https://" + r.Host + "/v2/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic") {
		t.Fatalf("GET /v2/ without credentials: %d %q, want 401 with a Basic challenge", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	// Without the CA: the handshake fails.
	if _, err := http.Get("https://" + r.Host + "/v2/"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("GET without the CA: %v, want a certificate error", err)
	}

	d := r.MustPushRandomImage(t, "acme/api", "prod")
	if got, err := r.Head("acme/api", "prod"); err != nil || got != d {
		t.Fatalf("HEAD acme/api:prod = %q, %v; want %s", got, err, d)
	}
	idx := r.MustPushRandomIndex(t, "acme/api", "multi", 2)
	if got, _ := r.Head("acme/api", "multi"); got != idx {
		t.Fatalf("HEAD acme/api:multi = %q, want the index digest %s", got, idx)
	}
	r.MustDeleteManifest(t, "acme/api", d)
	if _, err := r.Head("acme/api", "prod"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("HEAD of a tag whose manifest was deleted: %v, want a 404", err)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
}

func TestStart_MissingBinaryNamesTheInstallScript(t *testing.T) {
	_, err := Start(context.Background(), Options{Bin: "/nonexistent/docker-registry", Dir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "hack/install-distribution.sh") {
		t.Fatalf("err = %v, want one naming hack/install-distribution.sh", err)
	}
}
