package pinwebhook

import (
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"
)

func TestSelfSigned_ServingCertVerifiesForEveryHost(t *testing.T) {
	o := Options{Service: "image-refresh", Namespace: "ops", Host: "127.0.0.1"}
	now := time.Now()
	s, err := NewSelfSigned(o.Hosts(), time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(s.CA())
	leaf, _ := s.GetCertificate(nil)
	for _, host := range []string{"image-refresh.ops.svc", "image-refresh.ops.svc.cluster.local", "image-refresh", "127.0.0.1"} {
		if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, CurrentTime: now}); err != nil {
			t.Errorf("serving certificate does not verify for %s: %v", host, err)
		}
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "evil.example", Roots: roots, CurrentTime: now}); err == nil {
		t.Error("serving certificate verifies for a host it was not issued for")
	}
	if s.renewDue(s.current.Load(), now.Add(30*time.Minute)) || !s.renewDue(s.current.Load(), now.Add(41*time.Minute)) {
		t.Error("renewal is not due after two thirds of the lifetime")
	}
}

func TestOptions_HostsLeaveOutTheUnspecifiedAddress(t *testing.T) {
	for _, host := range []string{"", "0.0.0.0", "::"} {
		if h := (Options{Service: "s", Namespace: "n", Host: host}).Hosts(); len(h) != 4 {
			t.Errorf("host %q: %q", host, h)
		}
	}
}

func bundleCNs(t *testing.T, bundle []byte) []string {
	t.Helper()
	var out []string
	for rest := bundle; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			return out
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c.Subject.CommonName+"@"+c.NotBefore.Format(time.RFC3339))
	}
}

func TestMergeBundle_KeepsOtherReplicasDropsExpiredAndBoundsGrowth(t *testing.T) {
	now := time.Now().Truncate(time.Second)
	ca := func(at time.Time, validity time.Duration) *x509.Certificate {
		s, err := NewSelfSigned([]string{"h"}, validity, at)
		if err != nil {
			t.Fatal(err)
		}
		return s.CA()
	}
	pemOf := func(cs ...*x509.Certificate) []byte {
		var b []byte
		for _, c := range cs {
			b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
		}
		return b
	}
	own := ca(now, time.Hour)
	other := ca(now.Add(-time.Minute), time.Hour)
	expired := ca(now.Add(-3*time.Hour), time.Hour)

	got := mergeBundle(append(pemOf(other, expired), "garbage"...), now, own)
	if n := strings.Count(string(got), "BEGIN CERTIFICATE"); n != 2 {
		t.Errorf("bundle holds %d certificates, want 2 (the other replica's and ours): %q", n, bundleCNs(t, got))
	}
	if again := mergeBundle(got, now, own); string(again) != string(got) {
		t.Error("merging an already merged bundle changed it (every check would write)")
	}

	var many []*x509.Certificate
	for i := range 2 * maxBundledCAs {
		many = append(many, ca(now.Add(-time.Duration(i+1)*time.Minute), time.Hour))
	}
	got = mergeBundle(pemOf(many...), now, own)
	cns := bundleCNs(t, got)
	if len(cns) != maxBundledCAs {
		t.Fatalf("bundle holds %d CAs, want the bound %d", len(cns), maxBundledCAs)
	}
	if want := caCommonName + "@" + own.NotBefore.Format(time.RFC3339); cns[len(cns)-1] != want {
		t.Errorf("our CA is not in the bounded bundle: %q", cns)
	}
	if want := caCommonName + "@" + many[0].NotBefore.Format(time.RFC3339); cns[0] != want {
		t.Errorf("the bound did not keep the newest CAs: %q", cns)
	}
}
