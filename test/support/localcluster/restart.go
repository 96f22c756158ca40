package localcluster

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"syscall"
	"time"
)

// RestartAPIServer kills the kube-apiserver process with SIGKILL (a crash:
// every open connection and watch drops at once), starts it again with the
// same arguments on the same port, and returns once /readyz passes. It
// returns how long the API was down. Fault tests use it to prove that
// clients re-establish their watches; the other cluster processes
// reconnect on their own.
func (c *Cluster) RestartAPIServer(ctx context.Context) (time.Duration, error) {
	const name = "kube-apiserver"
	p, ok := c.Procs[name]
	if !ok {
		return 0, fmt.Errorf("localcluster: no %s process recorded", name)
	}
	start := time.Now()
	if p.alive() {
		_ = syscall.Kill(-p.PID, syscall.SIGKILL)
		gone, err := WaitExit(p.PID, 5*time.Second)
		if err != nil {
			return 0, fmt.Errorf("localcluster: %w", err)
		}
		if !gone {
			return 0, fmt.Errorf("localcluster: %s (pid %d) still running 5 s after SIGKILL", name, p.PID)
		}
	}
	// The main thread turns zombie before the other threads have exited
	// and closed the listener: wait until the port can be bound again.
	if err := waitPortFree(ctx, c.Server, 10*time.Second); err != nil {
		return 0, err
	}
	np, err := startProcess(c.RunDir, name, filepath.Join(c.BinDir, name), p.Args, c.Detach)
	if err != nil {
		return 0, err
	}
	c.Procs[name] = np
	if err := c.save(); err != nil {
		return 0, err
	}
	if err := c.waitAPI(ctx); err != nil {
		return 0, err
	}
	down := time.Since(start)
	c.logf("kube-apiserver restarted (pid %d -> %d), API down for %s", p.PID, np.PID, down.Round(time.Millisecond))
	return down, nil
}

// waitPortFree waits until the host:port of server can be listened on.
func waitPortFree(ctx context.Context, server string, timeout time.Duration) error {
	u, err := url.Parse(server)
	if err != nil {
		return fmt.Errorf("localcluster: server %q: %w", server, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		l, err := net.Listen("tcp", u.Host)
		if err == nil {
			return l.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("localcluster: %s still in use %s after the kube-apiserver was killed: %w", u.Host, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
