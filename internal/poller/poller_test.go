package poller

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/registry"
)

// These are unit tests of the scheduling logic with a counting Resolve; the
// real registry round trip is proven in internal/cli's run tests.

func img(repo, tag, name string) config.Image {
	return config.Image{Name: name, Repository: repo, Tag: tag}
}

func TestPoller_C2_OneAskPerRepoTagPerInterval(t *testing.T) {
	var calls sync.Map
	p := &Poller{Interval: 100 * time.Millisecond, Resolve: func(_ context.Context, i config.Image) (string, error) {
		n, _ := calls.LoadOrStore(Key(i), new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		return "sha256:" + string(make([]byte, 0)), nil
	}}
	// Three images, two sharing one repository:tag.
	p.Add(img("r/a", "prod", "a1"), img("r/a", "prod", "a2"), img("r/b", "prod", "b"))
	ctx, cancel := context.WithTimeout(context.Background(), 550*time.Millisecond)
	defer cancel()
	p.Run(ctx)
	for _, key := range []string{"r/a:prod", "r/b:prod"} {
		v, ok := calls.Load(key)
		if !ok {
			t.Fatalf("%s never polled", key)
		}
		if n := v.(*atomic.Int32).Load(); n < 5 || n > 7 {
			t.Errorf("%s polled %d times in 5.5 intervals, want 6±1", key, n)
		}
	}
}

func TestPoller_C2_BackoffHonoursRetryAfter(t *testing.T) {
	var n atomic.Int32
	p := &Poller{Interval: time.Hour, MinBackoff: 10 * time.Millisecond, Resolve: func(context.Context, config.Image) (string, error) {
		n.Add(1)
		return "", &registry.Error{Kind: registry.KindRateLimited, Status: 429, RetryAfter: 300 * time.Millisecond, Err: errors.New("429")}
	}}
	p.Add(img("r/a", "prod", "a"))
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	p.Run(ctx)
	if got := n.Load(); got != 2 {
		t.Errorf("%d asks in 500 ms with Retry-After 300 ms, want 2 (the backoff of 10 ms must yield to Retry-After)", got)
	}
}

func TestPoller_C2_FailuresBackOffExponentially(t *testing.T) {
	var n atomic.Int32
	p := &Poller{Interval: time.Hour, MinBackoff: 20 * time.Millisecond, Resolve: func(context.Context, config.Image) (string, error) {
		n.Add(1)
		return "", errors.New("connection refused")
	}}
	p.Add(img("r/a", "prod", "a"))
	ctx, cancel := context.WithTimeout(context.Background(), 330*time.Millisecond)
	defer cancel()
	p.Run(ctx)
	// Asks at 0, 20, 60, 140, 300 ms: 5 (a fixed 20 ms retry would be ~16).
	if got := n.Load(); got < 4 || got > 6 {
		t.Errorf("%d asks in 330 ms with backoff from 20 ms, want about 5", got)
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
	select {
	case k := <-changed:
		if k != "r/a:prod" {
			t.Errorf("change reported for %q", k)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a new digest was not reported")
	}
	if got := p.Latest(context.Background(), i, nil).Digest; got != "sha256:bbbb" {
		t.Errorf("Latest after the change %q", got)
	}
}
