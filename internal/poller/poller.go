// Package poller asks the registry for the digest of every distinct
// repository:tag on an interval with jitter — once per interval however many
// groups and targets use it — backing off on failure and honouring
// Retry-After (C2). The controller reads its answers instead of
// calling the registry on every reconcile.
package poller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"k8s.io/utils/clock"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/refresh"
)

// Resolve asks the registry once; the poller calls it.
type Resolve func(ctx context.Context, img config.Image) (string, error)

// Poller keeps the latest answer for each repository:tag.
type Poller struct {
	Interval time.Duration
	Jitter   float64 // fraction of Interval, e.g. 0.1
	// MinBackoff is the first retry delay after a failure; it doubles up to
	// Interval.
	MinBackoff time.Duration
	Resolve    Resolve
	// OnChange is called with the key ("repository:tag") whose answer changed
	// (a new digest, or a failure starting or ending).
	OnChange func(key string)
	// Clock schedules the polls; nil is the real clock (tests inject a
	// fake one).
	Clock clock.Clock
	// Pace, if set, may stretch the wait after a successful poll of img,
	// e.g. when its registry's rate-limit budget would not last the interval
	// (registry.Resolver.Pace).
	Pace func(img config.Image, interval time.Duration) time.Duration

	mu      sync.Mutex
	entries map[string]*entry
	wake    chan struct{}
	running bool // Run is polling (the leader); Kick needs it
	// asks numbers the answers (Resolution.Ask) across every key, so that
	// an image removed and added again never reuses a number.
	asks uint64
}

type entry struct {
	img      config.Image
	res      refresh.Resolution
	polled   bool
	kicked   bool      // a push notification named it (Kick)
	kickAt   time.Time // when the kicked ask is due
	next     time.Time
	failures int
	inflight chan struct{} // closed when the running poll ends
}

// Key names an image's repository:tag.
func Key(img config.Image) string { return img.Repository + ":" + img.Tag }

// Add registers images to poll (duplicates by repository:tag are merged).
func (p *Poller) Add(imgs ...config.Image) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.entries == nil {
		p.entries = map[string]*entry{}
	}
	for _, img := range imgs {
		if _, ok := p.entries[Key(img)]; !ok {
			p.entries[Key(img)] = &entry{img: img}
		}
	}
}

// Remove stops polling the repository:tag of each of imgs: the caller
// removes an image once no group uses its repository:tag any more (a
// workload let go, a group no longer discovered, D1), so that the registry
// is not asked for it forever. An ask already running ends normally; its
// answer is dropped. Latest or Refresh of it later asks once and does not
// add it again: only Add does.
func (p *Poller) Remove(imgs ...config.Image) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, img := range imgs {
		delete(p.entries, Key(img))
	}
}

// Keys returns the repository:tag keys being polled.
func (p *Poller) Keys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.entries))
}

// Latest returns the last answer for img; before the first poll of an
// added image it polls once synchronously. It satisfies pass.Latest.
//
// An image that is not added (never, or removed because no group uses it
// any more) is asked once and not added: the caller is a pass of a group
// that discovery let go while the pass was queued or running, and adding
// the image back would have it polled with no group left to remove it
// (C2, D1).
func (p *Poller) Latest(ctx context.Context, img config.Image, _ func() authn.Keychain) refresh.Resolution {
	p.mu.Lock()
	e, ok := p.entries[Key(img)]
	polled := ok && e.polled
	var res refresh.Resolution
	if polled {
		res = e.res
	}
	p.mu.Unlock()
	switch {
	case !ok:
		return p.askOnce(ctx, img)
	case polled:
		return res
	}
	return p.poll(ctx, Key(img))
}

// Refresh asks the registry for img now (sharing an ask already running)
// and keeps the answer, as a due poll would. The reconciler calls it before
// re-imaging a target away from a digest it runs (pass.Refresher). An
// image that is not added is asked once and not added, as in Latest.
func (p *Poller) Refresh(ctx context.Context, img config.Image) refresh.Resolution {
	p.mu.Lock()
	_, ok := p.entries[Key(img)]
	p.mu.Unlock()
	if !ok {
		return p.askOnce(ctx, img)
	}
	return p.poll(ctx, Key(img))
}

// askOnce asks the registry for an image that is not polled; nothing is
// kept and no change is reported.
func (p *Poller) askOnce(ctx context.Context, img config.Image) refresh.Resolution {
	d, err := p.Resolve(ctx, img)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asks++
	return refresh.Resolution{Digest: d, Err: err, Ask: p.asks}
}

// Kick makes every registered image that match accepts due after the
// delay and wakes Run, without waiting for the ask: a push notification is
// a hint to ask the registry, never an answer (R1). The delay lets the
// registry finish the push (Distribution sends its event before it moves
// the tag). Kicks of one repository:tag coalesce: however many arrive, at
// most one ask is running and one more is pending, due after the delay of
// the first kick that made it pending. It returns the keys it made due,
// and false when Run is not polling (a standby replica), when nothing is
// made due.
func (p *Poller) Kick(match func(config.Image) bool, delay time.Duration) (keys []string, running bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running {
		return nil, false
	}
	at := p.now().Add(delay)
	for k, e := range p.entries {
		if match(e.img) {
			if !e.kicked {
				e.kicked, e.kickAt = true, at
			}
			keys = append(keys, k)
		}
	}
	if len(keys) > 0 {
		select {
		case p.wake <- struct{}{}:
		default: // a wake is pending already
		}
	}
	return keys, true
}

// Run polls every due entry until ctx ends.
func (p *Poller) Run(ctx context.Context) {
	p.mu.Lock()
	if p.wake == nil {
		p.wake = make(chan struct{}, 1)
	}
	p.running = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.running = false
		p.mu.Unlock()
	}()
	for {
		next := p.pollDue(ctx)
		t := p.clock().NewTimer(next.Sub(p.now()))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		case <-p.wake:
			t.Stop()
		}
	}
}

// pollDue polls each entry whose time has come and returns when the next
// one is due.
func (p *Poller) pollDue(ctx context.Context) time.Time {
	now := p.now()
	var due []string
	next := now.Add(p.Interval)
	p.mu.Lock()
	for k, e := range p.entries {
		kickDue := e.kicked && !e.kickAt.After(now)
		switch {
		case !e.polled || kickDue || !e.next.After(now):
			due = append(due, k)
		case e.kicked && e.kickAt.Before(next) && e.kickAt.Before(e.next):
			next = e.kickAt
		case e.next.Before(next):
			next = e.next
		}
	}
	p.mu.Unlock()
	for _, k := range due {
		if ctx.Err() != nil {
			break
		}
		p.poll(ctx, k)
		p.mu.Lock()
		if e := p.entries[k]; e != nil && e.next.Before(next) { // nil: removed meanwhile
			next = e.next
		}
		p.mu.Unlock()
	}
	return next
}

// poll asks the registry for one key and schedules the next ask: the
// interval with jitter after a success; after a failure the larger of the
// exponential backoff and the registry's Retry-After.
func (p *Poller) poll(ctx context.Context, key string) refresh.Resolution {
	p.mu.Lock()
	e := p.entries[key]
	if e == nil { // removed (Remove) since it was due or added
		p.mu.Unlock()
		return refresh.Resolution{Err: fmt.Errorf("%s is no longer polled", key)}
	}
	if wait := e.inflight; wait != nil {
		// One ask at a time per key: share the running one.
		p.mu.Unlock()
		<-wait
		p.mu.Lock()
		defer p.mu.Unlock()
		return e.res
	}
	done := make(chan struct{})
	e.inflight = done
	if e.kicked && !e.kickAt.After(p.now()) {
		e.kicked = false // this ask answers every kick that is due
	}
	img := e.img
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		e.inflight = nil
		p.mu.Unlock()
		close(done)
	}()

	d, err := p.Resolve(ctx, img)
	res := refresh.Resolution{Digest: d, Err: err}

	p.mu.Lock()
	p.asks++
	res.Ask = p.asks
	changed := !e.polled || e.res.Digest != res.Digest || (e.res.Err == nil) != (res.Err == nil)
	e.res, e.polled = res, true
	if err == nil {
		e.failures = 0
		wait := p.jittered()
		if p.Pace != nil {
			wait = p.Pace(img, wait)
		}
		e.next = p.now().Add(wait)
	} else {
		e.failures++
		e.next = p.now().Add(p.backoff(e.failures, err))
	}
	p.mu.Unlock()
	if changed && p.OnChange != nil {
		p.OnChange(key)
	}
	return res
}

func (p *Poller) jittered() time.Duration {
	if p.Jitter <= 0 {
		return p.Interval
	}
	f := 1 + p.Jitter*(2*rand.Float64()-1)
	return time.Duration(float64(p.Interval) * f)
}

func (p *Poller) backoff(failures int, err error) time.Duration {
	min := p.MinBackoff
	if min <= 0 {
		min = 5 * time.Second
	}
	d := min
	for i := 1; i < failures && d < p.Interval; i++ {
		d *= 2
	}
	if d > p.Interval {
		d = p.Interval
	}
	var ra retryAfter
	if errors.As(err, &ra) && ra.RetryAfterDelay() > d {
		d = ra.RetryAfterDelay()
	}
	return d
}

// retryAfter is a failure that says when to ask again: registry.Error
// carries a 429's or 503's Retry-After. An interface, so that the poller
// links no registry client and none of its verification (issue 39).
type retryAfter interface{ RetryAfterDelay() time.Duration }

func (p *Poller) now() time.Time { return p.clock().Now() }

func (p *Poller) clock() clock.Clock {
	if p.Clock != nil {
		return p.Clock
	}
	return clock.RealClock{}
}
