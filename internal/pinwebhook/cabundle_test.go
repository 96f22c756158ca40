package pinwebhook

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log/slog"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// trusts reports whether the caBundle of every webhook of the configuration
// verifies the certificate served now. The fake clientset stands in for
// the API server here; TestWebhook_* in internal/cli run the same code
// against a real one.
func trusts(t *testing.T, inj *caInjector, now time.Time) bool {
	t.Helper()
	mwc, err := inj.client.Get(context.Background(), inj.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := inj.certs.GetCertificate(nil)
	for _, w := range mwc.Webhooks {
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(w.ClientConfig.CABundle) {
			return false
		}
		if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "image-refresh.ops.svc", Roots: roots, CurrentTime: now}); err != nil {
			return false
		}
	}
	return true
}

func TestCAInjector_FillsTheBundleOnceTheConfigurationExistsAndRotatesWithoutAGap(t *testing.T) {
	now := time.Now()
	certs, err := NewSelfSigned(Options{Service: "image-refresh", Namespace: "ops"}.Hosts(), 90*24*time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	kube := fake.NewClientset()
	inj := &caInjector{certs: certs, client: kube.AdmissionregistrationV1().MutatingWebhookConfigurations(), name: "image-refresh",
		interval: time.Second, timeout: time.Second, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx := context.Background()

	inj.sync(ctx, now) // not there yet: nothing to do, no error
	if inj.state != "missing" {
		t.Fatalf("state %q, want missing", inj.state)
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "image-refresh"},
		Webhooks:   []admissionregistrationv1.MutatingWebhook{{Name: "a.image-refresh.io"}, {Name: "b.image-refresh.io"}},
	}
	if _, err := inj.client.Create(ctx, mwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	inj.sync(ctx, now)
	if !trusts(t, inj, now) {
		t.Fatal("the caBundle does not verify the served certificate after the configuration appeared")
	}

	// Rotation: two thirds into the lifetime the new CA goes in first, and
	// the new certificate is served from the next round on.
	first := certs.CA()
	later := now.Add(61 * 24 * time.Hour)
	inj.sync(ctx, later)
	if !certs.CA().Equal(first) || inj.pending == nil {
		t.Fatal("the new certificate was served before its CA was in the bundle")
	}
	inj.sync(ctx, later.Add(time.Second))
	if certs.CA().Equal(first) {
		t.Fatal("the certificate was not rotated")
	}
	if !trusts(t, inj, later) {
		t.Fatal("the caBundle does not verify the rotated certificate")
	}
	got, _ := inj.client.Get(ctx, "image-refresh", metav1.GetOptions{})
	if !bytes.Contains(got.Webhooks[0].ClientConfig.CABundle, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: first.Raw})) {
		t.Error("the previous CA left the bundle before it expired (requests in flight to it would fail)")
	}
}
