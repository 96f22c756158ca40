// Package freeport picks loopback TCP ports for servers that bind them
// later: a child process, or a server that only takes an address.
//
// A port the kernel hands out for "127.0.0.1:0" comes from its ephemeral
// range, the range every outgoing connection's local port is drawn from
// too. Between the probe's close and the server's bind, a client
// connection or another test binary's ":0" listener can take it, and the
// server fails with "address already in use" (CI saw a controller's
// metrics listener fail so). Ports outside that range are never handed out
// implicitly, so only another explicit picker can collide: the test
// binaries `go test` runs side by side. Each port given is reserved for
// the life of the process that took it by a lock on a file named after it
// (flock, which the kernel drops when the process exits, however it
// exits), so two test binaries never get the same port while both run
// (CI saw a kube-controller-manager fail to bind a port another binary's
// cluster had just taken). A probe bind still skips ports that software
// not using this package holds.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// lowest is the lowest port picked: below it live the well-known and
// registered ports other software on a machine may expect to bind.
const lowest = 10000

var (
	mu         sync.Mutex
	given      = map[int]*os.File{} // the lock file of each port given, open for the process's life
	candidates []int                // the ports outside the ephemeral range, read once
	lockDir    = filepath.Join(os.TempDir(), "image-refresh-freeport")
)

// Addr returns "127.0.0.1:<port>" for a port that was free when probed.
func Addr() (string, error) {
	ps, err := Ports(1)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ps[0])), nil
}

// Port returns one loopback port that was free when probed.
func Port() (int, error) {
	ps, err := Ports(1)
	if err != nil {
		return 0, err
	}
	return ps[0], nil
}

// Ports returns n distinct loopback ports, each free when probed and none
// given before by this process.
func Ports(n int) ([]int, error) {
	mu.Lock()
	defer mu.Unlock()
	if candidates == nil {
		if err := os.MkdirAll(lockDir, 0o777); err != nil {
			return nil, fmt.Errorf("freeport: lock directory: %w", err)
		}
		candidates = outsideEphemeral(ephemeralRange())
	}
	if len(candidates) == 0 {
		return nil, fmt.Errorf("freeport: no loopback port outside the ephemeral range %v", ephemeralRange())
	}
	out := make([]int, 0, n)
	// Try as many ports as it takes, but not forever: a machine whose
	// whole non-ephemeral range is bound has a bigger problem.
	for tries := 0; len(out) < n && tries < 1000; tries++ {
		p := candidates[rand.IntN(len(candidates))]
		if given[p] != nil {
			continue
		}
		f, err := reserve(p)
		if err != nil {
			return nil, err
		}
		if f == nil {
			continue // another process holds it
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			f.Close() // bound by software that does not use this package
			continue
		}
		l.Close()
		given[p] = f
		out = append(out, p)
	}
	if len(out) < n {
		return nil, fmt.Errorf("freeport: found %d of %d free loopback ports in 1000 tries", len(out), n)
	}
	return out, nil
}

// reserve takes the lock of port p for this process: the open lock file,
// or nil if another process holds it. The file stays open (and locked)
// until the process exits; the kernel releases the lock then, so a test
// binary that is killed leaves nothing reserved behind. Ports has made the
// lock directory, once, with the candidates.
func reserve(p int) (*os.File, error) {
	name := filepath.Join(lockDir, strconv.Itoa(p)+".lock")
	f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, fmt.Errorf("freeport: lock file of port %d: %w", p, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if err == syscall.EWOULDBLOCK {
			return nil, nil
		}
		return nil, fmt.Errorf("freeport: lock port %d: %w", p, err)
	}
	return f, nil
}

// ephemeralRange reads the kernel's range for implicit ports; Linux's
// default when it cannot be read.
func ephemeralRange() [2]int {
	r := [2]int{32768, 60999}
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return r
	}
	return parseRange(string(b), r)
}

func parseRange(s string, def [2]int) [2]int {
	f := strings.Fields(s)
	if len(f) != 2 {
		return def
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || lo < 1 || hi > 65535 || lo > hi {
		return def
	}
	return [2]int{lo, hi}
}

// outsideEphemeral lists the ports from lowest to 65535 that are not in r.
func outsideEphemeral(r [2]int) []int {
	var ps []int
	for p := lowest; p <= 65535; p++ {
		if p < r[0] || p > r[1] {
			ps = append(ps, p)
		}
	}
	return ps
}

// MustAddr is Addr that fails the test on error.
func MustAddr(t testing.TB) string {
	t.Helper()
	a, err := Addr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}
