package registry

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/authn"
	k8schain "github.com/google/go-containerregistry/pkg/authn/kubernetes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Keychain returns the keychains to try in order: extra (e.g. the target's
// pull secrets), then the docker config file (DOCKER_CONFIG or
// ~/.docker/config.json, with its credential helpers), then the workload
// identity of the environment, each for its cloud's hosts only: Google
// Artifact Registry and GCR (googleKeychain), Amazon ECR (ecrKeychain),
// Azure Container Registry (acrKeychain); then anonymous. The credentials stay inside
// the keychain and the transport; nothing here logs them (R20).
func Keychain(extra ...authn.Keychain) authn.Keychain {
	chains := make([]authn.Keychain, 0, len(extra)+4)
	for _, kc := range extra {
		if kc != nil {
			chains = append(chains, kc)
		}
	}
	chains = append(chains, authn.DefaultKeychain, gcpKeychain, awsKeychain, azureKeychain)
	return authn.NewMultiKeychain(chains...)
}

// PullSecretKeychain reads the named image pull secrets (kubernetes.io/
// dockerconfigjson or dockercfg) from namespace, so that image-refresh
// resolves with the credentials the kubelet would pull with. It does not read
// the service account: a workload's pod template lists only its own pull
// secrets, so a caller that relies on the service account's must pass those
// names too. A secret that does not exist is skipped, as the kubelet does,
// and its name is returned in missing so that the caller can say so: the
// resolve that then lacks credentials fails as unauthorized.
func PullSecretKeychain(ctx context.Context, client kubernetes.Interface, namespace string, pullSecrets []string) (kc authn.Keychain, missing []string, err error) {
	secrets := make([]corev1.Secret, 0, len(pullSecrets))
	for _, name := range pullSecrets {
		s, err := client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			missing = append(missing, name)
		case err != nil:
			return nil, nil, fmt.Errorf("read image pull secret %s/%s: %w", namespace, name, err)
		default:
			secrets = append(secrets, *s)
		}
	}
	kc, err = k8schain.NewFromPullSecrets(ctx, secrets)
	if err != nil {
		return nil, nil, fmt.Errorf("read image pull secrets %v in namespace %s: %w", pullSecrets, namespace, err)
	}
	return kc, missing, nil
}
