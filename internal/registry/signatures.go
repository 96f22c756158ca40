package registry

import (
	"context"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/verify"
)

// Signatures verifies the signatures of repository@digest against policy
// (V1) through the repository's session: its credential, the host's
// transport and TLS settings, no hidden retries, bounded by one
// Options.Timeout for the whole lookup. A registry that could not be read
// is an *Error, a read failure like any other (R1's streak), never a
// verdict. Callers verify a digest once per policy, before it is first
// recorded or pinned, never per poll (C2).
func (r *Resolver) Signatures(ctx context.Context, repository, digest string, policy *config.VerificationPolicy, kc authn.Keychain) (verify.Verdict, error) {
	return read(ctx, r, repository, digest, kc, func(ctx context.Context, ref name.Digest, reuse remote.Option) (verify.Verdict, error) {
		return verify.Verify(ctx, ref, policy, reuse)
	})
}

// read runs f on repository@digest within one Options.Timeout, through the
// repository's session (reuse), and classifies what failed: a registry
// that could not be read is an *Error, never a verdict.
func read[T any](ctx context.Context, r *Resolver, repository, digest string, kc authn.Keychain, f func(context.Context, name.Digest, remote.Option) (T, error)) (T, error) {
	var zero T
	ref, route, err := r.digestRef(repository, digest)
	if err != nil {
		return zero, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	sess, err := r.puller(ctx, ref.Context(), route, kc)
	if err != nil {
		return zero, getFailure(ctx, ref.String(), err)
	}
	v, err := f(ctx, ref, remote.Reuse(sess.puller))
	r.settle(ref.Context(), sess, err)
	if err != nil {
		return v, getFailure(ctx, ref.String(), err)
	}
	return v, nil
}

// Promotion looks for repository@digest's promotion attestation from the
// signer of a follower (P2): V5's reader through the repository's session.
// A registry that cannot be read is an error (R1), never a verdict.
func (r *Resolver) Promotion(ctx context.Context, repository, digest string, a *config.AttestedBy, kc authn.Keychain) (verify.PromotionVerdict, error) {
	return read(ctx, r, repository, digest, kc, func(ctx context.Context, ref name.Digest, reuse remote.Option) (verify.PromotionVerdict, error) {
		return verify.VerifyPromotion(ctx, ref, a, reuse)
	})
}

// PublishPromotion signs and attaches repository@digest's promotion
// attestation (P2) with the credential kc gives the repository, which
// needs push rights there (and only there). It returns the digest of the
// attestation's manifest.
func (r *Resolver) PublishPromotion(ctx context.Context, repository, digest string, p *verify.Promoter, pred verify.PromotionPredicate, kc authn.Keychain) (string, error) {
	ref, route, err := r.digestRef(repository, digest)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	auth := authn.Anonymous
	if kc != nil {
		if auth, err = authn.Resolve(ctx, kc, ref.Context()); err != nil {
			return "", credentialError(ref.Context(), err)
		}
	}
	h, err := p.Publish(ctx, ref, pred, r.remoteOptions(route, auth)...)
	if err != nil {
		return "", getFailure(ctx, ref.String(), err)
	}
	return h.String(), nil
}
