// Package testenv gives integration tests a real cluster: one local cluster
// (etcd, kube-apiserver, controller-manager, scheduler, three kwok nodes) per
// test binary, started from TestMain, plus helpers to create workloads, break
// and heal nodes, and wait for rollouts.
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/localcluster"
)

var shared *localcluster.Cluster

// Main builds the cluster binaries if needed (hack/build-cluster.sh, cached
// outside the repo), starts a cluster, runs the tests and stops every
// process, also when a test panics.
func Main(m *testing.M) int {
	return MainWith(m, localcluster.Options{})
}

// MainWith is Main with a cluster of opts (BinDir, RunDir and Log are
// filled in), e.g. RealNodes: 1 for the tests of what a real node runs.
func MainWith(m *testing.M, opts localcluster.Options) int {
	binDir, err := BinDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	runDir, err := os.MkdirTemp("", "image-refresh-cluster-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	opts.BinDir, opts.RunDir, opts.Log = binDir, runDir, os.Stderr
	c, err := localcluster.Start(ctx, opts)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv: start cluster:", err)
		return 1
	}
	shared = c
	code := func() int {
		defer func() {
			if err := c.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "testenv: stop cluster:", err)
			}
		}()
		return m.Run()
	}()
	if code == 0 {
		_ = os.RemoveAll(runDir)
	} else {
		fmt.Fprintln(os.Stderr, "testenv: cluster logs kept in", filepath.Join(runDir, "logs"))
	}
	return code
}

// Cluster returns the cluster started by Main.
func Cluster(t testing.TB) *localcluster.Cluster {
	t.Helper()
	if shared == nil {
		t.Fatal("testenv: no cluster; call testenv.Main from TestMain")
	}
	return shared
}

// BinDir runs hack/build-cluster.sh (a no-op once built) and returns the
// directory that holds the cluster binaries. IMAGE_REFRESH_CLUSTER_BIN
// overrides it.
func BinDir() (string, error) {
	if d := os.Getenv("IMAGE_REFRESH_CLUSTER_BIN"); d != "" {
		return d, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(filepath.Join(root, "hack", "build-cluster.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/build-cluster.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "hack", "build-cluster.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("cannot find the repository root (hack/build-cluster.sh) above the working directory")
		}
		dir = parent
	}
}
