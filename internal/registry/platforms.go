package registry

import (
	"bytes"
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// ServedPlatforms reads the platforms repository@digest serves (V3): an
// image index's manifests' platforms, from the index alone (one GET), or
// a single manifest's config's os, architecture and variant (a GET of the
// manifest and one of its config blob). A descriptor of the index that
// names no platform is none the nodes can pick, and is left out; so is a
// config that names neither os nor architecture. A failure is an *Error
// classified as Latest's are (a read failure, never a verdict). Callers
// ask once per digest: a digest names immutable content.
func (r *Resolver) ServedPlatforms(ctx context.Context, repository, digest string, kc authn.Keychain) ([]v1.Platform, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	desc, s, err := r.getDigest(ctx, repository, digest, kc, " for its platforms")
	if err != nil {
		return nil, err
	}
	out := []v1.Platform{}
	if desc.MediaType.IsIndex() {
		m, err := v1.ParseIndexManifest(bytes.NewReader(desc.Manifest))
		if err != nil {
			return nil, &Error{Ref: s, Kind: KindOther, Err: fmt.Errorf("parse the image index: %w", err)}
		}
		for _, d := range m.Manifests {
			if d.Platform != nil {
				out = append(out, *d.Platform)
			}
		}
		return out, nil
	}
	img, err := desc.Image()
	if err != nil {
		return nil, &Error{Ref: s, Kind: KindOther, Err: fmt.Errorf("read the manifest for its platforms: %w", err)}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, getFailure(ctx, s, fmt.Errorf("read the image config for its platform: %w", err))
	}
	if cf.OS != "" || cf.Architecture != "" {
		out = append(out, v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant})
	}
	return out, nil
}
