package registry

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/verify"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// signLegacy pushes a cosign legacy signature of repo@digest, made with
// key, to the tag sha256-<hex>.sig, over the registry's basic auth.
func signLegacy(t *testing.T, s *testregistry.Server, repo, digest string, key *ecdsa.PrivateKey) {
	t.Helper()
	payload := `{"critical":{"identity":{"docker-reference":"` + s.Host() + "/" + repo + `"},` +
		`"image":{"docker-manifest-digest":"` + digest + `"},"type":"cosign container image signature"},"optional":null}`
	h := sha256.Sum256([]byte(payload))
	sig, err := ecdsa.SignASN1(rand.Reader, key, h[:])
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.Append(mutate.MediaType(empty.Image, types.OCIManifestSchema1), mutate.Addendum{
		Layer:       static.NewLayer([]byte(payload), verify.SimpleSigningMediaType),
		Annotations: map[string]string{verify.SignatureAnnotation: base64.StdEncoding.EncodeToString(sig)},
	})
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(s.Host()+"/"+repo+":"+strings.Replace(digest, ":", "-", 1)+".sig", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img, remote.WithAuth(&authn.Basic{Username: "u", Password: "p"})); err != nil {
		t.Fatal(err)
	}
}

func TestSignatures_V1_VerifiesThroughTheRepositorysSessionAndClassifiesARegistryError(t *testing.T) {
	s := testregistry.Start(t, testregistry.WithBasicAuth("u", "p"))
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	policy := &config.VerificationPolicy{Name: "prod-keys", Cosign: &config.CosignPolicy{
		PublicKeys: []string{"cosign.pub"}, Keys: []config.PublicKey{{File: "cosign.pub", DER: der}},
	}}
	signed := s.MustPushRandomImage(t, "acme/api", "prod")
	unsigned := s.MustPushRandomImage(t, "acme/api", "next")
	signLegacy(t, s, "acme/api", signed, key)
	r := newResolver(t, Options{})
	repo := s.Host() + "/acme/api"
	kc := Keychain(staticKeychain{s.Host(), "u", "p"})
	ctx := context.Background()

	v, err := r.Signatures(ctx, repo, signed, policy, kc)
	if err != nil || !v.Verified || v.By.Key != "cosign.pub" {
		t.Fatalf("signed: want verified with cosign.pub, got %s, %v", v, err)
	}
	v, err = r.Signatures(ctx, repo, unsigned, policy, kc)
	if err != nil || v.Verified || len(v.Rejected) != 0 {
		t.Fatalf("unsigned: want unverified, no signature found, got %s, %v", v, err)
	}
	if _, err := r.Signatures(ctx, repo, signed, policy, nil); err == nil {
		t.Fatal("anonymous: want an unauthorized error, got none")
	} else {
		wantKind(t, err, KindUnauthorized)
	}
	s.SetFault(testregistry.Fault{PathContains: ".sig", Status: http.StatusServiceUnavailable})
	_, err = r.Signatures(ctx, repo, unsigned, policy, kc)
	e := wantKind(t, err, KindServerError)
	if e.Status != http.StatusServiceUnavailable || !strings.Contains(e.Ref, unsigned) {
		t.Errorf("want the 503 and the digest in the error, got %v", e)
	}
}
