package refresh

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/state"
)

// V2: with onFailedRollout: rollback, a digest-change rollout that fails
// puts every target that moved back on the recorded digest, one write per
// workload under the next attempt (R10 bounds it), and quarantines the
// failed digest (R23) with the pods' own reason.

func (d *decision) rollsBack() bool {
	return d.obs.Group.OnFailedRollout == config.OnFailedRolloutRollback
}

// failureSignals lists why the group's workloads will not settle by
// themselves (FailureSignals of each). Empty: none seen (yet).
func (d *decision) failureSignals() []string {
	var out []string
	for _, w := range d.obs.Group.Workloads() {
		out = append(out, FailureSignals(w, d.obs.Workloads[w].Failed, d.obs.Pods[w].Pods)...)
	}
	return out
}

// FailureSignals names, one line each, why workload w will not settle by
// itself: failed, its controller's reason (ProgressDeadlineExceeded), and
// the containers of its current template's pods that cannot run
// (CrashLoopBackOff with the last exit code, ImagePullBackOff, …). `run`
// reads them from its watch events, a tick's wait from the pods it ends on
// (V2): both name a failure the same way.
func FailureSignals(w config.Workload, failed string, pods []RunningPod) []string {
	var out []string
	if failed != "" {
		out = append(out, fmt.Sprintf("%s: %s", w, failed))
	}
	for _, p := range pods {
		for _, c := range slices.Sorted(maps.Keys(p.Failing)) {
			out = append(out, fmt.Sprintf("pod %s container %s: %s", p.Name, c, p.Failing[c]))
		}
	}
	return out
}

// failedRollout says why the group's digest change in flight failed, or ""
// when it did not, or rolling back is not the group's policy (V2). It
// failed when a workload reports it will not finish (failureSignals, or
// those the tick's wait just ended on: a crashing container may be running
// again for a moment), or its attempt is past its deadline: in `run` the
// holder's time plus rolloutTimeout; in a tick an unfinished attempt no
// other live process holds, since the tick that wrote it waited (until
// rolloutTimeout or a failure) and released it. A rollback needs an
// attempt left (R10).
func (d *decision) failedRollout(settled bool, notSettled []string) string {
	if !d.rollsBack() || settled || d.p.Attempts == 0 || d.p.Attempts >= d.s.MaxAttempts {
		return ""
	}
	if sig := d.failureSignals(); len(sig) > 0 {
		return strings.Join(sig, "; ")
	}
	if d.obs.WaitFailure != "" {
		return d.obs.WaitFailure
	}
	v, ok := d.value(d.keys.Holder())
	h, err := state.ParseHolder(v, ok)
	if err != nil {
		return ""
	}
	timeout := fmt.Sprintf("not settled within rolloutTimeout %s of the write (%s)", d.s.RolloutTimeout, strings.Join(notSettled, "; "))
	if d.s.NoWait {
		if ok && h.Instance == d.s.Instance && d.s.RolloutTimeout > 0 && !d.now().Before(h.Since.Add(d.s.RolloutTimeout)) {
			return timeout
		}
		return ""
	}
	if !ok || !d.now().Before(h.Since.Add(d.s.HolderTTL)) {
		return timeout
	}
	return ""
}

// rollback puts every target that moved off its image's record back on it
// and quarantines the digests they moved to; why says how the rollout
// failed. It reports whether there was anything to roll back: nothing when
// the targets are on their records (a failed rollback, say), which R10's
// attempts then bound as before.
func (d *decision) rollback(why string) bool {
	d.order, d.changes, d.pending = nil, map[config.Workload][]ImageChange{}, Write{}
	var failed []string
	moved := map[string][]string{} // image → digests its targets moved to
	for _, img := range d.obs.Group.Images {
		recorded, ok := d.value(d.keys.Record(img.Name))
		if _, err := imageref.ParseDigest(recorded); img.PinnedDigest != "" || !ok || err != nil {
			continue
		}
		if d.rollbackPlatformsMissing(img, recorded) {
			continue // V3: the nodes cannot run the record either
		}
		for _, t := range img.Targets {
			c, ok := d.obs.Workloads[t.Workload()].Containers[t.Container]
			on := imageref.DigestOf(c.Image)
			live, err := imageref.Parse(c.Image)
			if !ok || on == "" || on == recorded || err != nil {
				continue
			}
			to := imageref.Pin(live.Repository, img.Tag, recorded, d.s.PinFormat)
			d.addChange(t.Workload(), ImageChange{Image: img.Name, Container: t.Container, From: c.Image, To: to, Cause: CauseRollback, Writer: c.Manager})
			if !slices.Contains(moved[img.Name], on) {
				moved[img.Name] = append(moved[img.Name], on)
			}
		}
	}
	if len(d.order) == 0 {
		return false
	}
	for _, img := range d.obs.Group.Images {
		digests := moved[img.Name]
		if len(digests) == 0 {
			continue
		}
		d.quarantine(img, digests)
		d.p.Bookkeeping.set(d.keys.RolledBack(img.Name), ptr(digests[len(digests)-1]+" "+oneLine(why)), d.ann)
		recorded := d.ann[d.keys.Record(img.Name)]
		for _, dg := range digests {
			failed = append(failed, fmt.Sprintf("%s:%s %s", img.Repository, img.Tag, dg))
		}
		msg := fmt.Sprintf("the rollout of %s:%s to %s failed (%s): every target that moved is rolled back to the recorded digest %s and %s is quarantined",
			img.Repository, img.Tag, strings.Join(digests, ", "), why, recorded, strings.Join(digests, ", "))
		rem := "fix the build and publish it under the tag (a new digest is tried by itself); to try this digest again, run: " + d.rearm()
		d.find(Finding{Severity: SeverityError, Reason: ReasonRolledBack, Image: img.Name, NeedsHuman: true, Message: msg, Remediation: rem})
		for i := range d.p.Rows {
			if r := &d.p.Rows[i]; r.Image == img.Name {
				r.State, r.Message, r.Remediation = StateRolledBack, msg, rem
			}
		}
	}
	d.p.WaitUntil = time.Time{}
	d.repin(false)
	d.p.Repin.Rollback = true
	return true
}

// quarantine adds digests to img's quarantine list (R23's locked-on).
func (d *decision) quarantine(img config.Image, digests []string) {
	key := d.keys.LockedOn(img.Name)
	v, ok := d.value(key)
	list, err := state.ParseDigests(v, ok)
	if err != nil {
		list = nil
	}
	for _, dg := range digests {
		if !slices.Contains(list, dg) {
			list = append(list, dg)
		}
	}
	if len(list) > state.MaxLockedOn {
		list = list[len(list)-state.MaxLockedOn:]
	}
	d.p.Bookkeeping.set(key, ptr(strings.Join(list, ",")), d.ann)
}

// rolledBackHold turns R23's quarantine of a digest this group rolled back
// into the rolled-back state, with the reason kept on the anchor.
func (d *decision) rolledBackHold(img config.Image, latest string, h *hold) *hold {
	v, ok := d.value(d.keys.RolledBack(img.Name))
	digest, why, _ := strings.Cut(v, " ")
	if !ok || digest != latest || h == nil || h.state != StateQuarantined {
		return h
	}
	msg := fmt.Sprintf("the registry serves %s:%s at %s, whose rollout failed and was rolled back (%s); it is quarantined and never tried again; held on the recorded digest",
		img.Repository, img.Tag, latest, why)
	h.state = StateRolledBack
	h.finding.Reason, h.finding.Message = ReasonRolledBack, msg
	return h
}

// forgetRolledBack deletes the rolled-back note once the registry serves
// another digest: the quarantine (R23's list) stays.
func (d *decision) forgetRolledBack(img config.Image, latest string) {
	v, ok := d.value(d.keys.RolledBack(img.Name))
	if digest, _, _ := strings.Cut(v, " "); ok && digest != latest {
		d.p.Bookkeeping.set(d.keys.RolledBack(img.Name), nil, d.ann)
	}
}

// oneLine keeps a reason fit for one annotation line.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 512 {
		s = s[:512] + "…"
	}
	return s
}
