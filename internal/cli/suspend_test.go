package cli

import (
	"strings"
	"testing"
	"time"
)

// O1: suspend's flags are checked before any config or cluster is read, and
// turn into the suspension's end; a mistake writes nothing.
func TestSuspendOptions_O1_ValidateTurnsTheFlagsIntoTheEndOrSaysWhatIsWrong(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 500, time.UTC)
	opts := func(group, forDuration, till string) *suspendOptions {
		o := &suspendOptions{group: group, forDuration: forDuration, till: till, reason: "INC-7"}
		o.now = func() time.Time { return now }
		return o
	}
	for name, tc := range map[string]struct {
		o         *suspendOptions
		wantUntil time.Time
		wantErr   string
	}{
		"until resumed":          {o: opts("api", "", ""), wantUntil: time.Time{}},
		"for 2h, whole seconds":  {o: opts("api", "2h", ""), wantUntil: time.Date(2026, 12, 7, 14, 0, 0, 0, time.UTC)},
		"until a time":           {o: opts("api", "", "2026-12-24T19:00:00+01:00"), wantUntil: time.Date(2026, 12, 24, 18, 0, 0, 0, time.UTC)},
		"no group":               {o: opts("", "", ""), wantErr: "--group is required"},
		"both ends":              {o: opts("api", "2h", "2026-12-24T18:00:00Z"), wantErr: "--for and --until: give one end, not both; nothing written"},
		"a duration that is not": {o: opts("api", "two hours", ""), wantErr: `--for: "two hours" is not a positive duration`},
		"a negative duration":    {o: opts("api", "-1h", ""), wantErr: `--for: "-1h" is not a positive duration`},
		"a time that is not":     {o: opts("api", "", "Christmas"), wantErr: `--until: "Christmas" is not an RFC 3339 time`},
		"a time that has passed": {o: opts("api", "", "2026-12-01T00:00:00Z"), wantErr: "--until: 2026-12-01T00:00:00Z has passed; nothing written"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.o.Validate()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Validate() = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			s := tc.o.suspension
			if !s.Until.Equal(tc.wantUntil) || s.Reason != "INC-7" || !strings.Contains(s.ResumeCommand, "resume --group api") {
				t.Errorf("suspension %+v, want until %v, the reason and the resume command", s, tc.wantUntil)
			}
		})
	}
	if err := (&resumeOptions{}).Validate(); err == nil || !strings.Contains(err.Error(), "--group is required") {
		t.Errorf("resume without --group: %v", err)
	}
}
