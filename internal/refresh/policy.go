package refresh

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/state"
)

// recentChanges returns the times image's record moved within
// digestChangeWindow, oldest first; an invalid value is an error (treated
// as a spent budget, fail-safe). A value whose times all left the window is
// deleted, unless the record is about to move and rewrite it.
func (d *decision) recentChanges(img config.Image, digestChanged bool) ([]time.Time, error) {
	key := d.keys.DigestChanges(img.Name)
	v, ok := d.value(key)
	times, err := state.ParseTimes(v, ok)
	if err != nil {
		return nil, fmt.Errorf("annotation %s on %s: %w", key, d.p.Anchor, err)
	}
	if d.s.DigestChangeWindow <= 0 {
		return nil, nil
	}
	since := d.now().Add(-d.s.DigestChangeWindow)
	var recent []time.Time
	for _, t := range times {
		if t.After(since) { // a time ahead of this clock counts: fail-safe
			recent = append(recent, t)
		}
	}
	sort.Slice(recent, func(i, j int) bool { return recent[i].Before(recent[j]) })
	if ok && len(recent) == 0 && !digestChanged {
		d.p.Bookkeeping.set(key, nil, d.ann)
	}
	return recent, nil
}

// hold is why the rollout policy keeps an image on its recorded digest
// instead of rolling to the registry's new answer (R21, R22, R23, P1).
type hold struct {
	state   State
	finding Finding
}

// holdFor applies the rollout policy to a digest change of img from
// recorded to latest, in order: a digest that did not verify (V1), one
// that lacks a platform the nodes need (V3), a quarantined digest (R23), a
// digest the group it follows has not soaked (P1), a spent churn budget
// (R21), a digest younger than minDigestAge (R22), outside every rollout
// window (R24). nil: roll it. A revert re-pin is never held: it restores
// the recorded digest.
func (d *decision) holdFor(img config.Image, recorded, latest string, recent []time.Time, budgetErr error, seen *state.FirstSeenValue) (h *hold) {
	if h := d.unverifiedHold(img, recorded, latest); h != nil {
		return h
	}
	if h := d.platformHold(img, recorded, latest); h != nil {
		return h
	}
	rearm := d.rearm()
	if !d.locked && slices.Contains(d.lockedOn(img), latest) {
		defer func() { h = d.rolledBackHold(img, latest, h) }()
		msg := fmt.Sprintf("the registry serves %s:%s at %s, a digest a lockout of group %s locked on: it is quarantined and never tried again; held on the recorded digest %s",
			img.Repository, img.Tag, latest, d.p.Group, recorded)
		return &hold{state: StateQuarantined, finding: Finding{Severity: SeverityWarn, Reason: ReasonDigestQuarantined, Image: img.Name, NeedsHuman: true, Message: msg,
			Remediation: "publish a fixed build under the tag (a new digest is tried by itself), or, to try the quarantined digest again, run: " + rearm}}
	}
	if h := d.promotionHold(img, recorded, latest); h != nil {
		return h
	}
	if d.budgetSpent(recent, budgetErr) {
		var msg string
		if budgetErr != nil {
			msg = fmt.Sprintf("%v; treated as a spent digest-change budget (fail-safe): %s:%s is held on its recorded digest %s instead of moving to %s",
				budgetErr, img.Repository, img.Tag, recorded, latest)
		} else {
			msg = fmt.Sprintf("the tag %s:%s is flapping: its digest moved %d times in the last %s (maxDigestChanges %d); held on the recorded digest %s instead of rolling to %s, until %s",
				img.Repository, img.Tag, len(recent), d.s.DigestChangeWindow, d.s.MaxDigestChanges, recorded, latest, d.flapUntil(recent, nil).Format(time.RFC3339))
		}
		return d.flapHold(img, msg)
	}
	if d.s.MinDigestAge > 0 {
		age := time.Duration(0)
		if seen != nil {
			age = d.now().Sub(seen.At)
		}
		if seen == nil || age < d.s.MinDigestAge {
			since := d.now()
			if seen != nil {
				since = seen.At
			}
			left := d.s.MinDigestAge - age
			d.wakeAt(since.Add(d.s.MinDigestAge))
			msg := fmt.Sprintf("waiting: %s:%s moved to %s, first seen %s; rolled out after minDigestAge %s, in %s (at %s); held on the recorded digest %s meanwhile",
				img.Repository, img.Tag, latest, since.UTC().Format(time.RFC3339), d.s.MinDigestAge, left.Round(time.Second), since.Add(d.s.MinDigestAge).UTC().Format(time.RFC3339), recorded)
			return &hold{state: StateWaiting, finding: Finding{Severity: SeverityInfo, Image: img.Name, Message: msg}}
		}
	}
	if now := d.now(); !config.WindowsOpen(d.s.RolloutWindows, now) {
		names := make([]string, len(d.s.RolloutWindows))
		for i, w := range d.s.RolloutWindows {
			names[i] = w.String()
		}
		msg := fmt.Sprintf("outside rolloutWindows (%s): the move of %s:%s to %s waits for the next window, opening %s; held on the recorded digest %s meanwhile",
			strings.Join(names, "; "), img.Repository, img.Tag, latest, config.NextWindowOpening(d.s.RolloutWindows, now).Format(time.RFC3339), recorded)
		return &hold{state: StateWindowClosed, finding: Finding{Severity: SeverityInfo, Image: img.Name, Message: msg}}
	}
	return nil
}

// flapHold is R21's hold of a flapping tag, loud and naming rearm.
func (d *decision) flapHold(img config.Image, msg string) *hold {
	return &hold{state: StateTagFlapping, finding: Finding{Severity: SeverityWarn, Reason: ReasonTagFlapping, Image: img.Name, NeedsHuman: true, Message: msg,
		Remediation: "find why the tag keeps moving (two publishers, registry replicas that disagree); to roll to the registry's digest now, run: " + d.rearm()}}
}

// budgetSpent reports whether the churn bound holds a digest change now
// (R21): maxDigestChanges moves within the window, or a list that does not
// parse (fail-safe).
func (d *decision) budgetSpent(recent []time.Time, budgetErr error) bool {
	return d.s.DigestChangeWindow > 0 && (budgetErr != nil || len(recent) >= d.s.MaxDigestChanges)
}

// flapUntil is when a spent budget is free again: the oldest counted move
// leaves the window. A list that does not parse has no such time; it
// counts a whole window from now (fail-safe).
func (d *decision) flapUntil(recent []time.Time, budgetErr error) time.Time {
	if budgetErr != nil || len(recent) < d.s.MaxDigestChanges || d.s.MaxDigestChanges <= 0 {
		return d.now().Add(d.s.DigestChangeWindow).UTC()
	}
	return recent[len(recent)-d.s.MaxDigestChanges].Add(d.s.DigestChangeWindow).UTC()
}

// stillFlapping keeps R21's tag-flapping for its whole window. A digest
// change held by the spent budget (h) marks the image; while the budget
// stays spent the image is tag-flapping, also when the tag sits on the held
// digest meanwhile: the tag has not stopped flapping, and the finding (and
// the alert on it) must not end and start again with each flip. Once the
// window has passed the marker goes, with one INFO line. It returns the
// hold to report when no digest change is held, else nil.
func (d *decision) stillFlapping(img config.Image, recorded string, h *hold, recent []time.Time, budgetErr error) *hold {
	key := d.keys.TagFlapping(img.Name)
	v, marked := d.value(key)
	spent := d.budgetSpent(recent, budgetErr)
	if h != nil && h.state == StateTagFlapping {
		if until := d.flapUntil(recent, budgetErr).Format(time.RFC3339); !marked || v != until {
			d.p.Bookkeeping.set(key, &until, d.ann)
		}
		return nil
	}
	if !marked {
		return nil
	}
	if !spent {
		d.p.Bookkeeping.set(key, nil, d.ann)
		d.find(Finding{Severity: SeverityInfo, Image: img.Name, Once: "tag-flapping-ended " + img.Name, Message: fmt.Sprintf(
			"the tag %s:%s is no longer held as flapping: its digestChangeWindow %s has passed; the next digest change rolls",
			img.Repository, img.Tag, d.s.DigestChangeWindow)})
		return nil
	}
	if h != nil {
		return nil // held for another reason, which is reported
	}
	var msg string
	if budgetErr != nil {
		msg = fmt.Sprintf("%v; treated as a spent digest-change budget (fail-safe): the tag %s:%s is flapping and its digest is held on %s, where the tag is now",
			budgetErr, img.Repository, img.Tag, recorded)
	} else {
		msg = fmt.Sprintf("the tag %s:%s is flapping: its digest moved %d times in the last %s (maxDigestChanges %d) and a further move was held; the tag is back on the held digest %s now, and the image stays held until %s",
			img.Repository, img.Tag, len(recent), d.s.DigestChangeWindow, d.s.MaxDigestChanges, recorded, d.flapUntil(recent, nil).Format(time.RFC3339))
	}
	return d.flapHold(img, msg)
}

// firstSeen keeps when the registry's answer for img was first seen while
// it differed from the record (R22): a new digest gets now, the record
// catching up deletes it. It returns the value that applies to latest, or
// nil when latest was first seen now. An unreadable value is restarted
// (fail-safe: the wait starts over, never skipped).
func (d *decision) firstSeen(img config.Image, recorded, latest string) *state.FirstSeenValue {
	key := d.keys.FirstSeen(img.Name)
	v, ok := d.value(key)
	if recorded == latest || d.s.MinDigestAge <= 0 {
		if ok {
			d.p.Bookkeeping.set(key, nil, d.ann)
		}
		return nil
	}
	if ok {
		if f, err := state.ParseFirstSeen(v); err == nil && f.Digest == latest {
			return &f
		} else if err != nil {
			d.find(Finding{Severity: SeverityWarn, Image: img.Name, Message: fmt.Sprintf("annotation %s on %s: %v; the minDigestAge wait starts over (fail-safe)", key, d.p.Anchor, err)})
		}
	}
	d.p.Bookkeeping.set(key, ptr(state.FirstSeenValue{Digest: latest, At: d.now()}.String()), d.ann)
	return nil
}

// hold reports an image the rollout policy keeps on its recorded digest.
func (d *decision) hold(img config.Image, h *hold) {
	d.find(h.finding)
	rem := h.finding.Remediation
	if rem == "" {
		rem = "none needed: it rolls by itself when the wait is over"
	}
	for i := range d.p.Rows {
		if r := &d.p.Rows[i]; r.Image == img.Name && r.State == StatePinned {
			r.State, r.Message, r.Remediation = h.state, h.finding.Message, rem
		}
	}
}

// lockedOn returns the digests lockouts of img's group locked on (R23); an
// unreadable value is reported and counts as none locked on.
func (d *decision) lockedOn(img config.Image) []string {
	key := d.keys.LockedOn(img.Name)
	v, ok := d.value(key)
	list, err := state.ParseDigests(v, ok)
	if err != nil {
		d.find(Finding{Severity: SeverityWarn, Image: img.Name, Message: fmt.Sprintf("annotation %s on %s: %v; no digest of %s is quarantined", key, d.p.Anchor, err, img.Name)})
	}
	return list
}

// latestOf is the registry's answer for img, "" when it failed or is not
// a digest.
func (d *decision) latestOf(img config.Image) string {
	res := d.obs.Latest[img.Name]
	if res.Err != nil {
		return ""
	}
	latest, err := imageref.ParseDigest(res.Digest)
	if err != nil {
		return ""
	}
	return latest
}

// rearmByNewDigest applies R23: a locked-out group whose lockout recorded
// the digests it locked on is re-armed once by itself when the registry
// serves another digest for one of its images. The attempt counter, its
// holder and the lockout marker are cleared in the bookkeeping write, and
// the rest of the decision reads the anchor as that write leaves it, so
// the new digest is tried at once under attempt 1. A group locked before
// it recorded its digests (the marker written with them), or whose counter
// does not parse, stays locked.
func (d *decision) rearmByNewDigest() bool {
	v, ok := d.value(d.keys.Attempt())
	if _, err := state.ParseCounter(v, ok); err != nil {
		return false
	}
	if flap, ok := d.value(d.keys.Flap()); !ok || flap != v {
		return false // the lockout has not recorded what it locked on yet: it does so now (lockOn)
	}
	var news []string
	recordedAny := false
	for _, img := range d.obs.Group.Images {
		if img.PinnedDigest != "" {
			continue
		}
		key := d.keys.LockedOn(img.Name)
		lv, ok := d.value(key)
		list, err := state.ParseDigests(lv, ok)
		if err != nil || !ok {
			continue
		}
		recordedAny = true
		latest := d.latestOf(img)
		if v, check := d.verification(img, latest); check && !v.Verified {
			continue // V1: a digest that cannot be tried does not re-arm
		}
		if missing, _, check := d.platformsMissing(img, latest); check && len(missing) > 0 {
			continue // V3: nor one the nodes cannot run
		}
		if latest != "" && !slices.Contains(list, latest) {
			news = append(news, fmt.Sprintf("%s:%s → %s", img.Repository, img.Tag, latest))
		}
	}
	if !recordedAny || len(news) == 0 {
		return false
	}
	cleared := maps.Clone(d.ann)
	for _, key := range []string{d.keys.Attempt(), d.keys.Holder(), d.keys.Flap()} {
		if _, ok := d.value(key); ok {
			d.p.Bookkeeping.set(key, nil, d.ann)
			delete(cleared, key)
		}
	}
	d.find(Finding{Severity: SeverityWarn, Reason: ReasonRearmedByNewDigest, Event: true, Message: fmt.Sprintf(
		"group %s was locked out after %d attempts; the registry now serves a digest it did not lock on (%s): re-armed once by itself, trying it; the digests it locked on stay quarantined",
		d.p.Group, d.p.Attempts, strings.Join(news, ", "))})
	d.ann, d.p.Attempts = cleared, 0
	return true
}

// lockOn records, while the group is locked out, the digest the registry
// serves for each of its images: the digests this lockout locked on (R23).
func (d *decision) lockOn() {
	for _, img := range d.obs.Group.Images {
		latest := d.latestOf(img)
		if _, err := imageref.ParseDigest(d.ann[d.keys.Record(img.Name)]); img.PinnedDigest != "" || latest == "" || err != nil {
			continue // an operator pin, no answer, or a first observation: nothing was tried
		}
		if v, check := d.verification(img, latest); check && !v.Verified {
			continue // V1: an unverified digest was never tried either
		}
		if missing, _, check := d.platformsMissing(img, latest); check && len(missing) > 0 {
			continue // V3: nor one the nodes cannot run
		}
		key := d.keys.LockedOn(img.Name)
		v, ok := d.value(key)
		list, err := state.ParseDigests(v, ok)
		if err != nil {
			list = nil // reported by lockedOn; rewritten with this lockout's digest
		}
		if slices.Contains(list, latest) {
			continue
		}
		list = append(list, latest)
		if len(list) > state.MaxLockedOn {
			list = list[len(list)-state.MaxLockedOn:]
		}
		d.p.Bookkeeping.set(key, ptr(strings.Join(list, ",")), d.ann)
	}
}

// RollingOnAnchor reports whether a group's anchor annotations say it has a
// rollout in flight (R24), for a group no pass has decided on yet: an
// attempt counter set and below maxRefreshAttempts (R10). A counter that
// does not parse counts as not rolling; the group's own pass reports it.
// Once a group's pass ran, its Plan.InFlight says it.
func RollingOnAnchor(prefix string, maxAttempts int, anchor map[string]string) bool {
	v, ok := anchor[state.Keys{Prefix: prefix}.Attempt()]
	n, err := state.ParseCounter(v, ok)
	return err == nil && n > 0 && n < maxAttempts
}

// queued applies R24's maxConcurrentRollouts: a new rollout that moves a
// target to another digest waits while that many other groups roll out.
// A revert re-pin restores what ran and is never queued.
func (d *decision) queued() bool {
	max, busy := d.s.MaxConcurrentRollouts, d.obs.RollingElsewhere
	if max <= 0 || len(busy) < max {
		return false
	}
	digestChange := false
	for _, w := range d.order {
		for _, c := range d.changes[w] {
			digestChange = digestChange || c.Cause != CauseRevert
		}
	}
	if !digestChange {
		return false
	}
	d.p.Queued = true
	msg := fmt.Sprintf("queued: %d group(s) roll out now (%s), maxConcurrentRollouts %d; group %s starts when one of them settled",
		len(busy), strings.Join(busy, ", "), max, d.p.Group)
	d.find(Finding{Severity: SeverityInfo, Message: msg})
	for i := range d.p.Rows {
		if r := &d.p.Rows[i]; r.State == StateDrifted {
			r.State, r.Message, r.Remediation = StateQueued, msg, "none needed: it rolls out when a slot is free"
		}
	}
	return true
}
