package pass

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/refresh"
)

// An unverified digest is looked up again after unverifiedRecheck, doubling
// up to unverifiedRecheckMax: a build is often signed a little after it is
// pushed, and a poll may see it in between. A verified digest is never
// looked up again (digests are immutable).
const (
	unverifiedRecheck    = time.Minute
	unverifiedRecheckMax = time.Hour
)

// signedEntry is one remembered lookup of repository@digest under a policy.
type signedEntry struct {
	v       refresh.Verification
	recheck time.Time     // an unverified answer's next lookup
	backoff time.Duration // the wait after that one
}

// signatures answers V1 for the registry's answer digest of img under
// policy: from what this process looked up before, from the anchor's memo
// (memo, state.Keys.Verified: a verified digest survives a restart), or by
// looking its signatures up. A registry that could not be read is an error
// (a read failure, R1), never a verdict.
func (r *Runner) signatures(ctx context.Context, policy *config.VerificationPolicy, img config.Image, digest, memo string, kc func() authn.Keychain) (refresh.Verification, error) {
	id := policy.Name + "/" + policy.Fingerprint()
	want := refresh.Verification{Policy: policy.Name, Digest: digest, Memo: id + "@" + digest}
	if memo == want.Memo {
		want.Verified, want.Verdict = true, "verified earlier (kept on the anchor)"
		return want, nil
	}
	key := id + "\x00" + img.Repository + "@" + digest
	now := r.now()
	e, seen := r.memo().signed.get(key)
	if seen && (e.v.Verified || now.Before(e.recheck)) {
		return e.v, nil
	}
	verdict, err := r.Resolver.Signatures(ctx, img.Repository, digest, policy, kc())
	if err != nil {
		r.countVerification(policy.Name, "error")
		return refresh.Verification{}, fmt.Errorf("look up the signatures of %s@%s (verification policy %s): %w", img.Repository, digest, policy.Name, err)
	}
	want.Verified, want.Verdict = verdict.Verified, verdict.String()
	want.Attestations = strings.Join(verdict.Unsatisfied(), ", ")
	prev := e
	e = signedEntry{v: want}
	if verdict.Verified {
		r.countVerification(policy.Name, "verified")
		r.Log.Info("signature verified", "image", img.Name, "digest", img.Repository+"@"+digest, "policy", policy.Name, "by", verdict.By.String())
	} else {
		r.countVerification(policy.Name, "unverified")
		e.backoff = unverifiedRecheck
		if seen {
			e.backoff = min(2*prev.backoff, unverifiedRecheckMax)
		}
		e.recheck = now.Add(e.backoff)
	}
	r.memo().signed.add(key, e)
	return want, nil
}

func (r *Runner) countVerification(policy, result string) {
	if r.Metrics != nil {
		r.Metrics.Verifications.WithLabelValues(policy, result).Inc()
	}
}

func (r *Runner) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}
