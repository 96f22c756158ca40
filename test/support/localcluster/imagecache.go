package localcluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// A node's image cache is what its container runtime has pulled: for each
// image reference a pod asked for, the manifest digest the node runs for it.
// It lives in a file of the run directory, not in the API (a kubelet's
// cache is node-local too), so that a test, `make cluster-node-cache` and
// the node's agent — three processes, possibly — share it: every access
// takes an flock and a write replaces the file whole.
//
// Keys are normalised references: "REPO:TAG" or "REPO@sha256:…", where
// REPO is the repository as go-containerregistry names it
// ("127.0.0.1:5000/acme/api", "index.docker.io/library/nginx").

// SetNodeImageCache makes node run digest for image from now on: new pods
// on the node that ask for image report digest as their imageID, without a
// pull unless their imagePullPolicy is Always. Running pods are not
// touched, as on a real node. Tests use it to make a node's cache stale on
// purpose (image "repo:tag"), or, with image "repo@sha256:index", to make a
// node report another digest than the one asked for (a runtime that reports
// the platform manifest of a multi-arch index).
func (c *Cluster) SetNodeImageCache(node, image, digest string) error {
	if _, err := c.nodeIndex(node); err != nil {
		return err
	}
	key, _, err := cacheKey(image)
	if err != nil {
		return err
	}
	if _, err := v1.NewHash(digest); err != nil {
		return fmt.Errorf("set image cache of %s: digest %q: %w", node, digest, err)
	}
	return c.imageCache(node).update(func(m map[string]string) { m[key] = digest })
}

// NodeImageCache returns a copy of node's image cache, normalised
// reference → digest.
func (c *Cluster) NodeImageCache(node string) (map[string]string, error) {
	if _, err := c.nodeIndex(node); err != nil {
		return nil, err
	}
	var out map[string]string
	err := c.imageCache(node).update(func(m map[string]string) { out = m })
	return out, err
}

type imageCache struct{ dir string }

func (c *Cluster) imageCache(node string) imageCache {
	return imageCache{dir: filepath.Join(c.RunDir, "nodes", node)}
}

// update runs fn on the cache under the lock and writes the result back
// when fn changed it.
func (ic imageCache) update(fn func(map[string]string)) error {
	if err := os.MkdirAll(ic.dir, 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(ic.dir, "images.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock image cache %s: %w", ic.dir, err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	path := filepath.Join(ic.dir, "images.json")
	m := map[string]string{}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return err
	default:
		if err := json.Unmarshal(b, &m); err != nil {
			return fmt.Errorf("read image cache %s: %w", path, err)
		}
	}
	before := fmt.Sprint(m)
	fn(m)
	if fmt.Sprint(m) == before {
		return nil
	}
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(out, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// lookup returns the cached digest of key, "" when the node has none.
func (ic imageCache) lookup(key string) (string, error) {
	var d string
	err := ic.update(func(m map[string]string) { d = m[key] })
	return d, err
}

// cacheKey parses image and returns its cache key and reference.
func cacheKey(image string) (string, name.Reference, error) {
	ref, err := name.ParseReference(image)
	if err != nil {
		return "", nil, fmt.Errorf("image %q: %w", image, err)
	}
	switch r := ref.(type) {
	case name.Digest:
		return r.Context().Name() + "@" + r.DigestStr(), ref, nil
	case name.Tag:
		return r.Context().Name() + ":" + r.TagStr(), ref, nil
	}
	return "", nil, fmt.Errorf("image %q: neither a tag nor a digest reference", image)
}

// imageID is what containerd reports in containerStatuses[].imageID: the
// repository, without tag, at the manifest digest ("docker.io/library/x"
// for Docker Hub, as containerd spells it).
func imageID(ref name.Reference, digest string) string {
	repo := ref.Context().Name()
	if ref.Context().RegistryStr() == name.DefaultRegistry {
		repo = "docker.io/" + ref.Context().RepositoryStr()
	}
	return repo + "@" + digest
}

// onLoopback reports whether the reference's registry is a loopback
// address: only such registries are pulled from (the harness never leaves
// the machine).
func onLoopback(ref name.Reference) bool {
	host := ref.Context().RegistryStr()
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
