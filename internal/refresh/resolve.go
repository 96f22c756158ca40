package refresh

import (
	"fmt"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/state"
)

// resolve applies R1: the registry's answer for img, as a digest. A failed
// answer, or one that is not a digest, counts toward maxReadFailures, gives
// every target an error row and skips the image (ok is false); an answer
// clears the streak.
func (d *decision) resolve(img config.Image) (latest string, ok bool) {
	res := d.obs.Latest[img.Name]
	err := res.Err
	if err == nil {
		if latest, err = imageref.ParseDigest(res.Digest); err != nil {
			err = fmt.Errorf("registry answer is not a digest: %w", err)
		}
	}
	if err != nil {
		n, ceiling := d.resolveFailure(img, res)
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
		return "", false
	}
	d.clear(&d.p.Bookkeeping, d.keys.ResolveFailures(img.Name))
	return latest, true
}

// resolveFailure counts a failed registry answer for img toward
// maxReadFailures (R1), once per ask: a failed ask an earlier pass counted
// (Observation.CountedAsks) reports the stored streak and writes nothing,
// unless the streak is not stored (then it is counted now). The plan
// names the failed ask it counts (Plan.CountedAsks).
func (d *decision) resolveFailure(img config.Image, res Resolution) (n int, atCeiling bool) {
	key := d.keys.ResolveFailures(img.Name)
	asked := res.Err != nil && res.Ask != 0
	if asked && d.obs.CountedAsks[img.Name] == res.Ask {
		v, ok := d.value(key)
		if n, err := state.ParseCounter(v, ok); err == nil && n > 0 {
			return n, n >= d.s.MaxReadFailures
		}
	}
	if asked {
		if d.p.CountedAsks == nil {
			d.p.CountedAsks = map[string]uint64{}
		}
		d.p.CountedAsks[img.Name] = res.Ask
	}
	return d.counter(key)
}

// record reads img's digest record. Without one (or with one that is not a
// digest) this is the first observation (R5): latest is recorded, no target
// is touched, and ok is false.
func (d *decision) record(img config.Image, latest string) (recorded string, ok bool) {
	recKey := d.keys.Record(img.Name)
	recorded, hasRecord := d.value(recKey)
	if _, err := imageref.ParseDigest(recorded); hasRecord && err != nil {
		d.find(Finding{Severity: SeverityWarn, Image: img.Name,
			Message: fmt.Sprintf("annotation %s holds %q, not a digest; treated as absent", recKey, recorded)})
		hasRecord = false
	}
	if hasRecord {
		return recorded, true
	}
	// V1: a first observation records only a verified digest.
	if !d.unverifiedFirst(img, latest) {
		return "", false
	}
	// V3: and only one that serves every platform the nodes need.
	if !d.platformFirst(img, latest) {
		return "", false
	}
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
	return "", false
}

// clearStalePin deletes R2's stale-pin finding of img, if the anchor holds
// one, and says so once.
func (d *decision) clearStalePin(img config.Image, staleKey, why string) {
	if _, ok := d.value(staleKey); !ok {
		return
	}
	d.p.Bookkeeping.set(staleKey, nil, d.ann)
	d.find(Finding{Severity: SeverityInfo, Image: img.Name, Once: "stale-pin-cleared " + img.Name, Message: fmt.Sprintf(
		"the stale-pin finding of %s:%s is cleared: %s", img.Repository, img.Tag, why)})
}

func (d *decision) operatorPin(img config.Image, latest, staleKey string) {
	if img.PinnedDigest == latest {
		d.clearStalePin(img, staleKey, "the operator pin "+img.PinnedDigest+" is the registry's latest now")
		d.find(Finding{Severity: SeverityInfo, Image: img.Name, Once: "operator-pin-current " + img.Name + " " + img.PinnedDigest, Message: fmt.Sprintf(
			"the operator pin %s of %s:%s is the registry's latest: not refreshed, only checked", img.PinnedDigest, img.Repository, img.Tag)})
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
