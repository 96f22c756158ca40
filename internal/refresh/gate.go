package refresh

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/state"
)

// gate applies the group-level rules: R4 settled guard, R10/R12 lockout,
// R11 unfinished attempt, and builds the Repin.
func (d *decision) gate(locked, blocked bool, notSettled []string) {
	settled := !blocked && len(notSettled) == 0
	if settled && d.p.SkipStreak > 0 {
		d.clear(&d.p.ClearSkip, d.keys.SkipStreak())
		d.find(Finding{Severity: SeverityInfo, Once: "skip-streak-cleared", Message: fmt.Sprintf(
			"group %s settled again after %d skipped pass(es): its skip streak is cleared", d.p.Group, d.p.SkipStreak)})
	}
	if !blocked {
		if why := d.failedRollout(settled, notSettled); why != "" && d.rollback(why) {
			return
		}
	}
	if !blocked && d.s.NoWait && d.p.Attempts > 0 {
		switch d.inFlight(settled, notSettled, locked) {
		case rolloutRunning:
			return
		case rolloutSettled:
			if locked {
				// The last attempt settled within its deadline: confirm
				// it, as a tick's wait would have; changes wait for the
				// next pass, under a fresh attempt.
				locked, d.order = false, nil
			}
		}
	}
	if locked {
		d.lockedOut()
		return
	}
	if blocked {
		return
	}
	// A group unsettled while refresh-attempt > 0 is unsettled by
	// image-refresh's own unconfirmed rollout: R11 waits for it again under
	// the next attempt, and changes decided now ride along in that attempt
	// (as the seed's forced retry did), rather than R4 skipping it.
	// A group re-armed by a new digest (R23) while still unsettled is
	// unsettled by its own rollout of the digest it locked on, which will
	// not settle by itself: the new digest replaces it under attempt 1, as
	// an unfinished attempt's changes would, instead of R4 skipping the
	// group until it freezes; it is not queued (R24): the group is rolling
	// out already.
	unfinished := d.p.Attempts > 0 || (d.rearmed && !settled)
	if unfinished && (!settled || len(d.order) > 0) && d.heldElsewhere(settled, notSettled) {
		return
	}
	if !settled && !unfinished {
		d.skipUnsettled(notSettled)
		return
	}
	if len(d.order) == 0 && !unfinished {
		d.landRecords()
		return
	}
	if !unfinished && d.queued() {
		return
	}
	d.repin(settled)
}

// lockedOut reports a group locked out (R10, R12): it marks the attempt the
// lockout was told at, records the digests it locked on (R23), and turns
// every row that would roll into a locked-out one.
func (d *decision) lockedOut() {
	d.p.LockedOut = true
	attempt := strconv.Itoa(d.p.Attempts)
	if v, ok := d.value(d.keys.Flap()); !ok || v != attempt {
		d.p.Bookkeeping.set(d.keys.Flap(), &attempt, d.ann)
	}
	d.lockOn()
	msg := fmt.Sprintf("refresh of group %s is LOCKED OUT: %d re-image attempts never confirmed settling (max %d); its images are not updated until it is re-armed, or the registry publishes a digest it did not lock on",
		d.obs.Group.Name, d.p.Attempts, d.s.MaxAttempts)
	d.find(Finding{Severity: SeverityWarn, Reason: ReasonRefreshLockedOut, NeedsHuman: true, Message: msg,
		Remediation: "find why the rollout does not settle (a NotReady node, a crashing pod), then run: " + d.rearm()})
	for i := range d.p.Rows {
		if r := &d.p.Rows[i]; r.State == StatePinned || r.State == StateDrifted {
			r.State, r.Message, r.Remediation = StateLockedOut, msg, "run: "+d.rearm()
		}
	}
}

// skipUnsettled applies R4 to a group not settled, and not because of
// image-refresh's own rollout: no change this pass, and the skip streak
// grows toward maxSkipTicks, where the group is reported frozen.
func (d *decision) skipUnsettled(notSettled []string) {
	n := d.p.SkipStreak + 1
	if d.obs.SkipUncounted {
		n = max(d.p.SkipStreak, 1)
	} else {
		d.p.Bookkeeping.set(d.keys.SkipStreak(), ptr(strconv.Itoa(n)), d.ann)
		d.p.SkipCounted = true
	}
	msg := fmt.Sprintf("group %s is not settled (%s); no change this tick (skip %d of %d)", d.obs.Group.Name, strings.Join(notSettled, "; "), n, d.s.MaxSkipTicks)
	f := Finding{Severity: SeverityNote, Message: msg}
	if n >= d.s.MaxSkipTicks && !d.obs.SkipUncounted {
		f = Finding{Severity: SeverityError, Reason: ReasonRefreshFrozen, NeedsHuman: true, Message: msg,
			Remediation: "find why the rollout does not finish (kubectl rollout status), or raise maxSkipTicks"}
	}
	d.find(f)
	for i := range d.p.Rows {
		if r := &d.p.Rows[i]; r.State == StateDrifted || r.State == StatePinned {
			r.State, r.Message = StateNotSettled, msg
			r.Remediation = f.Remediation
			if r.Remediation == "" {
				r.Remediation = "none needed yet: the next tick retries once the rollout finished"
			}
		}
	}
}

// landRecords writes the pending records of a settled group with nothing
// to roll: a record whose targets already run it lands now (R6).
func (d *decision) landRecords() {
	for k, v := range d.pending.Set {
		d.p.Bookkeeping.set(k, v, d.ann)
		if v != nil && strings.Contains(k, "/last-refreshed-") {
			d.find(Finding{Severity: SeverityInfo, Message: fmt.Sprintf("recorded %s=%s: every target already runs it", k, *v)})
		}
	}
}

func (d *decision) readSkipStreak() {
	v, ok := d.value(d.keys.SkipStreak())
	n, err := state.ParseCounter(v, ok)
	if err != nil {
		d.find(Finding{Severity: SeverityWarn, Message: fmt.Sprintf("annotation %s on %s: %v; treated as at its ceiling (fail-safe)", d.keys.SkipStreak(), d.p.Anchor, err)})
		n = d.s.MaxSkipTicks
	}
	d.p.SkipStreak = n
}

// readWorkloads applies the read half of R4: an unreadable workload is never
// a benign skip.
func (d *decision) readWorkloads() (blocked bool, notSettled []string) {
	for _, w := range d.obs.Group.Workloads() {
		st, ok := d.obs.Workloads[w]
		switch {
		case !ok:
			blocked = true
			d.find(Finding{Severity: SeverityError, Reason: ReasonRefreshError, NeedsHuman: true,
				Message:     fmt.Sprintf("%s%s was not read", w, d.targetsOf(w)),
				Remediation: "this is a bug in image-refresh: please report it with this log line"})
		case st.Err != nil:
			blocked = true
			d.find(Finding{Severity: SeverityError, Reason: ReasonRefreshError, NeedsHuman: true,
				Message:     fmt.Sprintf("read %s%s: %v", w, d.targetsOf(w), st.Err),
				Remediation: "the workload must exist and image-refresh must be allowed to get it: fix the config or the RBAC"})
		case !st.Settled && !d.superseded(w, st):
			notSettled = append(notSettled, fmt.Sprintf("%s: %s", w, st.Reason))
		}
	}
	return blocked, notSettled
}

// superseded applies C6: w is unsettled only because of a write that took
// it off its pin while it was settled on it (the object before the write
// was settled and every refreshed container of it ran the recorded
// digest), and nothing changed its images since. That rollout is the
// revert's, not the cluster's: the re-pin supersedes it in this pass.
func (d *decision) superseded(w config.Workload, st Workload) bool {
	rev, ok := d.obs.Reverted[w]
	if !ok || !rev.BeforeSettled || len(rev.After) != len(st.Containers) {
		return false
	}
	for name, c := range st.Containers {
		if img, ok := rev.After[name]; !ok || img != c.Image {
			return false // written again since: not the revert that was seen
		}
	}
	off := false
	for _, img := range d.obs.Group.Images {
		if img.PinnedDigest != "" {
			continue // an operator pin is checked, never re-pinned (R2)
		}
		recorded, err := imageref.ParseDigest(d.ann[d.keys.Record(img.Name)])
		for _, t := range img.Targets {
			if t.Workload() != w {
				continue
			}
			if err != nil || imageref.DigestOf(rev.Before[t.Container]) != recorded {
				return false // it was not on its pin before the write
			}
			if imageref.DigestOf(st.Containers[t.Container].Image) != recorded {
				off = true
			}
		}
	}
	if !off {
		return false
	}
	d.find(Finding{Severity: SeverityInfo, Message: fmt.Sprintf(
		"%s was taken off its pin while settled on it; re-pinning now instead of waiting for the rollout that write started (%s)", w, st.Reason)})
	return true
}

// targetsOf names the targets on w, so an unreadable workload's message
// says which configured targets it blocks (R19).
func (d *decision) targetsOf(w config.Workload) string {
	var names []string
	for _, img := range d.obs.Group.Images {
		for _, t := range img.Targets {
			if t.Workload() == w {
				names = append(names, t.String())
			}
		}
	}
	if len(names) == 0 {
		return " (the group's anchor)"
	}
	return " (targets: " + strings.Join(names, ", ") + ")"
}
