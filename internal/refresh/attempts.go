package refresh

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/image-refresh/image-refresh/internal/state"
)

// readAttempt reads refresh-attempt fail-closed (R10): an invalid value
// counts as locked out, never as 0.
func (d *decision) readAttempt() (locked bool) {
	v, ok := d.value(d.keys.Attempt())
	n, err := state.ParseCounter(v, ok)
	if err != nil {
		d.find(Finding{Severity: SeverityError, Reason: ReasonRefreshError, NeedsHuman: true,
			Message:     fmt.Sprintf("annotation %s on %s: %v; treated as locked out (fail-safe)", d.keys.Attempt(), d.p.Anchor, err),
			Remediation: "run: " + d.rearm()})
		n = d.s.MaxAttempts
	}
	d.p.Attempts = n
	return n >= d.s.MaxAttempts
}

// repin builds the Repin of a group the gate lets through: the attempt it
// runs under (R10, R11), the records that land once it settled (R6), and
// the image changes, one write per workload (R9).
func (d *decision) repin(settled bool) {
	g := d.obs.Group
	rp := &Repin{Wait: g.Workloads(), Unfinished: len(d.order) == 0}
	if d.s.NoWait {
		rp.Wait, rp.Async = nil, len(d.order) > 0 || !settled
	}
	next := d.attemptWrites(rp, settled)
	rp.RecordWrite = d.pending
	rp.Attempt, _ = strconv.Atoi(next)
	for _, w := range d.order {
		rp.Changes = append(rp.Changes, WorkloadChange{Workload: w, Images: d.changes[w]})
	}
	if rp.Unfinished && !d.s.NoWait {
		d.find(Finding{Severity: SeverityWarn, Message: fmt.Sprintf(
			"an earlier re-image of group %s (attempt %d of %d) never confirmed settling; waiting for the rollout again", g.Name, d.p.Attempts, d.s.MaxAttempts)})
	}
	d.p.Repin = rp
}

// attemptWrites sets the attempt writes of rp and returns the attempt it
// runs under: a new one, with this instance as its holder (C3), when it
// re-images or waits again; the current one when it only confirms a
// settled attempt. The clear write expects the attempt, its holder and the
// lockout marker as they will be.
func (d *decision) attemptWrites(rp *Repin, settled bool) (attempt string) {
	next := strconv.Itoa(d.p.Attempts + 1)
	holder := d.observedHolder()
	if len(d.order) > 0 || !settled {
		// R10: the attempt is persisted before anything is re-imaged.
		rp.AttemptWrite.set(d.keys.Attempt(), &next, d.ann)
		if d.s.Instance != "" {
			h := state.Holder{Instance: d.s.Instance, Since: d.now()}.String()
			rp.AttemptWrite.set(d.keys.Holder(), &h, d.ann)
			holder = &h
			rp.ReleaseWrite = Write{Expect: map[string]*string{d.keys.Attempt(): &next, d.keys.Holder(): &h}, Set: map[string]*string{d.keys.Holder(): nil}}
		}
	} else {
		next = strconv.Itoa(d.p.Attempts) // already settled: just confirm it
	}
	rp.ClearWrite = Write{Expect: map[string]*string{d.keys.Attempt(): &next}, Set: map[string]*string{d.keys.Attempt(): nil}}
	if holder != nil {
		rp.ClearWrite.Expect[d.keys.Holder()], rp.ClearWrite.Set[d.keys.Holder()] = holder, nil
	}
	if v, ok := d.value(d.keys.Flap()); ok {
		rp.ClearWrite.Expect[d.keys.Flap()], rp.ClearWrite.Set[d.keys.Flap()] = &v, nil
	}
	return next
}

// rolloutState is where the attempt of a NoWait pass stands.
type rolloutState int

const (
	rolloutUnknown rolloutState = iota // no holder to time it by: R11 as in a tick
	rolloutRunning                     // unsettled, within its deadline: nothing to do
	rolloutSettled                     // settled within its deadline: confirm it
	rolloutOverdue                     // this instance's attempt missed its deadline
)

// inFlight times the attempt in flight of a NoWait pass (C6: a worker never
// waits for a rollout). The deadline is the holder's time plus
// rolloutTimeout, on the anchor, so a restarted leader keeps it. An
// unsettled group within it is left alone (no write, no skip, no WARN) and
// the plan says when to look again; past it, this instance's attempt counts
// as failed as in a tick, and the next attempt (R10) or the lockout
// follows. Another instance's attempt is timed with the clock slack and,
// past its deadline, left to heldElsewhere.
func (d *decision) inFlight(settled bool, notSettled []string, locked bool) rolloutState {
	v, ok := d.value(d.keys.Holder())
	h, err := state.ParseHolder(v, ok)
	if err != nil || !ok || d.s.RolloutTimeout <= 0 {
		return rolloutUnknown
	}
	own := h.Instance == d.s.Instance
	deadline := h.Since.Add(d.s.RolloutTimeout)
	if !own {
		deadline = deadline.Add(holderSlack)
	}
	within := d.now().Before(deadline)
	switch {
	case settled && within:
		return rolloutSettled
	case settled:
		return rolloutUnknown
	case within:
		d.p.WaitUntil = deadline
		msg := fmt.Sprintf("rolling out under attempt %d of %d (written %s by %s), not settled yet (%s); confirmed when it settles, counted as failed at %s",
			d.p.Attempts, d.s.MaxAttempts, h.Since.UTC().Format(time.RFC3339), h.Instance, strings.Join(notSettled, "; "), deadline.UTC().Format(time.RFC3339))
		for i := range d.p.Rows {
			if r := &d.p.Rows[i]; r.State == StateDrifted || r.State == StatePinned {
				r.State, r.Message, r.Remediation = StateNotSettled, msg, "none needed yet"
			}
		}
		return rolloutRunning
	case !own:
		return rolloutUnknown
	}
	if v, ok := d.value(d.keys.Flap()); !locked || !ok || v != strconv.Itoa(d.p.Attempts) {
		// Once: a locked group's marker says it was told.
		next := "the next attempt waits for it again"
		if locked {
			next = "that was the last attempt"
		}
		d.find(Finding{Severity: SeverityError, Reason: ReasonRefreshError, NeedsHuman: true,
			Message: fmt.Sprintf("rollout not settled within rolloutTimeout %s of the write (%s); the digest record is unchanged and %s (attempt %d of %d)",
				d.s.RolloutTimeout, strings.Join(notSettled, "; "), next, d.p.Attempts, d.s.MaxAttempts),
			Remediation: "find why the rollout does not finish (kubectl rollout status)"})
	}
	return rolloutOverdue
}

// observedHolder is the attempt holder the anchor carries, or nil.
func (d *decision) observedHolder() *string {
	if v, ok := d.value(d.keys.Holder()); ok {
		return &v
	}
	return nil
}

// heldElsewhere reports whether another image-refresh process holds the
// unfinished attempt of this group and may still be acting on it (C3):
// waiting for its rollout, or between its attempt write and its image
// writes (the group still reads settled, its targets not yet re-imaged).
// The caller asks only when this pass would wait or re-image; confirming a
// settled attempt with nothing to re-image is safe, as the clear expects
// the other's holder. On a settled group the holder is heeded only for
// holderWriteGrace: its image writes follow its attempt write at once, and
// a holder killed in between (R10, R11) must not hold the group for the
// whole HolderTTL. Two instances
// running without leader election by mistake would otherwise each count
// the other's attempt as their own unfinished one (R11), stack attempts,
// race each other's image writes and lock the group out. The holder's pass
// ends within the tick deadline; past that (a process killed mid-pass) its
// attempt is taken over as unfinished.
func (d *decision) heldElsewhere(settled bool, notSettled []string) bool {
	if d.s.Instance == "" {
		return false
	}
	v, ok := d.value(d.keys.Holder())
	h, err := state.ParseHolder(v, ok)
	switch {
	case err != nil:
		d.find(Finding{Severity: SeverityWarn, Message: fmt.Sprintf("annotation %s on %s: %v; its attempt is treated as abandoned (the attempt counter still bounds the retries)", d.keys.Holder(), d.p.Anchor, err)})
		return false
	case !ok || h.Instance == d.s.Instance:
		return false
	}
	ttl := d.s.HolderTTL
	if settled {
		ttl = min(ttl, holderWriteGrace)
	}
	until := h.Since.Add(ttl)
	if !d.now().Before(until) {
		d.find(Finding{Severity: SeverityWarn, Message: fmt.Sprintf(
			"attempt %d of group %s was started by image-refresh instance %s at %s, which did not finish it within %s; taking it over as unfinished",
			d.p.Attempts, d.p.Group, h.Instance, h.Since.UTC().Format(time.RFC3339), ttl)})
		return false
	}
	status := "not finished yet"
	if len(notSettled) > 0 {
		status = "not settled (" + strings.Join(notSettled, "; ") + ")"
	}
	msg := fmt.Sprintf("group %s is rolling out under attempt %d of image-refresh instance %s (started %s), %s; this instance (%s) leaves it alone until that instance ends the attempt or %s passes",
		d.p.Group, d.p.Attempts, h.Instance, h.Since.UTC().Format(time.RFC3339), status, d.s.Instance, until.UTC().Format(time.RFC3339))
	d.find(Finding{Severity: SeverityWarn, Message: msg,
		Remediation: "if two image-refresh processes act on this cluster at once, run one, or run `image-refresh run --leader-elect` on every replica"})
	for i := range d.p.Rows {
		if r := &d.p.Rows[i]; r.State == StateDrifted || r.State == StatePinned {
			r.State, r.Message, r.Remediation = StateNotSettled, msg, "none needed if the other instance's rollout settles"
		}
	}
	return true
}
