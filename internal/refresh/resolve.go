package refresh

import (
	"fmt"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/state"
)

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
