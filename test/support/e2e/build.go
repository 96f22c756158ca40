package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"
)

// RaceEnabled says whether this test binary was built with -race.
func RaceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// Built is the image-refresh binary of this test process (buildImageRefresh).
var Built struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// BuildImageRefresh builds the command once per test process, with -race
// when this test binary has it, so that the build reuses the packages the
// test build compiled, and returns its path. Tests share the file: none
// writes it. TestMain removes it (removeBuilt).
func BuildImageRefresh(t *testing.T) string {
	t.Helper()
	Built.once.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			Built.err = fmt.Errorf("the go command is needed to build image-refresh: %w", err)
			return
		}
		if Built.dir, err = os.MkdirTemp("", "image-refresh-cli-test-"); err != nil {
			Built.err = err
			return
		}
		bin := filepath.Join(Built.dir, "image-refresh")
		args := []string{"build", "-o", bin}
		if RaceEnabled() {
			args = append(args, "-race")
		}
		start := time.Now()
		out, err := exec.Command(goBin, append(args, "github.com/image-refresh/image-refresh")...).CombinedOutput()
		if err != nil {
			Built.err = fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
			return
		}
		Built.bin = bin
		fmt.Fprintf(os.Stderr, "cli tests: built image-refresh (race %v) in %s\n", RaceEnabled(), time.Since(start).Round(time.Millisecond))
	})
	if Built.err != nil {
		t.Fatal(Built.err)
	}
	return Built.bin
}

// RemoveBuilt removes the binary buildImageRefresh built, if any.
func RemoveBuilt() {
	if Built.dir != "" {
		_ = os.RemoveAll(Built.dir)
	}
}
