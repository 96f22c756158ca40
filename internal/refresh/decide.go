package refresh

import (
	"fmt"
	"strconv"
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

func (d *decision) clear(w *Write, key string) {
	if _, ok := d.value(key); ok {
		w.set(key, nil, d.ann)
	}
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
