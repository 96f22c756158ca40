package registry

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/distribution"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// V4: Has is the check that a pinned digest is still pullable. Only a
// definite 404 is "gone"; every other failure is an error, never a false
// "gone"; each check is one HEAD by digest.

func TestHas_V4_ADeletedDigestIsGoneAndOtherFailuresAreNoVerdict(t *testing.T) {
	s := testregistry.Start(t, testregistry.WithBasicAuth("robot", "s3cret"))
	old := s.MustPushRandomImage(t, "acme/api", "prod")
	kept := s.MustPushRandomImage(t, "acme/api", "prod") // the tag moved on: old is untagged
	s.MustDeleteManifest(t, "acme/api", old)
	repo := s.Host() + "/acme/api"
	kc := freshKeychain(s.Host(), "robot", "s3cret")
	r := newResolver(t, Options{Hosts: []HostConfig{{Host: s.Host(), Insecure: true}}, Timeout: time.Minute})
	heads := func(d string) int { return s.Count(http.MethodHead, "/v2/acme/api/manifests/"+d) }

	if ok, err := r.Has(context.Background(), repo, kept, kc); !ok || err != nil {
		t.Errorf("Has(kept) = %v, %v; want true, nil", ok, err)
	}
	if ok, err := r.Has(context.Background(), repo, old, kc); ok || err != nil {
		t.Errorf("Has(deleted) = %v, %v; want false, nil: gone", ok, err)
	}
	if n := heads(old); n != 1 {
		t.Errorf("%d HEADs of the deleted digest, want 1", n)
	}

	for _, tc := range []faultCase{noCredentials, status500, status503, status429, hang} {
		t.Run(tc.name, func(t *testing.T) {
			s.SetFault(tc.fault)
			defer s.ClearFault()
			keys := tc.keys(kc)
			// A hang ends at the resolver's timeout whatever its length; an
			// answer must never be taken for one, however slow the machine.
			timeout := time.Minute
			if tc.fault.Hang {
				timeout = 300 * time.Millisecond
			}
			r := newResolver(t, Options{Hosts: []HostConfig{{Host: s.Host(), Insecure: true}}, Timeout: timeout})
			before := heads(kept)
			ok, err := r.Has(context.Background(), repo, kept, keys)
			if ok {
				t.Fatalf("Has = true during %s", tc.name)
			}
			wantKind(t, err, tc.want)
			if n := heads(kept) - before; n != 1 {
				t.Errorf("%d HEADs by digest, want 1 (no hidden retries)", n)
			}
		})
	}
}

func TestHas_V4_DistributionADeletedManifestIsGone(t *testing.T) {
	reg := distribution.StartWithT(t, distribution.Options{})
	old := reg.MustPushRandomImage(t, "acme/api", "prod")
	kept := reg.MustPushRandomImage(t, "acme/api", "prod")
	reg.MustDeleteManifest(t, "acme/api", old)
	front, err := reg.StartFront()
	if err != nil {
		t.Fatal(err)
	}
	r := newResolver(t, Options{Hosts: []HostConfig{{Host: front.Host, CAFile: reg.CAFile}}})
	repo := front.Host + "/acme/api"
	kc := freshKeychain(front.Host, reg.User, reg.Password)
	if ok, err := r.Has(context.Background(), repo, kept, kc); !ok || err != nil {
		t.Errorf("Has(kept) = %v, %v; want true, nil", ok, err)
	}
	before := frontBudget(reg, front)
	if ok, err := r.Has(context.Background(), repo, old, kc); ok || err != nil {
		t.Errorf("Has(deleted) = %v, %v; want false, nil: gone", ok, err)
	}
	if got, want := frontBudget(reg, front).minus(before), (budget{heads: 1}); got != want {
		t.Errorf("the check cost %+v, want %+v", got, want)
	}
	// Without credentials Distribution answers 401: no verdict.
	ok, err := newResolver(t, Options{Hosts: []HostConfig{{Host: front.Host, CAFile: reg.CAFile}}}).Has(context.Background(), repo, old, nil)
	if ok {
		t.Error("Has without credentials = true")
	}
	wantKind(t, err, KindUnauthorized)
}
