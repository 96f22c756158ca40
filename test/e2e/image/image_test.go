package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/x509"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// repoRoot is the module root, three levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "hack", "image", "build.sh")); err != nil {
		t.Fatalf("repo root %s: %v", root, err)
	}
	return root
}

// buildEnv is the test's environment for hack/image/build.sh, without the
// KO_* and image variables a developer may have set, nor GOTOOLCHAIN and
// the test's own Go on PATH (the script must pin the toolchain itself),
// plus extra.
func buildEnv(extra ...string) []string {
	// go test puts its own toolchain first on PATH (and sets GOROOT); the
	// script must not depend on that, so the go on PATH is the caller's.
	testGoBin := filepath.Join(runtime.GOROOT(), "bin")
	var env []string
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "KO_"), k == "REGISTRY", k == "TAG", k == "VERSION", k == "GOTOOLCHAIN", k == "GOROOT":
			continue
		case k == "PATH":
			var keep []string
			for _, dir := range filepath.SplitList(v) {
				if filepath.Clean(dir) != testGoBin {
					keep = append(keep, dir)
				}
			}
			kv = "PATH=" + strings.Join(keep, string(filepath.ListSeparator))
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// TestBuildRequiresRegistry: without REGISTRY, make image fails at once and
// says how to get one.
func TestBuildRequiresRegistry(t *testing.T) {
	cmd := exec.Command(filepath.Join(repoRoot(t), "hack", "image", "build.sh"))
	cmd.Env = buildEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("build.sh without REGISTRY: err = %v, want exit status 2; stderr:\n%s", err, &stderr)
	}
	if want := `eval "$(make -s cluster-up)"`; !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr does not name %s:\n%s", want, &stderr)
	}
}

// TestImage builds the image exactly as `make image` does (base pusher, then
// ko; ko is installed into the tools cache first if missing) into a test
// registry and checks the pushed image: tag, entrypoint, user, platform, and
// a static, stripped binary that prints the version stamp.
func TestImage(t *testing.T) {
	root := repoRoot(t)
	reg := testregistry.Start(t)
	version := fmt.Sprintf("0.0.0-imagetest.%d", time.Now().UnixNano())

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "image", "build.sh"))
	cmd.Dir = root
	cmd.Env = buildEnv("REGISTRY="+reg.Host(), "VERSION="+version)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("hack/image/build.sh: %v\nstderr:\n%s", err, &stderr)
	}
	t.Logf("build and push: %s", time.Since(start).Round(100*time.Millisecond))

	// stdout is the pushed reference, repo:tag@digest or repo@digest.
	printed := strings.TrimSpace(stdout.String())
	dref, err := name.NewDigest(printed)
	if err != nil {
		t.Fatalf("build.sh printed %q, want a digest reference: %v\nstderr:\n%s", printed, err, &stderr)
	}
	wantRepo := reg.Host() + "/image-refresh"
	if got := dref.Context().Name(); got != wantRepo {
		t.Errorf("pushed to repository %s, want %s", got, wantRepo)
	}

	tag, err := name.NewTag(wantRepo + ":dev")
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(tag)
	if err != nil {
		t.Fatalf("remote.Image(%s): %v", tag, err)
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if digest.String() != dref.DigestStr() {
		t.Errorf("%s is %s, build.sh printed %s", tag, digest, dref.DigestStr())
	}

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform %s/%s, want linux/amd64", cf.OS, cf.Architecture)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("User %q, want 65532:65532", cf.Config.User)
	}
	ep := cf.Config.Entrypoint
	if len(ep) != 1 || path.Base(ep[0]) != "image-refresh" || !path.IsAbs(ep[0]) {
		t.Fatalf("Entrypoint %q, want the image-refresh binary alone (the chart passes args only)", ep)
	}
	if len(cf.Config.Cmd) != 0 {
		t.Errorf("Cmd %q, want none", cf.Config.Cmd)
	}

	var size int64
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		s, err := l.Size()
		if err != nil {
			t.Fatal(err)
		}
		size += s
	}
	t.Logf("%s: %d layer(s), %.1f MiB compressed", dref, len(layers), float64(size)/(1<<20))

	// The CA roots Go reads, so that registries served over TLS with a
	// public CA can be polled (S1).
	roots := extractFile(t, img, "etc/ssl/certs/ca-certificates.crt", false)
	pool := x509.NewCertPool()
	rootsPEM, err := os.ReadFile(roots)
	if err != nil {
		t.Fatal(err)
	}
	if !pool.AppendCertsFromPEM(rootsPEM) {
		t.Errorf("the image's /etc/ssl/certs/ca-certificates.crt holds no PEM certificate")
	}

	bin := extract(t, img, strings.TrimPrefix(ep[0], "/"))
	checkStaticELF(t, bin)
	// Built with the toolchain the Makefile pins, not whatever go is on
	// PATH: the standard-library fixes govulncheck checks for are in it.
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatalf("read the Go build info of the image's binary: %v", err)
	}
	if want := pinnedToolchain(t, root); bi.GoVersion != want {
		t.Errorf("the image's binary was built with %s, want %s (the Makefile's GOTOOLCHAIN)", bi.GoVersion, want)
	}

	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skipf("cannot run a linux/amd64 binary on %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s version: %v\n%s", ep[0], err, out)
	}
	if got, want := strings.TrimSpace(string(out)), "image-refresh "+version; got != want {
		t.Errorf("image-refresh version printed %q, want %q", got, want)
	}
}

// pinnedToolchain is the Go toolchain the Makefile pins (GOTOOLCHAIN).
func pinnedToolchain(t *testing.T, root string) string {
	t.Helper()
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^export GOTOOLCHAIN := *(go\d+\.\d+\.\d+)\s*$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("the Makefile pins no GOTOOLCHAIN (export GOTOOLCHAIN := goX.Y.Z)")
	}
	return string(m[1])
}

// TestDockerfile_BuildsWithThePinnedGo: the Dockerfile's Go release is the
// Makefile's GOTOOLCHAIN, so both image builds carry the same standard
// library (the Docker build itself cannot run here: no Docker engine).
func TestDockerfile_BuildsWithThePinnedGo(t *testing.T) {
	root := repoRoot(t)
	df, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ARG GO_VERSION=(\S+)$`).FindSubmatch(df)
	if m == nil {
		t.Fatal("the Dockerfile has no ARG GO_VERSION=")
	}
	if got, want := "go"+string(m[1]), pinnedToolchain(t, root); got != want {
		t.Errorf("the Dockerfile builds with %s, the Makefile pins %s", got, want)
	}
}

// extract writes the file at name (no leading slash) of the image's
// flattened filesystem into a temporary directory and returns its path.
func extract(t *testing.T, img v1.Image, name string) string {
	t.Helper()
	return extractFile(t, img, name, true)
}

// extractFile is extract for any regular file, executable when exec.
func extractFile(t *testing.T, img v1.Image, name string, exec bool) string {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			t.Fatalf("no %s in the image", name)
		}
		if err != nil {
			t.Fatalf("read the image's filesystem: %v", err)
		}
		if path.Clean(strings.TrimPrefix(h.Name, "/")) != name {
			continue
		}
		if h.Typeflag != tar.TypeReg {
			t.Fatalf("%s: tar type %q, want a regular file", name, h.Typeflag)
		}
		if exec && h.Mode&0o111 == 0 {
			t.Errorf("%s: mode %o, not executable", name, h.Mode)
		}
		dst := filepath.Join(t.TempDir(), path.Base(name))
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		return dst
	}
}

// checkStaticELF: an x86-64 ELF executable with no interpreter and no shared
// libraries (CGO_ENABLED=0), without a symbol table (-s).
func checkStaticELF(t *testing.T, bin string) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatalf("%s is not an ELF file: %v", bin, err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 || f.Type != elf.ET_EXEC {
		t.Errorf("ELF machine %v type %v, want EM_X86_64 ET_EXEC", f.Machine, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("ELF has an interpreter (PT_INTERP): dynamically linked")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("ELF imports shared libraries %q (%v), want none", libs, err)
	}
	if f.Section(".symtab") != nil {
		t.Errorf("ELF has a symbol table: not stripped (-ldflags -s)")
	}
}
