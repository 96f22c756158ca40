// Package content is the one content API of the test registries
// (testregistry's in-memory one and distribution's CNCF Distribution
// process): push, tag, delete and HEAD images over the OCI distribution API,
// with a Must form of each that fails the test. A registry embeds a Store
// built with New, which says how to reach it.
package content

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// timeout bounds one helper call.
const timeout = time.Minute

// Store is a registry's content API. Build it with New.
type Store struct {
	prefix   string                                    // error prefix: the registry package's name
	host     func() string                             // the host of references
	insecure bool                                      // references without TLS
	options  func(ctx context.Context) []remote.Option // transport and auth of one call
}

// New returns the content API of a registry: prefix starts its errors
// ("testregistry"), host gives the host its references name (called on
// every use, so it may be set after New), insecure allows plain HTTP, and
// options gives the transport and auth of one call bounded by ctx.
func New(prefix string, host func() string, insecure bool, options func(ctx context.Context) []remote.Option) Store {
	return Store{prefix: prefix, host: host, insecure: insecure, options: options}
}

// platforms assigned, in order, to the children of PushRandomIndex.
var platforms = []v1.Platform{
	{OS: "linux", Architecture: "amd64"},
	{OS: "linux", Architecture: "arm64", Variant: "v8"},
	{OS: "linux", Architecture: "arm", Variant: "v7"},
	{OS: "linux", Architecture: "ppc64le"},
	{OS: "linux", Architecture: "s390x"},
	{OS: "linux", Architecture: "riscv64"},
}

// RandomImage returns a small single-arch image with a Docker v2 schema 2
// manifest, built for linux/amd64 as its config says (the platform of the
// local cluster's nodes, which V3 checks).
func RandomImage() (v1.Image, error) {
	return RandomImageFor(v1.Platform{OS: "linux", Architecture: "amd64"})
}

// RandomImageFor is RandomImage built for p: its config's os,
// architecture and variant.
func RandomImageFor(p v1.Platform) (v1.Image, error) {
	img, err := random.Image(256, 1)
	if err != nil {
		return nil, fmt.Errorf("random image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("random image: config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	return mutate.ConfigFile(img, cf)
}

// RandomOCIImage is RandomImage with an OCI image manifest.
func RandomOCIImage() (v1.Image, error) {
	return RandomOCIImageFor(v1.Platform{OS: "linux", Architecture: "amd64"})
}

// RandomOCIImageFor is RandomImageFor with an OCI image manifest.
func RandomOCIImageFor(p v1.Platform) (v1.Image, error) {
	img, err := RandomImageFor(p)
	if err != nil {
		return nil, err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	return mutate.ConfigMediaType(img, types.OCIConfigJSON), nil
}

// Push writes img to repo:tag and returns its manifest digest.
func (s Store) Push(repo, tag string, img v1.Image) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ref, err := s.tagRef(repo, tag)
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img, s.options(ctx)...); err != nil {
		return "", fmt.Errorf("%s: push %s:%s: %w", s.prefix, repo, tag, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("%s: image digest: %w", s.prefix, err)
	}
	return d.String(), nil
}

// PushRandomImage pushes new random content (RandomImage) to repo:tag and
// returns its manifest digest.
func (s Store) PushRandomImage(repo, tag string) (string, error) {
	img, err := RandomImage()
	if err != nil {
		return "", fmt.Errorf("%s: %w", s.prefix, err)
	}
	return s.Push(repo, tag, img)
}

// PushRandomOCIImage is PushRandomImage with an OCI image manifest.
func (s Store) PushRandomOCIImage(repo, tag string) (string, error) {
	img, err := RandomOCIImage()
	if err != nil {
		return "", fmt.Errorf("%s: %w", s.prefix, err)
	}
	return s.Push(repo, tag, img)
}

// PushRandomIndex pushes a multi-arch OCI image index of n linux platforms
// (1..6: amd64, arm64/v8, arm/v7, …) to repo:tag and returns the index
// digest, which is what R1 pins.
func (s Store) PushRandomIndex(repo, tag string, n int) (string, error) {
	if n < 1 || n > len(platforms) {
		return "", fmt.Errorf("%s: index of %d platforms: want 1..%d", s.prefix, n, len(platforms))
	}
	return s.PushIndexFor(repo, tag, platforms[:n]...)
}

// PushIndexFor pushes an OCI image index with one random image per
// platform of ps (each built for it, its descriptor naming it) to
// repo:tag and returns the index digest.
func (s Store) PushIndexFor(repo, tag string, ps ...v1.Platform) (string, error) {
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range ps {
		img, err := RandomOCIImageFor(p)
		if err != nil {
			return "", fmt.Errorf("%s: %w", s.prefix, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{MediaType: types.OCIManifestSchema1, Platform: &p},
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ref, err := s.tagRef(repo, tag)
	if err != nil {
		return "", err
	}
	if err := remote.WriteIndex(ref, idx, s.options(ctx)...); err != nil {
		return "", fmt.Errorf("%s: push index %s:%s: %w", s.prefix, repo, tag, err)
	}
	d, err := idx.Digest()
	if err != nil {
		return "", fmt.Errorf("%s: index digest: %w", s.prefix, err)
	}
	return d.String(), nil
}

// Tag points repo:tag at the manifest repo@digest already holds.
func (s Store) Tag(repo, tag, digest string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	src, err := s.digestRef(repo, digest)
	if err != nil {
		return err
	}
	desc, err := remote.Get(src, s.options(ctx)...)
	if err != nil {
		return fmt.Errorf("%s: get %s@%s: %w", s.prefix, repo, digest, err)
	}
	dst, err := s.tagRef(repo, tag)
	if err != nil {
		return err
	}
	if err := remote.Tag(dst, desc, s.options(ctx)...); err != nil {
		return fmt.Errorf("%s: tag %s:%s: %w", s.prefix, repo, tag, err)
	}
	return nil
}

// DeleteTag removes repo:tag; the manifest stays reachable by digest.
// Distribution refuses it (it has no tag deletion): use DeleteManifest.
func (s Store) DeleteTag(repo, tag string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ref, err := s.tagRef(repo, tag)
	if err != nil {
		return err
	}
	if err := remote.Delete(ref, s.options(ctx)...); err != nil {
		return fmt.Errorf("%s: delete %s:%s: %w", s.prefix, repo, tag, err)
	}
	return nil
}

// DeleteManifest deletes repo@digest. In Distribution
// (storage.delete.enabled) that also removes every tag that pointed at it,
// so a HEAD of such a tag is a 404.
func (s Store) DeleteManifest(repo, digest string) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ref, err := s.digestRef(repo, digest)
	if err != nil {
		return err
	}
	if err := remote.Delete(ref, s.options(ctx)...); err != nil {
		return fmt.Errorf("%s: delete %s@%s: %w", s.prefix, repo, digest, err)
	}
	return nil
}

// Head returns the digest the registry serves for repo:tag now.
func (s Store) Head(repo, tag string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ref, err := s.tagRef(repo, tag)
	if err != nil {
		return "", err
	}
	desc, err := remote.Head(ref, s.options(ctx)...)
	if err != nil {
		return "", fmt.Errorf("%s: head %s:%s: %w", s.prefix, repo, tag, err)
	}
	return desc.Digest.String(), nil
}

// MustPush is Push that fails the test on error.
func (s Store) MustPush(t testing.TB, repo, tag string, img v1.Image) string {
	t.Helper()
	d, err := s.Push(repo, tag, img)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// MustPushIndexFor is PushIndexFor that fails the test on error.
func (s Store) MustPushIndexFor(t testing.TB, repo, tag string, ps ...v1.Platform) string {
	t.Helper()
	d, err := s.PushIndexFor(repo, tag, ps...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// MustPushImageFor pushes one random single-platform image built for p
// (an OCI manifest whose config names p) to repo:tag and returns its
// digest; it fails the test on error.
func (s Store) MustPushImageFor(t testing.TB, repo, tag string, p v1.Platform) string {
	t.Helper()
	img, err := RandomOCIImageFor(p)
	if err != nil {
		t.Fatal(err)
	}
	return s.MustPush(t, repo, tag, img)
}

// MustPushRandomImage is PushRandomImage that fails the test on error.
func (s Store) MustPushRandomImage(t testing.TB, repo, tag string) string {
	t.Helper()
	d, err := s.PushRandomImage(repo, tag)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// MustPushRandomOCIImage is PushRandomOCIImage that fails the test on error.
func (s Store) MustPushRandomOCIImage(t testing.TB, repo, tag string) string {
	t.Helper()
	d, err := s.PushRandomOCIImage(repo, tag)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// MustPushRandomIndex is PushRandomIndex that fails the test on error.
func (s Store) MustPushRandomIndex(t testing.TB, repo, tag string, n int) string {
	t.Helper()
	d, err := s.PushRandomIndex(repo, tag, n)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// MustTag is Tag that fails the test on error.
func (s Store) MustTag(t testing.TB, repo, tag, digest string) {
	t.Helper()
	if err := s.Tag(repo, tag, digest); err != nil {
		t.Fatal(err)
	}
}

// MustDeleteTag is DeleteTag that fails the test on error.
func (s Store) MustDeleteTag(t testing.TB, repo, tag string) {
	t.Helper()
	if err := s.DeleteTag(repo, tag); err != nil {
		t.Fatal(err)
	}
}

// MustDeleteManifest is DeleteManifest that fails the test on error.
func (s Store) MustDeleteManifest(t testing.TB, repo, digest string) {
	t.Helper()
	if err := s.DeleteManifest(repo, digest); err != nil {
		t.Fatal(err)
	}
}

func (s Store) tagRef(repo, tag string) (name.Tag, error) {
	ref, err := name.NewTag(s.host()+"/"+repo+":"+tag, s.nameOptions()...)
	if err != nil {
		return name.Tag{}, fmt.Errorf("%s: %w", s.prefix, err)
	}
	return ref, nil
}

func (s Store) digestRef(repo, digest string) (name.Digest, error) {
	ref, err := name.NewDigest(s.host()+"/"+repo+"@"+digest, s.nameOptions()...)
	if err != nil {
		return name.Digest{}, fmt.Errorf("%s: %w", s.prefix, err)
	}
	return ref, nil
}

func (s Store) nameOptions() []name.Option {
	if s.insecure {
		return []name.Option{name.Insecure}
	}
	return nil
}
