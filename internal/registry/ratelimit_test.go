package registry

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

func rateLimitHeader(limit, remaining string) http.Header {
	h := http.Header{}
	h.Set("RateLimit-Limit", limit)
	h.Set("RateLimit-Remaining", remaining)
	return h
}

func TestParseRateLimit(t *testing.T) {
	for _, tc := range []struct {
		limit, remaining string
		want             RateLimit
		ok               bool
	}{
		{"100;w=21600", "76;w=21600", RateLimit{100, 76, 6 * time.Hour}, true},
		{"100", "0", RateLimit{100, 0, 0}, true},
		{"", "5", RateLimit{}, false},
		{"100;w=60", "many", RateLimit{}, false},
		{"100;w=60", "-1", RateLimit{}, false},
	} {
		got, ok := parseRateLimit(rateLimitHeader(tc.limit, tc.remaining))
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseRateLimit(%q, %q) = %+v, %v; want %+v, %v", tc.limit, tc.remaining, got, ok, tc.want, tc.ok)
		}
	}
}

func TestLatest_C2_RateLimitHeadersAreReported(t *testing.T) {
	s := testregistry.Start(t)
	s.MustPushRandomImage(t, "acme/api", "prod")
	var (
		mu  sync.Mutex
		got []RateLimit
	)
	r := newResolver(t, Options{OnRateLimit: func(host string, rl RateLimit) {
		mu.Lock()
		defer mu.Unlock()
		if host != s.Host() {
			t.Errorf("OnRateLimit host %q, want %q", host, s.Host())
		}
		got = append(got, rl)
	}})
	repo := s.Host() + "/acme/api"
	if _, err := r.Latest(context.Background(), repo, "prod", nil); err != nil {
		t.Fatal(err)
	}
	s.SetFault(testregistry.Fault{Method: http.MethodHead, Header: rateLimitHeader("100;w=21600", "76;w=21600")})
	if _, err := r.Latest(context.Background(), repo, "prod", nil); err != nil {
		t.Fatal(err)
	}
	s.SetFault(testregistry.Fault{Method: http.MethodHead, Status: 429, Header: rateLimitHeader("100;w=21600", "0;w=21600")})
	if _, err := r.Latest(context.Background(), repo, "prod", nil); err == nil {
		t.Fatal("Latest on a 429 succeeded")
	}
	mu.Lock()
	defer mu.Unlock()
	want := []RateLimit{{100, 76, 6 * time.Hour}, {100, 0, 6 * time.Hour}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("OnRateLimit got %+v, want %+v (none for the answer without headers)", got, want)
	}
}

func TestPace_C2_StretchesARegistryWhoseBudgetWouldNotLastAndSaysSoOnce(t *testing.T) {
	s := testregistry.Start(t)
	s.MustPushRandomImage(t, "acme/api", "prod")
	s.MustPushRandomImage(t, "acme/web", "prod")
	var logs bytes.Buffer
	var paced []time.Duration
	r := newResolver(t, Options{
		Log:    slog.New(slog.NewTextHandler(&logs, nil)),
		OnPace: func(_ string, d time.Duration) { paced = append(paced, d) },
	})
	api, web := s.Host()+"/acme/api", s.Host()+"/acme/web"
	if got := r.Pace(api, time.Minute); got != time.Minute {
		t.Fatalf("Pace before any rate-limit header = %s, want the interval", got)
	}
	resolveBoth := func(remaining string) {
		t.Helper()
		s.SetFault(testregistry.Fault{Method: http.MethodHead, Header: rateLimitHeader("200;w=3600", remaining+";w=3600")})
		for _, repo := range []string{api, web} {
			if _, err := r.Latest(context.Background(), repo, "prod", nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Two tags every minute need 2×60 = 120 requests an hour: 150 last.
	resolveBoth("150")
	if got := r.Pace(api, time.Minute); got != time.Minute {
		t.Fatalf("Pace with 150 of 120 needed = %s, want 1m", got)
	}
	// 30 left: spread the two tags over the hour, 2×3600/30 = 240 s.
	resolveBoth("30")
	for range 3 {
		if got := r.Pace(api, time.Minute); got != 4*time.Minute {
			t.Fatalf("Pace with 30 of 120 needed = %s, want 4m", got)
		}
	}
	// None left: a whole window.
	resolveBoth("0")
	if got := r.Pace(web, time.Minute); got != time.Hour {
		t.Fatalf("Pace with none left = %s, want 1h", got)
	}
	resolveBoth("200")
	if got := r.Pace(api, time.Minute); got != time.Minute {
		t.Fatalf("Pace after recovery = %s, want 1m", got)
	}
	out := logs.String()
	if n := strings.Count(out, "would not last"); n != 1 {
		t.Errorf("%d stretch lines, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, "budget recovered"); n != 1 {
		t.Errorf("%d recovery lines, want 1:\n%s", n, out)
	}
	want := []time.Duration{time.Minute, 4 * time.Minute, 4 * time.Minute, 4 * time.Minute, time.Hour, time.Minute}
	if len(paced) != len(want) {
		t.Fatalf("OnPace got %v, want %v", paced, want)
	}
	for i := range want {
		if paced[i] != want[i] {
			t.Fatalf("OnPace got %v, want %v", paced, want)
		}
	}
}
