package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// RolloutWindow is a weekly UTC time range in which digest-change
// rollouts may start (R24). A revert re-pin is allowed at any time.
type RolloutWindow struct {
	// Days are the weekdays the window opens on: Mon, Tue, Wed, Thu, Fri,
	// Sat, Sun.
	Days []string `yaml:"days"`
	// Start and End are "HH:MM" in UTC; End may be "24:00". An End at or
	// before Start closes the window on the next day (22:00–06:00).
	Start string `yaml:"start"`
	End   string `yaml:"end"`
}

var weekdays = []string{"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"} // time.Weekday order

// parseClock reads "HH:MM" as minutes after midnight; "24:00" only as an end.
func parseClock(s string, end bool) (int, error) {
	h, m, ok := strings.Cut(s, ":")
	hh, err1 := strconv.Atoi(h)
	mm, err2 := strconv.Atoi(m)
	if !ok || len(h) != 2 || len(m) != 2 || err1 != nil || err2 != nil || hh < 0 || mm < 0 || mm > 59 || hh > 24 || (hh == 24 && (mm != 0 || !end)) {
		want := "00:00 to 23:59"
		if end {
			want = "00:00 to 24:00"
		}
		return 0, fmt.Errorf("invalid time %q (want HH:MM in UTC, %s)", s, want)
	}
	return hh*60 + mm, nil
}

func weekday(s string) (time.Weekday, bool) {
	i := slices.IndexFunc(weekdays, func(d string) bool { return strings.EqualFold(d, s) })
	return time.Weekday(i), i >= 0
}

// validate checks one window, naming its fields under path.
func (v *validator) window(path string, w RolloutWindow) {
	if len(w.Days) == 0 {
		v.errorf(path+".days", "at least one weekday is required (Mon, Tue, Wed, Thu, Fri, Sat, Sun)")
	}
	for i, d := range w.Days {
		if _, ok := weekday(d); !ok {
			v.errorf(fmt.Sprintf("%s.days[%d]", path, i), "%q is not a weekday (want one of Mon, Tue, Wed, Thu, Fri, Sat, Sun)", d)
		}
	}
	start, err := parseClock(w.Start, false)
	if err != nil {
		v.errorf(path+".start", "%v", err)
	}
	end, err2 := parseClock(w.End, true)
	if err2 != nil {
		v.errorf(path+".end", "%v", err2)
	}
	if err == nil && err2 == nil && start == end {
		v.errorf(path+".end", "equals start %s: the window would be empty (for a whole day write 00:00 to 24:00)", w.Start)
	}
}

// bounds returns the window's days and its start and end in minutes; the
// window is valid (Validate).
func (w RolloutWindow) bounds() (days [7]bool, start, end int) {
	for _, d := range w.Days {
		if wd, ok := weekday(d); ok {
			days[wd] = true
		}
	}
	start, _ = parseClock(w.Start, false)
	end, _ = parseClock(w.End, true)
	return days, start, end
}

// Contains reports whether t falls in the window (in UTC).
func (w RolloutWindow) Contains(t time.Time) bool {
	days, start, end := w.bounds()
	t = t.UTC()
	wd, m := t.Weekday(), t.Hour()*60+t.Minute()
	if start < end {
		return days[wd] && m >= start && m < end
	}
	return (days[wd] && m >= start) || (days[(wd+6)%7] && m < end)
}

// WindowsOpen reports whether digest-change rollouts may start at t: no
// windows configured, or t in one of them (R24).
func WindowsOpen(ws []RolloutWindow, t time.Time) bool {
	if len(ws) == 0 {
		return true
	}
	return slices.ContainsFunc(ws, func(w RolloutWindow) bool { return w.Contains(t) })
}

// NextWindowOpening is the first time after t at which one of ws opens,
// within a week; the zero time when ws is empty.
func NextWindowOpening(ws []RolloutWindow, t time.Time) time.Time {
	var next time.Time
	t = t.UTC()
	midnight := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	for _, w := range ws {
		days, start, _ := w.bounds()
		for i := range 8 {
			day := midnight.AddDate(0, 0, i)
			at := day.Add(time.Duration(start) * time.Minute)
			if days[day.Weekday()] && at.After(t) && (next.IsZero() || at.Before(next)) {
				next = at
			}
		}
	}
	return next
}

// String renders the window as in the config: "Mon,Tue 22:00-06:00 UTC".
func (w RolloutWindow) String() string {
	return fmt.Sprintf("%s %s-%s UTC", strings.Join(w.Days, ","), w.Start, w.End)
}
