package distribution

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// helperTimeout bounds one content helper call.
const helperTimeout = time.Minute

// Content helpers push and delete over the registry's own API, over TLS
// (trusting CAPEM) with the basic-auth credentials, as any client would.

// RandomImage returns a small single-arch image (Docker v2 schema 2).
func RandomImage() (v1.Image, error) {
	img, err := random.Image(256, 1)
	if err != nil {
		return nil, fmt.Errorf("distribution: random image: %w", err)
	}
	return img, nil
}

// Push writes img to repo:tag and returns its manifest digest.
func (r *Registry) Push(repo, tag string, img v1.Image) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), helperTimeout)
	defer cancel()
	ref, err := name.NewTag(r.Host + "/" + repo + ":" + tag)
	if err != nil {
		return "", fmt.Errorf("distribution: %w", err)
	}
	if err := remote.Write(ref, img, r.options(ctx)...); err != nil {
		return "", fmt.Errorf("distribution: push %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("distribution: image digest: %w", err)
	}
	return d.String(), nil
}

// PushRandomImage pushes new random content to repo:tag and returns its
// digest.
func (r *Registry) PushRandomImage(repo, tag string) (string, error) {
	img, err := RandomImage()
	if err != nil {
		return "", err
	}
	return r.Push(repo, tag, img)
}

// PushRandomIndex pushes a multi-arch OCI image index of n linux platforms
// (amd64, arm64, …) to repo:tag and returns the index digest (what R1 pins).
func (r *Registry) PushRandomIndex(repo, tag string, n int) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), helperTimeout)
	defer cancel()
	archs := []string{"amd64", "arm64", "ppc64le", "s390x"}
	if n < 1 || n > len(archs) {
		return "", fmt.Errorf("distribution: index of %d platforms: want 1..%d", n, len(archs))
	}
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, arch := range archs[:n] {
		img, err := random.Image(256, 1)
		if err != nil {
			return "", fmt.Errorf("distribution: random image: %w", err)
		}
		img = mutate.ConfigMediaType(mutate.MediaType(img, types.OCIManifestSchema1), types.OCIConfigJSON)
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{MediaType: types.OCIManifestSchema1, Platform: &v1.Platform{OS: "linux", Architecture: arch}},
		})
	}
	ref, err := name.NewTag(r.Host + "/" + repo + ":" + tag)
	if err != nil {
		return "", fmt.Errorf("distribution: %w", err)
	}
	if err := remote.WriteIndex(ref, idx, r.options(ctx)...); err != nil {
		return "", fmt.Errorf("distribution: push index %s: %w", ref, err)
	}
	d, err := idx.Digest()
	if err != nil {
		return "", fmt.Errorf("distribution: index digest: %w", err)
	}
	return d.String(), nil
}

// DeleteManifest deletes repo@digest. Distribution has no tag deletion in
// its API: deleting the manifest by digest (storage.delete.enabled) also
// removes every tag that pointed at it, so a HEAD of such a tag is a 404.
func (r *Registry) DeleteManifest(repo, digest string) error {
	ctx, cancel := context.WithTimeout(context.Background(), helperTimeout)
	defer cancel()
	ref, err := name.NewDigest(r.Host + "/" + repo + "@" + digest)
	if err != nil {
		return fmt.Errorf("distribution: %w", err)
	}
	if err := remote.Delete(ref, r.options(ctx)...); err != nil {
		return fmt.Errorf("distribution: delete %s: %w", ref, err)
	}
	return nil
}

// Head returns the digest the registry serves for repo:tag now.
func (r *Registry) Head(repo, tag string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), helperTimeout)
	defer cancel()
	ref, err := name.NewTag(r.Host + "/" + repo + ":" + tag)
	if err != nil {
		return "", fmt.Errorf("distribution: %w", err)
	}
	desc, err := remote.Head(ref, r.options(ctx)...)
	if err != nil {
		return "", fmt.Errorf("distribution: head %s: %w", ref, err)
	}
	return desc.Digest.String(), nil
}

// options are the remote options of one helper call, bounded by ctx.
func (r *Registry) options(ctx context.Context) []remote.Option {
	return []remote.Option{
		remote.WithContext(ctx),
		remote.WithTransport(r.Transport()),
		remote.WithAuth(&authn.Basic{Username: r.User, Password: r.Password}),
	}
}

// MustPushRandomImage is PushRandomImage that fails the test on error.
func (r *Registry) MustPushRandomImage(t testing.TB, repo, tag string) string {
	t.Helper()
	d, err := r.PushRandomImage(repo, tag)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// MustPush is Push that fails the test on error.
func (r *Registry) MustPush(t testing.TB, repo, tag string, img v1.Image) string {
	t.Helper()
	d, err := r.Push(repo, tag, img)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// MustPushRandomIndex is PushRandomIndex that fails the test on error.
func (r *Registry) MustPushRandomIndex(t testing.TB, repo, tag string, n int) string {
	t.Helper()
	d, err := r.PushRandomIndex(repo, tag, n)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// MustDeleteManifest is DeleteManifest that fails the test on error.
func (r *Registry) MustDeleteManifest(t testing.TB, repo, digest string) {
	t.Helper()
	if err := r.DeleteManifest(repo, digest); err != nil {
		t.Fatal(err)
	}
}
