package poller

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/registry"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// The poller against the real test registry: a steady poll of one
// repository:tag costs one manifest HEAD per interval and nothing else — no
// ping, no token, no new connection (C2).
func TestPoller_C2_SteadyPollIsOneHeadPerIntervalOnTheRegistry(t *testing.T) {
	s := testregistry.Start(t, testregistry.WithTokenAuth("", ""))
	want := s.MustPushRandomImage(t, "acme/api", "prod")
	res, err := registry.NewResolver(registry.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p := &Poller{Interval: time.Minute, Resolve: func(ctx context.Context, img config.Image) (string, error) {
		return res.Latest(ctx, img.Repository, img.Tag, registry.Keychain())
	}}
	// Twenty targets of one repository:tag.
	for i := range 20 {
		p.Add(img(s.Host()+"/acme/api", "prod", "t"+string(rune('a'+i))))
	}
	step := fakeRun(t, p)
	count := func() (pings, tokens, heads int) {
		for _, r := range s.Requests() {
			switch {
			case r.Method == http.MethodGet && r.Path == "/v2/":
				pings++
			case r.Path == testregistry.TokenPath:
				tokens++
			case r.Method == http.MethodHead:
				heads++
			}
		}
		return
	}
	pings, tokens, heads := count()
	if pings != 1 || tokens != 1 || heads != 1 {
		t.Fatalf("first poll: %d pings, %d tokens, %d HEADs; want 1 each", pings, tokens, heads)
	}
	conns := s.Conns()
	const intervals = 5
	for i := 1; i <= intervals; i++ {
		step(time.Minute)
	}
	p2, t2, h2 := count()
	if p2 != pings || t2 != tokens || h2 != heads+intervals || s.Conns() != conns {
		t.Fatalf("%d intervals cost %d pings, %d tokens, %d HEADs, %d new connections; want 0, 0, %d, 0",
			intervals, p2-pings, t2-tokens, h2-heads, s.Conns()-conns, intervals)
	}
	if got := p.Latest(context.Background(), img(s.Host()+"/acme/api", "prod", "ta"), nil); got.Digest != want {
		t.Fatalf("Latest = %+v, want %s", got, want)
	}
}

// A registry whose rate-limit budget would not last the interval is polled
// less often (C2): 2 requests left in an hour for one tag polled every
// minute stretch the wait to 30 minutes.
func TestPoller_C2_RateLimitedRegistryIsPolledLessOften(t *testing.T) {
	s := testregistry.Start(t)
	s.MustPushRandomImage(t, "acme/api", "prod")
	h := http.Header{}
	h.Set("RateLimit-Limit", "100;w=3600")
	h.Set("RateLimit-Remaining", "2;w=3600")
	s.SetFault(testregistry.Fault{Method: http.MethodHead, Header: h})
	res, err := registry.NewResolver(registry.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p := &Poller{
		Interval: time.Minute,
		Resolve: func(ctx context.Context, img config.Image) (string, error) {
			return res.Latest(ctx, img.Repository, img.Tag, nil)
		},
		Pace: func(img config.Image, d time.Duration) time.Duration { return res.Pace(img.Repository, d) },
	}
	p.Add(img(s.Host()+"/acme/api", "prod", "api"))
	step := fakeRun(t, p)
	heads := func() int { return s.Count(http.MethodHead, "/manifests/prod") }
	if n := heads(); n != 1 {
		t.Fatalf("first poll: %d HEADs, want 1", n)
	}
	for range 29 {
		step(time.Minute)
	}
	if n := heads(); n != 1 {
		t.Fatalf("after 29 minutes: %d HEADs, want still 1 (the wait is stretched to 30m)", n)
	}
	step(time.Minute)
	if n := heads(); n != 2 {
		t.Fatalf("after 30 minutes: %d HEADs, want 2", n)
	}
}
