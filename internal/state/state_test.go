package state

import "testing"

func TestKeys_SeedPrefixGivesTheScriptsExactKeys(t *testing.T) {
	k := Keys{Prefix: "tracebloc.io"}
	cases := map[string]string{
		k.Record("jobs-manager"):   "tracebloc.io/last-refreshed-jobs-manager-digest",
		k.Attempt():                "tracebloc.io/refresh-attempt",
		k.Flap():                   "tracebloc.io/refresh-flap-detected",
		k.SkipStreak():             "tracebloc.io/refresh-skip-streak",
		k.StalePin("jobs-manager"): "tracebloc.io/stale-pin-jobs-manager",
	}
	for got, want := range cases {
		if got != want {
			t.Errorf("key %q, want %q", got, want)
		}
	}
}

func TestParseCounter_R10_InvalidValuesAreErrorsNeverZero(t *testing.T) {
	for _, tc := range []struct {
		value   string
		present bool
		want    int
		wantErr bool
	}{
		{"", false, 0, false},
		{"0", true, 0, false},
		{"3", true, 3, false},
		{" 2 ", true, 2, false},
		{"", true, 0, true},
		{"-1", true, 0, true},
		{"two", true, 0, true},
		{"99999999999999999999", true, 0, true},
		{"1048577", true, 0, true},
	} {
		got, err := ParseCounter(tc.value, tc.present)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("ParseCounter(%q, %v) = %d, %v; want %d, error %v", tc.value, tc.present, got, err, tc.want, tc.wantErr)
		}
	}
}

func FuzzParseCounter(f *testing.F) {
	for _, s := range []string{"0", "3", "-1", "x", "1048576", " 7"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseCounter(s, true)
		if err == nil && (n < 0 || n > MaxCounter) {
			t.Fatalf("ParseCounter(%q) = %d without error", s, n)
		}
		if err != nil && n != 0 {
			t.Fatalf("ParseCounter(%q) returned %d with error", s, n)
		}
	})
}
