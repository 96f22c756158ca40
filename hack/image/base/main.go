// Command base pushes the minimal base image `make image` builds on when no
// registry with a real base (distroless static) is reachable: no layers at
// all, an OCI config for linux/amd64 whose user is 65532:65532. ko adds the
// image-refresh binary as the only layer. It prints the pushed reference with
// its digest, for KO_DEFAULTBASEIMAGE.
//
//	go run ./hack/image/base 127.0.0.1:5000/image-refresh-base:scratch
//
// The image's one layer is the CA roots of the machine that builds it
// (Debian's ca-certificates bundle, CA_BUNDLE to name another file) at
// /etc/ssl/certs/ca-certificates.crt, where Go's crypto/x509 reads them:
// without them no public registry served over TLS could be polled. A
// registry that answers plain HTTP off loopback (the local cluster's real
// node) is written to with INSECURE=1.
package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// CABundle is where the image keeps its CA roots: the first file Go's
// crypto/x509 reads on Linux.
const CABundle = "etc/ssl/certs/ca-certificates.crt"

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

// Image is the base: one layer with the CA roots caPEM, an OCI manifest
// and config for linux/amd64.
func Image(caPEM []byte) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	layer, err := caLayer(caPEM)
	if err != nil {
		return nil, err
	}
	if img, err = mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: types.OCILayer}); err != nil {
		return nil, err
	}
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
	var opts []name.Option
	if os.Getenv("INSECURE") == "1" {
		opts = append(opts, name.Insecure)
	}
	tag, err := name.NewTag(tagRef, opts...)
	if err != nil {
		return "", err
	}
	bundle := os.Getenv("CA_BUNDLE")
	if bundle == "" {
		bundle = "/" + CABundle
	}
	caPEM, err := os.ReadFile(bundle)
	if err != nil {
		return "", fmt.Errorf("the image's CA roots: %w (install Debian's ca-certificates, or set CA_BUNDLE to a PEM bundle)", err)
	}
	img, err := Image(caPEM)
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

// caLayer is a layer holding caPEM at CABundle, readable by every user.
func caLayer(caPEM []byte) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, dir := range []string{"etc/", "etc/ssl/", "etc/ssl/certs/"} {
		if err := tw.WriteHeader(&tar.Header{Name: dir, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Name: CABundle, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(caPEM)), ModTime: epoch}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(caPEM); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
}
