package state

import (
	"strconv"
	"strings"
	"time"
)

// The group's state lives in two places (R25): the anchor's annotations,
// which operators read and the seed's script wrote, and a copy that
// image-refresh keeps in an object of its own (internal/statestore: a
// ConfigMap beside the anchor). Kubernetes copies a Deployment's
// annotations into each new ReplicaSet, and `kubectl rollout undo` puts an
// older ReplicaSet's copy back on the Deployment: the anchor's state
// rewound, an old attempt and holder brought back, churn history, lockout
// and quarantine lost. No rollback reaches the copy. Every write numbers
// the state (Generation) on both; the copy with the higher number is
// current.

// Copied reports whether annotation is a key of the group's state that the
// copy keeps: a key under the prefix that image-refresh writes (ScopeGroup,
// ScopeImage, ScopeMarker) or an operator's key marked Kept (the
// suspension, O1), and not the generation, which the copy keeps apart.
func (k Keys) Copied(annotation string) bool {
	name, ok := strings.CutPrefix(annotation, k.Prefix+"/")
	if !ok || name == table[generation].Name {
		return false
	}
	return copiedName(name)
}

// copiedName reports whether name (the text after "P/") is a copied key.
func copiedName(name string) bool {
	for _, e := range table {
		switch e.Scope {
		case ScopeGroup, ScopeMarker:
			if name == e.Name {
				return true
			}
		case ScopeOperator:
			if e.Kept && name == e.Name {
				return true
			}
		case ScopeImage:
			pre, suf, _ := strings.Cut(e.Name, imagePlaceholder)
			if len(name) > len(pre)+len(suf) && strings.HasPrefix(name, pre) && strings.HasSuffix(name, suf) {
				return true
			}
		}
	}
	return false
}

// Copy is one copy of a group's state: the copied keys (full annotation
// keys) and the generation they were written under.
type Copy struct {
	// Present: the copy exists (an anchor always does; the ConfigMap may
	// not yet, before the first write after an upgrade).
	Present    bool
	Generation uint64
	Values     map[string]string
}

// FromAnnotations is the anchor's copy: its copied keys and generation. A
// generation that does not parse is 0: the other copy, if any, is then
// current, and the next write numbers both again.
func (k Keys) FromAnnotations(ann map[string]string) Copy {
	c := Copy{Present: true, Values: map[string]string{}}
	for key, v := range ann {
		if k.Copied(key) {
			c.Values[key] = v
		}
	}
	c.Generation = parseGeneration(ann[k.Generation()])
	return c
}

// DataGeneration is the key of the generation in the copy's data.
const DataGeneration = "state-generation"

// FromData reads the copy's data: the names after "P/" as keys (a
// ConfigMap's keys cannot hold the "/"), and DataGeneration. A key that is
// not a copied key is ignored. A copy without a valid generation is not
// Present: it cannot be ordered against the anchor, which then stands.
func (k Keys) FromData(data map[string]string) Copy {
	c := Copy{Values: map[string]string{}}
	c.Generation = parseGeneration(data[DataGeneration])
	c.Present = c.Generation > 0
	for name, v := range data {
		if name != DataGeneration && copiedName(name) {
			c.Values[k.Prefix+"/"+name] = v
		}
	}
	return c
}

// Data renders the copied keys of state with generation as the copy's
// data (FromData reads it).
func (k Keys) Data(state map[string]string, generation uint64) map[string]string {
	data := map[string]string{DataGeneration: strconv.FormatUint(generation, 10)}
	for key, v := range state {
		if k.Copied(key) {
			data[strings.TrimPrefix(key, k.Prefix+"/")] = v
		}
	}
	return data
}

func parseGeneration(s string) uint64 {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// Choice is which copy of a group's state is current.
type Choice struct {
	// State is the anchor's annotations with the current copy's state:
	// what a pass decides on.
	State map[string]string
	// Rewound: the copy is newer than the anchor, whose state a rollback
	// (or another writer restoring old metadata) put back; State is the
	// copy's, and the next write restores the anchor.
	Rewound bool
	// AnchorGeneration and CopyGeneration are the generations read; the
	// next write is above the higher (Next).
	AnchorGeneration, CopyGeneration uint64
}

// Next is the generation of a write at now: the time in microseconds
// since 1970, or one above the higher generation read if that is more.
// One above keeps the generations increasing whatever the writers' clocks
// say; the time keeps them above those an old ReplicaSet may still hold
// after the state was started over by hand (the generation and the copy
// deleted), which a counter starting at 1 again would not be.
func (c Choice) Next(now time.Time) uint64 {
	return max(max(c.AnchorGeneration, c.CopyGeneration)+1, uint64(max(now.UnixMicro(), 0)))
}

// Current chooses between the anchor's annotations and the copy (R25): the
// copy when it is present and its generation is higher than the anchor's,
// else the anchor. Equal generations keep the anchor, so that a hand edit
// of its annotations (which leaves the generation alone) stands, and an
// installation that has no copy yet keeps its state (the first write
// creates the copy from the anchor).
func (k Keys) Current(anchor map[string]string, copied Copy) Choice {
	own := k.FromAnnotations(anchor)
	ch := Choice{State: anchor, AnchorGeneration: own.Generation}
	if copied.Present {
		ch.CopyGeneration = copied.Generation
	}
	if !copied.Present || copied.Generation <= own.Generation {
		return ch
	}
	st := make(map[string]string, len(anchor)+len(copied.Values))
	for key, v := range anchor {
		if !k.Copied(key) && key != k.Generation() {
			st[key] = v
		}
	}
	for key, v := range copied.Values {
		st[key] = v
	}
	st[k.Generation()] = strconv.FormatUint(copied.Generation, 10)
	ch.State, ch.Rewound = st, true
	return ch
}

// Apply returns state with set applied (nil deletes a key); state is not
// changed.
func Apply(state map[string]string, set map[string]*string) map[string]string {
	out := make(map[string]string, len(state)+len(set))
	for key, v := range state {
		out[key] = v
	}
	for key, v := range set {
		if v == nil {
			delete(out, key)
		} else {
			out[key] = *v
		}
	}
	return out
}

// Patch is the annotation write that makes have what want says: a value
// for each key that differs, nil for each key want lacks (want is a
// Choice's State with a write applied, so it holds every key of the
// anchor that was neither deleted nor rewound). Empty when nothing
// differs.
func Patch(have, want map[string]string) map[string]*string {
	set := map[string]*string{}
	for key, v := range want {
		if got, ok := have[key]; !ok || got != v {
			set[key] = &v
		}
	}
	for key := range have {
		if _, ok := want[key]; !ok {
			set[key] = nil
		}
	}
	return set
}
