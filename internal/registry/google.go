package registry

import (
	"context"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/google"
)

// googleKeychain gives Google Artifact Registry and Container Registry hosts
// (gcr.io, *.gcr.io, *-docker.pkg.dev) the credentials of the environment:
// Application Default Credentials, which on GKE with Workload Identity are
// the Google service account that the pod's Kubernetes service account is
// bound to, served by the metadata server. No binary, no secret: the token
// comes from go-containerregistry's google.NewEnvAuthenticator, an oauth2
// token source that fetches a new access token before the old one expires.
// Other hosts get nothing from it, so it sits behind pull secrets and the
// docker config in Keychain.
//
// Unlike go-containerregistry's google.Keychain, a failed lookup (no
// metadata server yet, a transient error) is not remembered as anonymous
// for the life of the process: the next call tries again. The token source
// is made with a background context, since it outlives the call that made
// it.
type googleKeychain struct {
	mu   sync.Mutex
	auth authn.Authenticator
}

// gcpKeychain is the process's one Google keychain: its token source and
// cached token are shared by every image.
var gcpKeychain = &googleKeychain{}

func (g *googleKeychain) Resolve(res authn.Resource) (authn.Authenticator, error) {
	if !isGoogleHost(res.RegistryStr()) {
		return authn.Anonymous, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.auth != nil {
		return g.auth, nil
	}
	auth, err := google.NewEnvAuthenticator(context.Background())
	if err != nil {
		// No Google credentials here (not on GCP, no ADC): anonymous, and
		// ask again next time.
		return authn.Anonymous, nil //nolint:nilerr // a keychain that has nothing answers anonymous
	}
	g.auth = auth
	return auth, nil
}

func isGoogleHost(host string) bool {
	return host == "gcr.io" || strings.HasSuffix(host, ".gcr.io") || strings.HasSuffix(host, "-docker.pkg.dev")
}
