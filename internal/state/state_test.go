package state

import (
	"strings"
	"testing"
	"time"
	"unicode"
)

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

func TestParseTimes_R6_InvalidValuesAreErrorsNeverNoChanges(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	got, err := ParseTimes(FormatTimes([]time.Time{t0, t0.Add(time.Minute)}), true)
	if err != nil || len(got) != 2 || !got[0].Equal(t0) || !got[1].Equal(t0.Add(time.Minute)) {
		t.Fatalf("round trip = %v, %v", got, err)
	}
	if got, err := ParseTimes("", false); err != nil || got != nil {
		t.Errorf("absent = %v, %v; want none", got, err)
	}
	for _, bad := range []string{"", "yesterday", "2026-12-02", "2026-12-02T12:00:00Z,", "1733140800", "0000-01-01T00:00:00+01:00",
		strings.Repeat("2026-12-02T12:00:00Z,", MaxDigestChangeTimes) + "2026-12-02T12:00:00Z"} {
		if got, err := ParseTimes(bad, true); err == nil {
			t.Errorf("ParseTimes(%.40q) = %v without error", bad, got)
		}
	}
}

func FuzzParseTimes(f *testing.F) {
	for _, s := range []string{"2026-12-02T12:00:00Z", "2026-12-02T12:00:00Z,2026-12-02T13:00:00+01:00", "x", ",", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ts, err := ParseTimes(s, true)
		if err != nil {
			if ts != nil {
				t.Fatalf("ParseTimes(%q) returned %v with an error", s, ts)
			}
			return
		}
		if len(ts) == 0 || len(ts) > MaxDigestChangeTimes {
			t.Fatalf("ParseTimes(%q) = %d times without error", s, len(ts))
		}
		again, err := ParseTimes(FormatTimes(ts), true)
		if err != nil || len(again) != len(ts) {
			t.Fatalf("FormatTimes(ParseTimes(%q)) does not parse back: %v", s, err)
		}
	})
}

func TestParseHolder_C3_RoundTripsAndRejectsWhatItCannotRead(t *testing.T) {
	h := Holder{Instance: "image-refresh-7d9f-abc123", Since: time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)}
	got, err := ParseHolder(h.String(), true)
	if err != nil || got.Instance != h.Instance || !got.Since.Equal(h.Since) {
		t.Fatalf("round trip of %q = %+v, %v", h.String(), got, err)
	}
	if got, err := ParseHolder("", false); err != nil || got != (Holder{}) {
		t.Errorf("absent = %+v, %v; want the zero holder", got, err)
	}
	for _, bad := range []string{"", "pod-1", " 2026-12-03T09:00:00Z", "pod-1 yesterday", "pod-1 2026-12-03T09:00:00Z extra", "pod-1 0000-01-01T00:00:00+01:00",
		strings.Repeat("p", MaxInstanceLen+1) + " 2026-12-03T09:00:00Z"} {
		if got, err := ParseHolder(bad, true); err == nil {
			t.Errorf("ParseHolder(%.40q) = %+v without error", bad, got)
		} else if !strings.Contains(err.Error(), "holder") {
			t.Errorf("ParseHolder(%.40q): error %q does not say what it read", bad, err)
		}
	}
}

func FuzzParseHolder(f *testing.F) {
	for _, s := range []string{"pod-1 2026-12-03T09:00:00Z", "pod-1", " ", "a b c", "x 2026-12-03T09:00:00+01:00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := ParseHolder(s, true)
		if err != nil {
			if h != (Holder{}) {
				t.Fatalf("ParseHolder(%q) returned %+v with an error", s, h)
			}
			return
		}
		if h.Instance == "" || len(h.Instance) > MaxInstanceLen || strings.ContainsFunc(h.Instance, unicode.IsSpace) {
			t.Fatalf("ParseHolder(%q) = instance %q without error", s, h.Instance)
		}
		again, err := ParseHolder(h.String(), true)
		if err != nil || again.Instance != h.Instance || !again.Since.Equal(h.Since.Truncate(time.Second)) {
			t.Fatalf("ParseHolder(%q).String() = %q does not parse back: %v", s, h.String(), err)
		}
	})
}

func TestTable_EveryKeyIsNamedOnce(t *testing.T) {
	seen := map[string]bool{}
	for _, e := range Table() {
		if seen[e.Name] {
			t.Errorf("key %q twice in the table", e.Name)
		}
		seen[e.Name] = true
		if (e.Scope == ScopeImage) != strings.Contains(e.Name, "<image>") {
			t.Errorf("key %q: scope %d, want <image> exactly in the per-image keys", e.Name, e.Scope)
		}
	}
}

func TestTable_TheListsAreDerivedFromIt(t *testing.T) {
	k := Keys{Prefix: "p"}
	for _, tc := range []struct {
		name      string
		got, want []string
	}{
		{"per image (config validation)", ImageKeyNames("api"), []string{
			"last-refreshed-api-digest", "stale-pin-api", "ever-pinned-api", "live-read-failure-streak-api",
			"resolve-failure-streak-api", "pin-check-failure-streak-api", "digest-changes-api", "first-seen-api", "locked-on-api", "verified-api", "rolled-back-api", "tag-flapping-api", "soak-api", "published-api"}},
		{"per group, the holder too (R10, C3)", GroupKeyNames(), []string{
			"refresh-attempt", "refresh-attempt-holder", "refresh-flap-detected", "refresh-skip-streak", "suspended-since", "suspended-by", "state-generation"}},
		{"rearm (R18, R21, R23)", k.Rearmed([]string{"api", "mon"}), []string{
			k.Attempt(), k.Holder(), k.Flap(), k.DigestChanges("api"), k.LockedOn("api"), k.RolledBack("api"), k.TagFlapping("api"),
			k.DigestChanges("mon"), k.LockedOn("mon"), k.RolledBack("mon"), k.TagFlapping("mon")}},
		{"the operator's (D1)", k.Operator(), []string{k.Enabled(), k.DiscoveryGroup(), k.IgnoreContainers(), k.OnFailedRollout(), k.Suspend(), k.SuspendReason()}},
	} {
		if strings.Join(tc.got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("%s: %q, want %q", tc.name, tc.got, tc.want)
		}
	}
	if got := k.Enabled(); got != "p/enabled" {
		t.Errorf("Enabled() = %q", got)
	}
}

// P1: the soak clock's value round-trips, and a value that does not parse
// is an error naming it (the engine starts the soak over, fail-safe).
func TestParseSoak_P1_RoundTripsAndRejectsWhatItCannotRead(t *testing.T) {
	d := "sha256:" + strings.Repeat("ab", 32)
	v := SoakValue{Digest: d, Since: time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC), Restarts: 3}
	got, err := ParseSoak(v.String())
	if err != nil || got != v {
		t.Errorf("ParseSoak(%q) = %+v, %v; want %+v", v.String(), got, err, v)
	}
	for _, bad := range []string{"", d, d + " 2026-12-07T12:00:00Z", d + " noon 0", d + " 2026-12-07T12:00:00Z -1", d + " 2026-12-07T12:00:00Z x"} {
		if _, err := ParseSoak(bad); err == nil || !strings.Contains(err.Error(), "invalid soak value") {
			t.Errorf("ParseSoak(%q) = %v, want an error naming the value", bad, err)
		}
	}
}

// P2: the published record round-trips and a value that does not parse
// is an error naming it.
func TestParsePublished_P2_ReadsWhatItWritesAndRejectsTheRest(t *testing.T) {
	d := "sha256:" + strings.Repeat("cd", 32)
	at := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	got, when, err := ParsePublished(d + " " + at.Format(time.RFC3339))
	if err != nil || got != d || !when.Equal(at) {
		t.Errorf("ParsePublished = %q, %v, %v", got, when, err)
	}
	for _, bad := range []string{"", d, d + " noon", d + " 2026-12-07T12:00:00Z x"} {
		if _, _, err := ParsePublished(bad); err == nil || !strings.Contains(err.Error(), "invalid published value") {
			t.Errorf("ParsePublished(%q) = %v, want an error naming the value", bad, err)
		}
	}
}
