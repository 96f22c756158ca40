package registry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	ktesting "k8s.io/client-go/testing"
	crfake "sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

func serviceAccount(ns, name string, secrets ...string) *corev1.ServiceAccount {
	sa := &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{"a": "b"}},
		Secrets:    []corev1.ObjectReference{{Name: name + "-token"}},
	}
	for _, s := range secrets {
		sa.ImagePullSecrets = append(sa.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
	}
	return sa
}

// Both sources of a ServiceAccount's imagePullSecrets answer alike: the
// names, and none with no error when the ServiceAccount does not exist.
// The API source (tick, status) GETs each at most once per TTL; the cache
// source (`run`) makes no API request at all (C6).
func TestServiceAccounts_R20_TheAPIAndTheCacheAnswerAlike(t *testing.T) {
	ctx := context.Background()
	kube := fake.NewClientset(serviceAccount("shop", "default", "regcred", "other"))
	gets := 0
	kube.PrependReactor("get", "serviceaccounts", func(ktesting.Action) (bool, runtime.Object, error) {
		gets++
		return false, nil, nil
	})
	reader := crfake.NewClientBuilder().WithObjects(serviceAccount("shop", "default", "regcred", "other")).Build()
	for name, src := range map[string]ServiceAccountSource{
		"api":   ServiceAccountsFromAPI(kube, time.Second),
		"cache": ServiceAccountsFromCache(reader, time.Second),
	} {
		for range 2 {
			got, err := src.ImagePullSecrets(ctx, "shop", "default")
			if err != nil || !slices.Equal(got, []string{"regcred", "other"}) {
				t.Errorf("%s: shop/default = %v, %v; want [regcred other]", name, got, err)
			}
			got, err = src.ImagePullSecrets(ctx, "shop", "absent")
			if err != nil || got != nil {
				t.Errorf("%s: shop/absent = %v, %v; want none, no error", name, got, err)
			}
		}
	}
	// The API source: one GET of each (the one of "absent" is not kept).
	if gets != 3 {
		t.Errorf("the API source made %d GETs for 2 reads of one ServiceAccount and 2 of a missing one, want 3", gets)
	}
}

// The cache of `run` keeps only what the pull secrets need: not the token
// secrets, annotations or labels of every ServiceAccount.
func TestStripServiceAccount_KeepsOnlyTheImagePullSecrets(t *testing.T) {
	out, err := StripServiceAccount(serviceAccount("shop", "default", "regcred"))
	if err != nil {
		t.Fatal(err)
	}
	sa := out.(*corev1.ServiceAccount)
	if sa.Namespace != "shop" || sa.Name != "default" || len(sa.ImagePullSecrets) != 1 || sa.ImagePullSecrets[0].Name != "regcred" {
		t.Errorf("stripped to %+v, want shop/default with regcred", sa)
	}
	if sa.Secrets != nil || sa.Annotations != nil {
		t.Errorf("stripped ServiceAccount still holds secrets %v, annotations %v", sa.Secrets, sa.Annotations)
	}
}

// A ServiceAccount that cannot be read is resolved without: a WARN, as a
// missing secret is, and the keychain still resolves with the rest.
func TestPullSecrets_R20_AServiceAccountThatCannotBeReadIsResolvedWithout(t *testing.T) {
	s := testregistry.Start(t)
	want := s.MustPushRandomImage(t, "acme/api", "prod")
	var p PullSecrets
	src := SecretSource{Kube: fake.NewClientset(), ServiceAccounts: failingServiceAccounts{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	kc := p.Keychain(context.Background(), src, "api", "k", []PodAuth{{Namespace: "shop"}}, true)
	r := newResolver(t, Options{Hosts: []HostConfig{{Host: s.Host(), Insecure: true}}})
	if got, err := r.Latest(context.Background(), s.Host()+"/acme/api", "prod", kc); err != nil || got != want {
		t.Fatalf("Latest = %q, %v; want %q", got, err, want)
	}
}

type failingServiceAccounts struct{}

func (failingServiceAccounts) ImagePullSecrets(context.Context, string, string) ([]string, error) {
	return nil, context.DeadlineExceeded
}

// The keychains kept per image are bounded: the least recently used one
// goes first and is read again on its next use, as after a restart; one in
// use stays.
func TestPullSecrets_R20_KeptKeychainsAreBounded(t *testing.T) {
	var p PullSecrets
	src := SecretSource{Kube: fake.NewClientset(), ServiceAccounts: failingServiceAccounts{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	p.Keychain(context.Background(), src, "api", "first", nil, false)
	p.Keychain(context.Background(), src, "api", "used", nil, false)
	if _, ok := p.Cached("first", 0); !ok {
		t.Fatal("a keychain just built is not kept")
	}
	for i := range pullSecretCacheSize - 1 {
		p.Keychain(context.Background(), src, "api", fmt.Sprintf("image-%d", i), nil, false)
		if i == pullSecretCacheSize/2 {
			if _, ok := p.Cached("used", 0); !ok {
				t.Fatal("a keychain in use was dropped before the cache was full")
			}
		}
	}
	if _, ok := p.Cached("used", 0); !ok {
		t.Error("the keychain used most recently of the oldest was dropped")
	}
	if _, ok := p.Cached("first", 0); ok {
		t.Errorf("%d keychains kept: the least recently used one was not dropped", pullSecretCacheSize+1)
	}
}
