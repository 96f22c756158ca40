package refresh

import (
	"fmt"

	"github.com/image-refresh/image-refresh/internal/config"
)

// verification returns V1's answer for img when the registry's answer
// latest needs one: a verification policy matches the repository and
// latest is not the record. ok is false when nothing is to be verified.
func (d *decision) verification(img config.Image, latest string) (v Verification, ok bool) {
	v, ok = d.obs.Verification[img.Name]
	if !ok || v.Policy == "" {
		return Verification{}, false
	}
	if v.Digest != latest {
		// An answer for another digest proves nothing about this one
		// (fail-closed).
		return Verification{Policy: v.Policy, Digest: latest,
			Verdict: fmt.Sprintf("%s@%s: not looked up", img.Repository, latest)}, true
	}
	return v, true
}

// unverifiedFirst applies V1 to a first observation (R5): only a verified
// digest is recorded. It reports whether latest may be recorded.
func (d *decision) unverifiedFirst(img config.Image, latest string) (recordable bool) {
	v, ok := d.verification(img, latest)
	if !ok || v.Verified {
		return true
	}
	f := d.unverifiedFinding(img, v, "nothing is recorded and no target is touched until a signed digest is served")
	d.find(f)
	for _, t := range img.Targets {
		d.row(img, t, StateUnverified, f.Message, f.Remediation)
	}
	return false
}

// unverifiedHold is V1 for a digest change: an unverified digest is never
// pinned or recorded; the image holds its current pin (R7 keeps it). It
// comes before every other rule of the rollout policy, and `rearm` does not
// lift it.
func (d *decision) unverifiedHold(img config.Image, recorded, latest string) *hold {
	v, ok := d.verification(img, latest)
	if !ok || v.Verified {
		return nil
	}
	return &hold{state: StateUnverified, finding: d.unverifiedFinding(img, v, "held on the recorded digest "+recorded)}
}

func (d *decision) unverifiedFinding(img config.Image, v Verification, held string) Finding {
	msg := fmt.Sprintf("the registry serves %s:%s at %s, which did not verify against verification policy %s: %s; %s",
		img.Repository, img.Tag, v.Digest, v.Policy, v.Verdict, held)
	rem := fmt.Sprintf("sign %s@%s with a key or identity of verification policy %s (or publish a signed build under the tag); if the signature is right, check the policy's keys",
		img.Repository, v.Digest, v.Policy)
	if v.Attestations != "" {
		// V5: signed, but an attestation is missing or fails a condition.
		rem = fmt.Sprintf("attest %s@%s with %s, signed with a key or identity of verification policy %s and meeting its conditions (or publish a build that does); see docs/config.md#attestations",
			img.Repository, v.Digest, v.Attestations, v.Policy)
	}
	return Finding{Severity: SeverityWarn, Reason: ReasonDigestUnverified, Image: img.Name, NeedsHuman: true, Message: msg, Remediation: rem}
}

// rememberVerified keeps a verified digest that is not the record yet on the
// anchor (state.Keys.Verified), so that a restart does not look it up again;
// once the record caught up the memo goes.
func (d *decision) rememberVerified(img config.Image, recorded, latest string) {
	key := d.keys.Verified(img.Name)
	v, ok := d.verification(img, latest)
	if recorded == latest || !ok || !v.Verified || v.Memo == "" {
		if recorded == latest {
			d.clear(&d.p.Bookkeeping, key)
		}
		return
	}
	if cur, _ := d.value(key); cur != v.Memo {
		d.p.Bookkeeping.set(key, ptr(v.Memo), d.ann)
	}
}
