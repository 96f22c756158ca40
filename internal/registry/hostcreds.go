package registry

import (
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"k8s.io/apimachinery/pkg/util/cache"
)

// hostCacheSize bounds the hosts whose credential is kept: the cloud
// registries of one installation's images, a handful.
const hostCacheSize = 64

// hostCredentials keeps a cloud keychain's credential per registry host
// until it is due for renewal: a lookup costs token exchanges with the
// cloud, so it runs once per host per reuse period; a failed lookup is not
// kept, so the next resolve asks again.
type hostCredentials struct {
	mu     sync.Mutex // one lookup at a time: the next one waits for the kept credential
	cached *cache.LRUExpireCache
	now    func() time.Time // time.Now unless a test sets it
}

// clockFunc is a func as the cache's clock.
type clockFunc func() time.Time

func (f clockFunc) Now() time.Time { return f() }

// get returns host's kept credential, or the one fetch returns, kept for
// reuse.
func (h *hostCredentials) get(host string, reuse time.Duration, fetch func() (authn.AuthConfig, error)) (authn.AuthConfig, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cached == nil {
		now := time.Now
		if h.now != nil {
			now = h.now
		}
		h.cached = cache.NewLRUExpireCacheWithClock(hostCacheSize, clockFunc(now))
	}
	if auth, ok := h.cached.Get(host); ok {
		return auth.(authn.AuthConfig), nil
	}
	auth, err := fetch()
	if err != nil {
		return authn.AuthConfig{}, err
	}
	h.cached.Add(host, auth, reuse)
	return auth, nil
}
