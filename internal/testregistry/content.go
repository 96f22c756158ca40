package testregistry

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Content helpers talk to the registry in-process, past the middleware: they
// work before Start and under TLS or basic auth, are not counted in Requests,
// and are not hit by faults.

// contentHost names the registry in references the content helpers build; the
// in-process transport ignores it.
const contentHost = "testregistry.invalid"

// platforms assigned, in order, to the children of PushRandomIndex.
var platforms = []v1.Platform{
	{OS: "linux", Architecture: "amd64"},
	{OS: "linux", Architecture: "arm64", Variant: "v8"},
	{OS: "linux", Architecture: "arm", Variant: "v7"},
	{OS: "linux", Architecture: "ppc64le"},
	{OS: "linux", Architecture: "s390x"},
	{OS: "linux", Architecture: "riscv64"},
}

// PushRandomImage pushes a small single-arch image with a Docker v2 schema 2
// manifest to repo:tag and returns its manifest digest.
func (s *Server) PushRandomImage(repo, tag string) (string, error) {
	img, err := random.Image(256, 1)
	if err != nil {
		return "", fmt.Errorf("testregistry: random image: %w", err)
	}
	return s.pushImage(repo, tag, img)
}

// PushRandomOCIImage is PushRandomImage with an OCI image manifest.
func (s *Server) PushRandomOCIImage(repo, tag string) (string, error) {
	img, err := randomOCIImage()
	if err != nil {
		return "", err
	}
	return s.pushImage(repo, tag, img)
}

// PushRandomIndex pushes a multi-arch OCI image index of n platforms (1..6)
// to repo:tag and returns the index digest, which is what R1 pins.
func (s *Server) PushRandomIndex(repo, tag string, n int) (string, error) {
	if n < 1 || n > len(platforms) {
		return "", fmt.Errorf("testregistry: index of %d platforms: want 1..%d", n, len(platforms))
	}
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms[:n] {
		img, err := randomOCIImage()
		if err != nil {
			return "", err
		}
		p := p
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{MediaType: types.OCIManifestSchema1, Platform: &p},
		})
	}
	ref, err := s.tagRef(repo, tag)
	if err != nil {
		return "", err
	}
	if err := remote.WriteIndex(ref, idx, s.contentOptions()...); err != nil {
		return "", fmt.Errorf("testregistry: push index %s:%s: %w", repo, tag, err)
	}
	d, err := idx.Digest()
	if err != nil {
		return "", fmt.Errorf("testregistry: index digest: %w", err)
	}
	return d.String(), nil
}

// Tag points repo:tag at the manifest repo@digest already holds.
func (s *Server) Tag(repo, tag, digest string) error {
	src, err := name.NewDigest(contentHost+"/"+repo+"@"+digest, name.Insecure)
	if err != nil {
		return fmt.Errorf("testregistry: %w", err)
	}
	desc, err := remote.Get(src, s.contentOptions()...)
	if err != nil {
		return fmt.Errorf("testregistry: get %s@%s: %w", repo, digest, err)
	}
	dst, err := s.tagRef(repo, tag)
	if err != nil {
		return err
	}
	if err := remote.Tag(dst, desc, s.contentOptions()...); err != nil {
		return fmt.Errorf("testregistry: tag %s:%s: %w", repo, tag, err)
	}
	return nil
}

// DeleteTag removes repo:tag; the manifest stays reachable by digest.
func (s *Server) DeleteTag(repo, tag string) error {
	ref, err := s.tagRef(repo, tag)
	if err != nil {
		return err
	}
	if err := remote.Delete(ref, s.contentOptions()...); err != nil {
		return fmt.Errorf("testregistry: delete %s:%s: %w", repo, tag, err)
	}
	return nil
}

// MustPushRandomImage is PushRandomImage that fails the test on error.
func (s *Server) MustPushRandomImage(t testing.TB, repo, tag string) string {
	t.Helper()
	d, err := s.PushRandomImage(repo, tag)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// MustPushRandomOCIImage is PushRandomOCIImage that fails the test on error.
func (s *Server) MustPushRandomOCIImage(t testing.TB, repo, tag string) string {
	t.Helper()
	d, err := s.PushRandomOCIImage(repo, tag)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// MustPushRandomIndex is PushRandomIndex that fails the test on error.
func (s *Server) MustPushRandomIndex(t testing.TB, repo, tag string, n int) string {
	t.Helper()
	d, err := s.PushRandomIndex(repo, tag, n)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// MustTag is Tag that fails the test on error.
func (s *Server) MustTag(t testing.TB, repo, tag, digest string) {
	t.Helper()
	if err := s.Tag(repo, tag, digest); err != nil {
		t.Fatal(err)
	}
}

// MustDeleteTag is DeleteTag that fails the test on error.
func (s *Server) MustDeleteTag(t testing.TB, repo, tag string) {
	t.Helper()
	if err := s.DeleteTag(repo, tag); err != nil {
		t.Fatal(err)
	}
}

func randomOCIImage() (v1.Image, error) {
	img, err := random.Image(256, 1)
	if err != nil {
		return nil, fmt.Errorf("testregistry: random image: %w", err)
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	return mutate.ConfigMediaType(img, types.OCIConfigJSON), nil
}

func (s *Server) pushImage(repo, tag string, img v1.Image) (string, error) {
	ref, err := s.tagRef(repo, tag)
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img, s.contentOptions()...); err != nil {
		return "", fmt.Errorf("testregistry: push %s:%s: %w", repo, tag, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("testregistry: image digest: %w", err)
	}
	return d.String(), nil
}

func (s *Server) tagRef(repo, tag string) (name.Tag, error) {
	ref, err := name.NewTag(contentHost+"/"+repo+":"+tag, name.Insecure)
	if err != nil {
		return name.Tag{}, fmt.Errorf("testregistry: %w", err)
	}
	return ref, nil
}

func (s *Server) contentOptions() []remote.Option {
	return []remote.Option{remote.WithTransport(inProcess{s.registry})}
}

// inProcess is a RoundTripper that answers from the handler directly.
type inProcess struct{ h http.Handler }

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	// Give the handler what a server-side request always has.
	in := req.Clone(req.Context())
	if in.Body == nil {
		in.Body = http.NoBody
	}
	in.RequestURI = req.URL.RequestURI()
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, in)
	resp := rec.Result()
	resp.Request = req
	return resp, nil
}
