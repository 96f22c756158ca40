package freeport

import (
	"net"
	"strconv"
	"testing"
)

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
