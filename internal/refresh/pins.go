package refresh

import (
	"fmt"
	"slices"
	"strings"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/state"
)

// V4: every digest the targets are pinned to, and the digest V2 would roll
// them back to, must still be pullable. Registries delete untagged
// manifests by retention policy; once the tag moved on, the pinned digest
// is untagged, and nothing breaks until a node needs to pull it again.

// PinRef names one digest in one repository that V4 checks.
type PinRef struct {
	Repository string
	Digest     string
}

func (r PinRef) String() string { return r.Repository + "@" + r.Digest }

// PinCheck is the registry's answer to "does it still hold the digest?"
// (V4): Missing only on a definite 404 (MANIFEST_UNKNOWN); Err when it
// could not tell (401, 5xx, a timeout), which is never a verdict.
type PinCheck struct {
	Missing bool
	Err     error
}

// pinUse is one pinned digest of an image and who depends on it.
type pinUse struct {
	ref PinRef
	// on are the targets pinned to it: a new pod of theirs pulls it.
	on []config.Target
	// retreat are the targets a digest change in flight moved off it,
	// which V2 rolls back to it when the rollout fails.
	retreat []config.Target
	// rollback: V2 rolls this image back to it (onFailedRollout:
	// rollback), now or on the next digest change.
	rollback bool
}

// PinsToCheck lists the digests of img that V4 checks in a group as
// observed: the digest its targets are pinned to (its record, or an
// operator's pinnedDigest), in each repository a target pulls it from,
// where a target is on it or V2 would roll back to it. A digest no target
// is pinned to and no rollback returns to is not checked.
func PinsToCheck(prefix string, obs Observation, img config.Image) []PinRef {
	var out []PinRef
	for _, u := range pinUses(state.Keys{Prefix: prefix}, obs, img) {
		out = append(out, u.ref)
	}
	return out
}

// pinUses finds img's pinned digest and the targets that depend on it, per
// repository they pull from (a mirror is its own, R3).
func pinUses(keys state.Keys, obs Observation, img config.Image) []pinUse {
	pinned := img.PinnedDigest
	if pinned == "" {
		pinned = obs.Anchor[keys.Record(img.Name)]
	}
	if _, err := imageref.ParseDigest(pinned); err != nil {
		return nil
	}
	rollback := img.PinnedDigest == "" && obs.Group.OnFailedRollout == config.OnFailedRolloutRollback
	var uses []pinUse
	use := func(repo string) *pinUse {
		for i := range uses {
			if uses[i].ref.Repository == repo {
				return &uses[i]
			}
		}
		uses = append(uses, pinUse{ref: PinRef{Repository: repo, Digest: pinned}, rollback: rollback})
		return &uses[len(uses)-1]
	}
	for _, t := range img.Targets {
		live := obs.Workloads[t.Workload()].Containers[t.Container].Image
		ref, err := imageref.Parse(live)
		on := imageref.DigestOf(live)
		switch {
		case err != nil || on == "":
			// Unreadable, or on the bare tag: pinned to nothing yet.
		case on == pinned:
			u := use(ref.Repository)
			u.on = append(u.on, t)
		case rollback:
			u := use(ref.Repository)
			u.retreat = append(u.retreat, t)
		}
	}
	return uses
}

// pins applies V4 to the group: a pinned digest the registry no longer
// holds is pin-missing, with who depends on it and what will fail. It
// runs after the rows are decided, and after O1 (a suspended group moves
// nothing); a pass that checked nothing (no Observation.PinChecks) says
// nothing.
func (d *decision) pins() {
	if d.obs.PinChecks == nil {
		return
	}
	for _, img := range d.obs.Group.Images {
		var failed []string
		for _, u := range pinUses(d.keys, d.obs, img) {
			if !u.rollback {
				// A target this pass moves to another digest no longer
				// depends on this one once its rollout settled; with
				// rollback, the lost digest is where it would retreat to.
				u.on = slices.DeleteFunc(u.on, d.moving(u.ref.Digest))
				if len(u.on) == 0 {
					continue
				}
			}
			check, ok := d.obs.PinChecks[u.ref]
			switch {
			case !ok:
			case check.Err != nil:
				failed = append(failed, fmt.Sprintf("cannot tell whether the registry still holds %s, which %s depend on: %v",
					u.ref, d.namedAll(append(slices.Clone(u.on), u.retreat...)), check.Err))
			case check.Missing:
				d.pinMissing(img, u)
			}
		}
		d.pinCheckStreak(img, failed)
	}
}

// pinCheckStreak counts the checks of img's pins in a row that the
// registry could not answer, as R1 counts failed resolves: a WARN each
// time, not a verdict; at maxReadFailures an error that needs a human, as
// the digests may be gone unseen. A check that answered clears it.
func (d *decision) pinCheckStreak(img config.Image, failed []string) {
	key := d.keys.PinCheckFailures(img.Name)
	if len(failed) == 0 {
		d.clear(&d.p.Bookkeeping, key)
		return
	}
	n, ceiling := d.counter(key)
	msg := fmt.Sprintf("%s; not taken as missing, checked again at the next pin check (failure %d of %d in a row)", strings.Join(failed, "; "), n, d.s.MaxReadFailures)
	f := Finding{Severity: SeverityWarn, Image: img.Name, Message: msg}
	if ceiling {
		f = Finding{Severity: SeverityError, Reason: ReasonRefreshError, Image: img.Name, NeedsHuman: true, Message: msg,
			Remediation: "check the registry and the pull credentials: while it cannot answer, a digest it deleted goes unseen until a pod fails to pull it"}
	}
	f.Once = fmt.Sprintf("pin-check-failed %s %d", img.Name, n) // once per check, not per pass
	d.find(f)
}

// pinMissing reports one pinned digest the registry no longer holds (V4).
func (d *decision) pinMissing(img config.Image, u pinUse) {
	var parts []string
	if len(u.on) > 0 {
		parts = append(parts, fmt.Sprintf("%s %s pinned to it: their running pods keep running, but a new pod, a reschedule or a scale-up cannot pull it (ErrImagePull)",
			d.namedAll(u.on), isAre(len(u.on))))
	}
	switch {
	case u.rollback && len(u.retreat) > 0:
		parts = append(parts, fmt.Sprintf("it is the recorded digest that a failed rollout of %s rolls back to (onFailedRollout: rollback): the rollback cannot retreat to it", d.namedAll(u.retreat)))
	case u.rollback:
		parts = append(parts, "it is the recorded digest a failed rollout of the next digest rolls back to (onFailedRollout: rollback): the rollback cannot retreat to it")
	}
	msg := fmt.Sprintf("the registry no longer holds %s (404: deleted, e.g. by a retention rule once the tag moved on); %s",
		u.ref, strings.Join(parts, "; "))
	rem := fmt.Sprintf("publish a build under %s:%s so that image-refresh pins it, or restore %s; and make the registry's retention rule keep the digests that are pinned (GHCR cleanup, ECR lifecycle rules, Harbor GC delete untagged manifests)",
		img.Repository, img.Tag, u.ref)
	if img.PinnedDigest != "" {
		rem = fmt.Sprintf("set pinnedDigest of image %s to a digest the registry holds, or restore %s; and make the registry's retention rule keep the digests that are pinned",
			img.Name, u.ref)
	}
	d.find(Finding{Severity: SeverityError, Reason: ReasonPinMissing, Image: img.Name, NeedsHuman: true, Message: msg, Remediation: rem})
	for _, t := range append(slices.Clone(u.on), u.retreat...) {
		for i := range d.p.Rows {
			r := &d.p.Rows[i]
			if r.Image != img.Name || r.target != t {
				continue
			}
			switch r.State {
			case StatePinned, StateWaiting, StateWindowClosed, StateQueued:
				// Nothing else about the target needs you.
				r.State, r.Message, r.Remediation = StatePinMissing, msg, rem
			default:
				r.Also = append(r.Also, Beside{State: StatePinMissing, Message: msg, Remediation: rem})
			}
		}
	}
}

// moving reports whether this plan re-images a target to another digest
// than digest.
func (d *decision) moving(digest string) func(config.Target) bool {
	return func(t config.Target) bool {
		if d.p.Repin == nil {
			return false
		}
		for _, wc := range d.p.Repin.Changes {
			for _, ic := range wc.Images {
				if wc.Workload == t.Workload() && ic.Container == t.Container && imageref.DigestOf(ic.To) != digest {
					return true
				}
			}
		}
		return false
	}
}

// namedAll names targets for people, joined.
func (d *decision) namedAll(ts []config.Target) string {
	if len(ts) == 0 {
		return "no target"
	}
	names := make([]string, 0, len(ts))
	for _, t := range ts {
		names = append(names, d.named(t))
	}
	return strings.Join(names, ", ")
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}
