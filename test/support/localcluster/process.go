package localcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/image-refresh/image-refresh/test/support/freeport"
)

// process is one server the cluster started. Only its PID is load-bearing,
// so that a later invocation (cluster-down, node-down) can stop it.
type process struct {
	Name string   `json:"name"`
	PID  int      `json:"pid"`
	Args []string `json:"args"`
	Log  string   `json:"log"`
}

// startProcess runs bin with args, output to runDir/logs/<name>.log. With
// detach the process survives its parent (command-line cluster); otherwise
// it gets SIGKILL when the parent dies, so an interrupted test leaves
// nothing behind.
func startProcess(runDir, name, bin string, args []string, detach bool) (*process, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("start %s: binary %s missing (run hack/build-cluster.sh): %w", name, bin, err)
	}
	logDir := filepath.Join(runDir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	logPath := filepath.Join(logDir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = runDir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if !detach {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{Name: name, PID: cmd.Process.Pid, Args: args, Log: logPath}
	// Reap the child when it exits so that alive() sees it gone; a detached
	// process outlives us and is reaped by init.
	go func() { _ = cmd.Wait() }()
	return p, nil
}

// alive reports whether the process still runs (and is not a zombie).
func (p *process) alive() bool {
	if p == nil || p.PID <= 0 {
		return false
	}
	if err := syscall.Kill(p.PID, 0); err != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

// stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *process) stop(grace time.Duration) error {
	if !p.alive() {
		return nil
	}
	_ = syscall.Kill(-p.PID, syscall.SIGTERM)
	if gone, err := WaitExit(p.PID, grace); gone || err != nil {
		return err
	}
	_ = syscall.Kill(-p.PID, syscall.SIGKILL)
	gone, err := WaitExit(p.PID, 2*time.Second)
	if err != nil {
		return err
	}
	if !gone {
		return fmt.Errorf("stop %s (pid %d): still running after SIGKILL", p.Name, p.PID)
	}
	return nil
}

// WaitExit waits up to d for process pid to exit and reports whether it
// did (a zombie counts as gone). It waits on a pidfd, which polls readable
// once the process has exited: the kernel's signal for any process, not
// only a child (cluster-down stops processes an earlier command started),
// so no poll.
func WaitExit(pid int, d time.Duration) (bool, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("pidfd_open(%d): %w", pid, err)
	}
	defer unix.Close(fd)
	deadline := time.Now().Add(d)
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(max(time.Until(deadline), 0).Milliseconds()))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("poll the pidfd of %d: %w", pid, err)
		}
		return n == 1, nil
	}
}

// tail returns the last lines of the process log, for error messages.
func (p *process) tail(n int) string {
	b, err := os.ReadFile(p.Log)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freePort picks a free loopback port. Two clusters started at once by two
// test binaries must not collide, so no port is fixed; and a restarted
// kube-apiserver binds its port again, so it is one no client connection
// can hold meanwhile (see freeport).
func freePort() (int, error) {
	return freeport.Port()
}

func freePorts(n int) ([]int, error) {
	return freeport.Ports(n)
}

func addr(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

var errNotReady = errors.New("not ready")
