// Package freeport picks loopback TCP ports for servers that bind them
// later: a child process, or a server that only takes an address.
//
// A port the kernel hands out for "127.0.0.1:0" comes from its ephemeral
// range, the range every outgoing connection's local port is drawn from
// too. Between the probe's close and the server's bind, a client
// connection or another test binary's ":0" listener can take it, and the
// server fails with "address already in use" (CI saw a controller's
// metrics listener fail so). Ports outside that range are never handed out
// implicitly, so only another explicit picker can collide; a random pick,
// a probe bind and a per-process memory of the ports already given make
// that rare.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// lowest is the lowest port picked: below it live the well-known and
// registered ports other software on a machine may expect to bind.
const lowest = 10000

var (
	mu         sync.Mutex
	given      = map[int]bool{}
	candidates []int // the ports outside the ephemeral range, read once
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
		if given[p] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		l.Close()
		given[p] = true
		out = append(out, p)
	}
	if len(out) < n {
		return nil, fmt.Errorf("freeport: found %d of %d free loopback ports in 1000 tries", len(out), n)
	}
	return out, nil
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
