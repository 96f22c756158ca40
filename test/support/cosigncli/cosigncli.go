// Package cosigncli runs the real cosign CLI in tests: the released
// cosign v3 that hack/build-cosign.sh builds once into the local cluster's
// cache. Every run is offline: keyed signing uploads nothing to a
// transparency log, verification asks none, and cosign's TUF cache lives in
// the test's own directory, so no request leaves the machine; the registry
// is the test's, on loopback, over plain HTTP.
package cosigncli

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Binary runs hack/build-cosign.sh (a no-op once built) and returns the
// cosign binary's path. IMAGE_REFRESH_COSIGN overrides it.
func Binary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("IMAGE_REFRESH_COSIGN"); p != "" {
		return p
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "hack", "build-cosign.sh"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/build-cosign.sh: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// CLI is cosign with a home of the test's own.
type CLI struct {
	Bin string
	// Dir is the working directory and HOME of every run (cosign.key and
	// cosign.pub are written here).
	Dir string
	// Password protects cosign.key (COSIGN_PASSWORD).
	Password string
}

// New finds (or builds) cosign and gives it a fresh directory.
func New(t testing.TB) *CLI {
	t.Helper()
	return &CLI{Bin: Binary(t), Dir: t.TempDir(), Password: "test-password"}
}

// Run runs cosign with args and returns what it printed (stdout, then
// stderr) and its error; a non-zero exit is an *exec.ExitError.
func (c *CLI) Run(args ...string) (string, error) {
	cmd := exec.Command(c.Bin, args...)
	cmd.Dir = c.Dir
	cmd.Env = []string{
		"HOME=" + c.Dir,
		"PATH=" + os.Getenv("PATH"),
		"COSIGN_PASSWORD=" + c.Password,
		// cosign's TUF cache: never the user's, and never fetched for
		// the offline commands the tests run.
		"TUF_ROOT=" + filepath.Join(c.Dir, ".sigstore"),
		"COSIGN_YES=true",
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String() + stderr.String(), err
}

// MustRun is Run that fails the test when cosign fails.
func (c *CLI) MustRun(t testing.TB, args ...string) string {
	t.Helper()
	out, err := c.Run(args...)
	if err != nil {
		t.Fatalf("cosign %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// GenerateKeyPair runs cosign generate-key-pair in Dir and returns the
// paths of cosign.key and cosign.pub.
func (c *CLI) GenerateKeyPair(t testing.TB, prefix string) (priv, pub string) {
	t.Helper()
	c.MustRun(t, "generate-key-pair", "--output-key-prefix", prefix)
	priv, pub = filepath.Join(c.Dir, prefix+".key"), filepath.Join(c.Dir, prefix+".pub")
	for _, f := range []string{priv, pub} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("cosign generate-key-pair wrote no %s: %v", f, err)
		}
	}
	return priv, pub
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "hack", "build-cosign.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("cannot find the repository root (hack/build-cosign.sh) above the working directory")
		}
		dir = parent
	}
}
