package chart

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/test/support/testenv"
)

var update = flag.Bool("update", false, "rewrite test/e2e/chart/testdata/golden/*.yaml from `helm template` (go test ./test/e2e/chart -run Golden -update)")

const goldenDir = "testdata/golden"

// TestChart_GoldenFiles renders the chart with the real Helm CLI for every
// ci/<mode>-values.yaml and compares the output byte for byte with
// testdata/golden/<mode>.yaml. Any template change that is not reflected
// in the golden files fails here; review the diff, then regenerate with
//
//	go test ./test/e2e/chart -run Golden -update
func TestChart_GoldenFiles(t *testing.T) {
	bin, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	helmBin := filepath.Join(bin, "helm")
	home := t.TempDir()

	valueFiles, err := filepath.Glob(filepath.Join(chartDir(t), "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(valueFiles) == 0 {
		t.Fatal("no ci/*-values.yaml in the chart")
	}
	var names []string
	for _, f := range valueFiles {
		names = append(names, strings.TrimSuffix(filepath.Base(f), "-values.yaml"))
	}
	slices.Sort(names)

	if *update {
		if err := os.MkdirAll(goldenDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, mode := range names {
		t.Run(mode, func(t *testing.T) {
			got := helmTemplate(t, helmBin, home, ciValues(t, mode))
			path := filepath.Join(goldenDir, mode+".yaml")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v\n(new mode? run: go test ./test/e2e/chart -run Golden -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("helm template with ci/%s-values.yaml differs from %s:\n%s\nIf the change is intended, run: go test ./test/e2e/chart -run Golden -update",
					mode, path, lineDiff(string(want), string(got)))
			}
		})
	}

	// A golden file without its values file is a mode that no longer exists.
	t.Run("no stale golden files", func(t *testing.T) {
		files, err := filepath.Glob(filepath.Join(goldenDir, "*.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			mode := strings.TrimSuffix(filepath.Base(f), ".yaml")
			if slices.Contains(names, mode) {
				continue
			}
			if *update {
				if err := os.Remove(f); err != nil {
					t.Fatal(err)
				}
				continue
			}
			t.Errorf("%s has no charts/image-refresh/ci/%s-values.yaml; remove it (or run with -update)", f, mode)
		}
	})
}

// helmTemplate returns the stdout of `helm template rel <chart> --namespace
// ops -f values`, the same release and namespace the other chart tests use.
// It needs no cluster.
func helmTemplate(t *testing.T, helmBin, home, values string) []byte {
	t.Helper()
	cmd := exec.Command(helmBin, "template", release, chartDir(t), "--namespace", releaseNS, "-f", values)
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+filepath.Join(home, "no-kubeconfig"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm template -f %s: %v\n%s", values, err, stderr.String())
	}
	if stdout.Len() == 0 {
		t.Fatalf("helm template -f %s rendered nothing\n%s", values, stderr.String())
	}
	return stdout.Bytes()
}

// lineDiff reports the first differing line of want and got with a few
// lines of context, and the line counts.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	i := 0
	for i < len(w) && i < len(g) && w[i] == g[i] {
		i++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "golden has %d lines, helm rendered %d; first difference at line %d\n", len(w), len(g), i+1)
	from := max(0, i-3)
	for j := from; j < i; j++ {
		fmt.Fprintf(&b, "  %4d   %s\n", j+1, w[j])
	}
	for j := i; j < min(len(w), i+6); j++ {
		fmt.Fprintf(&b, "- %4d   %s\n", j+1, w[j])
	}
	for j := i; j < min(len(g), i+6); j++ {
		fmt.Fprintf(&b, "+ %4d   %s\n", j+1, g[j])
	}
	return b.String()
}
