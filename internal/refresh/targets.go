package refresh

import (
	"fmt"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/state"
)

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
			what, name := "container", t.Container
			if v, ok := t.Volume(); ok {
				what, name = "image volume", v
			}
			msg := fmt.Sprintf("configuration error: %s has no %s %q (target %s)", t.Workload(), what, name, t)
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

// rollTo is what the targets of one image are decided against (R6–R8).
type rollTo struct {
	img      config.Image
	recorded string // the digest record
	resolved string // the registry's answer
	// latest is the digest the targets are pinned to: resolved, or
	// recorded while the rollout policy holds the image (held).
	latest        string
	digestChanged bool // latest is not the record
	held          bool
	everPinned    bool
}

// targets decides each target of an image that has a record (R6, R7, R8),
// under the rollout policy (R21–R24), and what of the record moves.
func (d *decision) targets(img config.Image, recorded, latest string) {
	digestChanged := recorded != latest
	recent, budgetErr := d.recentChanges(img, digestChanged)
	firstSeen := d.firstSeen(img, recorded, latest)
	var h *hold
	if digestChanged {
		h = d.holdFor(img, recorded, latest, recent, budgetErr, firstSeen)
	}
	flapping := d.stillFlapping(img, recorded, h, recent, budgetErr)
	r := rollTo{img: img, recorded: recorded, resolved: latest, latest: latest, digestChanged: digestChanged, held: h != nil}
	if r.held {
		// The rollout policy holds the image on its recorded digest, which
		// R7 keeps pinned, instead of rolling to the new answer.
		r.latest, r.digestChanged = recorded, false
	}
	_, r.everPinned = d.value(d.keys.EverPinned(img.Name))
	changed := false
	for _, t := range img.Targets {
		if d.target(r, t) {
			changed = true
		}
	}
	if r.held {
		d.hold(img, h)
	} else if flapping != nil {
		d.hold(img, flapping)
	}
	d.moveRecord(r, changed, recent, firstSeen)
}

// target decides one target: on the digest, or why it is not re-imaged
// (R8's firstInstall, C5, R3), or its image change. It reports whether it
// changes the target.
func (d *decision) target(r rollTo, t config.Target) (changed bool) {
	img := r.img
	c := d.obs.Workloads[t.Workload()].Containers[t.Container]
	if on := imageref.DigestOf(c.Image); on == r.latest || (r.held && on == r.resolved) {
		// Held: a target someone already moved to the registry's
		// answer is not rolled back either.
		d.row(img, t, StatePinned, "on the pinned digest", "")
		return false
	}
	cause, ok := d.cause(r, t)
	if !ok || d.fought(img, t) || d.unproven(r, t, c) {
		return false
	}
	live, _ := imageref.Parse(c.Image)
	to := imageref.Pin(live.Repository, img.Tag, r.latest, d.s.PinFormat)
	d.addChange(t.Workload(), ImageChange{Image: img.Name, Container: t.Container, From: c.Image, To: to, Cause: cause, Writer: c.Manager, GitOps: c.GitOps})
	msg := fmt.Sprintf("not on the pinned digest: fresh install, or a re-render reverted the pin (image last written by %s)", writerName(c.Manager, c.GitOps))
	rem := ""
	if cause == CauseRevert && c.GitOps != nil {
		// O2: the tool syncs the tag back again at its next sync; its own
		// setting ends that.
		rem = c.GitOps.Remediation()
	}
	if r.digestChanged {
		msg, rem = fmt.Sprintf("the registry moved %s:%s from %s to %s", img.Repository, img.Tag, r.recorded, r.latest), ""
	}
	d.row(img, t, StateDrifted, msg, rem)
	return true
}

// cause tells why a target off the digest is re-imaged: a digest change
// (R6), a revert of a pin it had (R7), or a first install (R8); ok is false
// when firstInstall only-after-ever-pinned leaves it on the tag.
func (d *decision) cause(r rollTo, t config.Target) (cause Cause, ok bool) {
	switch {
	case r.digestChanged:
		return CauseDigestChange, true
	case r.everPinned:
		return CauseRevert, true
	case d.s.FirstInstall == config.FirstInstallOnlyAfterEverPinned:
		d.row(r.img, t, StateFirstObserved, "on the tag; firstInstall only-after-ever-pinned: pinned at the next digest change", "")
		return "", false
	}
	return CauseFirstInstall, true
}

// fought reports a target another writer keeps rewriting right after each
// re-pin (C5): never fight another writer forever.
func (d *decision) fought(img config.Image, t config.Target) bool {
	writer, fight := d.obs.Fights[t]
	if !fight {
		return false
	}
	msg := fmt.Sprintf("the environment rewrites image references: %s rewrote %s right after each of the last re-pins; image-refresh leaves it alone", orUnknown(writer), t)
	rem := fmt.Sprintf("stop %s from rewriting the image of this container (a mutating webhook or another controller), or remove the target from the config", orUnknown(writer))
	if g := d.obs.Workloads[t.Workload()].Containers[t.Container].GitOps; g != nil && g.Manager == writer {
		// O2: a GitOps controller syncs the bare tag back; its own
		// setting ends the fight.
		msg = fmt.Sprintf("%s syncs the bare tag back: %s (field manager %s) rewrote %s right after each of the last re-pins; image-refresh leaves it alone", g.Tool, g, writer, t)
		rem = g.Remediation()
	}
	d.find(Finding{Severity: SeverityWarn, Reason: ReasonRewriteFight, Image: img.Name, Target: &t, Message: msg, Remediation: rem, NeedsHuman: true, Writer: writer})
	d.row(img, t, StateError, msg, rem)
	return true
}

// unproven reports a target served by a mirror not proven to hold the
// digest (R3): it is left on its image and noted. A held image's proof was
// asked for the registry's answer, not for the held digest.
func (d *decision) unproven(r rollTo, t config.Target, c Container) bool {
	img := r.img
	repo, need := NeedsMirrorProof(img, c.Image)
	if !need || (!r.held && d.obs.MirrorProof[t].Has) {
		return false
	}
	why := "not known to hold it"
	if perr := d.obs.MirrorProof[t].Err; perr != nil {
		why = "could not tell: " + perr.Error()
	}
	if r.held {
		why = "the proof was asked for " + r.resolved + ", not for the held digest"
	}
	msg := fmt.Sprintf("%s is served by %s; not pinning %s there (%s)", t, repo, r.latest, why)
	d.find(Finding{Severity: SeverityNote, Image: img.Name, Target: &t, Message: msg})
	d.row(img, t, StateInert, msg, "mirror the digest to that registry, or point the target at "+img.Repository)
	return true
}

// moveRecord writes what of an image's record moves. R6: after a digest
// change the record moves only after every rollout settled (pending), and
// with it the time of the move, which the churn bound counts (R21). The
// ever-pinned marker is set once a target is changed, or at once when every
// target already runs the record.
func (d *decision) moveRecord(r rollTo, changed bool, recent []time.Time, firstSeen *state.FirstSeenValue) {
	img := r.img
	switch {
	case r.digestChanged:
		d.pending.set(d.keys.Record(img.Name), ptr(r.latest), d.ann)
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
		if changed && !r.everPinned {
			d.pending.set(d.keys.EverPinned(img.Name), ptr("true"), d.ann)
		}
	case changed && !r.everPinned:
		d.pending.set(d.keys.EverPinned(img.Name), ptr("true"), d.ann)
	case !changed && !r.everPinned && d.allOn(img, r.latest):
		// Every target already runs the recorded digest: it has been pinned.
		d.p.Bookkeeping.set(d.keys.EverPinned(img.Name), ptr("true"), d.ann)
	}
}

func (d *decision) addChange(w config.Workload, c ImageChange) {
	if _, ok := d.changes[w]; !ok {
		d.order = append(d.order, w)
	}
	d.changes[w] = append(d.changes[w], c)
}

func (d *decision) allOn(img config.Image, digest string) bool {
	for _, t := range img.Targets {
		if imageref.DigestOf(d.obs.Workloads[t.Workload()].Containers[t.Container].Image) != digest {
			return false
		}
	}
	return true
}
