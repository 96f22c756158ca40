package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// listenIn opens a TCP listener on addr inside the network namespace nsPath.
// A socket keeps the namespace it was made in, so the listener accepts
// there while this process dials loopback in its own namespace.
func listenIn(nsPath, addr string) (net.Listener, error) {
	runtime.LockOSThread()
	own, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer own.Close()
	target, err := os.Open(nsPath)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("enter network namespace %s: %w", nsPath, err)
	}
	ln, lerr := net.Listen("tcp", addr)
	if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked and ends with this goroutine, so no other
		// goroutine ever runs in the wrong namespace.
		if ln != nil {
			ln.Close()
		}
		return nil, fmt.Errorf("return from network namespace %s: %w", nsPath, err)
	}
	runtime.UnlockOSThread()
	if lerr != nil {
		return nil, fmt.Errorf("listen on %s in %s: %w", addr, nsPath, lerr)
	}
	return ln, nil
}

// forwarder serves the real node's forwards: NodeIP:port in the node's
// namespace to 127.0.0.1:port in the host's.
type forwarder struct {
	mu  sync.Mutex
	lns map[int]net.Listener
}

func (f *forwarder) add(nsPath, nodeIP string, port int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lns == nil {
		f.lns = map[int]net.Listener{}
	}
	if _, ok := f.lns[port]; ok {
		return nil
	}
	ln, err := listenIn(nsPath, net.JoinHostPort(nodeIP, strconv.Itoa(port)))
	if err != nil {
		return err
	}
	f.lns[port] = ln
	target := addr(port)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go pipe(c, target)
		}
	}()
	return nil
}

func (f *forwarder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ln := range f.lns {
		ln.Close()
	}
	f.lns = nil
}

func pipe(in net.Conn, target string) {
	defer in.Close()
	out, err := net.DialTimeout("tcp", target, 10*time.Second)
	if err != nil {
		return
	}
	defer out.Close()
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(out, in)
	go cp(in, out)
	<-done
	<-done
}

// RunNodeForwarder serves the forwards of runDir's real node until ctx ends
// or the node's namespace is gone, picking up the ports Expose adds to
// state.json. It runs as a goroutine of the process that started the
// cluster, or, for a detached cluster, as a process of its own
// (hack/localcluster node-forward).
func RunNodeForwarder(ctx context.Context, runDir string, log io.Writer) error {
	f := &forwarder{}
	defer f.close()
	failed := map[int]bool{}
	for {
		var st struct {
			Real *RealNode `json:"real"`
		}
		b, err := os.ReadFile(filepath.Join(runDir, "state.json"))
		if err == nil && json.Unmarshal(b, &st) == nil && st.Real != nil {
			rn := st.Real
			nsPath := "/run/netns/" + rn.NetNS
			if _, err := os.Stat(nsPath); err != nil {
				return fmt.Errorf("real node %s: network namespace %s is gone", rn.Name, rn.NetNS)
			}
			for _, p := range rn.Forwards {
				if err := f.add(nsPath, rn.NodeIP, p); err != nil && !failed[p] {
					failed[p] = true
					fmt.Fprintf(log, "[localcluster %s] forward %s: %v\n", time.Now().Format("15:04:05"), rn.Addr(p), err)
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// startForwarder runs RunNodeForwarder: as a process of its own when the
// cluster is detached (command is Options.ForwardCommand), else as a
// goroutine that Stop ends.
func (c *Cluster) startForwarder(command []string) error {
	if c.Detach {
		if len(command) == 0 {
			return fmt.Errorf("localcluster: a detached cluster with a real node needs Options.ForwardCommand")
		}
		p, err := startProcess(c.RunDir, "forward-"+c.Real.Name, command[0], append(append([]string{}, command[1:]...), c.RunDir), true)
		if err != nil {
			return err
		}
		c.Procs["forward-"+c.Real.Name] = p
		// The forwarder outlives this process, as the node does: it is the
		// node's owner from now on, so that the next start of a real node
		// on this machine does not reap it as stale.
		c.Real.Owner = p.PID
		if err := c.Real.record(); err != nil {
			return err
		}
		return c.save()
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.stopForward, c.forwardDone = cancel, make(chan struct{})
	go func() {
		defer close(c.forwardDone)
		if err := RunNodeForwarder(ctx, c.RunDir, c.log); err != nil {
			c.logf("forwarder: %v", err)
		}
	}()
	return nil
}

// RealNodeName is the name of the cluster's real node, "" without one.
func (c *Cluster) RealNodeName() string {
	if c.Real == nil {
		return ""
	}
	return c.Real.Name
}
