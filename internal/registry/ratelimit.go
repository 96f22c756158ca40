package registry

import (
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// RateLimit is what a registry said about its pull budget in the headers of
// its last answer: Docker Hub's "RateLimit-Limit: 100;w=21600" and
// "RateLimit-Remaining: 76;w=21600" (other registries send the same form).
type RateLimit struct {
	Limit     int
	Remaining int
	Window    time.Duration // the w= of the headers; 0 when not given
}

// parseRateLimit reads the two headers; ok is false when either is absent or
// does not parse.
func parseRateLimit(h http.Header) (RateLimit, bool) {
	limit, lw, ok1 := parseQuota(h.Get("RateLimit-Limit"))
	remaining, rw, ok2 := parseQuota(h.Get("RateLimit-Remaining"))
	if !ok1 || !ok2 {
		return RateLimit{}, false
	}
	w := rw
	if w == 0 {
		w = lw
	}
	return RateLimit{Limit: limit, Remaining: remaining, Window: w}, true
}

// parseQuota reads "76" or "76;w=21600".
func parseQuota(v string) (n int, window time.Duration, ok bool) {
	if v == "" {
		return 0, 0, false
	}
	parts := strings.Split(v, ";")
	n, err := strconv.Atoi(strings.TrimSpace(parts[0]))
	if err != nil || n < 0 {
		return 0, 0, false
	}
	for _, p := range parts[1:] {
		if s, found := strings.CutPrefix(strings.TrimSpace(p), "w="); found {
			if secs, err := strconv.Atoi(s); err == nil && secs > 0 {
				window = time.Duration(secs) * time.Second
			}
		}
	}
	return n, window, true
}

// budgets keeps, per registry host, the last rate limit it announced and the
// repository:tags polled on it, so that Pace can tell whether the remaining
// budget lasts (C2).
type budgets struct {
	mu    sync.Mutex
	hosts map[string]*hostBudget
}

type hostBudget struct {
	rl        RateLimit
	seen      bool
	refs      map[string]bool // repository:tag HEADed on this host
	stretched time.Duration   // the interval Pace last gave when stretched; 0 when not
}

func (b *budgets) host(h string) *hostBudget {
	if b.hosts == nil {
		b.hosts = map[string]*hostBudget{}
	}
	hb, ok := b.hosts[h]
	if !ok {
		hb = &hostBudget{refs: map[string]bool{}}
		b.hosts[h] = hb
	}
	return hb
}

// polled notes that ref (repository:tag) is polled on host.
func (b *budgets) polled(host, ref string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.host(host).refs[ref] = true
}

// record keeps the rate limit host announced.
func (b *budgets) record(host string, rl RateLimit) {
	b.mu.Lock()
	defer b.mu.Unlock()
	hb := b.host(host)
	hb.rl, hb.seen = rl, true
}

// Pace returns the interval to wait before polling repository again: the
// interval asked for, or longer when the registry's remaining budget would
// not last it. With N repository:tags polled on the registry every interval,
// a window w needs N×w/interval requests; when fewer remain, the polls of
// that registry are spread over the window instead: N×w/remaining (a whole
// window when none remain). A registry that sent no rate-limit headers, or
// no window, is not paced. The first stretch of a registry and its end are
// logged once each, and Options.OnPace reports the interval in force.
func (r *Resolver) Pace(repository string, interval time.Duration) time.Duration {
	host := registryHost(repository)
	r.budgets.mu.Lock()
	hb, ok := r.budgets.hosts[host]
	if !ok || !hb.seen || hb.rl.Window <= 0 || interval <= 0 {
		r.budgets.mu.Unlock()
		return interval
	}
	rl, n := hb.rl, len(hb.refs)
	if n == 0 {
		n = 1
	}
	paced := interval
	if need := float64(n) * float64(rl.Window) / float64(interval); float64(rl.Remaining) < need {
		paced = rl.Window
		if rl.Remaining > 0 {
			paced = time.Duration(float64(n) * float64(rl.Window) / float64(rl.Remaining))
		}
		if paced < interval {
			paced = interval
		}
	}
	was := hb.stretched
	if paced > interval {
		hb.stretched = paced
	} else {
		hb.stretched = 0
	}
	r.budgets.mu.Unlock()

	switch {
	case was == 0 && paced > interval:
		r.log.Warn("registry rate limit: the remaining budget would not last the poll interval; polling this registry less often until it recovers",
			"registry", host, "limit", rl.Limit, "remaining", rl.Remaining, "window", rl.Window.String(),
			"images", n, "interval", interval.String(), "stretchedInterval", paced.String())
	case was != 0 && paced == interval:
		r.log.Info("registry rate limit: budget recovered; polling at the configured interval again",
			"registry", host, "remaining", rl.Remaining, "interval", interval.String())
	}
	if r.onPace != nil {
		r.onPace(host, paced)
	}
	return paced
}

// discardLog is the logger of a Resolver built without Options.Log.
var discardLog = slog.New(slog.DiscardHandler)
