package distribution

import (
	"context"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/image-refresh/image-refresh/test/support/content"
)

// newContent is the content API of r (content.Store, embedded in Registry:
// Push, PushRandomIndex, DeleteManifest, Head, … and their Must forms): it
// talks to the registry over its own API, over TLS (trusting CAPEM) with
// the basic-auth credentials, as any client would. Distribution has no tag
// deletion: DeleteManifest removes a manifest with every tag on it.
func newContent(r *Registry) content.Store {
	return content.New("distribution", func() string { return r.Host }, false,
		func(ctx context.Context) []remote.Option {
			return []remote.Option{
				remote.WithContext(ctx),
				remote.WithTransport(r.Transport()),
				remote.WithAuth(&authn.Basic{Username: r.User, Password: r.Password}),
			}
		})
}
