package registry

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

// fakeAzure stands in for Entra ID's token endpoint and ACR's
// /oauth2/exchange, the two token exchanges of Azure Workload Identity,
// which cannot run here without an Azure tenant and registry. Only those
// exchanges are faked; no registry API is.
type fakeAzure struct {
	mu               sync.Mutex
	aad, exchanges   int
	assertion, scope string
}

func (f *fakeAzure) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if err := req.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case req.URL.Path == "/tenant-1/oauth2/v2.0/token":
		f.aad++
		f.assertion, f.scope = req.PostForm.Get("client_assertion"), req.PostForm.Get("scope")
		if req.PostForm.Get("client_id") != "client-1" || req.PostForm.Get("grant_type") != "client_credentials" {
			http.Error(w, `{"error":"invalid_client"}`, http.StatusUnauthorized)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "aad-token", "expires_in": 3600, "token_type": "Bearer"})
	case req.URL.Path == "/oauth2/exchange":
		f.exchanges++
		if req.PostForm.Get("access_token") != "aad-token" || req.PostForm.Get("service") != "acme.azurecr.io" {
			http.Error(w, `{"error":"bad exchange, echoing `+req.PostForm.Get("access_token")+`"}`, http.StatusUnauthorized)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"refresh_token": "acr-refresh-" + strings.Repeat("x", f.exchanges)})
	default:
		http.NotFound(w, req)
	}
}

func azureEnv(t *testing.T, fake http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	tokenFile := filepath.Join(t.TempDir(), "azure-identity-token")
	if err := os.WriteFile(tokenFile, []byte("projected-sa-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AZURE_CLIENT_ID", "client-1")
	t.Setenv("AZURE_TENANT_ID", "tenant-1")
	t.Setenv("AZURE_FEDERATED_TOKEN_FILE", tokenFile)
	t.Setenv("AZURE_AUTHORITY_HOST", srv.URL+"/")
	return srv
}

func TestACRKeychain_R20_WorkloadIdentityExchangedOnceAndRenewedBeforeExpiry(t *testing.T) {
	fake := &fakeAzure{}
	srv := azureEnv(t, fake)
	now := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	kc := &acrKeychain{hostCredentials: hostCredentials{now: func() time.Time { return now }}, exchangeURL: func(string) string { return srv.URL + "/oauth2/exchange" }}
	repo, err := name.NewRepository("acme.azurecr.io/team/api")
	if err != nil {
		t.Fatal(err)
	}
	password := passwordOf(t, kc, repo, acrUser)
	for range 3 {
		if p := password(); p != "acr-refresh-x" {
			t.Fatalf("password %q, want acr-refresh-x, reused", p)
		}
	}
	fake.mu.Lock()
	aad, ex, assertion, scope := fake.aad, fake.exchanges, fake.assertion, fake.scope
	fake.mu.Unlock()
	if aad != 1 || ex != 1 || assertion != "projected-sa-token" || scope != "https://management.azure.com/.default" {
		t.Fatalf("Entra ID %d, exchange %d, assertion %q, scope %q; want 1, 1, the projected token, the ARM scope", aad, ex, assertion, scope)
	}
	now = now.Add(acrTokenReuse + time.Second) // past the reuse period
	if p := password(); p != "acr-refresh-xx" {
		t.Fatalf("password after %s: %q, want the renewed acr-refresh-xx", acrTokenReuse+time.Second, p)
	}
	other, _ := name.NewRepository("ghcr.io/acme/api")
	if auth, _ := kc.Resolve(other); auth != authn.Anonymous {
		t.Fatalf("ghcr.io got %v from the ACR keychain, want anonymous", auth)
	}
}

func TestACRKeychain_R20_FailedExchangeNamesTheStepNotTheToken(t *testing.T) {
	fake := &fakeAzure{}
	srv := azureEnv(t, fake)
	// The exchange refuses (and echoes the token in its body).
	kc := &acrKeychain{exchangeURL: func(string) string { return srv.URL + "/oauth2/exchange" }}
	repo, _ := name.NewRepository("other.azurecr.io/team/api")
	_, err := kc.Resolve(repo)
	if err == nil || !strings.Contains(err.Error(), "ACR refresh token for other.azurecr.io: HTTP 401") {
		t.Fatalf("err = %v, want the failed step and its status", err)
	}
	for _, secret := range []string{"aad-token", "projected-sa-token"} {
		if strings.Contains(err.Error(), secret) {
			t.Fatalf("the error holds %q: %v", secret, err)
		}
	}
	if kc.keptHosts() != 0 {
		t.Fatal("a failed exchange was kept")
	}
}

func TestACRKeychain_WithoutWorkloadIdentityIsAnonymous(t *testing.T) {
	t.Setenv("AZURE_CLIENT_ID", "")
	t.Setenv("AZURE_TENANT_ID", "")
	t.Setenv("AZURE_FEDERATED_TOKEN_FILE", "")
	repo, _ := name.NewRepository("acme.azurecr.io/team/api")
	if auth, err := (&acrKeychain{}).Resolve(repo); err != nil || auth != authn.Anonymous {
		t.Fatalf("Resolve = %v, %v; want anonymous", auth, err)
	}
}
