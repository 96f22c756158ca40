package refresh

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/state"
)

// decision carries one Decide call's working state.
type decision struct {
	s       Settings
	obs     Observation
	keys    state.Keys
	p       *Plan
	ann     map[string]string
	pending Write // digest records and ever-pinned markers, after a settled rollout
	changes map[config.Workload][]ImageChange
	order   []config.Workload
	locked  bool // locked out (R10), after R23's re-arm by a new digest
	rearmed bool // this pass re-armed the group by a new digest (R23)
}

// Decide applies the rules of SPEC.md to one group's observation.
func Decide(s Settings, obs Observation) *Plan {
	d := &decision{
		s: s, obs: obs, keys: state.Keys{Prefix: s.Prefix}, ann: obs.Anchor,
		p:       &Plan{Group: obs.Group.Name, Anchor: obs.Group.Anchor},
		changes: map[config.Workload][]ImageChange{},
	}
	if obs.AnchorErr != nil {
		d.anchorUnreadable()
		return d.p
	}
	locked := d.readAttempt()
	if locked {
		d.rearmed = d.rearmByNewDigest()
		locked = !d.rearmed
	}
	d.locked = locked
	d.readSkipStreak()
	blocked, notSettled := d.readWorkloads()
	for _, img := range obs.Group.Images {
		d.image(img)
	}
	d.gate(locked, blocked, notSettled)
	d.running()
	return d.p
}

func (d *decision) value(key string) (string, bool) {
	v, ok := d.ann[key]
	return v, ok
}

func (d *decision) now() time.Time {
	if d.s.Now == nil {
		return time.Now()
	}
	return d.s.Now()
}

func (d *decision) find(f Finding) { d.p.Findings = append(d.p.Findings, f) }

// rearm is the remediation every lockout names (R18).
func (d *decision) rearm() string { return d.s.RearmCommand(d.p.Group) }

func (d *decision) anchorUnreadable() {
	g := d.obs.Group
	msg := fmt.Sprintf("read anchor %s of group %s: %v", g.Anchor, g.Name, d.obs.AnchorErr)
	d.find(Finding{Severity: SeverityError, Reason: ReasonRefreshError, Message: msg, NeedsHuman: true,
		Remediation: "make sure the anchor workload exists and image-refresh may get and patch it (RBAC)"})
	for _, img := range g.Images {
		for _, t := range img.Targets {
			d.row(img, t, StateError, msg, "make sure the anchor workload exists and image-refresh may get and patch it (RBAC)")
		}
	}
}

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
		if latest := d.latestOf(img); latest != "" && !slices.Contains(list, latest) {
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
		"group %s was locked out after %d attempts; the registry now serves a digest it did not lock on (%s): re-armed once by itself, trying it (R23); the digests it locked on stay quarantined",
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
		"%s was taken off its pin while settled on it; re-pinning now instead of waiting for the rollout that write started (%s) (C6)", w, st.Reason)})
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

// counter increments a per-image failure streak and reports whether it
// reached its ceiling; an invalid stored value counts as at the ceiling.
func (d *decision) counter(key string) (n int, atCeiling bool) {
	v, ok := d.value(key)
	old, err := state.ParseCounter(v, ok)
	if err != nil {
		old = d.s.MaxReadFailures
	}
	n = old + 1
	d.p.Bookkeeping.set(key, ptr(strconv.Itoa(n)), d.ann)
	return n, n >= d.s.MaxReadFailures
}

// resolveFailure counts a failed registry answer for img toward
// maxReadFailures (R1), once per ask: an answer an earlier pass counted
// (counted) reports the stored streak and writes nothing, unless the
// streak is not stored (then it is counted now).
func (d *decision) resolveFailure(img config.Image, counted bool) (n int, atCeiling bool) {
	key := d.keys.ResolveFailures(img.Name)
	if counted {
		v, ok := d.value(key)
		if n, err := state.ParseCounter(v, ok); err == nil && n > 0 {
			return n, n >= d.s.MaxReadFailures
		}
	}
	return d.counter(key)
}

func (d *decision) clear(w *Write, key string) {
	if _, ok := d.value(key); ok {
		w.set(key, nil, d.ann)
	}
}

func (d *decision) image(img config.Image) {
	staleKey := d.keys.StalePin(img.Name)
	if img.PinnedDigest == "" {
		// R2: the pin was removed, so its finding goes, registry or not.
		d.clear(&d.p.Bookkeeping, staleKey)
	}
	// R1: resolve.
	res := d.obs.Latest[img.Name]
	latest := res.Digest
	err := res.Err
	if err == nil {
		if latest, err = imageref.ParseDigest(res.Digest); err != nil {
			err = fmt.Errorf("registry answer is not a digest: %w", err)
		}
	}
	if err != nil {
		n, ceiling := d.resolveFailure(img, res.Counted)
		msg := fmt.Sprintf("resolve %s:%s: %v; image skipped this tick (failure %d of %d)", img.Repository, img.Tag, err, n, d.s.MaxReadFailures)
		f := Finding{Severity: SeverityWarn, Image: img.Name, Message: msg}
		if ceiling {
			f = Finding{Severity: SeverityError, Reason: ReasonRefreshError, Image: img.Name, NeedsHuman: true, Message: msg,
				Remediation: "check the registry, the repository and tag, and the pull credentials"}
		}
		d.find(f)
		for _, t := range img.Targets {
			d.row(img, t, StateError, msg, f.Remediation)
		}
		return
	}
	d.clear(&d.p.Bookkeeping, d.keys.ResolveFailures(img.Name))

	// R2: an operator pin is not refreshed, only checked.
	if img.PinnedDigest != "" {
		d.operatorPin(img, latest, staleKey)
		return
	}

	// R5: first observation records latest and touches nothing.
	recKey := d.keys.Record(img.Name)
	recorded, hasRecord := d.value(recKey)
	if _, err := imageref.ParseDigest(recorded); hasRecord && err != nil {
		d.find(Finding{Severity: SeverityWarn, Image: img.Name,
			Message: fmt.Sprintf("annotation %s holds %q, not a digest; treated as absent", recKey, recorded)})
		hasRecord = false
	}
	if !hasRecord {
		d.p.Bookkeeping.set(recKey, ptr(latest), d.ann)
		if _, everPinned := d.value(d.keys.EverPinned(img.Name)); !everPinned && d.allOn(img, latest) {
			// Every target already runs the digest: mark it pinned in the
			// same write, not in a second one on the next pass.
			d.p.Bookkeeping.set(d.keys.EverPinned(img.Name), ptr("true"), d.ann)
		}
		msg := "first observation: the registry's digest is recorded, no target touched"
		d.find(Finding{Severity: SeverityInfo, Image: img.Name, Message: fmt.Sprintf("%s %s:%s → %s", msg, img.Repository, img.Tag, latest)})
		for _, t := range img.Targets {
			d.row(img, t, StateFirstObserved, msg, "")
		}
		return
	}

	// R7/R19: every target must be readable, else the image is skipped.
	if !d.readTargets(img) {
		return
	}

	// R6, R7, R8: per target.
	digestChanged := recorded != latest
	resolved := latest
	recent, budgetErr := d.recentChanges(img, digestChanged)
	firstSeen := d.firstSeen(img, recorded, latest)
	var h *hold
	if digestChanged {
		h = d.holdFor(img, recorded, latest, recent, budgetErr, firstSeen)
	}
	held := h != nil
	if held {
		// The rollout policy holds the image on its recorded digest, which
		// R7 keeps pinned, instead of rolling to the new answer.
		latest, digestChanged = recorded, false
	}
	_, everPinned := d.value(d.keys.EverPinned(img.Name))
	changed := false
	for _, t := range img.Targets {
		c := d.obs.Workloads[t.Workload()].Containers[t.Container]
		if on := imageref.DigestOf(c.Image); on == latest || (held && on == resolved) {
			// Held: a target someone already moved to the registry's
			// answer is not rolled back either.
			d.row(img, t, StatePinned, "on the pinned digest", "")
			continue
		}
		cause := CauseDigestChange
		switch {
		case digestChanged:
		case everPinned:
			cause = CauseRevert
		case d.s.FirstInstall == config.FirstInstallOnlyAfterEverPinned:
			d.row(img, t, StateFirstObserved, "on the tag; firstInstall only-after-ever-pinned: pinned at the next digest change", "")
			continue
		default:
			cause = CauseFirstInstall
		}
		if writer, fight := d.obs.Fights[t]; fight {
			// C5: never fight another writer forever.
			msg := fmt.Sprintf("the environment rewrites image references: %s rewrote %s right after each of the last re-pins; image-refresh leaves it alone", writer, t)
			rem := fmt.Sprintf("stop %s from rewriting the image of this container (a mutating webhook or another controller), or remove the target from the config", writer)
			d.find(Finding{Severity: SeverityWarn, Reason: ReasonRewriteFight, Image: img.Name, Target: &t, Message: msg, Remediation: rem, NeedsHuman: true, Writer: writer})
			d.row(img, t, StateError, msg, rem)
			continue
		}
		if repo, need := NeedsMirrorProof(img, c.Image); need && (held || !d.obs.MirrorProof[t].Has) {
			why := "not known to hold it"
			if perr := d.obs.MirrorProof[t].Err; perr != nil {
				why = "could not tell: " + perr.Error()
			}
			if held {
				why = "the proof was asked for " + resolved + ", not for the held digest"
			}
			msg := fmt.Sprintf("%s is served by %s; not pinning %s there (%s)", t, repo, latest, why)
			d.find(Finding{Severity: SeverityNote, Image: img.Name, Target: &t, Message: msg})
			d.row(img, t, StateInert, msg, "mirror the digest to that registry, or point the target at "+img.Repository)
			continue
		}
		live, _ := imageref.Parse(c.Image)
		to := imageref.Pin(live.Repository, img.Tag, latest, d.s.PinFormat)
		d.addChange(t.Workload(), ImageChange{Image: img.Name, Container: t.Container, From: c.Image, To: to, Cause: cause, Writer: c.Manager})
		changed = true
		msg := fmt.Sprintf("not on the pinned digest: fresh install, or a re-render reverted the pin (image last written by %s)", orUnknown(c.Manager))
		if digestChanged {
			msg = fmt.Sprintf("the registry moved %s:%s from %s to %s", img.Repository, img.Tag, recorded, latest)
		}
		d.row(img, t, StateDrifted, msg, "")
	}
	if held {
		d.hold(img, h)
	}
	switch {
	case digestChanged:
		// R6: the record moves only after every rollout settled, and with
		// it the time of the move, which the churn bound counts (R21).
		d.pending.set(recKey, ptr(latest), d.ann)
		if firstSeen != nil {
			d.pending.set(d.keys.FirstSeen(img.Name), nil, d.ann)
		}
		if d.s.DigestChangeWindow > 0 {
			times := append(recent, d.now())
			if len(times) > d.s.MaxDigestChanges {
				times = times[len(times)-d.s.MaxDigestChanges:]
			}
			d.pending.set(d.keys.DigestChanges(img.Name), ptr(state.FormatTimes(times)), d.ann)
		}
		if changed && !everPinned {
			d.pending.set(d.keys.EverPinned(img.Name), ptr("true"), d.ann)
		}
	case changed && !everPinned:
		d.pending.set(d.keys.EverPinned(img.Name), ptr("true"), d.ann)
	case !changed && !everPinned && d.allOn(img, latest):
		// Every target already runs the recorded digest: it has been pinned.
		d.p.Bookkeeping.set(d.keys.EverPinned(img.Name), ptr("true"), d.ann)
	}
}

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
// instead of rolling to the registry's new answer (R21, R22, R23).
type hold struct {
	state   State
	finding Finding
}

// holdFor applies the rollout policy to a digest change of img from
// recorded to latest, in order: a quarantined digest (R23), a spent churn
// budget (R21), a digest younger than minDigestAge (R22), outside every
// rollout window (R24). nil: roll it. A revert re-pin is never held: it
// restores the recorded digest.
func (d *decision) holdFor(img config.Image, recorded, latest string, recent []time.Time, budgetErr error, seen *state.FirstSeenValue) *hold {
	rearm := d.rearm()
	if !d.locked && slices.Contains(d.lockedOn(img), latest) {
		msg := fmt.Sprintf("the registry serves %s:%s at %s, a digest a lockout of group %s locked on: it is quarantined and never tried again (R23); held on the recorded digest %s",
			img.Repository, img.Tag, latest, d.p.Group, recorded)
		return &hold{state: StateQuarantined, finding: Finding{Severity: SeverityWarn, Reason: ReasonDigestQuarantined, Image: img.Name, NeedsHuman: true, Message: msg,
			Remediation: "publish a fixed build under the tag (a new digest is tried by itself), or, to try the quarantined digest again, run: " + rearm}}
	}
	if d.s.DigestChangeWindow > 0 && (budgetErr != nil || len(recent) >= d.s.MaxDigestChanges) {
		var msg string
		if budgetErr != nil {
			msg = fmt.Sprintf("%v; treated as a spent digest-change budget (fail-safe): %s:%s is held on its recorded digest %s instead of moving to %s",
				budgetErr, img.Repository, img.Tag, recorded, latest)
		} else {
			until := recent[len(recent)-d.s.MaxDigestChanges].Add(d.s.DigestChangeWindow)
			msg = fmt.Sprintf("the tag %s:%s is flapping: its digest moved %d times in the last %s (maxDigestChanges %d); held on the recorded digest %s instead of rolling to %s, until %s",
				img.Repository, img.Tag, len(recent), d.s.DigestChangeWindow, d.s.MaxDigestChanges, recorded, latest, until.UTC().Format(time.RFC3339))
		}
		return &hold{state: StateTagFlapping, finding: Finding{Severity: SeverityWarn, Reason: ReasonTagFlapping, Image: img.Name, NeedsHuman: true, Message: msg,
			Remediation: "find why the tag keeps moving (two publishers, registry replicas that disagree); to roll to the registry's digest now, run: " + rearm}}
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

func (d *decision) allOn(img config.Image, digest string) bool {
	for _, t := range img.Targets {
		if imageref.DigestOf(d.obs.Workloads[t.Workload()].Containers[t.Container].Image) != digest {
			return false
		}
	}
	return true
}

func (d *decision) operatorPin(img config.Image, latest, staleKey string) {
	if img.PinnedDigest == latest {
		d.clear(&d.p.Bookkeeping, staleKey)
		if !d.readTargets(img) {
			return
		}
		for _, t := range img.Targets {
			live := d.obs.Workloads[t.Workload()].Containers[t.Container].Image
			if imageref.DigestOf(live) == img.PinnedDigest {
				d.row(img, t, StatePinned, "operator pin "+img.PinnedDigest+" (not refreshed)", "")
				continue
			}
			// R2: image-refresh never writes an operator pin, but it does
			// not call a target that does not run it pinned either.
			msg := fmt.Sprintf("%s runs %s, not the operator pin %s; image-refresh does not write operator pins", t, live, img.PinnedDigest)
			rem := fmt.Sprintf("deploy %s@%s (chart values), or remove pinnedDigest of image %s so that image-refresh pins the tag", img.Repository, img.PinnedDigest, img.Name)
			d.find(Finding{Severity: SeverityNote, Image: img.Name, Target: &t, Message: msg})
			d.row(img, t, StateInert, msg, rem)
		}
		return
	}
	if v, ok := d.value(staleKey); !ok || v != latest {
		d.p.Bookkeeping.set(staleKey, ptr(latest), d.ann)
	}
	msg := fmt.Sprintf("the operator pin %s of %s:%s is not the registry's latest %s", img.PinnedDigest, img.Repository, img.Tag, latest)
	rem := fmt.Sprintf("set pinnedDigest of image %s to %s, or remove it so that image-refresh follows the tag", img.Name, latest)
	d.find(Finding{Severity: SeverityWarn, Reason: ReasonStalePin, Image: img.Name, Message: msg, Remediation: rem, NeedsHuman: true})
	for _, t := range img.Targets {
		d.row(img, t, StateStalePin, msg, rem)
	}
}

// readTargets checks every target of img is readable (R7, fail-closed) and
// exists (R19); otherwise it counts the read-failure streak and skips img.
func (d *decision) readTargets(img config.Image) bool {
	ok := true
	for _, t := range img.Targets {
		w, read := d.obs.Workloads[t.Workload()]
		if !read || w.Err != nil {
			ok = false
			err := w.Err
			if !read {
				err = fmt.Errorf("not read")
			}
			d.row(img, t, StateError, fmt.Sprintf("read %s: %v", t.Workload(), err), "")
			continue
		}
		c, found := w.Containers[t.Container]
		if !found {
			ok = false
			msg := fmt.Sprintf("configuration error: %s has no container %q (target %s)", t.Workload(), t.Container, t)
			rem := "fix the container name of this target in the config"
			d.find(Finding{Severity: SeverityError, Reason: ReasonRefreshError, Image: img.Name, Target: &t, Message: msg, Remediation: rem, NeedsHuman: true})
			d.row(img, t, StateError, msg, rem)
			continue
		}
		if _, err := imageref.Parse(c.Image); err != nil {
			ok = false
			d.row(img, t, StateUnreadable, fmt.Sprintf("live image unreadable: %v", err),
				"fix the image reference of this container in its workload (or chart)")
		}
	}
	key := d.keys.ReadFailures(img.Name)
	if ok {
		d.clear(&d.p.Bookkeeping, key)
		return true
	}
	n, ceiling := d.counter(key)
	msg := fmt.Sprintf("could not read the live image of every target of %s; image skipped this tick (failure %d of %d)", img.Name, n, d.s.MaxReadFailures)
	f := Finding{Severity: SeverityWarn, Image: img.Name, Message: msg}
	if ceiling {
		f = Finding{Severity: SeverityError, Reason: ReasonRefreshError, Image: img.Name, Message: msg, NeedsHuman: true,
			Remediation: "see the target rows in `image-refresh status`: fix the workload, container name or RBAC"}
	}
	d.find(f)
	return false
}

func (d *decision) addChange(w config.Workload, c ImageChange) {
	if _, ok := d.changes[w]; !ok {
		d.order = append(d.order, w)
	}
	d.changes[w] = append(d.changes[w], c)
}

// gate applies the group-level rules: R4 settled guard, R10/R12 lockout,
// R11 unfinished attempt, and builds the Repin.
func (d *decision) gate(locked, blocked bool, notSettled []string) {
	g := d.obs.Group
	settled := !blocked && len(notSettled) == 0
	if settled && d.p.SkipStreak > 0 {
		d.clear(&d.p.ClearSkip, d.keys.SkipStreak())
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
		d.p.LockedOut = true
		attempt := strconv.Itoa(d.p.Attempts)
		if v, ok := d.value(d.keys.Flap()); !ok || v != attempt {
			d.p.Bookkeeping.set(d.keys.Flap(), &attempt, d.ann)
		}
		d.lockOn()
		msg := fmt.Sprintf("refresh of group %s is LOCKED OUT: %d re-image attempts never confirmed settling (max %d); its images are not updated until it is re-armed, or the registry publishes a digest it did not lock on (R23)",
			g.Name, d.p.Attempts, d.s.MaxAttempts)
		d.find(Finding{Severity: SeverityWarn, Reason: ReasonRefreshLockedOut, NeedsHuman: true, Message: msg,
			Remediation: "find why the rollout does not settle (a NotReady node, a crashing pod), then run: " + d.rearm()})
		for i := range d.p.Rows {
			if r := &d.p.Rows[i]; r.State == StatePinned || r.State == StateDrifted {
				r.State, r.Message, r.Remediation = StateLockedOut, msg, "run: "+d.rearm()
			}
		}
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
		// R4: not settled, and not because of our own rollout.
		n := d.p.SkipStreak + 1
		if d.obs.SkipUncounted {
			n = max(d.p.SkipStreak, 1)
		} else {
			d.p.Bookkeeping.set(d.keys.SkipStreak(), ptr(strconv.Itoa(n)), d.ann)
		}
		msg := fmt.Sprintf("group %s is not settled (%s); no change this tick (skip %d of %d)", g.Name, strings.Join(notSettled, "; "), n, d.s.MaxSkipTicks)
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
		return
	}
	if len(d.order) == 0 && !unfinished {
		// Nothing to roll: a record whose targets already run it lands now.
		for k, v := range d.pending.Set {
			d.p.Bookkeeping.set(k, v, d.ann)
			if v != nil && strings.Contains(k, "/last-refreshed-") {
				d.find(Finding{Severity: SeverityInfo, Message: fmt.Sprintf("recorded %s=%s: every target already runs it", k, *v)})
			}
		}
		return
	}
	if !unfinished && d.queued() {
		return
	}
	rp := &Repin{Wait: g.Workloads(), Unfinished: len(d.order) == 0}
	if d.s.NoWait {
		rp.Wait, rp.Async = nil, len(d.order) > 0 || !settled
	}
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
		Remediation: "if two image-refresh processes act on this cluster at once, run one, or run `image-refresh run --leader-elect` on every replica (C3)"})
	for i := range d.p.Rows {
		if r := &d.p.Rows[i]; r.State == StateDrifted || r.State == StatePinned {
			r.State, r.Message, r.Remediation = StateNotSettled, msg, "none needed if the other instance's rollout settles"
		}
	}
	return true
}

func (d *decision) row(img config.Image, t config.Target, st State, msg, rem string) {
	recorded := d.ann[d.keys.Record(img.Name)]
	live := ""
	if w, ok := d.obs.Workloads[t.Workload()]; ok {
		live = w.Containers[t.Container].Image
	}
	d.p.Rows = append(d.p.Rows, Row{
		Group: d.p.Group, Image: img.Name, Repository: img.Repository, Tag: img.Tag, Target: t.String(),
		Latest: d.obs.Latest[img.Name].Digest, Recorded: recorded, Live: live, State: st,
		Attempts: d.p.Attempts, SkipStreak: d.p.SkipStreak, Message: msg, Remediation: rem, target: t,
	})
}

func ptr(s string) *string { return &s }

func orUnknown(s string) string {
	if s == "" {
		return "an unknown writer"
	}
	return s
}
