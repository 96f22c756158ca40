package poller

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/registry"
	"github.com/image-refresh/image-refresh/internal/testregistry"
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
