// Command localcluster starts, stops and breaks the local test cluster from
// the command line (see `make cluster-up`). Progress goes to stderr; `up`
// prints exactly two lines on stdout so that
//
//	eval "$(make -s cluster-up)"
//
// points kubectl and the registry helpers at it.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/image-refresh/image-refresh/test/support/localcluster"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

const usage = `usage: localcluster <command> [args]
  up BINDIR RUNDIR      start the cluster and a loopback registry; print two export lines
                        (REAL_NODES=1: also a real node, kubelet and containerd)
  down RUNDIR           stop every process the cluster started
  node-down RUNDIR NODE make NODE NotReady (stops its kwok)
  node-up RUNDIR NODE   make NODE Ready again (its pods are re-reported Ready)
  node-cache RUNDIR NODE [IMAGE DIGEST]
                        make NODE run DIGEST for IMAGE (repo:tag or repo@digest) from
                        now on, e.g. a stale cached tag; without IMAGE print its cache
  node-agent RUNDIR NODE    (internal) run NODE's image agent
  node-forward RUNDIR       (internal) run the real node's forwarder
  serve-registry ADDRFILE   (internal) serve the registry, write its address to ADDRFILE`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	need := func(n int) error {
		if len(args) != n+1 {
			return fmt.Errorf("%s: wrong number of arguments\n%s", args[0], usage)
		}
		return nil
	}
	switch args[0] {
	case "up":
		if err := need(2); err != nil {
			return err
		}
		return up(ctx, args[1], args[2])
	case "down":
		if err := need(1); err != nil {
			return err
		}
		return down(args[1])
	case "node-down", "node-up":
		if err := need(2); err != nil {
			return err
		}
		c, err := attach(args[1])
		if err != nil {
			return err
		}
		c.SetLog(os.Stderr)
		if args[0] == "node-down" {
			return c.NodeDown(ctx, args[2])
		}
		return c.NodeUp(ctx, args[2])
	case "node-cache":
		if len(args) != 3 && len(args) != 5 {
			return fmt.Errorf("node-cache: wrong number of arguments\n%s", usage)
		}
		c, err := localcluster.Attach(args[1])
		if err != nil {
			return err
		}
		if len(args) == 5 {
			if err := c.SetNodeImageCache(args[2], args[3], args[4]); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "localcluster: %s now runs %s for %s (new pods; running pods are unchanged)\n", args[2], args[4], args[3])
		}
		m, err := c.NodeImageCache(args[2])
		if err != nil {
			return err
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Printf("%s\t%s\n", k, m[k])
		}
		return nil
	case "node-agent":
		if err := need(2); err != nil {
			return err
		}
		return localcluster.RunNodeAgent(ctx, args[1], args[2], os.Stderr)
	case "node-forward":
		if err := need(1); err != nil {
			return err
		}
		return localcluster.RunNodeForwarder(ctx, args[1], os.Stderr)
	case "serve-registry":
		if err := need(1); err != nil {
			return err
		}
		return serveRegistry(ctx, args[1])
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

// attach loads the cluster of runDir. A node agent it (re)starts is a
// process of this binary, also for a cluster whose agents were goroutines
// of the process that started it (make demo KEEP=1).
func attach(runDir string) (*localcluster.Cluster, error) {
	c, err := localcluster.Attach(runDir)
	if err != nil {
		return nil, err
	}
	if len(c.AgentCommand) == 0 {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		c.AgentCommand = []string{self, "node-agent"}
	}
	return c, nil
}

func up(ctx context.Context, binDir, runDir string) error {
	if c, err := localcluster.Attach(runDir); err == nil && len(c.Processes()) > 0 {
		return fmt.Errorf("a cluster already runs from %s; stop it with `make cluster-down`", runDir)
	}
	_ = os.RemoveAll(runDir)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	realNodes := 0
	if v := os.Getenv("REAL_NODES"); v != "" && v != "0" {
		if realNodes, err = strconv.Atoi(v); err != nil || realNodes < 0 {
			return fmt.Errorf("REAL_NODES=%q: want a number of real nodes (0 or 1)", v)
		}
	}
	c, err := localcluster.Start(ctx, localcluster.Options{
		BinDir: binDir, RunDir: runDir, Detach: true, Log: os.Stderr,
		// Each node's image agent outlives this command, as its kwok does,
		// and so does the real node's forwarder.
		AgentCommand: []string{self, "node-agent"}, ForwardCommand: []string{self, "node-forward"},
		RealNodes: realNodes,
	})
	if err != nil {
		return err
	}
	registry, err := startRegistry(runDir)
	if err != nil {
		_ = c.Stop()
		return err
	}
	// With a real node the registry's name is its forward into the node's
	// network namespace: the same name works from this shell, the node's
	// containerd and pods.
	if c.Real != nil {
		_, port, err := net.SplitHostPort(registry)
		if err == nil {
			var p int
			if p, err = strconv.Atoi(port); err == nil {
				registry, err = c.Expose(p)
			}
		}
		if err != nil {
			_ = c.Stop()
			return fmt.Errorf("expose the registry %s to the real node: %w", registry, err)
		}
	}
	fmt.Printf("export KUBECONFIG=%s\nexport REGISTRY=%s\n", c.Kubeconfig, registry)
	return nil
}

// startRegistry runs this binary's serve-registry as a detached process and
// waits for the address it picked.
func startRegistry(runDir string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	addrFile := filepath.Join(runDir, "registry.addr")
	logFile, err := os.Create(filepath.Join(runDir, "logs", "registry.log"))
	if err != nil {
		return "", err
	}
	defer logFile.Close()
	cmd := exec.Command(self, "serve-registry", addrFile)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start registry: %w", err)
	}
	if err := os.WriteFile(filepath.Join(runDir, "registry.pid"), []byte(fmt.Sprint(cmd.Process.Pid)), 0o644); err != nil {
		return "", err
	}
	for i := 0; i < 100; i++ {
		if b, err := os.ReadFile(addrFile); err == nil && len(b) > 0 {
			return strings.TrimSpace(string(b)), nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "", fmt.Errorf("registry did not report its address in %s", addrFile)
}

func serveRegistry(ctx context.Context, addrFile string) error {
	s := testregistry.New()
	if err := s.Start("127.0.0.1:0"); err != nil {
		return err
	}
	defer s.Close()
	if err := os.WriteFile(addrFile, []byte(s.Host()), 0o644); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

func down(runDir string) error {
	var errs []error
	if b, err := os.ReadFile(filepath.Join(runDir, "registry.pid")); err == nil {
		var pid int
		if _, err := fmt.Sscan(string(b), &pid); err == nil && pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
		_ = os.Remove(filepath.Join(runDir, "registry.pid"))
	}
	c, err := localcluster.Attach(runDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "localcluster: nothing to stop:", err)
		return errors.Join(errs...)
	}
	errs = append(errs, c.Stop())
	fmt.Fprintln(os.Stderr, "localcluster: stopped")
	return errors.Join(errs...)
}
