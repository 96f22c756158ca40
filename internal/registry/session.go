package registry

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// sessions keeps one go-containerregistry Puller per repository and
// credential, reused across calls, ticks and polls (C2): the GET /v2/ ping,
// the token exchange and the scheme probe of an insecure host happen when
// the Puller is made, not per call, and its transport keeps connections
// alive. An expired or revoked token is refreshed by the Puller's bearer
// transport on the registry's 401 challenge; a call that still fails as
// unauthorized, or on the network or TLS, drops the session so that the next
// call pings and authenticates afresh.
type sessions struct {
	mu sync.Mutex
	m  map[string]*session // by registry/repository; one credential each
}

type session struct {
	fingerprint [sha256.Size]byte // of the credential the Puller was made with
	puller      *remote.Puller
}

// puller returns the session of repo for the credential kc gives it, making
// one when there is none or the credential changed (a rotated pull secret, a
// helper's refreshed token). Only a SHA-256 of the credential is kept beside
// the Puller (R20).
func (r *Resolver) puller(ctx context.Context, repo name.Repository, route hostRoute, kc authn.Keychain) (*session, error) {
	auth := authn.Anonymous
	if kc != nil {
		a, err := authn.Resolve(ctx, kc, repo)
		if err != nil {
			return nil, credentialError(repo, err)
		}
		auth = a
	}
	cfg, err := authn.Authorization(ctx, auth)
	if err != nil {
		return nil, credentialError(repo, err)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("read credentials for %s: %w", repo.RegistryStr(), err)
	}
	fp := sha256.Sum256(raw)
	key := repo.Name()

	r.sessions.mu.Lock()
	defer r.sessions.mu.Unlock()
	if s, ok := r.sessions.m[key]; ok && s.fingerprint == fp {
		return s, nil
	}
	p, err := remote.NewPuller(r.remoteOptions(route, authn.FromConfig(*cfg))...)
	if err != nil {
		return nil, err
	}
	s := &session{fingerprint: fp, puller: p}
	if r.sessions.m == nil {
		r.sessions.m = map[string]*session{}
	}
	r.sessions.m[key] = s
	return s, nil
}

// credentialError reports a keychain that failed (a credential helper that
// exited non-zero, an unreadable docker config). The docker credential
// helper client puts the helper's whole output into its error ("err: exit
// status 1, out: `...`"); that output is cut off, since a broken helper can
// print a secret there (R20).
func credentialError(repo name.Repository, err error) error {
	msg := err.Error()
	if i := strings.Index(msg, ", out:"); i >= 0 {
		msg = msg[:i] + " (helper output withheld)"
	}
	return fmt.Errorf("find credentials for %s: %s", repo.RegistryStr(), msg)
}

// settle drops s after a failure that a fresh ping and token might cure.
func (r *Resolver) settle(repo name.Repository, s *session, err error) {
	if err == nil {
		return
	}
	switch Classify(err).Kind {
	case KindUnauthorized, KindNetwork, KindTLS:
	default:
		return
	}
	r.sessions.mu.Lock()
	defer r.sessions.mu.Unlock()
	if r.sessions.m[repo.Name()] == s {
		delete(r.sessions.m, repo.Name())
	}
}
