// Package registry resolves image tags to the digests a registry serves
// (R1) and proves that a registry holds a digest (R3, V4), with
// go-containerregistry doing the protocol and auth. Every call is bounded
// (R14), classified (Error, Kind) and free of credentials (R20). A steady
// poll costs one manifest HEAD: ping, token and connection live in a
// per-repository session (session.go); rate-limit headers pace the polls
// of their registry (ratelimit.go, C2). Credentials come from pull
// secrets, the docker config and its helpers, and the cloud's workload
// identity for ECR, GAR/GCR and ACR hosts (keychain.go); the pull secrets
// of the pods that run an image, and of their ServiceAccounts, are read and
// kept per image (pullsecrets.go).
package registry

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/image-refresh/image-refresh/internal/imageref"
)

// DefaultTimeout bounds one registry call when Options.Timeout is zero (R14).
const DefaultTimeout = 15 * time.Second

// HostConfig is the connection setting of one registry host.
type HostConfig struct {
	Host string // "registry.example.com" or "10.0.0.5:5000"; "docker.io" means Docker Hub
	// Insecure allows plain HTTP and accepts any TLS certificate.
	Insecure bool
	// CAFile is a PEM file of roots trusted in addition to the system's.
	CAFile string
}

// Options configures a Resolver.
type Options struct {
	Hosts     []HostConfig
	Timeout   time.Duration // per call, including auth (R14); 0 means DefaultTimeout
	UserAgent string
	// OnRequest, if set, is called once per manifest HEAD sent, with the HTTP
	// status (0 when no answer came), so a caller can count
	// image_refresh_registry_requests_total{registry,code}. It must be safe
	// for concurrent use.
	OnRequest func(host string, status int)
	// OnRateLimit, if set, is called with the rate limit a registry announced
	// in the headers of a manifest answer (RateLimit-Limit and
	// RateLimit-Remaining), for the image_refresh_registry_ratelimit_*
	// gauges. It must be safe for concurrent use.
	OnRateLimit func(host string, rl RateLimit)
	// OnPace, if set, is called by Pace with the poll interval in force for a
	// registry that announced a rate limit (C2).
	OnPace func(host string, interval time.Duration)
	// Log receives the one line a rate-limit stretch starts or ends with;
	// nil discards it.
	Log *slog.Logger
}

// Resolver asks registries for digests. It is safe for concurrent use.
type Resolver struct {
	timeout   time.Duration
	userAgent string
	hosts     map[string]hostRoute // by registry name as go-containerregistry spells it
	fallback  hostRoute
	sessions  sessions
	budgets   budgets
	onPace    func(host string, interval time.Duration)
	log       *slog.Logger
}

type hostRoute struct {
	insecure  bool
	transport http.RoundTripper
}

// NewResolver builds one transport per configured host and one for all other
// hosts; errors name the host and the file at fault.
func NewResolver(opts Options) (*Resolver, error) {
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("registry timeout %s: must not be negative", opts.Timeout)
	}
	r := &Resolver{
		timeout:   opts.Timeout,
		userAgent: opts.UserAgent,
		hosts:     map[string]hostRoute{},
		onPace:    opts.OnPace,
		log:       opts.Log,
	}
	if r.log == nil {
		r.log = discardLog
	}
	seen := &observed{budgets: &r.budgets, onRateLimit: opts.OnRateLimit, onRequest: opts.OnRequest}
	if r.timeout == 0 {
		r.timeout = DefaultTimeout
	}
	fallback, err := newHostTransport(HostConfig{})
	if err != nil {
		return nil, err
	}
	r.fallback = hostRoute{transport: &observer{inner: fallback, observed: seen}}
	for i, hc := range opts.Hosts {
		reg, err := name.NewRegistry(hc.Host)
		if err != nil || hc.Host == "" {
			return nil, fmt.Errorf("registry hosts[%d]: invalid host %q", i, hc.Host)
		}
		key := reg.RegistryStr()
		if _, dup := r.hosts[key]; dup {
			return nil, fmt.Errorf("registry hosts[%d]: host %q is configured twice", i, hc.Host)
		}
		t, err := newHostTransport(hc)
		if err != nil {
			return nil, fmt.Errorf("registry hosts[%d]: %w", i, err)
		}
		r.hosts[key] = hostRoute{insecure: hc.Insecure, transport: &observer{inner: t, observed: seen}}
	}
	return r, nil
}

// Latest returns the digest the registry serves for repository:tag now, from
// one manifest HEAD that accepts Docker v2 manifests and manifest lists and OCI
// manifests and indexes; for a multi-arch tag that is the index digest (R1).
// A Docker-Content-Digest that does not parse is an invalid-digest error,
// never a digest. A well-formed digest of another algorithm (sha512:<128 hex>)
// is accepted: R1 asks for algorithm:hex, and the pin stays verifiable.
// A nil keychain means anonymous. Errors are *Error.
func (r *Resolver) Latest(ctx context.Context, repository, tag string, kc authn.Keychain) (string, error) {
	s := repository + ":" + tag
	route := r.route(repository)
	ref, err := name.NewTag(s, route.nameOptions()...)
	if err != nil {
		return "", &Error{Ref: s, Kind: KindOther, Err: err}
	}
	r.budgets.polled(ref.RegistryStr(), s)
	return r.head(ctx, ref, route, kc)
}

// Has reports whether repository holds digest, from a HEAD of
// repository@digest: the proof R3 asks before a digest is pinned onto a
// reference another registry (a mirror) serves, and V4's check that a pinned
// digest is still pullable. It returns (false, nil) only on a definite 404
// (MANIFEST_UNKNOWN), and (false, err) when it could not tell (401, 429,
// 5xx, a timeout): never a false "gone".
func (r *Resolver) Has(ctx context.Context, repository, digest string, kc authn.Keychain) (bool, error) {
	ref, route, err := r.digestRef(repository, digest)
	if err != nil {
		return false, err
	}
	if _, err := r.head(ctx, ref, route, kc); err != nil {
		if e := Classify(err); e.Kind == KindNotFound {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// Verify GETs the manifest of repository:tag and checks that its content
// hashes to digest, the answer of Latest's HEAD. A registry whose HEAD names
// one digest while its GET serves other content (replicas or a cache that
// disagree, a proxy that rewrites manifests) is reported as an
// inconsistent-digest error, so that digest is never pinned blindly (R1).
// Callers verify a digest once, before it is first recorded or pinned: the
// steady state stays one HEAD per poll (C2).
func (r *Resolver) Verify(ctx context.Context, repository, tag, digest string, kc authn.Keychain) error {
	s := repository + ":" + tag
	want, err := v1.NewHash(digest)
	if err != nil {
		return &Error{Ref: s, Kind: KindInvalidDigest, Err: err}
	}
	route := r.route(repository)
	ref, err := name.NewTag(s, route.nameOptions()...)
	if err != nil {
		return &Error{Ref: s, Kind: KindOther, Err: err}
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	desc, err := r.get(ctx, ref, route, kc)
	if err != nil {
		return getFailure(ctx, s, fmt.Errorf("verify the HEAD's %s with a GET: %w", digest, err))
	}
	h, err := v1.Hasher(want.Algorithm)
	if err != nil {
		return &Error{Ref: s, Kind: KindInvalidDigest, Err: err}
	}
	h.Write(desc.Manifest)
	if got := want.Algorithm + ":" + hex.EncodeToString(h.Sum(nil)); got != digest {
		return &Error{Ref: s, Kind: KindInconsistent, Status: http.StatusOK,
			Err: fmt.Errorf("the HEAD answered %s, but the GET of the same tag serves a manifest whose digest is %s; not pinned", digest, got)}
	}
	return nil
}

// Platforms returns the digests of the platform manifests of
// repository@digest when it is an image index (a multi-arch pin), and nil
// for a single-platform manifest: a node runs one of them for a pin on the
// index, and its pod reports that one as its imageID (N1). One GET.
func (r *Resolver) Platforms(ctx context.Context, repository, digest string, kc authn.Keychain) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	desc, s, err := r.getDigest(ctx, repository, digest, kc, "")
	if err != nil {
		return nil, err
	}
	if !desc.MediaType.IsIndex() {
		return nil, nil
	}
	idx, err := desc.ImageIndex()
	if err != nil {
		return nil, &Error{Ref: s, Kind: KindOther, Err: err}
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, &Error{Ref: s, Kind: KindOther, Err: err}
	}
	out := make([]string, 0, len(m.Manifests))
	for _, d := range m.Manifests {
		out = append(out, d.Digest.String())
	}
	return out, nil
}

// getDigest GETs the manifest of repository@digest within ctx and returns
// it with the reference as errors name it; why says what the manifest is
// read for, in the error.
func (r *Resolver) getDigest(ctx context.Context, repository, digest string, kc authn.Keychain, why string) (*remote.Descriptor, string, error) {
	ref, route, err := r.digestRef(repository, digest)
	if err != nil {
		return nil, "", err
	}
	desc, err := r.get(ctx, ref, route, kc)
	if err != nil {
		return nil, ref.String(), getFailure(ctx, ref.String(), fmt.Errorf("read the manifest%s: %w", why, err))
	}
	return desc, ref.String(), nil
}

// digestRef parses repository@digest for the host's route.
func (r *Resolver) digestRef(repository, digest string) (name.Digest, hostRoute, error) {
	s := repository + "@" + digest
	if _, err := imageref.ParseDigest(digest); err != nil {
		return name.Digest{}, hostRoute{}, &Error{Ref: s, Kind: KindInvalidDigest, Err: err}
	}
	route := r.route(repository)
	ref, err := name.NewDigest(s, route.nameOptions()...)
	if err != nil {
		return name.Digest{}, hostRoute{}, &Error{Ref: s, Kind: KindOther, Err: err}
	}
	return ref, route, nil
}

// getFailure classifies a failed manifest GET of ref; err wraps the cause.
func getFailure(ctx context.Context, ref string, err error) *Error {
	e := Classify(err)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		e.Kind = KindTimeout
	}
	return &Error{Ref: ref, Kind: e.Kind, Status: e.Status, Err: err}
}

// registryHost names the registry of repository as go-containerregistry
// does (the key of Options.OnRequest and of rate limits).
func registryHost(repository string) string {
	repo, err := name.NewRepository(repository)
	if err != nil {
		return ""
	}
	return repo.RegistryStr()
}

func (r *Resolver) route(repository string) hostRoute {
	repo, err := name.NewRepository(repository)
	if err != nil {
		return r.fallback // the reference parse that follows reports it
	}
	if route, ok := r.hosts[repo.RegistryStr()]; ok {
		return route
	}
	return r.fallback
}

func (h hostRoute) nameOptions() []name.Option {
	if h.insecure {
		return []name.Option{name.Insecure}
	}
	return nil
}

// head sends one manifest HEAD within the timeout. go-containerregistry's
// retries are off: a failure is reported at once so the caller counts it (R1
// failure streak) and decides when to retry (C2).
func (r *Resolver) head(ctx context.Context, ref name.Reference, route hostRoute, kc authn.Keychain) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	state := &callState{}
	ctx = context.WithValue(ctx, callKey{}, state)

	var desc *v1.Descriptor
	sess, err := r.puller(ctx, ref.Context(), route, kc)
	if err == nil {
		desc, err = sess.puller.Head(ctx, ref)
		r.settle(ref.Context(), sess, err)
	}
	answer := state.answer()
	if err != nil {
		return "", r.failure(ctx, ref, answer, err)
	}
	d, err := imageref.ParseDigest(desc.Digest.String())
	if err != nil {
		return "", &Error{Ref: ref.String(), Kind: KindInvalidDigest, Status: answer.status, Err: err}
	}
	return d, nil
}

// get GETs the manifest of ref through the repository's session.
func (r *Resolver) get(ctx context.Context, ref name.Reference, route hostRoute, kc authn.Keychain) (*remote.Descriptor, error) {
	sess, err := r.puller(ctx, ref.Context(), route, kc)
	if err != nil {
		return nil, err
	}
	desc, err := sess.puller.Get(ctx, ref)
	r.settle(ref.Context(), sess, err)
	return desc, err
}

// remoteOptions are go-containerregistry's options for a session: through
// the host's transport, with one credential, without hidden retries. Each
// call brings its own context and timeout.
func (r *Resolver) remoteOptions(route hostRoute, auth authn.Authenticator) []remote.Option {
	opts := []remote.Option{
		remote.WithAuth(auth),
		remote.WithTransport(route.transport),
		remote.WithRetryBackoff(remote.Backoff{Steps: 1}),
		remote.WithRetryStatusCodes(),
		remote.WithRetryPredicate(func(error) bool { return false }),
	}
	if r.userAgent != "" {
		opts = append(opts, remote.WithUserAgent(r.userAgent))
	}
	return opts
}

// failure classifies a failed HEAD, adding what only the raw answer shows.
func (r *Resolver) failure(ctx context.Context, ref name.Reference, answer headAnswer, err error) *Error {
	e := &Error{Ref: ref.String(), Kind: kindOf(err), Err: err}
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		e.Kind = KindTimeout
	case answer.answered && answer.status == http.StatusOK:
		// ggcr refused a 200: say what was wrong with the digest (R1).
		e.Status = answer.status
		if kind, derr := digestProblem(ref, answer.digest); derr != nil {
			e.Kind, e.Err = kind, derr
		}
	case answer.answered:
		e.Status = answer.status
		if answer.status == http.StatusTooManyRequests || answer.status == http.StatusServiceUnavailable {
			e.RetryAfter = parseRetryAfter(answer.retryAfter, time.Now())
		}
	case e.Kind != KindTLS && e.Kind != KindNetwork:
		e.Status = Classify(err).Status // a failing ping or token request
	}
	return e
}

// digestProblem says why a 200 answer carries no usable digest: none, one
// that does not parse, or (for a HEAD by digest) another one than asked for.
// It returns a nil error when the digest header is fine.
func digestProblem(ref name.Reference, header string) (ErrorKind, error) {
	if header == "" {
		return KindInvalidDigest, errors.New("the answer has no Docker-Content-Digest header")
	}
	if _, err := imageref.ParseDigest(header); err != nil {
		return KindInvalidDigest, fmt.Errorf("Docker-Content-Digest: %w", err)
	}
	if d, ok := ref.(name.Digest); ok && d.DigestStr() != header {
		return KindInvalidDigest, fmt.Errorf("asked for %s, the registry answered %s", d.DigestStr(), header)
	}
	return "", nil
}
