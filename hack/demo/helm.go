package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// helm runs the real Helm CLI (built by hack/build-cluster.sh) against the
// demo cluster, with its cache, config and data in the demo's own directory.
type helm struct {
	n          *narrator
	bin        string
	kubeconfig string
	home       string
}

// run shows the command, streams its output and returns it.
func (h *helm) run(ctx context.Context, args ...string) (string, error) {
	h.n.command("helm " + strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, h.bin, args...)
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+h.kubeconfig,
		"HELM_CACHE_HOME="+filepath.Join(h.home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(h.home, "config"),
		"HELM_DATA_HOME="+filepath.Join(h.home, "data"),
	)
	out := h.n.output()
	cmd.Stdout, cmd.Stderr = out, out
	err := cmd.Run()
	out.Flush()
	return out.String(), err
}

// releaseArgs are the install/upgrade arguments shared by every Helm call.
func releaseArgs(verb, chart, registry string, extra ...string) []string {
	args := []string{verb, release, chart, "--namespace", namespace}
	if verb == "install" {
		args = append(args, "--create-namespace", "--set", "registry="+registry)
	}
	return append(args, extra...)
}
