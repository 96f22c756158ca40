// Command base pushes the minimal base image `make image` builds on when no
// registry with a real base (distroless static) is reachable: no layers at
// all, an OCI config for linux/amd64 whose user is 65532:65532. ko adds the
// image-refresh binary as the only layer. It prints the pushed reference with
// its digest, for KO_DEFAULTBASEIMAGE.
//
//	go run ./hack/image/base 127.0.0.1:5000/image-refresh-base:scratch
//
// The image has no CA certificates: fine against the loopback plain-HTTP
// registry, not for registries served over TLS (see docs/image.md).
package main

import (
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// User is the non-root user of the chart's pod (runAsUser 65532), the same
// as distroless's "nonroot".
const User = "65532:65532"

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: base REGISTRY/REPOSITORY:TAG")
		os.Exit(2)
	}
	ref, err := push(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "base:", err)
		os.Exit(1)
	}
	fmt.Println(ref)
}

// Image is the base: no layers, an OCI manifest and config for linux/amd64.
func Image() (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = "amd64"
	cf.RootFS.Type = "layers"
	cf.Config.User = User
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	return mutate.ConfigFile(img, cf)
}

// push writes the base to tagRef (plain HTTP is used for loopback hosts) and
// returns repository@digest.
func push(tagRef string) (string, error) {
	tag, err := name.NewTag(tagRef)
	if err != nil {
		return "", err
	}
	img, err := Image()
	if err != nil {
		return "", fmt.Errorf("build base: %w", err)
	}
	if err := remote.Write(tag, img, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return "", fmt.Errorf("push %s: %w", tag, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return tag.Context().Digest(d.String()).String(), nil
}
