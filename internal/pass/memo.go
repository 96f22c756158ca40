package pass

import (
	"k8s.io/utils/lru"

	"github.com/image-refresh/image-refresh/internal/refresh"
)

// memoSize bounds each memo of a Runner: digests are immutable, so an
// answer about one can be reused for the life of the process, but new
// digests keep coming (a busy tag moves many times a day, for years). The
// least recently used answer goes first; one forgotten is asked again, as
// on a restart. 4096 answers are a few hundred KiB at most, and more than
// the digests a large installation keeps pinned.
const memoSize = 4096

// memo is a bounded, concurrency-safe memo of the answers a Runner reuses
// (k8s.io/utils/lru, typed).
type memo[K comparable, V any] struct{ c *lru.Cache }

func newMemo[K comparable, V any](size int) *memo[K, V] {
	return &memo[K, V]{c: lru.New(size)}
}

func (m *memo[K, V]) get(k K) (V, bool) {
	v, ok := m.c.Get(k)
	if !ok {
		var zero V
		return zero, false
	}
	return v.(V), true
}

func (m *memo[K, V]) add(k K, v V) { m.c.Add(k, v) }

// memos are the Runner's memos of registry answers, made on first use.
type memos struct {
	verified  *memo[string, string]             // repository:tag → the digest verify last proved
	signed    *memo[string, signedEntry]        // policy, repository@digest → its signatures' lookup (V1, V5)
	mirrored  *memo[string, bool]               // repository@digest the mirror proved it holds (R3)
	indexes   *memo[string, []string]           // repository@digest → its platform digests (N1)
	served    *memo[string, []refresh.Platform] // digest → the platforms it serves (V3)
	pinChecks *memo[refresh.PinRef, pinChecked] // V4's last answer per pinned digest, and when it was asked
	promoted  *memo[string, promotionEntry]     // signer, repository@digest → its promotion attestation's lookup (P2)
}

// memo returns the Runner's memos.
func (r *Runner) memo() *memos {
	r.memoOnce.Do(func() {
		r.memos = &memos{
			verified:  newMemo[string, string](memoSize),
			signed:    newMemo[string, signedEntry](memoSize),
			mirrored:  newMemo[string, bool](memoSize),
			indexes:   newMemo[string, []string](memoSize),
			served:    newMemo[string, []refresh.Platform](memoSize),
			pinChecks: newMemo[refresh.PinRef, pinChecked](memoSize),
			promoted:  newMemo[string, promotionEntry](memoSize),
		}
	})
	return r.memos
}
