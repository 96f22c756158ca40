package registry

import (
	"context"
	"io"
	"sync"
	"time"

	ecr "github.com/awslabs/amazon-ecr-credential-helper/ecr-login"
	"github.com/awslabs/amazon-ecr-credential-helper/ecr-login/api"
	"github.com/google/go-containerregistry/pkg/authn"
)

// ecrTokenReuse is how long an ECR authorization token is used before a new
// one is asked for. ECR's tokens are valid for 12 hours; asking again after
// 6 keeps a token in hand that never expires mid-poll.
const ecrTokenReuse = 6 * time.Hour

// ecrKeychain gives Amazon ECR hosts (<account>.dkr.ecr.<region>.amazonaws.com
// and the other ECR partitions, public.ecr.aws) credentials from the AWS
// SDK's default chain: on EKS with IRSA, the role of the pod's service
// account (AWS_ROLE_ARN and the projected token the EKS webhook injects),
// exchanged at STS; on EKS Pod Identity or a node role, theirs. The
// exchange is AWS's own amazon-ecr-credential-helper library
// (ecr.GetAuthorizationToken); its logs are discarded so nothing it would
// print reaches ours (R20). Every lookup costs an STS and an ECR call, so
// the answer is kept per host for ecrTokenReuse; a failed lookup is not
// kept. Other hosts get nothing from it.
type ecrKeychain struct {
	mu     sync.Mutex
	cached map[string]ecrCredential
	now    func() time.Time
}

type ecrCredential struct {
	auth    authn.AuthConfig
	renewAt time.Time
}

// awsKeychain is the process's one ECR keychain, shared by every image.
var awsKeychain = &ecrKeychain{}

func (k *ecrKeychain) Resolve(res authn.Resource) (authn.Authenticator, error) {
	return k.ResolveContext(context.Background(), res)
}

// ResolveContext bounds the STS and ECR calls by ctx (R14).
func (k *ecrKeychain) ResolveContext(ctx context.Context, res authn.Resource) (authn.Authenticator, error) {
	host := res.RegistryStr()
	if _, err := api.ExtractRegistry(host); err != nil {
		return authn.Anonymous, nil //nolint:nilerr // not an ECR host: nothing to add
	}
	now := time.Now
	if k.now != nil {
		now = k.now
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if c, ok := k.cached[host]; ok && now().Before(c.renewAt) {
		return authn.FromConfig(c.auth), nil
	}
	helper := ecr.NewECRHelper(ecr.WithContext(ctx), ecr.WithLogger(io.Discard), ecr.WithClientFactory(api.DefaultClientFactory{}))
	user, secret, err := helper.Get(host)
	if err != nil {
		// No AWS credentials here, or the exchange failed: anonymous, and
		// ask again next time.
		return authn.Anonymous, nil //nolint:nilerr // a keychain that has nothing answers anonymous
	}
	if k.cached == nil {
		k.cached = map[string]ecrCredential{}
	}
	c := ecrCredential{auth: authn.AuthConfig{Username: user, Password: secret}, renewAt: now().Add(ecrTokenReuse)}
	k.cached[host] = c
	return authn.FromConfig(c.auth), nil
}
