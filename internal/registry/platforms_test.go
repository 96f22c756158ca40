package registry

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// V3: ServedPlatforms reads what a digest serves: an index's manifests'
// platforms from the index alone, a single manifest's from its config. A
// failure is a read failure, never a verdict.

var (
	amd64 = v1.Platform{OS: "linux", Architecture: "amd64"}
	arm64 = v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}
	armv7 = v1.Platform{OS: "linux", Architecture: "arm", Variant: "v7"}
)

func TestServedPlatforms_V3_AnIndexFromItsManifestsAndAnImageFromItsConfig(t *testing.T) {
	s := testregistry.Start(t)
	repo := s.Host() + "/acme/api"
	r := newResolver(t, Options{Hosts: []HostConfig{{Host: s.Host(), Insecure: true}}, Timeout: time.Minute})
	for _, tc := range []struct {
		name            string
		push            func() string
		want            []v1.Platform
		manifests, blob int // GETs of the manifest by digest, of blobs
	}{
		{name: "an amd64+arm64 index", push: func() string { return s.MustPushIndexFor(t, "acme/api", "multi", amd64, arm64) },
			want: []v1.Platform{amd64, arm64}, manifests: 1},
		{name: "an arm64-only index", push: func() string { return s.MustPushIndexFor(t, "acme/api", "arm", arm64) },
			want: []v1.Platform{arm64}, manifests: 1},
		{name: "a single amd64 manifest", push: func() string { return s.MustPushImageFor(t, "acme/api", "amd64", amd64) },
			want: []v1.Platform{amd64}, manifests: 1, blob: 1},
		{name: "a single arm/v7 manifest (a variant)", push: func() string { return s.MustPushImageFor(t, "acme/api", "armv7", armv7) },
			want: []v1.Platform{armv7}, manifests: 1, blob: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.push()
			gets, blobs := s.Count(http.MethodGet, "/v2/acme/api/manifests/"+d), s.Count(http.MethodGet, "/v2/acme/api/blobs/")
			got, err := r.ServedPlatforms(context.Background(), repo, d, nil)
			if err != nil {
				t.Fatalf("ServedPlatforms(%s): %v", d, err)
			}
			if !slices.EqualFunc(got, tc.want, func(a, b v1.Platform) bool { return a.Equals(b) }) {
				t.Errorf("ServedPlatforms = %+v, want %+v", got, tc.want)
			}
			if n := s.Count(http.MethodGet, "/v2/acme/api/manifests/"+d) - gets; n != tc.manifests {
				t.Errorf("%d GETs of the manifest, want %d", n, tc.manifests)
			}
			if n := s.Count(http.MethodGet, "/v2/acme/api/blobs/") - blobs; n != tc.blob {
				t.Errorf("%d GETs of blobs, want %d (the config of a single manifest only)", n, tc.blob)
			}
		})
	}
}

func TestServedPlatforms_V3_AFailureIsAReadFailureNotAVerdict(t *testing.T) {
	s := testregistry.Start(t, testregistry.WithBasicAuth("robot", "s3cret"))
	d := s.MustPushIndexFor(t, "acme/api", "prod", amd64, arm64)
	repo := s.Host() + "/acme/api"
	kc := freshKeychain(s.Host(), "robot", "s3cret")
	r := newResolver(t, Options{Hosts: []HostConfig{{Host: s.Host(), Insecure: true}}, Timeout: time.Minute})
	if got, err := r.ServedPlatforms(context.Background(), repo, d, kc); err != nil || len(got) != 2 {
		t.Fatalf("ServedPlatforms = %+v, %v; want the two platforms first", got, err)
	}
	for _, tc := range []faultCase{noCredentials, status500, status429} {
		t.Run(tc.name, func(t *testing.T) {
			s.SetFault(tc.fault)
			defer s.ClearFault()
			keys := tc.keys(kc)
			got, err := newResolver(t, Options{Hosts: []HostConfig{{Host: s.Host(), Insecure: true}}, Timeout: time.Minute}).
				ServedPlatforms(context.Background(), repo, d, keys)
			if got != nil {
				t.Errorf("ServedPlatforms = %+v during %s, want no answer", got, tc.name)
			}
			wantKind(t, err, tc.want)
		})
	}
}
