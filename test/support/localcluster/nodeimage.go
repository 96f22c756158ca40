package localcluster

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// nodeAppSource is the program every image of the real node runs: the pod
// sandbox's pause process and the test application (nodeapp/main.go.txt).
//
//go:embed nodeapp/main.go.txt
var nodeAppSource []byte

// PauseImage is the pod sandbox image of the real node's containerd. It is
// imported into containerd at node start, never pulled: no registry outside
// this machine is reachable.
const PauseImage = "localcluster.local/pause:3.10"

var nodeAppBuild struct {
	sync.Mutex
	bin []byte
}

// nodeAppBinary builds nodeapp (a static binary, std library only) once per
// process, into the cache dir when one is given.
func nodeAppBinary(cacheDir string) ([]byte, error) {
	nodeAppBuild.Lock()
	defer nodeAppBuild.Unlock()
	if nodeAppBuild.bin != nil {
		return nodeAppBuild.bin, nil
	}
	sum := sha256.Sum256(nodeAppSource)
	cached := ""
	if cacheDir != "" {
		cached = filepath.Join(cacheDir, "nodeapp-"+hex.EncodeToString(sum[:8]))
		if b, err := os.ReadFile(cached); err == nil {
			nodeAppBuild.bin = b
			return b, nil
		}
	}
	dir, err := os.MkdirTemp("", "nodeapp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module nodeapp\n\ngo 1.26\n"), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), nodeAppSource, 0o644); err != nil {
		return nil, err
	}
	out := filepath.Join(dir, "nodeapp")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the real node's nodeapp (go build): %w\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return nil, err
	}
	if cached != "" {
		tmp := cached + ".tmp"
		if err := os.WriteFile(tmp, b, 0o755); err == nil {
			_ = os.Rename(tmp, cached)
		}
	}
	nodeAppBuild.bin = b
	return b, nil
}

// nodeImage is nodeapp as an image: the binary at /<file>, run as the
// entrypoint, with env. A fixed creation time keeps the digest a function of
// the binary and env alone.
func nodeImage(cacheDir, file string, env ...string) (v1.Image, error) {
	bin, err := nodeAppBinary(cacheDir)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := &tar.Header{Name: file, Mode: 0o755, Size: int64(len(bin)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layerBytes := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerBytes)), nil })
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Entrypoint = []string{"/" + file}
	cf.Config.Env = append([]string{"PATH=/"}, env...)
	return mutate.ConfigFile(img, cf)
}

// AppImage is the test application of the real node for one build: its
// container prints "nodeapp: serving build BUILD" and answers HTTP on :8080
// with "build BUILD". Each build is an image of its own digest. cacheDir
// (may be empty) keeps the compiled binary between processes.
func AppImage(cacheDir, build string) (v1.Image, error) {
	return nodeImage(cacheDir, "nodeapp", "BUILD="+build)
}

// CrashingAppImage is a build of the test application whose container
// prints "nodeapp: build BUILD exits CODE" and exits with code at once: a
// broken release (V2). Its digest differs from AppImage's of the same build.
func CrashingAppImage(cacheDir, build string, code int) (v1.Image, error) {
	return nodeImage(cacheDir, "nodeapp", "BUILD="+build, fmt.Sprintf("EXIT_CODE=%d", code))
}

// writePauseTar writes PauseImage as an image tarball that `ctr images
// import` reads.
func writePauseTar(cacheDir, path string) error {
	img, err := nodeImage(cacheDir, "pause")
	if err != nil {
		return err
	}
	ref, err := name.NewTag(PauseImage)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		return fmt.Errorf("write the pause image: %w", err)
	}
	return os.Rename(tmp, path)
}
