package pass

import (
	"context"
	"fmt"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/refresh"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/verify"
)

// P2: a digest without a promotion attestation from the signer a group
// follows is looked up again after Runner.PromotionRecheck (the signer
// attests it once its soak ends there, at a time no one here knows); a
// digest with one is never looked up again. A publication that failed is
// tried again after publishRetry.
const (
	DefaultPromotionRecheck = 30 * time.Second
	publishRetry            = time.Minute
)

func (r *Runner) promotionRecheck() time.Duration {
	if r.PromotionRecheck > 0 {
		return r.PromotionRecheck
	}
	return DefaultPromotionRecheck
}

// promotionEntry is one remembered lookup of a digest's promotion
// attestation.
type promotionEntry struct {
	ev refresh.PromotionEvidence
}

// promotion answers P2 for the registry's answer digest of img in a group
// that follows a signer of another cluster: from what this process looked
// up before, or by reading the digest's referrers (V5's reader).
func (r *Runner) promotion(ctx context.Context, a *config.AttestedBy, img config.Image, digest string, kc func() authn.Keychain) refresh.PromotionEvidence {
	key := a.Policy.Name + "/" + a.Policy.Fingerprint() + "\x00" + img.Repository + "@" + digest
	now := r.now()
	if e, ok := r.memo().promoted.get(key); ok && (e.ev.Attested || now.Before(e.ev.Recheck)) {
		return e.ev
	}
	ev := refresh.PromotionEvidence{Digest: digest, Signer: a.Name}
	v, err := r.Resolver.Promotion(ctx, img.Repository, digest, a, kc())
	if err != nil {
		ev.Err = fmt.Errorf("look up the promotion attestation of %s@%s from %s: %w", img.Repository, digest, a.Name, err)
		return ev
	}
	ev.Attested, ev.Verdict = v.Attested(), v.String()
	ev.Rejected = !ev.Attested && len(v.Attestation.Rejected) > 0
	if ev.Attested {
		ev.At = v.Predicate.Time
		r.Log.Info("promotion attestation verified", "image", img.Name, "digest", img.Repository+"@"+digest, "signer", a.Name, "by", v.Attestation.By.Key)
	} else {
		ev.Recheck = now.Add(r.promotionRecheck())
	}
	r.memo().promoted.add(key, promotionEntry{ev: ev})
	return ev
}

// observePromotion looks up, for a group that follows a signer of another
// cluster (P2), the promotion attestation of img's new digest.
func (r *Runner) observePromotion(ctx context.Context, g config.Group, img config.Image, digest string, kc func() authn.Keychain, obs *refresh.Observation) {
	if g.Promotion == nil || g.Promotion.AttestedBy == nil || g.Promotion.AttestedBy.Policy == nil {
		return
	}
	if obs.Promotions == nil {
		obs.Promotions = map[string]refresh.PromotionEvidence{}
	}
	obs.Promotions[img.Name] = r.promotion(ctx, g.Promotion.AttestedBy, img, digest, kc)
}

// promoter is the signer of this installation's promotion attestations,
// parsed once.
func (r *Runner) promoter() (*verify.Promoter, error) {
	r.promoterOnce.Do(func() {
		r.promoterV, r.promoterErr = verify.NewPromoter(r.Config.PromotionSigning)
	})
	return r.promoterV, r.promoterErr
}

// publish signs and pushes the plan's promotion attestations (P2), each
// then recorded on the group's state so that it is published once. A
// failure is a WARN, an Event and a metric, and `run` tries again after
// publishRetry (a tick on its next run); it never holds the group.
func (r *Runner) publish(ctx context.Context, p *refresh.Plan, snap Snapshot) {
	keys := state.Keys{Prefix: r.Config.AnnotationPrefix}
	for _, pub := range p.Publish {
		img, ok := imageNamed(snap.Observation.Group, pub.Image)
		if !ok {
			continue
		}
		now := r.now()
		pred := verify.PromotionPredicate{Installation: r.Config.Installation, Group: p.Group, Image: pub.Image, Repository: pub.Repository,
			Soak: pub.Soak.String(), Since: pub.Since.UTC(), Time: now.UTC()}
		promoter, err := r.promoter()
		artifact := ""
		if err == nil {
			kc := r.keychain(ctx, img, snap.Objects, r.ServiceAccounts || snap.Observation.Group.Discovered)
			artifact, err = r.Resolver.PublishPromotion(ctx, pub.Repository, pub.Digest, promoter, pred, kc)
		}
		if err != nil {
			r.countPublish(p.Group, pub.Image, "failed")
			retry := now.Add(publishRetry)
			if p.WakeAt.IsZero() || retry.Before(p.WakeAt) {
				p.WakeAt = retry
			}
			p.Findings = append(p.Findings, refresh.Finding{Severity: refresh.SeverityWarn, Reason: refresh.ReasonPromotionPublishFailed, Image: pub.Image, Event: true,
				Message: fmt.Sprintf("group %s ran %s@%s settled and healthy for %s, and its promotion attestation could not be published: %v; tried again in %s (the group itself is not held)",
					p.Group, pub.Repository, pub.Digest, pub.Soak, err, publishRetry),
				Remediation: fmt.Sprintf("give image-refresh push rights on %s (that repository only: a pull secret or registry credential of its ServiceAccount), and check promotionSigning.keyFile; see docs/promotion.md#across-clusters-p2", pub.Repository)})
			continue
		}
		r.countPublish(p.Group, pub.Image, "published")
		value := pub.Digest + " " + now.UTC().Format(time.RFC3339)
		msg := fmt.Sprintf("published the promotion attestation of %s@%s (installation %s, group %s, soaked %s since %s) as referrer %s",
			pub.Repository, pub.Digest, r.Config.Installation, p.Group, pub.Soak, pub.Since.UTC().Format(time.RFC3339), artifact)
		if _, err := r.States().Update(ctx, p.Anchor, nil, map[string]*string{keys.Published(pub.Image): &value}); err != nil {
			msg += fmt.Sprintf("; recording it on %s failed (%v): the next pass publishes it again", p.Anchor, err)
		}
		p.Findings = append(p.Findings, refresh.Finding{Severity: refresh.SeverityInfo, Reason: refresh.ReasonPromotionPublished, Image: pub.Image, Message: msg})
		if anchor := snap.Objects[p.Anchor]; anchor != nil {
			r.event(ctx, anchor, "Normal", refresh.ReasonPromotionPublished, msg)
		}
	}
}

func imageNamed(g config.Group, name string) (config.Image, bool) {
	for _, img := range g.Images {
		if img.Name == name {
			return img, true
		}
	}
	return config.Image{}, false
}

func (r *Runner) countPublish(group, image, result string) {
	if r.Metrics != nil {
		r.Metrics.PromotionPublishes.WithLabelValues(group, image, result).Inc()
	}
}
