package refresh

import (
	"fmt"
	"strings"
	"time"

	"github.com/image-refresh/image-refresh/internal/state"
)

// SuspendedWithoutEndAfter is how long a suspension without an end stays
// benign; after it, it is a finding (O1).
const SuspendedWithoutEndAfter = 24 * time.Hour

// Suspension is O1's hold of a group, as its anchor says.
type Suspension struct {
	// Until is when it ends; zero: when it is removed (resume).
	Until time.Time
	// Reason is the operator's why (P/suspend-reason), "" when none.
	Reason string
	// By is the field manager of the write that set P/suspend, "" when
	// unknown.
	By string
	// Since is when a pass first saw it (P/suspended-since).
	Since time.Time
	// Invalid holds why P/suspend could not be read: the group is held
	// anyway (fail-safe).
	Invalid error
}

// Describe says who suspended the group, why and until when.
func (s Suspension) Describe() string {
	var b strings.Builder
	b.WriteString("suspended")
	if s.By != "" {
		b.WriteString(" by " + s.By)
	}
	if s.Until.IsZero() {
		b.WriteString(" until resumed")
	} else {
		b.WriteString(" until " + s.Until.UTC().Format(time.RFC3339))
	}
	if s.Reason != "" {
		b.WriteString(": " + s.Reason)
	}
	return b.String()
}

// ParseSuspend reads a P/suspend value: "true" (until resumed), "false"
// (not suspended) or an RFC 3339 time it ends at.
func ParseSuspend(value string) (suspended bool, until time.Time, err error) {
	switch v := strings.TrimSpace(value); v {
	case "true":
		return true, time.Time{}, nil
	case "false":
		return false, time.Time{}, nil
	default:
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return true, time.Time{}, fmt.Errorf("invalid suspend value %q (want true, false or an RFC 3339 time such as 2026-12-24T18:00:00Z)", value)
		}
		return true, t, nil
	}
}

// SuspensionOf reads the suspension a group's anchor annotations hold at
// now (O1): nil when the group is not suspended (no P/suspend, "false", or
// an end that passed). A value that does not parse suspends the group
// (fail-safe: nothing is written until an operator fixes it), with
// Invalid set. by is the field manager of P/suspend, as the caller read it.
// The webhook, render and every pass ask it.
func SuspensionOf(prefix string, anchor map[string]string, by string, now time.Time) *Suspension {
	keys := state.Keys{Prefix: prefix}
	v, ok := anchor[keys.Suspend()]
	if !ok {
		return nil
	}
	on, until, err := ParseSuspend(v)
	if !on || (err == nil && !until.IsZero() && !now.Before(until)) {
		return nil
	}
	if by == "" {
		by = anchor[keys.SuspendedBy()] // as a pass first saw it (R25)
	}
	s := &Suspension{Until: until, Reason: anchor[keys.SuspendReason()], By: by, Invalid: err}
	if since, err := time.Parse(time.RFC3339, anchor[keys.SuspendedSince()]); err == nil {
		s.Since = since
	}
	return s
}

// suspend applies O1 to the plan decided so far: while the group is
// suspended nothing is written to its targets (the Repin goes; the
// bookkeeping, records and findings stay, so that a resume acts on the
// truth), the rows say so, and a suspension without an end is a finding
// after SuspendedWithoutEndAfter. When a suspension ended, its
// suspended-since mark goes with one INFO line.
func (d *decision) suspend() {
	s := SuspensionOf(d.s.Prefix, d.ann, d.obs.SuspendedBy, d.now())
	sinceKey, byKey := d.keys.SuspendedSince(), d.keys.SuspendedBy()
	since, marked := d.value(sinceKey)
	if s == nil {
		if _, ok := d.value(byKey); ok {
			d.p.Bookkeeping.set(byKey, nil, d.ann)
		}
		if marked {
			d.p.Bookkeeping.set(sinceKey, nil, d.ann)
			d.find(Finding{Severity: SeverityInfo, Once: "suspension-ended", Message: fmt.Sprintf(
				"group %s is no longer suspended (resumed, or its end passed): image-refresh writes to its targets again", d.p.Group)})
		}
		return
	}
	if s.Since.IsZero() {
		s.Since = d.now().UTC()
		if !marked || since != s.Since.Format(time.RFC3339) {
			d.p.Bookkeeping.set(sinceKey, ptr(s.Since.Format(time.RFC3339)), d.ann)
		}
	}
	if by, _ := d.value(byKey); d.obs.SuspendedBy != "" && by != d.obs.SuspendedBy {
		d.p.Bookkeeping.set(byKey, ptr(d.obs.SuspendedBy), d.ann)
	}
	d.p.Suspended = s
	resume := d.resume()
	var held []string
	if d.p.Repin != nil {
		for _, wc := range d.p.Repin.Changes {
			for _, c := range wc.Images {
				held = append(held, fmt.Sprintf("%s container %s %s -> %s", wc.Workload, c.Container, c.From, c.To))
			}
		}
		d.p.Repin = nil
	}
	msg := fmt.Sprintf("group %s is %s; nothing is written to its targets", d.p.Group, s.Describe())
	if len(held) > 0 {
		msg += "; held back: " + strings.Join(held, "; ")
	}
	if s.Invalid != nil {
		d.find(Finding{Severity: SeverityWarn, Reason: ReasonRefreshError, NeedsHuman: true, Message: fmt.Sprintf(
			"annotation %s on %s: %v; the group is held as suspended until it is fixed (fail-safe)", d.keys.Suspend(), d.p.Anchor, s.Invalid),
			Remediation: fmt.Sprintf("set %s to true or to an RFC 3339 end time, or run: %s", d.keys.Suspend(), resume)})
	}
	until := "resumed"
	if !s.Until.IsZero() {
		until = s.Until.UTC().Format(time.RFC3339)
	}
	d.find(Finding{Severity: SeverityInfo, Once: "suspended " + until + " " + s.By + " " + s.Reason, Message: msg})
	if s.Until.IsZero() && s.Invalid == nil && !d.now().Before(s.Since.Add(SuspendedWithoutEndAfter)) {
		d.find(Finding{Severity: SeverityWarn, Reason: ReasonSuspendedWithoutEnd, NeedsHuman: true, Message: fmt.Sprintf(
			"group %s has been suspended without an end since %s (%s ago): new digests and reverts wait",
			d.p.Group, s.Since.UTC().Format(time.RFC3339), d.now().Sub(s.Since).Round(time.Minute)),
			Remediation: fmt.Sprintf("resume it: %s; or give it an end: %s", resume, strings.Replace(resume, " resume ", " suspend ", 1)+" --for DURATION")})
	}
	rowMsg := s.Describe()
	for i := range d.p.Rows {
		r := &d.p.Rows[i]
		switch r.State {
		case StatePinned, StateDrifted, StateTagFlapping, StateQuarantined, StateWaiting, StateWindowClosed, StateQueued, StateFirstObserved, StateNotSettled:
		default:
			continue // a state that needs attention says more
		}
		m := rowMsg
		if r.State == StateDrifted {
			m += "; not re-imaged meanwhile (" + r.Message + ")"
		}
		r.State, r.Message, r.Remediation = StateSuspended, m, "to let image-refresh write again now, run: "+resume
	}
}

// resume is the command that ends a suspension (O1).
func (d *decision) resume() string {
	if d.s.ResumeCommand == nil {
		return "image-refresh resume --group " + d.p.Group
	}
	return d.s.ResumeCommand(d.p.Group)
}
