package registry

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

// fakeMetadata stands in for the GKE metadata server, the one part of
// Google's workload identity that cannot run here: it serves the default
// service account's access token, the first two about to expire. Only the
// token exchange is faked; no registry is.
type fakeMetadata struct {
	mu       sync.Mutex
	requests int
}

func (f *fakeMetadata) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Header.Get("Metadata-Flavor") != "Google" {
		http.Error(w, "missing Metadata-Flavor", http.StatusForbidden)
		return
	}
	w.Header().Set("Metadata-Flavor", "Google")
	switch {
	case strings.HasSuffix(req.URL.Path, "/instance/service-accounts/default/token"):
		f.mu.Lock()
		f.requests++
		n := f.requests
		f.mu.Unlock()
		expires := 3600
		if n <= 2 {
			expires = 1 // within oauth2's expiry margin: refreshed before its next use
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "ya29.workload-" + strings.Repeat("x", n), "expires_in": expires, "token_type": "Bearer"})
	case strings.HasSuffix(req.URL.Path, "/universe/universe-domain"):
		_, _ = w.Write([]byte("googleapis.com"))
	case strings.HasSuffix(req.URL.Path, "/project/project-id"):
		_, _ = w.Write([]byte("acme-prod"))
	default:
		http.NotFound(w, req)
	}
}

func (f *fakeMetadata) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests
}

func TestGoogleKeychain_R20_WorkloadIdentityTokenRefreshedBeforeExpiry(t *testing.T) {
	md := &fakeMetadata{}
	srv := httptest.NewServer(md)
	t.Cleanup(srv.Close)
	t.Setenv("GCE_METADATA_HOST", strings.TrimPrefix(srv.URL, "http://"))
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", "")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("CLOUDSDK_CONFIG", t.TempDir())

	kc := &googleKeychain{}
	gar, err := name.NewRepository("europe-docker.pkg.dev/acme-prod/images/api")
	if err != nil {
		t.Fatal(err)
	}
	password := passwordOf(t, kc, gar, "_token")
	// Making the keychain fetched token 1, about to expire: the first use
	// fetches token 2, about to expire too; the next use fetches token 3,
	// which lasts and is reused.
	if p := password(); p != "ya29.workload-xx" {
		t.Fatalf("first use: token %q, want ya29.workload-xx (token 1 was about to expire)", p)
	}
	for range 3 {
		if p := password(); p != "ya29.workload-xxx" {
			t.Fatalf("token %q, want ya29.workload-xxx (refreshed before token 2 expired, then reused)", p)
		}
	}
	if n := md.count(); n != 3 {
		t.Fatalf("%d token requests, want 3", n)
	}

	// Other registries get nothing from it.
	other, _ := name.NewRepository("ghcr.io/acme/api")
	if auth, _ := kc.Resolve(other); auth != authn.Anonymous {
		t.Fatalf("ghcr.io got %v from the Google keychain, want anonymous", auth)
	}
	if n := md.count(); n != 3 {
		t.Fatalf("resolving another registry asked the metadata server (%d requests)", n)
	}
}

func TestGoogleKeychain_NoGoogleCredentialsIsAnonymousAndRetried(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	t.Setenv("GCE_METADATA_HOST", strings.TrimPrefix(srv.URL, "http://"))
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", "")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("CLOUDSDK_CONFIG", t.TempDir())
	t.Setenv("PATH", t.TempDir()) // no gcloud
	kc := &googleKeychain{}
	gar, _ := name.NewRepository("us-docker.pkg.dev/acme/images/api")
	auth, err := kc.Resolve(gar)
	if err != nil || auth != authn.Anonymous {
		t.Fatalf("Resolve = %v, %v; want anonymous", auth, err)
	}
	if kc.auth != nil {
		t.Fatal("a failed lookup was remembered; the next call must try again")
	}
}
