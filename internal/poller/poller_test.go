package poller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/registry"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

// These are unit tests of the scheduling logic with a counting Resolve; the
// real registry round trip is proven in test/e2e/run's tests.

func img(repo, tag, name string) config.Image {
	return config.Image{Name: name, Repository: repo, Tag: tag}
}

// fakeRun runs p.Run on a fake clock and returns a step
// function: it advances the clock by d and returns once Run has done what
// came due and waits again, so that every count after it is exact.
func fakeRun(t *testing.T, p *Poller) func(d time.Duration) {
	t.Helper()
	clk := newSignalClock(time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC))
	p.Clock = clk
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waiting := func() {
		t.Helper()
		testwait.Until(t, "the poller to wait on its clock", clk.changed, func() bool { return clk.Waiters() == 1 })
	}
	waiting() // the first polls are done
	return func(d time.Duration) {
		t.Helper()
		// The fake clock fires only waiters that exist when it steps: a
		// timer Run creates after the step, already due, would wait for
		// the next step. So step only while Run waits on its clock.
		waiting()
		clk.Step(d)
		waiting()
	}
}

// signalClock is a fake clock that announces each change of its waiters
// (a timer made or stopped), so that a test waits for Run to wait on it
// instead of polling Waiters.
type signalClock struct {
	*clocktesting.FakeClock
	mu sync.Mutex
	ch chan struct{}
}

func newSignalClock(at time.Time) *signalClock {
	return &signalClock{FakeClock: clocktesting.NewFakeClock(at), ch: make(chan struct{})}
}

// changed is closed at the next timer made or stopped.
func (c *signalClock) changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ch
}

func (c *signalClock) announce() {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.ch)
	c.ch = make(chan struct{})
}

func (c *signalClock) NewTimer(d time.Duration) clock.Timer {
	t := c.FakeClock.NewTimer(d)
	c.announce()
	return signalTimer{t, c}
}

type signalTimer struct {
	clock.Timer
	c *signalClock
}

func (t signalTimer) Stop() bool {
	stopped := t.Timer.Stop()
	t.c.announce()
	return stopped
}

func TestPoller_C2_OneAskPerRepoTagPerInterval(t *testing.T) {
	var calls sync.Map
	count := func(key string) int32 {
		v, ok := calls.Load(key)
		if !ok {
			return 0
		}
		return v.(*atomic.Int32).Load()
	}
	p := &Poller{Interval: time.Minute, Resolve: func(_ context.Context, i config.Image) (string, error) {
		n, _ := calls.LoadOrStore(Key(i), new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		return "sha256:" + string(make([]byte, 0)), nil
	}}
	// Three images, two sharing one repository:tag.
	p.Add(img("r/a", "prod", "a1"), img("r/a", "prod", "a2"), img("r/b", "prod", "b"))
	step := fakeRun(t, p)
	for i := int32(1); i <= 6; i++ {
		for _, key := range []string{"r/a:prod", "r/b:prod"} {
			if n := count(key); n != i {
				t.Fatalf("interval %d: %s asked %d times, want %d (once per interval per repository:tag)", i, key, n, i)
			}
		}
		step(time.Minute - time.Second)
		if n := count("r/a:prod"); n != i {
			t.Fatalf("asked again %s before the interval ended", time.Minute-time.Second)
		}
		step(time.Second)
	}
}

func TestPoller_C2_BackoffHonoursRetryAfter(t *testing.T) {
	var n atomic.Int32
	p := &Poller{Interval: time.Hour, MinBackoff: 10 * time.Millisecond, Resolve: func(context.Context, config.Image) (string, error) {
		n.Add(1)
		return "", &registry.Error{Kind: registry.KindRateLimited, Status: 429, RetryAfter: 300 * time.Millisecond, Err: errors.New("429")}
	}}
	p.Add(img("r/a", "prod", "a"))
	step := fakeRun(t, p)
	if got := n.Load(); got != 1 {
		t.Fatalf("%d asks at start, want 1", got)
	}
	step(10 * time.Millisecond) // the backoff alone would ask again now
	if got := n.Load(); got != 1 {
		t.Errorf("asked again after the 10 ms backoff; Retry-After 300 ms must win")
	}
	step(290 * time.Millisecond)
	if got := n.Load(); got != 2 {
		t.Errorf("%d asks once Retry-After passed, want 2", got)
	}
}

func TestPoller_C2_FailuresBackOffExponentially(t *testing.T) {
	var n atomic.Int32
	p := &Poller{Interval: time.Hour, MinBackoff: 20 * time.Millisecond, Resolve: func(context.Context, config.Image) (string, error) {
		n.Add(1)
		return "", errors.New("connection refused")
	}}
	p.Add(img("r/a", "prod", "a"))
	step := fakeRun(t, p)
	// Asks at 0, 20, 60, 140, 300 ms: the delay doubles from 20 ms.
	at := time.Duration(0)
	for i, next := range []time.Duration{20, 60, 140, 300} {
		next *= time.Millisecond
		step(next - at - time.Millisecond)
		if got := n.Load(); got != int32(i+1) {
			t.Fatalf("%d asks 1 ms before %s, want %d", got, next, i+1)
		}
		step(time.Millisecond)
		if got := n.Load(); got != int32(i+2) {
			t.Fatalf("%d asks at %s, want %d", got, next, i+2)
		}
		at = next
	}
}

func TestPoller_LatestAnswersFromTheLastPollAndReportsChanges(t *testing.T) {
	var digest atomic.Value
	digest.Store("sha256:aaaa")
	changed := make(chan string, 10)
	p := &Poller{Interval: 50 * time.Millisecond, Resolve: func(context.Context, config.Image) (string, error) {
		return digest.Load().(string), nil
	}, OnChange: func(k string) { changed <- k }}
	i := img("r/a", "prod", "a")
	p.Add(i)
	if got := p.Latest(context.Background(), i, nil).Digest; got != "sha256:aaaa" {
		t.Fatalf("first Latest %q", got)
	}
	<-changed
	ctx, cancel := context.WithCancel(context.Background())
	go p.Run(ctx)
	defer cancel()
	digest.Store("sha256:bbbb")
	if k := testwait.Recv(t, changed, "the new digest reported"); k != "r/a:prod" {
		t.Errorf("change reported for %q", k)
	}
	if got := p.Latest(context.Background(), i, nil).Digest; got != "sha256:bbbb" {
		t.Errorf("Latest after the change %q", got)
	}
}

// gatedResolve is a Resolve that reports each ask of a key when it starts
// and, while the key is held, waits for release before answering.
type gatedResolve struct {
	mu      sync.Mutex
	held    map[string]chan struct{}
	started map[string]chan struct{}
	asks    map[string]int
}

func newGatedResolve(keys ...string) *gatedResolve {
	g := &gatedResolve{held: map[string]chan struct{}{}, started: map[string]chan struct{}{}, asks: map[string]int{}}
	for _, k := range keys {
		g.started[k] = make(chan struct{}, 100)
	}
	return g
}

func (g *gatedResolve) resolve(_ context.Context, i config.Image) (string, error) {
	g.mu.Lock()
	g.asks[Key(i)]++
	hold := g.held[Key(i)]
	g.mu.Unlock()
	g.started[Key(i)] <- struct{}{}
	if hold != nil {
		<-hold
	}
	return "sha256:" + fmt.Sprintf("%064x", 1), nil
}

func (g *gatedResolve) hold(key string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := make(chan struct{})
	g.held[key] = c
	return c
}

func (g *gatedResolve) release(key string, c chan struct{}) {
	g.mu.Lock()
	delete(g.held, key)
	g.mu.Unlock()
	close(c)
}

func (g *gatedResolve) count(key string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.asks[key]
}

func waitStarted(t *testing.T, g *gatedResolve, key string) {
	t.Helper()
	testwait.Recv(t, g.started[key], "an ask of "+key+" to start")
}

func TestPoller_Kick_AsksNowAndAFloodCostsOneAskInFlightPlusOnePending(t *testing.T) {
	g := newGatedResolve("r/a:prod", "r/b:prod")
	p := &Poller{Interval: time.Hour, Resolve: g.resolve}
	p.Add(img("r/a", "prod", "a"), img("r/b", "prod", "b"))
	fakeRun(t, p) // the first asks of both are done; the next are an hour away
	waitStarted(t, g, "r/a:prod")
	waitStarted(t, g, "r/b:prod")

	isA := func(i config.Image) bool { return Key(i) == "r/a:prod" }
	gate := g.hold("r/a:prod")
	if keys, running := p.Kick(isA, 0); !running || len(keys) != 1 || keys[0] != "r/a:prod" {
		t.Fatalf("Kick = %v, %v; want [r/a:prod], true", keys, running)
	}
	waitStarted(t, g, "r/a:prod") // asked now, not in an hour
	for range 100 {               // a flood while that ask runs
		p.Kick(isA, 0)
	}
	g.release("r/a:prod", gate)
	waitStarted(t, g, "r/a:prod") // the one pending ask
	// A barrier: b's ask starts only after a's pending ask ended, since Run
	// polls one due key at a time and a's kicks all came before it started.
	p.Kick(func(i config.Image) bool { return Key(i) == "r/b:prod" }, 0)
	waitStarted(t, g, "r/b:prod")
	if n := g.count("r/a:prod"); n != 3 {
		t.Errorf("r/a:prod asked %d times, want 3: the first poll, the kicked one, and one for the whole flood", n)
	}
}

func TestPoller_Kick_AsksOnlyOnceTheDelayHasPassed(t *testing.T) {
	g := newGatedResolve("r/a:prod", "r/b:prod")
	var askedAt atomic.Value
	p := &Poller{Interval: time.Hour}
	p.Resolve = func(ctx context.Context, i config.Image) (string, error) {
		if Key(i) == "r/a:prod" {
			askedAt.Store(p.now())
		}
		return g.resolve(ctx, i)
	}
	p.Add(img("r/a", "prod", "a"), img("r/b", "prod", "b"))
	step := fakeRun(t, p)
	waitStarted(t, g, "r/a:prod")
	waitStarted(t, g, "r/b:prod")
	kickedAt := p.now()
	p.Kick(func(i config.Image) bool { return Key(i) == "r/a:prod" }, 500*time.Millisecond)
	// Two asks of b, each kicked after the previous one started, so the
	// pass that saw a's kick has ended: a must not have been asked.
	for range 2 {
		p.Kick(func(i config.Image) bool { return Key(i) == "r/b:prod" }, 0)
		waitStarted(t, g, "r/b:prod")
	}
	if n := g.count("r/a:prod"); n != 1 {
		t.Fatalf("r/a:prod asked %d times before the delay passed, want 1 (the first poll)", n)
	}
	step(500 * time.Millisecond)
	waitStarted(t, g, "r/a:prod")
	if at := askedAt.Load().(time.Time); at.Sub(kickedAt) < 500*time.Millisecond {
		t.Errorf("asked %s after the kick, want at least the 500ms delay", at.Sub(kickedAt))
	}
}

func TestPoller_Kick_OnAStandbyReportsNotRunning(t *testing.T) {
	p := &Poller{Interval: time.Hour, Resolve: func(context.Context, config.Image) (string, error) {
		t.Error("a standby asked the registry")
		return "", nil
	}}
	p.Add(img("r/a", "prod", "a"))
	if keys, running := p.Kick(func(config.Image) bool { return true }, 0); running || len(keys) != 0 {
		t.Errorf("Kick without Run = %v, %v; want nothing kicked and not running", keys, running)
	}
}

// R1: every answer carries the number of the ask that gave it, so that the
// controller counts a failed ask once however many passes read it.
func TestPoller_R1_EachAnswerNamesTheAskThatGaveIt(t *testing.T) {
	var asks atomic.Int32
	p := &Poller{Interval: time.Hour, Resolve: func(context.Context, config.Image) (string, error) {
		asks.Add(1)
		return "", errors.New("503 Service Unavailable")
	}}
	i := img("r/a", "prod", "a")
	p.Add(i)
	ctx := context.Background()
	first := p.Latest(ctx, i, nil)
	again := p.Latest(ctx, i, nil)
	if asks.Load() != 1 {
		t.Fatalf("%d asks for two reads of the answer, want 1", asks.Load())
	}
	if first.Ask == 0 || again.Ask != first.Ask {
		t.Errorf("re-reading one answer gave asks %d and %d, want one nonzero number", first.Ask, again.Ask)
	}
	next := p.Refresh(ctx, i)
	if asks.Load() != 2 {
		t.Fatalf("%d asks after Refresh, want 2", asks.Load())
	}
	if next.Ask == first.Ask || next.Ask == 0 {
		t.Errorf("a new ask's answer is numbered %d, the first's %d: want a new number", next.Ask, first.Ask)
	}
	if got := p.Latest(ctx, i, nil); got.Ask != next.Ask {
		t.Errorf("Latest after Refresh is ask %d, want %d", got.Ask, next.Ask)
	}
}

// TestPoller_C2_D1_ARemovedImageIsNoLongerAsked: once the image of a
// workload let go is removed, the registry is not asked for its
// repository:tag again, while the others still are.
func TestPoller_C2_D1_ARemovedImageIsNoLongerAsked(t *testing.T) {
	var mu sync.Mutex
	asks := map[string]int{}
	count := func(key string) int {
		mu.Lock()
		defer mu.Unlock()
		return asks[key]
	}
	p := &Poller{Interval: time.Minute, Resolve: func(_ context.Context, i config.Image) (string, error) {
		mu.Lock()
		asks[Key(i)]++
		mu.Unlock()
		return "sha256:" + fmt.Sprintf("%064x", 1), nil
	}}
	gone, kept := img("r/gone", "prod", "gone"), img("r/kept", "prod", "kept")
	p.Add(gone, kept)
	step := fakeRun(t, p)
	step(time.Minute)
	// The poller ran: both were asked at start and after one interval.
	for _, k := range []string{"r/gone:prod", "r/kept:prod"} {
		if n := count(k); n != 2 {
			t.Fatalf("%s asked %d times after one interval, want 2", k, n)
		}
	}
	// onlyKeptIsPolled steps three intervals after what: r/kept:prod is
	// asked once each (from keptAsks on), r/gone:prod stays at goneAsks,
	// and only r/kept:prod is polled.
	onlyKeptIsPolled := func(what string, keptAsks, goneAsks int) {
		t.Helper()
		for i := range 3 {
			step(time.Minute)
			if n := count("r/kept:prod"); n != keptAsks+i {
				t.Fatalf("interval %d after %s: r/kept:prod asked %d times, want %d", i+1, what, n, keptAsks+i)
			}
			if n := count("r/gone:prod"); n != goneAsks {
				t.Fatalf("interval %d after %s: the removed r/gone:prod is polled again (%d asks, want %d)", i+1, what, n, goneAsks)
			}
		}
		if got := p.Keys(); len(got) != 1 || got[0] != "r/kept:prod" {
			t.Errorf("polled keys after %s: %v, want [r/kept:prod]", what, got)
		}
	}
	p.Remove(gone)
	onlyKeptIsPolled("Remove", 3, 2)
	// A pass of the group let go that was still queued reads the image:
	// each read asks once and answers, and the image is not polled again.
	if got := p.Latest(context.Background(), gone, nil); got.Err != nil || got.Digest == "" {
		t.Fatalf("Latest of the removed image = %+v, want an answer", got)
	}
	if got := p.Refresh(context.Background(), gone); got.Err != nil || got.Digest == "" {
		t.Fatalf("Refresh of the removed image = %+v, want an answer", got)
	}
	if n := count("r/gone:prod"); n != 4 {
		t.Fatalf("Latest and Refresh of the removed image asked %d times in all, want 4 (2 + one each)", n)
	}
	onlyKeptIsPolled("the late reads", 6, 4)
}
