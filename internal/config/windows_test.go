package config

import (
	"testing"
	"time"
)

func TestRolloutWindow_R24_ContainsAndNextOpening(t *testing.T) {
	nights := RolloutWindow{Days: []string{"Mon", "Tue", "Wed", "Thu", "Fri"}, Start: "22:00", End: "06:00"}
	day := RolloutWindow{Days: []string{"sat"}, Start: "00:00", End: "24:00"}
	at := func(s string) time.Time {
		t.Helper()
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		name string
		w    RolloutWindow
		t    string
		want bool
	}{
		{"a weeknight window is open at its start", nights, "2026-12-02T22:00:00Z", true},
		{"it is closed a minute before", nights, "2026-12-02T21:59:00Z", false},
		{"past midnight it belongs to the day it opened on", nights, "2026-12-05T05:59:00Z", true}, // Sat, opened Fri
		{"it closes at its end", nights, "2026-12-03T06:00:00Z", false},
		{"a window that opened on no day is closed past midnight", nights, "2026-12-07T01:00:00Z", false}, // Mon, Sun not listed
		{"times are UTC whatever the zone", nights, "2026-12-02T23:30:00+01:00", true},
		{"00:00 to 24:00 is the whole day", day, "2026-12-05T23:59:00Z", true},
		{"weekdays are case-insensitive", day, "2026-12-05T00:00:00Z", true},
	} {
		if got := tc.w.Contains(at(tc.t)); got != tc.want {
			t.Errorf("%s: %s contains %s = %v, want %v", tc.name, tc.w, tc.t, got, tc.want)
		}
	}
	if got := NextWindowOpening([]RolloutWindow{nights, day}, at("2026-12-04T23:00:00Z")); !got.Equal(at("2026-12-05T00:00:00Z")) {
		t.Errorf("next opening after Fri 23:00 = %s, want Sat 00:00", got)
	}
	if got := NextWindowOpening([]RolloutWindow{nights}, at("2026-12-05T12:00:00Z")); !got.Equal(at("2026-12-07T22:00:00Z")) {
		t.Errorf("next opening after Sat noon = %s, want Mon 22:00", got)
	}
	if !WindowsOpen(nil, at("2026-12-05T12:00:00Z")) {
		t.Errorf("no windows must mean always open")
	}
}
