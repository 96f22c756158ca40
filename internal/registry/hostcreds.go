package registry

import (
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
)

// hostCredentials keeps a cloud keychain's credential per registry host
// until it is due for renewal: a lookup costs token exchanges with the
// cloud, so it runs once per host per reuse period; a failed lookup is not
// kept, so the next resolve asks again.
type hostCredentials struct {
	mu     sync.Mutex
	cached map[string]renewable
	now    func() time.Time // time.Now unless a test sets it
}

type renewable struct {
	auth    authn.AuthConfig
	renewAt time.Time
}

// get returns host's kept credential, or the one fetch returns, kept for
// reuse.
func (h *hostCredentials) get(host string, reuse time.Duration, fetch func() (authn.AuthConfig, error)) (authn.AuthConfig, error) {
	now := time.Now
	if h.now != nil {
		now = h.now
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if c, ok := h.cached[host]; ok && now().Before(c.renewAt) {
		return c.auth, nil
	}
	auth, err := fetch()
	if err != nil {
		return authn.AuthConfig{}, err
	}
	if h.cached == nil {
		h.cached = map[string]renewable{}
	}
	h.cached[host] = renewable{auth: auth, renewAt: now().Add(reuse)}
	return auth, nil
}
