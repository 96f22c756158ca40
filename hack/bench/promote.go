package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/internal/state"
)

// promoteSoak is the promote phase's soak: long enough that the follower's
// move is the timer's doing, short enough for a bench.
const promoteSoak = 5 * time.Second

// measurePromote: the end of a leader's soak → every target of its
// follower changed (P1), in one cluster. A leader group of 5 and a
// follower group of 20 one-replica Deployments (kwok pods) track one
// repo:tag; the follower follows the leader with a soak of promoteSoak.
// Per push, the bench reads the leader's soak clock from its anchor (the
// soak ends at its start plus the soak, as the engine reckons it) and
// takes from a watch the moment the follower's last target is on the new
// digest. `run` requeues the follower for the soak's end (a timer), so
// the figure is the timer's lateness plus one pass, not a poll interval.
func measurePromote(ctx context.Context, w *world, pushes int) ([]row, error) {
	leader, _, digest, err := w.pinnedGroup(ctx, "bench-promote-staging", "promote", "s", 5)
	if err != nil {
		return nil, err
	}
	leader.name = "staging"
	follower := group{name: "production", ns: "bench-promote-prod", image: leader.image, targets: names("p", 20), promotion: fmt.Sprintf("{after: %s, soak: %s}", leader.name, promoteSoak)}
	if err := w.createGroup(ctx, follower, digest); err != nil {
		return nil, err
	}
	gs := []group{leader, follower}
	first := digest
	b, err := w.startIdle(ctx, gs, ctlOptions{pollInterval: time.Second, pollJitter: 0, config: "maxDigestChanges: 1000\n"},
		func(group) string { return first })
	if err != nil {
		return nil, err
	}
	defer b.stop()
	late, fromPush, err := promoteSeries(ctx, w, leader, follower, pushes, "promote", "the soak ended",
		func(digest string) (time.Time, error) { return soakEndOf(ctx, w, leader, digest) })
	if err != nil {
		return nil, err
	}
	n := fmt.Sprint(len(late))
	return []row{
		{"soak end → all 20 follower targets changed (P1, one cluster)", fmtSeconds(late.median()), span(late), n,
			fmt.Sprintf("the leader's soak clock (its anchor's soak annotation) + soak %s → the follower's last stored spec on the digest (watch); leader 5, follower 20 one-replica Deployments, --poll-interval 1s", promoteSoak)},
		{"  push → all follower targets changed", fmtSeconds(fromPush.median()), span(fromPush), n,
			"the poll, the leader's rollout settling, its first healthy pass starting the clock, the soak, the follower's pass"},
	}, nil
}

// createGroup creates g's namespace and its one-replica Deployments,
// pinned to digest of its image, and waits until they settled.
func (w *world) createGroup(ctx context.Context, g group, digest string) error {
	if err := w.namespace(ctx, g.ns); err != nil {
		return err
	}
	var ds []*appsv1.Deployment
	for _, t := range g.targets {
		ds = append(ds, deployment(g.ns, t, w.repo(g.image)+":prod@"+digest))
	}
	if err := w.createDeployments(ctx, ds, 4); err != nil {
		return err
	}
	return w.waitSettled(ctx, []string{g.ns}, nil, 2*time.Minute)
}

// promoteSeries pushes new digests of leader's image, one after the other,
// and for each takes from a watch the moment every target of follower is
// on it, and from due the moment its promotion became due (the soak's
// end, the publication). It returns, per push, due → all changed and
// push → all changed, and waits for both groups to be idle again.
func promoteSeries(ctx context.Context, w *world, leader, follower group, pushes int, phase, dueWhat string, due func(digest string) (time.Time, error)) (fromDue, fromPush sample, err error) {
	for i := range pushes {
		list, err := w.kube.AppsV1().Deployments(follower.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, nil, err
		}
		digest, err := w.push(leader.image)
		if err != nil {
			return nil, nil, err
		}
		pushed := time.Now()
		all, err := waitAllOn(ctx, w, follower, list, "@"+digest)
		if err != nil {
			return nil, nil, fmt.Errorf("push %d: %s: %w", i+1, follower.name, err)
		}
		at, err := due(digest)
		if err != nil {
			return nil, nil, fmt.Errorf("push %d: %w", i+1, err)
		}
		if all.Before(at.Truncate(time.Second)) {
			return nil, nil, fmt.Errorf("push %d: %s moved %s before %s", i+1, follower.name, at.Sub(all), dueWhat)
		}
		fromDue = append(fromDue, all.Sub(at).Seconds())
		fromPush = append(fromPush, all.Sub(pushed).Seconds())
		progress("%s: push %d: %s %s after the push, %s's %d targets changed %s after that",
			phase, i+1, dueWhat, fmtSeconds(at.Sub(pushed).Seconds()), follower.name, len(follower.targets), fmtSeconds(all.Sub(at).Seconds()))
		for _, g := range []group{leader, follower} {
			if err := w.waitSettled(ctx, []string{g.ns}, onDigest(digest), 5*time.Minute); err != nil {
				return nil, nil, err
			}
			if err := waitIdle(ctx, w, g.ns, g, "@"+digest); err != nil {
				return nil, nil, err
			}
		}
	}
	return fromDue, fromPush, nil
}

// soakEndOf reads when the leader's soak of digest ended, as the engine
// reckons it: the clock's start on the leader's anchor plus the soak.
func soakEndOf(ctx context.Context, w *world, leader group, digest string) (time.Time, error) {
	keys := state.Keys{Prefix: prefix}
	d, err := w.kube.AppsV1().Deployments(leader.ns).Get(ctx, leader.targets[0], metav1.GetOptions{})
	if err != nil {
		return time.Time{}, err
	}
	v, err := state.ParseSoak(d.Annotations[keys.Soak(leader.image)])
	if err != nil {
		return time.Time{}, fmt.Errorf("the leader's soak clock: %w", err)
	}
	if v.Digest != digest {
		return time.Time{}, fmt.Errorf("the leader's soak clock runs for %s, want %s", v.Digest, digest)
	}
	return v.Since.Add(promoteSoak), nil
}

// measurePromoteAcross: a promotion attestation published by one
// installation → every target of a group of another installation that
// follows it changed (P2). Two controllers, each with a config of its own
// (installation staging, which publishes after a soak of promoteSoak; and
// installation production, which follows staging's signed attestations
// with soak 0s), share nothing but the registry: that each runs against
// its own namespaces of one API server instead of a cluster of its own
// changes nothing of the path measured (registry → poll → attestation
// lookup → pass → patches). Per push, the publication time is read from
// staging's anchor (P/published-<image>) and the end from a watch of
// production's 20 Deployments.
func measurePromoteAcross(ctx context.Context, w *world, pushes int) ([]row, error) {
	keyFile, pubFile, err := writeKeyPair(w.runDir, "staging-promotion")
	if err != nil {
		return nil, err
	}
	staging, _, digest, err := w.pinnedGroup(ctx, "bench-across-staging", "across", "s", 5)
	if err != nil {
		return nil, err
	}
	staging.name = "staging"
	staging.promotion = fmt.Sprintf("{publish: {soak: %s}}", promoteSoak)
	prod := group{name: "production", ns: "bench-across-prod", image: staging.image, targets: names("p", 20),
		promotion: fmt.Sprintf("{attestedBy: {name: staging, cosign: {publicKeys: [%s]}}, soak: 0s}", pubFile)}
	if err := w.createGroup(ctx, prod, digest); err != nil {
		return nil, err
	}
	first := digest
	opts := ctlOptions{pollInterval: time.Second, pollJitter: 0}
	opts.config = fmt.Sprintf("maxDigestChanges: 1000\ninstallation: staging\npromotionSigning: {keyFile: %s}\n", keyFile)
	a, err := w.startIdle(ctx, []group{staging}, opts, func(group) string { return first })
	if err != nil {
		return nil, fmt.Errorf("installation staging: %w", err)
	}
	defer a.stop()
	opts.config = "maxDigestChanges: 1000\ninstallation: production\n"
	b, err := w.startIdle(ctx, []group{prod}, opts, func(group) string { return first })
	if err != nil {
		return nil, fmt.Errorf("installation production: %w", err)
	}
	defer b.stop()
	fromPublish, fromPush, err := promoteSeries(ctx, w, staging, prod, pushes, "promote-across", "published",
		func(digest string) (time.Time, error) { return publishedAt(ctx, w, staging, digest) })
	if err != nil {
		return nil, err
	}
	n := fmt.Sprint(len(fromPublish))
	return []row{
		{"attestation published → all 20 targets of the other installation changed (P2)", fmtSeconds(fromPublish.median()), span(fromPublish), n,
			"staging's record of the publication (P/published-<image>, whole seconds) → production's last stored spec on the digest (watch); production saw the digest at its poll, found no attestation yet, and looks again 30 s later (the recheck bounds this figure)"},
		{"  push → all 20 targets of the other installation changed", fmtSeconds(fromPush.median()), span(fromPush), n,
			fmt.Sprintf("the poll, staging's rollout and soak of %s, the signed push, production's recheck and pass", promoteSoak)},
	}, nil
}

// publishedAt reads when the leader published digest's promotion
// attestation, from its anchor.
func publishedAt(ctx context.Context, w *world, leader group, digest string) (time.Time, error) {
	keys := state.Keys{Prefix: prefix}
	d, err := w.kube.AppsV1().Deployments(leader.ns).Get(ctx, leader.targets[0], metav1.GetOptions{})
	if err != nil {
		return time.Time{}, err
	}
	got, at, err := state.ParsePublished(d.Annotations[keys.Published(leader.image)])
	if err != nil {
		return time.Time{}, fmt.Errorf("the leader's publication record: %w", err)
	}
	if got != digest {
		return time.Time{}, fmt.Errorf("the leader published %s, want %s", got, digest)
	}
	return at, nil
}

// writeKeyPair writes an ECDSA P-256 key pair (PKCS#8 PEM) into dir.
func writeKeyPair(dir, prefix string) (keyFile, pubFile string, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return "", "", err
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		return "", "", err
	}
	keyFile, pubFile = filepath.Join(dir, prefix+".key"), filepath.Join(dir, prefix+".pub")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return "", "", err
	}
	return keyFile, pubFile, os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600)
}
