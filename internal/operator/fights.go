package operator

import (
	"sync"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
)

// fights remembers, per target, how often it was re-pinned after a revert
// in quick succession (C5). A target re-pinned MaxRounds times, each within
// Window of the previous, is left alone until Window passed since the last
// re-pin: something in the environment rewrites it and fighting would only
// churn ReplicaSets. The memory is not load-bearing: a restarted controller
// at worst fights a few more rounds before it stops again.
type fights struct {
	MaxRounds int
	Window    time.Duration

	mu sync.Mutex
	m  map[config.Target]*fight
}

type fight struct {
	rounds int
	last   time.Time
	writer string
}

// repinned records a revert re-pin of t; writer is the field manager that
// wrote the reverted value.
func (f *fights) repinned(t config.Target, writer string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[config.Target]*fight{}
	}
	e := f.m[t]
	if e == nil || at.Sub(e.last) > f.Window {
		e = &fight{}
		f.m[t] = e
	}
	e.rounds++
	e.last, e.writer = at, writer
}

// active returns the targets to leave alone now, with their writer.
func (f *fights) active(now time.Time) map[config.Target]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[config.Target]string{}
	for t, e := range f.m {
		if now.Sub(e.last) > f.Window {
			delete(f.m, t)
			continue
		}
		if e.rounds >= f.MaxRounds {
			out[t] = e.writer
		}
	}
	return out
}
