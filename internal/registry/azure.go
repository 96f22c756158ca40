package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
)

// acrTokenReuse is how long an ACR refresh token is used before a new one
// is asked for: ACR's refresh tokens last 3 hours, the Entra ID access token
// they are made from about one.
const acrTokenReuse = 45 * time.Minute

// acrUser is the user name ACR expects with a refresh token as password.
const acrUser = "00000000-0000-0000-0000-000000000000"

// acrKeychain gives Azure Container Registry hosts (*.azurecr.io and the
// sovereign clouds' suffixes) credentials from Azure Workload Identity: the
// webhook of a pod labelled azure.workload.identity/use=true whose service
// account carries azure.workload.identity/client-id sets AZURE_CLIENT_ID,
// AZURE_TENANT_ID, AZURE_FEDERATED_TOKEN_FILE and AZURE_AUTHORITY_HOST. The
// projected token is exchanged at Entra ID for an access token (client
// credentials with a federated assertion), and that at the registry's
// /oauth2/exchange for an ACR refresh token, which go-containerregistry
// then uses as the password of acrUser. Two form POSTs, no SDK. The answer
// is kept per host for acrTokenReuse; a failed lookup is not kept. Tokens
// never reach an error or a log (R20): failures say which step failed and
// its HTTP status only.
type acrKeychain struct {
	hostCredentials
	client *http.Client
	// exchangeURL is the registry's token exchange endpoint;
	// https://<host>/oauth2/exchange unless a test points it elsewhere.
	exchangeURL func(host string) string
}

// azureKeychain is the process's one ACR keychain, shared by every image.
var azureKeychain = &acrKeychain{}

func isACRHost(host string) bool {
	for _, suffix := range []string{".azurecr.io", ".azurecr.cn", ".azurecr.us"} {
		if strings.HasSuffix(host, suffix) {
			return true
		}
	}
	return false
}

func (k *acrKeychain) Resolve(res authn.Resource) (authn.Authenticator, error) {
	return k.ResolveContext(context.Background(), res)
}

// ResolveContext bounds both exchanges by ctx (R14).
func (k *acrKeychain) ResolveContext(ctx context.Context, res authn.Resource) (authn.Authenticator, error) {
	host := res.RegistryStr()
	if !isACRHost(host) {
		return authn.Anonymous, nil
	}
	clientID, tenant, tokenFile := os.Getenv("AZURE_CLIENT_ID"), os.Getenv("AZURE_TENANT_ID"), os.Getenv("AZURE_FEDERATED_TOKEN_FILE")
	if clientID == "" || tenant == "" || tokenFile == "" {
		return authn.Anonymous, nil // no workload identity here
	}
	auth, err := k.get(host, acrTokenReuse, func() (authn.AuthConfig, error) {
		return k.exchange(ctx, host, clientID, tenant, tokenFile)
	})
	if err != nil {
		return nil, err
	}
	return authn.FromConfig(auth), nil
}

// exchange trades the pod's federated token for an Entra ID access token,
// and that for an ACR refresh token, the password of acrUser.
func (k *acrKeychain) exchange(ctx context.Context, host, clientID, tenant, tokenFile string) (authn.AuthConfig, error) {
	assertion, err := os.ReadFile(tokenFile)
	if err != nil {
		return authn.AuthConfig{}, fmt.Errorf("azure workload identity: read AZURE_FEDERATED_TOKEN_FILE: %w", err)
	}
	authority := os.Getenv("AZURE_AUTHORITY_HOST")
	if authority == "" {
		authority = "https://login.microsoftonline.com/"
	}
	var aad struct {
		AccessToken string `json:"access_token"`
	}
	if err := k.post(ctx, strings.TrimRight(authority, "/")+"/"+url.PathEscape(tenant)+"/oauth2/v2.0/token", url.Values{
		"grant_type":            {"client_credentials"},
		"client_id":             {clientID},
		"scope":                 {"https://management.azure.com/.default"},
		"client_assertion_type": {"urn:ietf:params:oauth:client-assertion-type:jwt-bearer"},
		"client_assertion":      {strings.TrimSpace(string(assertion))},
	}, &aad); err != nil || aad.AccessToken == "" {
		return authn.AuthConfig{}, fmt.Errorf("azure workload identity: Entra ID token for %s: %w", host, orEmpty(err, "no access_token in the answer"))
	}
	exchange := "https://" + host + "/oauth2/exchange"
	if k.exchangeURL != nil {
		exchange = k.exchangeURL(host)
	}
	var acr struct {
		RefreshToken string `json:"refresh_token"`
	}
	if err := k.post(ctx, exchange, url.Values{
		"grant_type":   {"access_token"},
		"service":      {host},
		"tenant":       {tenant},
		"access_token": {aad.AccessToken},
	}, &acr); err != nil || acr.RefreshToken == "" {
		return authn.AuthConfig{}, fmt.Errorf("azure workload identity: ACR refresh token for %s: %w", host, orEmpty(err, "no refresh_token in the answer"))
	}
	return authn.AuthConfig{Username: acrUser, Password: acr.RefreshToken}, nil
}

// post sends a form and decodes a JSON answer; its errors hold the status,
// never a body (which may echo a token).
func (k *acrKeychain) post(ctx context.Context, target string, form url.Values, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, strings.NewReader(form.Encode()))
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	client := k.client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		// A *url.Error names the URL, which holds no secret: the secrets
		// are in the body.
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out)
}

func orEmpty(err error, msg string) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("%s", msg)
}
