package verify

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/test/support/testsign"
)

// BenchmarkVerify_V1 is what verification adds for a new digest: one
// Verify per op against the in-process registry with the referrers API,
// reported as p50/p99 latency and registry GETs per lookup (docs/performance.md).
//
//	go test -run '^$' -bench BenchmarkVerify_V1 ./internal/verify
func BenchmarkVerify_V1(b *testing.B) {
	cases := []struct {
		name   string
		sign   func(b *testing.B, f *fixture) *config.VerificationPolicy
		verify bool
	}{
		{"unsigned", func(b *testing.B, f *fixture) *config.VerificationPolicy {
			return policyOf(newSigner(b, "cosign.pub"))
		}, false},
		{"keyed bundle", func(b *testing.B, f *fixture) *config.VerificationPolicy {
			key := newSigner(b, "cosign.pub")
			key.SignBundle(b, f.digest, f.opts...)
			return policyOf(key)
		}, true},
		{"keyed legacy .sig", func(b *testing.B, f *fixture) *config.VerificationPolicy {
			key := newSigner(b, "cosign.pub")
			key.AttachLegacy(b, f.digest, f.opts, legacyPayload(f.digest))
			return policyOf(key)
		}, true},
		{"keyless bundle", func(b *testing.B, f *fixture) *config.VerificationPolicy {
			s := testsign.NewSigstore(b)
			s.SignKeyless(b, f.digest, ciIssuer, "release@example.com", f.opts...)
			return keylessPolicy(b, s, config.KeylessIdentity{Issuer: ciIssuer, Subject: "release@example.com"})
		}, true},
		{"notation", func(b *testing.B, f *fixture) *config.VerificationPolicy {
			n := testsign.NewNotary()
			n.Sign(b, f.digest, f.digest, f.opts...)
			return notationPolicy(n, b)
		}, true},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			f := newFixture(b, true)
			measure(b, f, c.sign(b, f), c.verify)
		})
	}
}

// measure runs one Verify per op and reports p50/p99 latency and the
// registry GETs per lookup.
func measure(b *testing.B, f *fixture, p *config.VerificationPolicy, verified bool) {
	f.reg.ResetRequests()
	durations := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		v, err := f.verify(p)
		durations = append(durations, time.Since(start))
		if err != nil || v.Verified != verified {
			b.Fatalf("got %s, %v", v, err)
		}
	}
	b.StopTimer()
	gets := 0
	for _, r := range f.reg.Requests() {
		if r.Method == http.MethodGet && r.Path != "/v2/" {
			gets++
		}
	}
	slices.Sort(durations)
	b.ReportMetric(float64(durations[len(durations)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(durations[len(durations)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(gets)/float64(b.N), "GETs/op")
}

// BenchmarkVerify_V5 is what required attestations add to a new digest's
// lookup: the signature alone, then with one and two attestations (SLSA
// provenance and a vulnerability scan, each with a CEL condition), as
// bundles and in the legacy format (docs/performance.md).
//
//	go test -run '^$' -bench BenchmarkVerify_V5 ./internal/verify
func BenchmarkVerify_V5(b *testing.B) {
	one := func(keys ...signer) *config.VerificationPolicy {
		p := attestPolicy(keys...)
		p.Attestations = p.Attestations[1:]
		return p
	}
	// sign signs f's digest and attests it (SLSA provenance and a clean
	// scan), as bundles or in the legacy format.
	sign := func(b *testing.B, f *fixture, legacy bool) signer {
		key := newSigner(b, "cosign.pub")
		if legacy {
			f.attachLegacy(f.digest, key, legacyPayload(f.digest))
			key.AttachLegacyAttestation(b, f.digest, f.opts,
				testsign.AttestationStatement(f.digest, slsa, fromOurRepo), testsign.AttestationStatement(f.digest, vuln, scanClean))
			return key
		}
		key.SignBundle(b, f.digest, f.opts...)
		key.Attest(b, f.digest, slsa, fromOurRepo, f.opts...)
		key.Attest(b, f.digest, vuln, scanClean, f.opts...)
		return key
	}
	cases := []struct {
		name   string
		legacy bool
		policy func(...signer) *config.VerificationPolicy
	}{
		{"bundle, signature only", false, policyOf},
		{"bundle, one attestation", false, one},
		{"bundle, two attestations", false, attestPolicy},
		{"legacy, signature only", true, policyOf},
		{"legacy, two attestations", true, attestPolicy},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			f := newFixture(b, true)
			measure(b, f, c.policy(sign(b, f, c.legacy)), true)
		})
	}
}
