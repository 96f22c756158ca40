package registry

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
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

// fakeAWS stands in for AWS STS (AssumeRoleWithWebIdentity, the IRSA
// exchange) and the ECR API (GetAuthorizationToken), the parts of ECR's
// workload identity that cannot run here without an AWS account. Only the
// token exchange is faked; no registry is.
type fakeAWS struct {
	mu          sync.Mutex
	sts, ecr    int
	webIdentity string // the projected service-account token STS received
}

func (f *fakeAWS) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case strings.Contains(string(body), "Action=AssumeRoleWithWebIdentity"):
		f.sts++
		if i := strings.Index(string(body), "WebIdentityToken="); i >= 0 {
			f.webIdentity = strings.SplitN(string(body[i+len("WebIdentityToken="):]), "&", 2)[0]
		}
		w.Header().Set("Content-Type", "text/xml")
		fmt.Fprintf(w, `<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
<AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>ASIAFAKE</AccessKeyId><SecretAccessKey>fake-secret</SecretAccessKey><SessionToken>fake-session</SessionToken><Expiration>%s</Expiration></Credentials>
<AssumedRoleUser><Arn>arn:aws:sts::123456789012:assumed-role/image-refresh/s</Arn><AssumedRoleId>AROAFAKE:s</AssumedRoleId></AssumedRoleUser></AssumeRoleWithWebIdentityResult>
<ResponseMetadata><RequestId>1</RequestId></ResponseMetadata></AssumeRoleWithWebIdentityResponse>`, time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	case strings.HasSuffix(req.Header.Get("X-Amz-Target"), ".GetAuthorizationToken"):
		f.ecr++
		if !strings.Contains(req.Header.Get("Authorization"), "ASIAFAKE") {
			http.Error(w, `{"__type":"UnrecognizedClientException"}`, http.StatusForbidden)
			return
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		_ = json.NewEncoder(w).Encode(map[string]any{"authorizationData": []map[string]any{{
			"authorizationToken": base64.StdEncoding.EncodeToString([]byte(fmt.Sprintf("AWS:ecr-token-%d", f.ecr))),
			"expiresAt":          float64(time.Now().Add(12 * time.Hour).Unix()),
			"proxyEndpoint":      "https://123456789012.dkr.ecr.eu-west-1.amazonaws.com",
		}}})
	default:
		http.Error(w, "unexpected request "+req.URL.String(), http.StatusBadRequest)
	}
}

func (f *fakeAWS) counts() (sts, ecr int, webIdentity string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sts, f.ecr, f.webIdentity
}

// irsaEnv sets up the environment the EKS pod identity webhook gives a pod
// whose service account carries eks.amazonaws.com/role-arn, with the STS and
// ECR endpoints pointed at fake.
func irsaEnv(t *testing.T, fake http.Handler) {
	t.Helper()
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("projected-sa-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"AWS_ROLE_ARN":                "arn:aws:iam::123456789012:role/image-refresh",
		"AWS_WEB_IDENTITY_TOKEN_FILE": tokenFile,
		"AWS_REGION":                  "eu-west-1",
		"AWS_ENDPOINT_URL_STS":        srv.URL,
		"AWS_ENDPOINT_URL_ECR":        srv.URL,
		"AWS_CONFIG_FILE":             filepath.Join(dir, "none"),
		"AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "none"),
		"AWS_EC2_METADATA_DISABLED":   "true",
		"AWS_ACCESS_KEY_ID":           "",
		"AWS_SECRET_ACCESS_KEY":       "",
		"AWS_PROFILE":                 "",
		"HOME":                        dir,
	} {
		t.Setenv(k, v)
	}
}

func TestECRKeychain_R20_IRSATokenIsExchangedOnceAndRenewedBeforeExpiry(t *testing.T) {
	fake := &fakeAWS{}
	irsaEnv(t, fake)
	home := os.Getenv("HOME")
	now := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	kc := &ecrKeychain{hostCredentials: hostCredentials{now: func() time.Time { return now }}}
	repo, err := name.NewRepository("123456789012.dkr.ecr.eu-west-1.amazonaws.com/acme/api")
	if err != nil {
		t.Fatal(err)
	}
	// ECR's authorization token is AWS:<password>.
	password := passwordOf(t, kc, repo, "AWS")
	for range 3 {
		if p := password(); p != "ecr-token-1" {
			t.Fatalf("password %q, want ecr-token-1, reused", p)
		}
	}
	sts, ecrCalls, web := fakeCounts(fake)
	if sts != 1 || ecrCalls != 1 || web != "projected-sa-token" {
		t.Fatalf("STS %d, ECR %d calls, web identity %q; want 1, 1 and the projected token", sts, ecrCalls, web)
	}
	// Before the 12 h token expires, a new one is asked for.
	now = now.Add(ecrTokenReuse + time.Second) // past the reuse period
	if p := password(); p != "ecr-token-2" {
		t.Fatalf("password after %s: %q, want the renewed ecr-token-2", ecrTokenReuse+time.Second, p)
	}
	// Other registries get nothing from it and cost no call.
	for _, host := range []string{"ghcr.io", "public.ecr.aws", "123456789012.dkr.ecr.eu-west-1.example.com"} {
		other, _ := name.NewRepository(host + "/acme/api")
		if auth, _ := kc.Resolve(other); auth != authn.Anonymous {
			t.Fatalf("%s got %v from the ECR keychain, want anonymous", host, auth)
		}
	}
	if _, ecrCalls, _ := fakeCounts(fake); ecrCalls != 2 {
		t.Fatalf("%d ECR calls, want 2", ecrCalls)
	}
	// The token stays in memory: nothing was written under HOME (R20).
	if entries, _ := os.ReadDir(home); len(entries) != 1 { // the projected token file
		t.Fatalf("HOME holds %d entries, want only the test's token file", len(entries))
	}
}

func fakeCounts(f *fakeAWS) (int, int, string) { return f.counts() }

func TestECRKeychain_NoAWSCredentialsIsAnonymousAndNotKept(t *testing.T) {
	irsaEnv(t, http.NotFoundHandler())
	kc := &ecrKeychain{}
	repo, _ := name.NewRepository("123456789012.dkr.ecr.eu-west-1.amazonaws.com/acme/api")
	auth, err := kc.Resolve(repo)
	if err != nil || auth != authn.Anonymous {
		t.Fatalf("Resolve = %v, %v; want anonymous", auth, err)
	}
	if kc.keptHosts() != 0 {
		t.Fatal("a failed lookup was kept; the next call must try again")
	}
}

// keptHosts counts the hosts whose credential is kept.
func (h *hostCredentials) keptHosts() int {
	if h.cached == nil {
		return 0
	}
	return len(h.cached.Keys())
}
