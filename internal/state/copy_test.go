package state

import (
	"maps"
	"testing"
	"time"
)

func TestCurrent_R25_TheCopyWithTheHigherGenerationIsCurrent(t *testing.T) {
	k := Keys{Prefix: "p"}
	// The anchor after `kubectl rollout undo`: the annotations the older
	// ReplicaSet copied, generation and all, beside the operator's keys.
	rewound := map[string]string{
		"p/state-generation": "3", "p/last-refreshed-api-digest": "sha256:a",
		"p/refresh-attempt": "1", "p/refresh-attempt-holder": "tick-1 2026-12-01T10:00:00Z",
		"p/enabled": "true", "deployment.kubernetes.io/revision": "3", "team": "core",
	}
	// The copy as the last write left it.
	current := Copy{Present: true, Generation: 7, Values: map[string]string{
		"p/last-refreshed-api-digest": "sha256:b", "p/digest-changes-api": "2026-12-01T10:05:00Z",
		"p/locked-on-api": "sha256:c",
	}}
	for _, tc := range []struct {
		name        string
		anchor      map[string]string
		copied      Copy
		wantRewound bool
		want        map[string]string
		wantNext    uint64
	}{
		{
			name:   "a rollback rewound the anchor: the copy's state, the anchor's other keys kept",
			anchor: rewound, copied: current, wantRewound: true, wantNext: 8,
			want: map[string]string{
				"p/last-refreshed-api-digest": "sha256:b", "p/digest-changes-api": "2026-12-01T10:05:00Z", "p/locked-on-api": "sha256:c",
				"p/enabled": "true", "deployment.kubernetes.io/revision": "3", "team": "core", "p/state-generation": "7",
			},
		},
		{
			name:   "O1: the undo took the suspension off the anchor; the copy's suspension holds",
			anchor: map[string]string{"p/state-generation": "3", "p/last-refreshed-api-digest": "sha256:a"},
			copied: Copy{Present: true, Generation: 7, Values: map[string]string{
				"p/last-refreshed-api-digest": "sha256:b", "p/suspend": "true", "p/suspend-reason": "INC-77", "p/suspended-by": "image-refresh-suspend"}},
			wantRewound: true, wantNext: 8,
			want: map[string]string{"p/last-refreshed-api-digest": "sha256:b", "p/suspend": "true", "p/suspend-reason": "INC-77",
				"p/suspended-by": "image-refresh-suspend", "p/state-generation": "7"},
		},
		{
			name:        "O1: the undo brought back a suspension that a resume since ended; the copy's no suspension holds",
			anchor:      map[string]string{"p/state-generation": "3", "p/suspend": "true", "p/last-refreshed-api-digest": "sha256:a"},
			copied:      Copy{Present: true, Generation: 7, Values: map[string]string{"p/last-refreshed-api-digest": "sha256:b"}},
			wantRewound: true, wantNext: 8,
			want: map[string]string{"p/last-refreshed-api-digest": "sha256:b", "p/state-generation": "7"},
		},
		{
			name:     "O1: the suspension taken off a current anchor by hand: the removal stands (a resume)",
			anchor:   map[string]string{"p/state-generation": "7", "p/last-refreshed-api-digest": "sha256:b"},
			copied:   Copy{Present: true, Generation: 7, Values: map[string]string{"p/last-refreshed-api-digest": "sha256:b", "p/suspend": "true"}},
			wantNext: 8,
			want:     map[string]string{"p/state-generation": "7", "p/last-refreshed-api-digest": "sha256:b"},
		},
		{
			name:   "an installation from before the copies (no copy): the anchor stands",
			anchor: map[string]string{"p/last-refreshed-api-digest": "sha256:a", "p/refresh-attempt": "2"},
			want:   map[string]string{"p/last-refreshed-api-digest": "sha256:a", "p/refresh-attempt": "2"}, wantNext: 1,
		},
		{
			name:   "equal generations: the anchor stands, so that a hand edit of its annotations counts",
			anchor: map[string]string{"p/state-generation": "7", "p/last-refreshed-api-digest": "sha256:edited"},
			copied: current, wantNext: 8,
			want: map[string]string{"p/state-generation": "7", "p/last-refreshed-api-digest": "sha256:edited"},
		},
		{
			name:   "the anchor is newer (the copy's write failed): the anchor stands",
			anchor: map[string]string{"p/state-generation": "9", "p/last-refreshed-api-digest": "sha256:d"},
			copied: current, wantNext: 10,
			want: map[string]string{"p/state-generation": "9", "p/last-refreshed-api-digest": "sha256:d"},
		},
		{
			name:   "the anchor's generation does not parse: the copy is current",
			anchor: map[string]string{"p/state-generation": "seven", "p/last-refreshed-api-digest": "sha256:a"},
			copied: current, wantRewound: true, wantNext: 8,
			want: map[string]string{"p/last-refreshed-api-digest": "sha256:b", "p/digest-changes-api": "2026-12-01T10:05:00Z", "p/locked-on-api": "sha256:c", "p/state-generation": "7"},
		},
		{
			name:   "a copy that is not present (no valid generation) never wins",
			anchor: map[string]string{"p/last-refreshed-api-digest": "sha256:a"},
			copied: Copy{Values: map[string]string{"p/last-refreshed-api-digest": "sha256:b"}}, wantNext: 1,
			want: map[string]string{"p/last-refreshed-api-digest": "sha256:a"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := k.Current(tc.anchor, tc.copied)
			// A clock before every generation read: the next is one above.
			next := ch.Next(time.Unix(0, 0))
			if ch.Rewound != tc.wantRewound || !maps.Equal(ch.State, tc.want) || next != tc.wantNext {
				t.Errorf("Current = rewound %v, next %d, state %v\nwant rewound %v, next %d, state %v", ch.Rewound, next, ch.State, tc.wantRewound, tc.wantNext, tc.want)
			}
		})
	}
}

func TestNext_R25_AGenerationIsAboveEveryOneReadAndAboveAnyOlderWrite(t *testing.T) {
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		ch   Choice
		want uint64
	}{
		{"started over by hand (no generation left): the time, above any an old ReplicaSet holds", Choice{}, uint64(at.UnixMicro())},
		{"read a generation from the clock's past: the time", Choice{AnchorGeneration: 5, CopyGeneration: 7}, uint64(at.UnixMicro())},
		{"read one from a writer whose clock is ahead: one above it", Choice{AnchorGeneration: uint64(at.UnixMicro()) + 10, CopyGeneration: 3}, uint64(at.UnixMicro()) + 11},
	} {
		if got := tc.ch.Next(at); got != tc.want {
			t.Errorf("%s: Next = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestPatch_R25_RestoresARewoundAnchorInTheSameWrite(t *testing.T) {
	k := Keys{Prefix: "p"}
	anchor := map[string]string{"p/state-generation": "3", "p/last-refreshed-api-digest": "sha256:a", "p/refresh-attempt": "1", "team": "core"}
	ch := k.Current(anchor, Copy{Present: true, Generation: 7, Values: map[string]string{"p/last-refreshed-api-digest": "sha256:b", "p/digest-changes-api": "t1"}})
	b := "2"
	set := Patch(anchor, Apply(ch.State, map[string]*string{"p/refresh-skip-streak": &b}))
	got := map[string]string{}
	for key, v := range set {
		if v == nil {
			got[key] = "<delete>"
		} else {
			got[key] = *v
		}
	}
	want := map[string]string{
		"p/last-refreshed-api-digest": "sha256:b", "p/digest-changes-api": "t1", // restored
		"p/refresh-attempt":     "<delete>", // the attempt the rollback brought back
		"p/refresh-skip-streak": "2",        // the pass's own write
		"p/state-generation":    "7",        // the copy's; the caller sets Next
	}
	if !maps.Equal(got, want) {
		t.Errorf("Patch = %v\nwant %v", got, want)
	}
	if len(Patch(anchor, anchor)) != 0 {
		t.Errorf("Patch of an unchanged anchor is not empty")
	}
}

func TestCopied_R25_O1_TheKeysImageRefreshWritesAndTheSuspensionAreCopied(t *testing.T) {
	k := Keys{Prefix: "p"}
	for key, want := range map[string]bool{
		"p/last-refreshed-api-digest": true, "p/refresh-attempt": true, "p/refresh-attempt-holder": true,
		"p/digest-changes-api": true, "p/locked-on-api": true, "p/first-seen-api": true, "p/discovered-group": true,
		"p/state-generation": false,                                                 // kept apart
		"p/enabled":          false, "p/group": false, "p/ignore-containers": false, // the operator's
		"p/on-failed-rollout": false,
		"p/suspend":           true, "p/suspend-reason": true, // the operator's, Kept: a suspension outlives the undo it was set for (O1)
		"p/suspended-since": true, "p/suspended-by": true,
		"p/last-refreshed--digest": false, "q/refresh-attempt": false, "refresh-attempt": false, "p/something-else": false,
	} {
		if got := k.Copied(key); got != want {
			t.Errorf("Copied(%q) = %v, want %v", key, got, want)
		}
	}
	data := k.Data(map[string]string{"p/refresh-attempt": "1", "p/enabled": "true", "team": "core"}, 4)
	if want := map[string]string{"refresh-attempt": "1", "state-generation": "4"}; !maps.Equal(data, want) {
		t.Errorf("Data = %v, want %v", data, want)
	}
	back := k.FromData(data)
	if !back.Present || back.Generation != 4 || !maps.Equal(back.Values, map[string]string{"p/refresh-attempt": "1"}) {
		t.Errorf("FromData(Data(...)) = %+v", back)
	}
}
