package registry

import (
	"context"
	"encoding/base64"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ecr"
	"github.com/google/go-containerregistry/pkg/authn"
)

// ecrTokenReuse is how long an ECR authorization token is used before a new
// one is asked for. ECR's tokens are valid for 12 hours; asking again after
// 6 keeps a token in hand that never expires mid-poll.
const ecrTokenReuse = 6 * time.Hour

// ecrHost matches a private ECR registry host and captures its region:
// <account>.dkr.ecr[-fips].<region>.<AWS partition's domain>.
var ecrHost = regexp.MustCompile(`^[0-9]{12}\.dkr[.-]ecr(?:-fips)?\.([a-z0-9-]+)\.(?:amazonaws\.com|amazonaws\.com\.cn|amazonaws\.eu|on\.aws|on\.amazonwebservices\.com\.cn|sc2s\.sgov\.gov|c2s\.ic\.gov|cloud\.adc-e\.uk|csp\.hci\.ic\.gov)$`)

// ecrKeychain gives private Amazon ECR hosts credentials from the AWS SDK's
// default chain: on EKS with IRSA, the role of the pod's service account
// (AWS_ROLE_ARN and the projected token the EKS webhook injects), exchanged
// at STS; with EKS Pod Identity or a node role, theirs. With those
// credentials it asks ECR's GetAuthorizationToken in the registry's region,
// whose answer is "AWS:<password>". The SDK is called directly, not through
// amazon-ecr-credential-helper, whose file cache would write the token to
// disk and whose global logger would print to stderr. Every lookup costs an
// STS and an ECR call, so the answer is kept in memory per host for
// ecrTokenReuse; a failed lookup is not kept. Other hosts (and ECR Public,
// which serves anonymously) get nothing from it.
type ecrKeychain struct{ hostCredentials }

// awsKeychain is the process's one ECR keychain, shared by every image.
var awsKeychain = &ecrKeychain{}

func (k *ecrKeychain) Resolve(res authn.Resource) (authn.Authenticator, error) {
	return k.ResolveContext(context.Background(), res)
}

// ResolveContext bounds the STS and ECR calls by ctx (R14).
func (k *ecrKeychain) ResolveContext(ctx context.Context, res authn.Resource) (authn.Authenticator, error) {
	host := res.RegistryStr()
	m := ecrHost.FindStringSubmatch(host)
	if m == nil {
		return authn.Anonymous, nil
	}
	auth, err := k.get(host, ecrTokenReuse, func() (authn.AuthConfig, error) { return ecrToken(ctx, m[1]) })
	if err != nil {
		// No AWS credentials here, or the exchange failed: anonymous, and
		// ask again next time. The resolve then fails as unauthorized.
		return authn.Anonymous, nil //nolint:nilerr // a keychain that has nothing answers anonymous
	}
	return authn.FromConfig(auth), nil
}

// ecrToken asks ECR in region for an authorization token.
func ecrToken(ctx context.Context, region string) (authn.AuthConfig, error) {
	cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion(region))
	if err != nil {
		return authn.AuthConfig{}, fmt.Errorf("load AWS config: %w", err)
	}
	out, err := ecr.NewFromConfig(cfg).GetAuthorizationToken(ctx, &ecr.GetAuthorizationTokenInput{})
	if err != nil {
		return authn.AuthConfig{}, fmt.Errorf("ECR GetAuthorizationToken: %w", err)
	}
	if len(out.AuthorizationData) == 0 || out.AuthorizationData[0].AuthorizationToken == nil {
		return authn.AuthConfig{}, fmt.Errorf("ECR GetAuthorizationToken: no token in the answer")
	}
	raw, err := base64.StdEncoding.DecodeString(*out.AuthorizationData[0].AuthorizationToken)
	if err != nil {
		return authn.AuthConfig{}, fmt.Errorf("ECR authorization token: not base64")
	}
	user, pass, ok := strings.Cut(string(raw), ":")
	if !ok {
		return authn.AuthConfig{}, fmt.Errorf("ECR authorization token: not user:password")
	}
	return authn.AuthConfig{Username: user, Password: pass}, nil
}
