package refresh

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/state"
)

// Leader is what a follower's pass read of the group it follows (P1): the
// leader's anchor state, or why it could not be read.
type Leader struct {
	Group  string
	Anchor map[string]string
	Err    error
}

// soakHealthy lists the states of a target whose pods can soak the
// recorded digest: the target is on it, whatever the policy holds of a
// newer digest.
var soakHealthy = []State{StatePinned, StateWaiting, StateWindowClosed, StateQueued, StateUnverified, StateQuarantined, StateTagFlapping, StatePinMissing}

// soak keeps the soak clock of every image of a group that other groups
// follow (P1): the recorded digest, since when every target runs it
// settled and healthy, and the pods' restart count then. A pass that finds
// the group otherwise deletes the clock; a restart starts it over.
func (d *decision) soak() {
	pr := d.obs.Group.Promotion
	publishes := pr != nil && pr.Publish != nil
	if len(d.obs.Followers) == 0 && !publishes {
		return
	}
	for _, img := range d.obs.Group.Images {
		if img.PinnedDigest != "" {
			continue
		}
		key := d.keys.Soak(img.Name)
		v, had := d.value(key)
		recorded := d.ann[d.keys.Record(img.Name)]
		restarts, why, pods := d.healthy(img, recorded)
		if why != "" {
			// Only the pods disagree (not Ready yet, not reporting the
			// digest yet): `run` looks again soon, as no event of the
			// group's workloads may follow.
			d.p.SoakPending = d.p.SoakPending || pods
			if had {
				d.p.Bookkeeping.set(key, nil, d.ann)
				waiting := "group(s) " + strings.Join(d.obs.Followers, ", ") + " wait for it"
				if len(d.obs.Followers) == 0 {
					waiting = "its promotion attestation waits for it (P2)"
				}
				d.find(Finding{Severity: SeverityInfo, Image: img.Name, Message: fmt.Sprintf(
					"the soak of %s by group %s stops: %s; %s", recorded, d.p.Group, why, waiting)})
			}
			continue
		}
		old, err := state.ParseSoak(v)
		switch {
		case had && err == nil && old.Digest == recorded && restarts == old.Restarts:
			// soaking on
			d.publishSoaked(img, old)
			continue
		case had && err == nil && old.Digest == recorded && restarts < old.Restarts:
			// Pods were replaced (fewer restarts, none new): the clock
			// runs on from the new count.
			d.p.Bookkeeping.set(key, ptr(state.SoakValue{Digest: recorded, Since: old.Since, Restarts: restarts}.String()), d.ann)
			d.publishSoaked(img, old)
			continue
		case had && err == nil && old.Digest == recorded:
			d.find(Finding{Severity: SeverityInfo, Image: img.Name, Message: fmt.Sprintf(
				"a container of group %s restarted while it soaked %s (%d restarts, %d before): its soak starts over", d.p.Group, recorded, restarts, old.Restarts)})
		case had && err != nil:
			d.find(Finding{Severity: SeverityWarn, Image: img.Name, Message: fmt.Sprintf("annotation %s on %s: %v; the soak starts over (fail-safe)", key, d.p.Anchor, err)})
		}
		clock := state.SoakValue{Digest: recorded, Since: d.now(), Restarts: restarts}
		d.p.Bookkeeping.set(key, ptr(clock.String()), d.ann)
		d.publishSoaked(img, clock)
	}
}

// publishSoaked is P2's part of the soak: once a group that publishes ran
// the recorded digest settled and healthy for promotion.publish.soak, the
// plan publishes its promotion attestation, once (state.Keys.Published
// records it); before, `run` wakes at the soak's end.
func (d *decision) publishSoaked(img config.Image, clock state.SoakValue) {
	pr := d.obs.Group.Promotion
	if pr == nil || pr.Publish == nil {
		return
	}
	if v, ok := d.value(d.keys.Published(img.Name)); ok {
		digest, _, err := state.ParsePublished(v)
		if err == nil && digest == clock.Digest {
			return // published already
		}
	}
	at := clock.Since.Add(pr.Publish.Soak)
	if at.After(d.now()) {
		d.wakeAt(at)
		return
	}
	d.p.Publish = append(d.p.Publish, Publication{Image: img.Name, Repository: img.Repository, Digest: clock.Digest, Since: clock.Since, Soak: pr.Publish.Soak})
}

// healthy says why img's targets do not run recorded settled and healthy
// (P1), "" when they do, with the restarts of their pods; pods: only what
// the pods report stands in the way.
func (d *decision) healthy(img config.Image, recorded string) (restarts int, why string, pods bool) {
	p := d.p
	switch {
	case recorded == "":
		return 0, "no digest is recorded yet", false
	case p.Suspended != nil:
		return 0, "the group is suspended", false
	case p.LockedOut:
		return 0, "the group is locked out", false
	case p.Repin != nil:
		return 0, "this pass re-images it", false
	case p.Attempts > 0:
		return 0, "a rollout is in flight", false
	case d.obs.Pods == nil:
		return 0, "its pods were not read", false
	}
	for _, r := range p.Rows {
		if r.Image != img.Name {
			continue
		}
		t := r.target
		switch {
		case !slices.Contains(soakHealthy, r.State) || len(r.Also) > 0:
			return 0, fmt.Sprintf("%s is %s", r.Target, r.State), false
		case imageref.DigestOf(r.Live) != recorded:
			return 0, fmt.Sprintf("%s is not pinned to %s", r.Target, recorded), false
		case !d.obs.Workloads[t.Workload()].Settled:
			return 0, fmt.Sprintf("%s is not settled", t.Workload()), false
		}
		read := d.obs.Pods[t.Workload()]
		if read.Err != nil {
			return 0, fmt.Sprintf("the pods of %s could not be read", t.Workload()), true
		}
		if len(read.Pods) == 0 || r.PodsOn != len(read.Pods) {
			return 0, fmt.Sprintf("%s: %s of its pods run %s", r.Target, r.Running, recorded), true
		}
	}
	seen := map[config.Workload]bool{}
	for _, t := range img.Targets {
		w := t.Workload()
		if seen[w] {
			continue
		}
		seen[w] = true
		for _, pod := range d.obs.Pods[w].Pods {
			if !pod.Ready {
				return 0, fmt.Sprintf("pod %s of %s is not Ready", pod.Name, w), true
			}
			restarts += pod.Restarts
		}
	}
	return restarts, "", false
}

// promotionHold holds a follower's move to latest until the group it
// follows ran latest settled and healthy for the soak (P1): nil lets it
// move.
func (d *decision) promotionHold(img config.Image, recorded, latest string) *hold {
	pr := d.obs.Group.Promotion
	if pr == nil {
		return nil
	}
	if pr.AttestedBy != nil {
		return d.attestedHold(img, recorded, latest)
	}
	if pr.After == "" {
		return nil // a group that only publishes (P2)
	}
	l := d.obs.Leader
	leaderImage := pr.Images[img.Name]
	wait := func(sev Severity, format string, args ...any) *hold {
		msg := fmt.Sprintf(format, args...) + fmt.Sprintf("; held on the recorded digest %s meanwhile", recorded)
		return &hold{state: StateWaiting, finding: Finding{Severity: sev, Image: img.Name, Message: msg}}
	}
	if l == nil || l.Err != nil || leaderImage == "" {
		why := "it was not read"
		if l != nil && l.Err != nil {
			why = l.Err.Error()
		}
		return wait(SeverityWarn, "waiting: the state of group %s, which group %s follows, cannot be read (%s): %s:%s does not move to %s without it (fail-safe)",
			pr.After, d.p.Group, why, img.Repository, img.Tag, latest)
	}
	if v := l.Anchor[d.keys.Suspend()]; v != "" {
		if suspended, _, _ := ParseSuspend(v); suspended {
			return wait(SeverityInfo, "waiting: group %s, which group %s follows, is suspended: %s:%s moves to %s only once it ran it",
				pr.After, d.p.Group, img.Repository, img.Tag, latest)
		}
	}
	if why, ok := leaderRejected(d.keys, l.Anchor, leaderImage, latest); ok {
		msg := fmt.Sprintf("group %s, which group %s follows, %s: it never reaches this group; held on the recorded digest %s",
			pr.After, d.p.Group, why, recorded)
		return &hold{state: StateQuarantined, finding: Finding{Severity: SeverityWarn, Reason: ReasonDigestQuarantined, Image: img.Name, Message: msg,
			Remediation: "publish a fixed build under the tag: it moves here once group " + pr.After + " ran it healthy for the soak"}}
	}
	soak, err := state.ParseSoak(l.Anchor[d.keys.Soak(leaderImage)])
	if err != nil || soak.Digest != latest {
		runs := l.Anchor[d.keys.Record(leaderImage)]
		if runs == latest {
			// The leader moved to it; its soak clock starts on its first
			// pass that finds it settled and healthy there.
			return wait(SeverityInfo, "waiting: group %s, which group %s follows, runs %s but has not yet been found settled and healthy on it (its soak clock starts then)",
				pr.After, d.p.Group, latest)
		}
		if runs == "" {
			runs = "no recorded digest"
		}
		return wait(SeverityInfo, "waiting: group %s, which group %s follows, has not run %s settled and healthy yet (its record is %s)",
			pr.After, d.p.Group, latest, runs)
	}
	at := soak.Since.Add(pr.Soak)
	if left := at.Sub(d.now()); left > 0 {
		d.wakeAt(at)
		return wait(SeverityInfo, "waiting: group %s, which group %s follows, has run %s settled and healthy since %s; it moves here after the soak of %s, in %s (at %s)",
			pr.After, d.p.Group, latest, soak.Since.UTC().Format(time.RFC3339), pr.Soak, left.Round(time.Second), at.UTC().Format(time.RFC3339))
	}
	return nil
}

// leaderRejected says whether the leader rolled latest back (V2) or
// quarantined it (R23), and which.
func leaderRejected(keys state.Keys, anchor map[string]string, image, latest string) (string, bool) {
	if v, ok := anchor[keys.RolledBack(image)]; ok {
		if digest, why, _ := strings.Cut(v, " "); digest == latest {
			return fmt.Sprintf("rolled %s back (%s)", latest, why), true
		}
	}
	v, ok := anchor[keys.LockedOn(image)]
	list, err := state.ParseDigests(v, ok)
	if err == nil && slices.Contains(list, latest) {
		return "quarantined " + latest, true
	}
	return "", false
}

// wakeAt asks `run` to pass the group again at t (Plan.WakeAt).
func (d *decision) wakeAt(t time.Time) {
	if d.p.WakeAt.IsZero() || t.Before(d.p.WakeAt) {
		d.p.WakeAt = t
	}
}

// attestedHold holds a follower of another cluster's move to latest until
// latest carries a valid promotion attestation from its signer, and the
// extra soak after the attestation's time passed (P2): nil lets it move.
// A digest without one waits; one whose attestations were all rejected
// (forged, signed with another key, made for another digest or by another
// installation) is unverified, and the reason says why.
func (d *decision) attestedHold(img config.Image, recorded, latest string) *hold {
	pr := d.obs.Group.Promotion
	signer := pr.AttestedBy.Name
	ev, ok := d.obs.Promotions[img.Name]
	held := fmt.Sprintf("held on the recorded digest %s meanwhile", recorded)
	wait := func(sev Severity, format string, args ...any) *hold {
		msg := fmt.Sprintf(format, args...) + "; " + held
		return &hold{state: StateWaiting, finding: Finding{Severity: sev, Image: img.Name, Message: msg}}
	}
	switch {
	case !ok || ev.Digest != latest:
		// An answer for another digest proves nothing about this one
		// (fail-closed).
		return wait(SeverityInfo, "waiting: %s:%s moved to %s, whose promotion attestation from %s was not looked up",
			img.Repository, img.Tag, latest, signer)
	case ev.Err != nil:
		return wait(SeverityWarn, "waiting: the promotion attestation of %s@%s from %s cannot be read (%v): it does not move without it (fail-safe)",
			img.Repository, latest, signer, ev.Err)
	case ev.Rejected:
		if !ev.Recheck.IsZero() {
			d.wakeAt(ev.Recheck)
		}
		msg := fmt.Sprintf("the registry serves %s:%s at %s, and no promotion attestation of it from %s verified: %s; %s",
			img.Repository, img.Tag, latest, signer, ev.Verdict, "held on the recorded digest "+recorded)
		return &hold{state: StateUnverified, finding: Finding{Severity: SeverityWarn, Reason: ReasonDigestUnverified, Image: img.Name, NeedsHuman: true, Message: msg,
			Remediation: fmt.Sprintf("only installation %s, with a key or identity of promotion.attestedBy, can promote a digest here: let it run %s@%s for its soak, or check promotion.attestedBy's keys; an attestation signed with another key, made for another digest or by another installation never counts",
				signer, img.Repository, latest)}}
	case !ev.Attested:
		if !ev.Recheck.IsZero() {
			d.wakeAt(ev.Recheck)
		}
		return wait(SeverityInfo, "waiting: %s:%s moved to %s, which carries no promotion attestation from %s yet (%s runs it first, and attests it once it soaked there)",
			img.Repository, img.Tag, latest, signer, signer)
	}
	at := ev.At.Add(pr.Soak)
	if left := at.Sub(d.now()); left > 0 {
		d.wakeAt(at)
		return wait(SeverityInfo, "waiting: %s attested %s@%s at %s; it moves here after the soak of %s, in %s (at %s)",
			signer, img.Repository, latest, ev.At.UTC().Format(time.RFC3339), pr.Soak, left.Round(time.Second), at.UTC().Format(time.RFC3339))
	}
	return nil
}
