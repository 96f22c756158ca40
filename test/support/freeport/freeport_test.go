package freeport

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestMain lets the test binary play the other test binary of
// TestPorts_AreNeverGivenToTwoProcessesAtOnce.
func TestMain(m *testing.M) {
	if os.Getenv("FREEPORT_CHILD") == "1" {
		ps, err := Ports(50)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(strings.Trim(fmt.Sprint(ps), "[]"))
		io.Copy(io.Discard, os.Stdin) // hold the ports until the parent closes stdin
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestPorts_AreNeverGivenToTwoProcessesAtOnce(t *testing.T) {
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), "FREEPORT_CHILD=1")
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("read the child's ports: %v", err)
	}
	var theirs []int
	for _, f := range strings.Fields(line) {
		p, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("child said %q", line)
		}
		theirs = append(theirs, p)
	}
	if len(theirs) != 50 {
		t.Fatalf("child gave %d ports, want 50: %q", len(theirs), line)
	}
	// While the child runs, every port it took is reserved: this process
	// cannot take one of them, though none is bound.
	for _, p := range theirs {
		f, err := reserve(p)
		if err != nil {
			t.Fatal(err)
		}
		if f != nil {
			f.Close()
			t.Fatalf("port %d, taken by the running child, was reserved by this process too", p)
		}
	}
	// Once it exits, the kernel has dropped its locks: the same ports are
	// free to take (which also proves the check above could pass).
	stdin.Close()
	if err := child.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	for _, p := range theirs {
		f, err := reserve(p)
		if err != nil {
			t.Fatal(err)
		}
		if f == nil {
			t.Fatalf("port %d is still reserved after the child that took it exited", p)
		}
		f.Close()
	}
}

func TestPorts_AreOutsideTheEphemeralRangeDistinctAndBindable(t *testing.T) {
	r := ephemeralRange()
	ps, err := Ports(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ps {
		if p >= r[0] && p <= r[1] {
			t.Errorf("port %d is in the ephemeral range %v, where a client connection can take it", p, r)
		}
		if p < lowest {
			t.Errorf("port %d is below %d", p, lowest)
		}
		if seen[p] {
			t.Errorf("port %d given twice", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Errorf("port %d is not bindable: %v", p, err)
			continue
		}
		l.Close()
	}
}

func TestPort_IsNeverGivenTwiceByOneProcess(t *testing.T) {
	// 2000 random picks among ~22 000 ports repeat one about 90 times
	// unless the picker remembers what it gave.
	seen := map[int]bool{}
	for range 2000 {
		p, err := Port()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d given twice", p)
		}
		seen[p] = true
	}
}

func TestParseRange(t *testing.T) {
	def := [2]int{1, 2}
	for in, want := range map[string][2]int{
		"32768\t60999\n": {32768, 60999},
		"40000 50000":    {40000, 50000},
		"":               def,
		"a b":            def,
		"50000 40000":    def,
		"0 70000":        def,
		"1 2 3":          def,
	} {
		if got := parseRange(in, def); got != want {
			t.Errorf("parseRange(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestOutsideEphemeral(t *testing.T) {
	ps := outsideEphemeral([2]int{lowest + 1, 65534})
	if len(ps) != 2 || ps[0] != lowest || ps[1] != 65535 {
		t.Fatalf("got %v, want [%d 65535]", ps, lowest)
	}
}
