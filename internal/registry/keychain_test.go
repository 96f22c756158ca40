package registry

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// The fake clientset stands in for the API server only to serve one Secret
// read; the registry side is real.
func TestPullSecretKeychain_R20_ResolvesWithPullSecret(t *testing.T) {
	s := testregistry.Start(t, testregistry.WithBasicAuth("robot", "s3cret"))
	want := s.MustPushRandomImage(t, "acme/api", "prod")
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "regcred"},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(
			`{"auths":{"` + s.Host() + `":{"username":"robot","password":"s3cret"}}}`)},
	}
	client := fake.NewClientset(secret)
	r := newResolver(t, Options{})
	repo := s.Host() + "/acme/api"

	kc, missing, err := PullSecretKeychain(context.Background(), client, "shop", []string{"regcred"})
	if err != nil || len(missing) != 0 {
		t.Fatalf("PullSecretKeychain(regcred) = missing %v, %v; want none, nil", missing, err)
	}
	if got, err := r.Latest(context.Background(), repo, "prod", Keychain(kc)); err != nil || got != want {
		t.Fatalf("with the pull secret: Latest = %q, %v; want %q", got, err, want)
	}

	// A missing secret is skipped, as the kubelet does; the resolve then
	// fails loudly as unauthorized, and the caller learns which is missing.
	kc, missing, err = PullSecretKeychain(context.Background(), client, "shop", []string{"absent", "regcred"})
	if err != nil || len(missing) != 1 || missing[0] != "absent" {
		t.Fatalf("PullSecretKeychain(absent, regcred) = missing %v, %v; want [absent], nil", missing, err)
	}
	if got, err := r.Latest(context.Background(), repo, "prod", Keychain(kc)); err != nil || got != want {
		t.Fatalf("with regcred next to a missing secret: Latest = %q, %v; want %q", got, err, want)
	}
	kc, _, err = PullSecretKeychain(context.Background(), client, "shop", []string{"absent"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Latest(context.Background(), repo, "prod", kc)
	wantKind(t, err, KindUnauthorized)
}
