// Package state names the annotations image-refresh keeps on a group's
// anchor (SPEC "State") and reads their values fail-safe.
//
// With the prefix "tracebloc.io" the keys are exactly those of the seed's
// shell script, so an installation can switch without losing state.
package state

import (
	"fmt"
	"strconv"
	"strings"
)

// Keys builds annotation keys under one prefix.
type Keys struct{ Prefix string }

func (k Keys) key(name string) string { return k.Prefix + "/" + name }

// Record holds the digest last confirmed as rolled out for image.
func (k Keys) Record(image string) string { return k.key("last-refreshed-" + image + "-digest") }

// Attempt counts consecutive re-image attempts not yet confirmed settled (R10).
func (k Keys) Attempt() string { return k.key("refresh-attempt") }

// Flap is the lockout marker; its value is the attempt count (R10, R12).
func (k Keys) Flap() string { return k.key("refresh-flap-detected") }

// SkipStreak counts ticks skipped because the group was not settled (R4).
func (k Keys) SkipStreak() string { return k.key("refresh-skip-streak") }

// StalePin is the finding that the operator's pin is not the latest (R2).
func (k Keys) StalePin(image string) string { return k.key("stale-pin-" + image) }

// EverPinned marks an image that image-refresh has pinned before (R5).
func (k Keys) EverPinned(image string) string { return k.key("ever-pinned-" + image) }

// ReadFailures counts ticks whose live-image read of image failed (R7).
func (k Keys) ReadFailures(image string) string { return k.key("live-read-failure-streak-" + image) }

// ResolveFailures counts ticks whose registry resolve of image failed (R1).
func (k Keys) ResolveFailures(image string) string { return k.key("resolve-failure-streak-" + image) }

// ImageKeyNames lists the name parts (after "prefix/") of every per-image
// key, so that config validation can check they are legal annotation keys.
func ImageKeyNames(image string) []string {
	k := Keys{}
	var names []string
	for _, full := range []string{k.Record(image), k.StalePin(image), k.EverPinned(image), k.ReadFailures(image), k.ResolveFailures(image)} {
		names = append(names, strings.TrimPrefix(full, "/"))
	}
	return names
}

// MaxCounter bounds a counter value; anything larger is treated as invalid.
const MaxCounter = 1 << 20

// ParseCounter reads a counter annotation. Absent is 0. A value that is not
// a small non-negative integer is an error: callers treat it fail-safe (as
// at its ceiling), never as 0 — a corrupted attempt counter must not re-arm
// a locked-out group.
func ParseCounter(value string, present bool) (int, error) {
	if !present {
		return 0, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(value))
	if err != nil || n < 0 || n > MaxCounter {
		return 0, fmt.Errorf("invalid counter value %q (want an integer 0..%d)", value, MaxCounter)
	}
	return n, nil
}
