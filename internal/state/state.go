// Package state names the annotations image-refresh keeps on a group's
// anchor (docs/annotations.md), and the labels discovery reads, in one table; it
// reads their values fail-safe.
//
// With the prefix "tracebloc.io" the keys are exactly those of the seed's
// shell script, so an installation can switch without losing state.
package state

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Scope says where a key of the table lives and what it is kept per.
type Scope int

const (
	// ScopeGroup: on the anchor, one per group. The name carries no group
	// name, which is why two groups may not share an anchor (R10).
	ScopeGroup Scope = iota + 1
	// ScopeImage: on the anchor, one per image of the group; "<image>" in
	// the name stands for the image's name.
	ScopeImage
	// ScopeMarker: on the anchor of a group that discovery found (D1).
	ScopeMarker
	// ScopeOperator: a label or annotation the operator writes on
	// workloads and namespaces (discovery's, D1; an anchor's suspension,
	// O1); a pass never decides it, and letting a workload go keeps it.
	// Only the operator (by hand, GitOps, or the suspend and resume
	// commands) sets or removes the suspension; a pass puts it back only
	// when a rollback took it off the anchor (Key.Kept, R25).
	ScopeOperator
)

// Key is one entry of the table: the text after "P/", where it lives, and
// whether `rearm` deletes it.
type Key struct {
	Name  string
	Scope Scope
	// Rearm: `image-refresh rearm` deletes it (R18; R21's hold and R23's
	// quarantine end with the lockout).
	Rearm bool
	// Kept: an operator's key that the copy of the state keeps all the
	// same (R25 with O1): a suspension must survive the `rollout undo` it
	// was set for, which puts the annotations of a ReplicaSet made before
	// it back on the anchor.
	Kept bool
}

// key names an entry of the table.
type key int

const (
	record key = iota
	attempt
	holder
	flap
	skipStreak
	stalePin
	everPinned
	readFailures
	resolveFailures
	pinCheckFailures
	digestChanges
	firstSeen
	lockedOn
	verified
	rolledBack
	tagFlapping
	soak
	published
	suspendedSince
	suspendedBy
	generation
	discoveredGroup
	enabled
	discoveryGroup
	ignoreContainers
	onFailedRollout
	suspend
	suspendReason
)

// table is every key under the prefix, the only list of them: the Keys
// methods and every list below (config validation, rearm, let-go, the
// discovery watch) read it. The order is the order of those lists.
var table = [...]Key{
	record:           {Name: "last-refreshed-<image>-digest", Scope: ScopeImage},
	attempt:          {Name: "refresh-attempt", Scope: ScopeGroup, Rearm: true},
	holder:           {Name: "refresh-attempt-holder", Scope: ScopeGroup, Rearm: true},
	flap:             {Name: "refresh-flap-detected", Scope: ScopeGroup, Rearm: true},
	skipStreak:       {Name: "refresh-skip-streak", Scope: ScopeGroup},
	stalePin:         {Name: "stale-pin-<image>", Scope: ScopeImage},
	everPinned:       {Name: "ever-pinned-<image>", Scope: ScopeImage},
	readFailures:     {Name: "live-read-failure-streak-<image>", Scope: ScopeImage},
	resolveFailures:  {Name: "resolve-failure-streak-<image>", Scope: ScopeImage},
	pinCheckFailures: {Name: "pin-check-failure-streak-<image>", Scope: ScopeImage},
	digestChanges:    {Name: "digest-changes-<image>", Scope: ScopeImage, Rearm: true},
	firstSeen:        {Name: "first-seen-<image>", Scope: ScopeImage},
	lockedOn:         {Name: "locked-on-<image>", Scope: ScopeImage, Rearm: true},
	verified:         {Name: "verified-<image>", Scope: ScopeImage},
	rolledBack:       {Name: "rolled-back-<image>", Scope: ScopeImage, Rearm: true},
	tagFlapping:      {Name: "tag-flapping-<image>", Scope: ScopeImage, Rearm: true},
	soak:             {Name: "soak-<image>", Scope: ScopeImage},
	published:        {Name: "published-<image>", Scope: ScopeImage},
	suspendedSince:   {Name: "suspended-since", Scope: ScopeGroup},
	suspendedBy:      {Name: "suspended-by", Scope: ScopeGroup},
	generation:       {Name: "state-generation", Scope: ScopeGroup},
	discoveredGroup:  {Name: "discovered-group", Scope: ScopeMarker},
	enabled:          {Name: "enabled", Scope: ScopeOperator},
	discoveryGroup:   {Name: "group", Scope: ScopeOperator},
	ignoreContainers: {Name: "ignore-containers", Scope: ScopeOperator},
	onFailedRollout:  {Name: "on-failed-rollout", Scope: ScopeOperator},
	suspend:          {Name: "suspend", Scope: ScopeOperator, Kept: true},
	suspendReason:    {Name: "suspend-reason", Scope: ScopeOperator, Kept: true},
}

// Table returns every key under the prefix, in the table's order.
func Table() []Key { return slices.Clone(table[:]) }

// imagePlaceholder stands for the image's name in a ScopeImage key.
const imagePlaceholder = "<image>"

// NameFor is the key's name (the text after "P/") for image; image is
// ignored by a key that is not per image.
func (k Key) NameFor(image string) string {
	if k.Scope != ScopeImage {
		return k.Name
	}
	return strings.Replace(k.Name, imagePlaceholder, image, 1)
}

// Keys builds annotation keys under one prefix.
type Keys struct{ Prefix string }

func (k Keys) key(id key) string { return k.Prefix + "/" + table[id].Name }

func (k Keys) image(id key, image string) string {
	return k.Prefix + "/" + table[id].NameFor(image)
}

// Record holds the digest last confirmed as rolled out for image.
func (k Keys) Record(image string) string { return k.image(record, image) }

// Attempt counts consecutive re-image attempts not yet confirmed settled (R10).
func (k Keys) Attempt() string { return k.key(attempt) }

// Holder names the image-refresh process that persisted the current
// attempt and when: "<instance> <RFC 3339 time>". Another process leaves an
// unsettled group alone while the holder may still be waiting for its
// rollout, so two instances without leader election never stack attempts
// or undo each other's rollout (C3). The holder deletes it when its attempt
// ends either way.
func (k Keys) Holder() string { return k.key(holder) }

// Flap is the lockout marker; its value is the attempt count (R10, R12).
func (k Keys) Flap() string { return k.key(flap) }

// SkipStreak counts ticks skipped because the group was not settled (R4).
func (k Keys) SkipStreak() string { return k.key(skipStreak) }

// StalePin is the finding that the operator's pin is not the latest (R2).
func (k Keys) StalePin(image string) string { return k.image(stalePin, image) }

// EverPinned marks an image that image-refresh has pinned before (R5).
func (k Keys) EverPinned(image string) string { return k.image(everPinned, image) }

// ReadFailures counts ticks whose live-image read of image failed (R7).
func (k Keys) ReadFailures(image string) string { return k.image(readFailures, image) }

// ResolveFailures counts ticks whose registry resolve of image failed (R1).
func (k Keys) ResolveFailures(image string) string { return k.image(resolveFailures, image) }

// PinCheckFailures counts V4's checks of image's pinned digests in a row
// that the registry could not answer (401, 5xx, a timeout): read failures
// (R1), never a verdict, but at maxReadFailures they need a human.
func (k Keys) PinCheckFailures(image string) string { return k.image(pinCheckFailures, image) }

// DigestChanges lists when image's digest record last moved to a new
// digest (R6), as comma-separated RFC 3339 UTC times, oldest first: the
// budget that bounds a tag flapping between digests (see refresh).
func (k Keys) DigestChanges(image string) string { return k.image(digestChanges, image) }

// FirstSeen holds the digest the registry answered for image that is not
// its record yet, and when image-refresh first saw it: "<digest> <RFC 3339
// time>". minDigestAge counts from that time (R22), so a restart does not
// reset it.
func (k Keys) FirstSeen(image string) string { return k.image(firstSeen, image) }

// LockedOn lists the digests of image that lockouts of its group locked on
// (R23), comma-separated, newest last, at most MaxLockedOn: such a digest
// is quarantined (never tried again unless re-armed by hand), and any
// other digest re-arms the locked group once by itself.
func (k Keys) LockedOn(image string) string { return k.image(lockedOn, image) }

// Verified remembers the registry's answer for image that last verified
// against its verification policy (V1) while it was not the record yet:
// an opaque "<policy>/<key fingerprint>@<digest>" (refresh.Verification's
// Memo), so that a restart does not look its signatures up again and a
// policy whose keys changed does. The record itself was verified when it was
// recorded.
func (k Keys) Verified(image string) string { return k.image(verified, image) }

// RolledBack names the digest of image whose rollout failed and was rolled
// back, and why (V2): "<digest> <reason>". The digest is quarantined too
// (LockedOn); this key makes `status` say rolled-back, with the pods' own
// reason, while the registry still serves it.
func (k Keys) RolledBack(image string) string { return k.image(rolledBack, image) }

// OnFailedRollout is the annotation on a discovered group's anchor that
// sets its onFailedRollout (V2): "hold" or "rollback".
func (k Keys) OnFailedRollout() string { return k.key(onFailedRollout) }

// TagFlapping marks an image the churn bound holds (R21): set when a digest
// change is held because the budget is spent, its value the time the hold
// ends (RFC 3339 UTC). While the budget stays spent the image stays
// tag-flapping, also when the tag sits on the held digest meanwhile; it is
// deleted once the window has passed, or by rearm.
func (k Keys) TagFlapping(image string) string { return k.image(tagFlapping, image) }

// Soak is when the group began to run the recorded digest of image settled
// and healthy, on a group other groups follow (P1), with the pods'
// restart count then: "<digest> <RFC 3339 time> <restarts>".
func (k Keys) Soak(image string) string { return k.image(soak, image) }

// Published records the digest of image whose promotion attestation this
// installation published (P2), and when: "<digest> <RFC 3339 time>". It
// is published once; a restart reads it here.
func (k Keys) Published(image string) string { return k.image(published, image) }

// Suspend suspends the group of the anchor it is on (O1): "true" until it
// is removed (`image-refresh resume`), or an RFC 3339 time it ends at.
// While it holds, nothing is written to the group's targets.
func (k Keys) Suspend() string { return k.key(suspend) }

// SuspendReason is the operator's why of a suspension (O1), free text.
func (k Keys) SuspendReason() string { return k.key(suspendReason) }

// SuspendedSince is when a pass first saw the group suspended (O1), an
// RFC 3339 UTC time: a suspension without an end becomes a finding 24
// hours later. A pass deletes it once the suspension ended.
func (k Keys) SuspendedSince() string { return k.key(suspendedSince) }

// SuspendedBy is the field manager that set P/suspend, as a pass first
// saw it (O1): who suspended the group still reads right after a pass
// put a suspension that a rollback took off back on the anchor (R25),
// which makes image-refresh the annotation's manager.
func (k Keys) SuspendedBy() string { return k.key(suspendedBy) }

// Generation numbers the writes of the group's state: every write of
// image-refresh sets it, on the anchor and in the state's copy, above the
// highest it read (R25, see Current and Choice.Next). An older value on the anchor
// than in the copy means the anchor's state was rewound: `kubectl rollout
// undo` put back the annotations an older ReplicaSet copied.
func (k Keys) Generation() string { return k.key(generation) }

// DiscoveredGroup marks the anchor of a group that discovery found (D1);
// its value is the group's name. It is what lets a workload go once it is
// no longer labelled: only a workload that carries it has its state removed
// (internal/discovery), never the anchor of a configured group, also of
// another config sharing the prefix.
func (k Keys) DiscoveredGroup() string { return k.key(discoveredGroup) }

// Enabled is the label that opts a workload or a namespace in to
// discovery: "true". On a workload of a labelled namespace, "false" opts
// it out again (D1).
func (k Keys) Enabled() string { return k.key(enabled) }

// DiscoveryGroup is the label or annotation whose value joins workloads of
// one namespace into one discovered group (D1).
func (k Keys) DiscoveryGroup() string { return k.key(discoveryGroup) }

// IgnoreContainers is the annotation (or label) listing, comma-separated,
// the containers discovery leaves alone (D1).
func (k Keys) IgnoreContainers() string { return k.key(ignoreContainers) }

// Operator lists the keys of ScopeOperator: what makes a workload
// discovered, which image-refresh only reads.
func (k Keys) Operator() []string {
	var out []string
	for _, e := range table {
		if e.Scope == ScopeOperator {
			out = append(out, k.Prefix+"/"+e.Name)
		}
	}
	return out
}

// Rearmed lists the keys `rearm` deletes on the anchor of a group with
// images: the group's, then each image's.
func (k Keys) Rearmed(images []string) []string {
	var out []string
	for _, e := range table {
		if e.Rearm && e.Scope == ScopeGroup {
			out = append(out, k.Prefix+"/"+e.Name)
		}
	}
	for _, img := range images {
		for _, e := range table {
			if e.Rearm && e.Scope == ScopeImage {
				out = append(out, k.Prefix+"/"+e.NameFor(img))
			}
		}
	}
	return out
}

// ImageKeyNames lists the name parts (after "prefix/") of every per-image
// key, so that config validation can check they are legal annotation keys.
func ImageKeyNames(image string) []string {
	var names []string
	for _, e := range table {
		if e.Scope == ScopeImage {
			names = append(names, e.NameFor(image))
		}
	}
	return names
}

// GroupKeyNames lists the name parts of the per-group keys on the anchor
// (ScopeGroup): they carry no group name, so config validation rejects two
// groups on one anchor naming them.
func GroupKeyNames() []string {
	var names []string
	for _, e := range table {
		if e.Scope == ScopeGroup {
			names = append(names, e.Name)
		}
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

// MaxDigestChangeTimes bounds how many times a DigestChanges value may hold;
// a longer value is invalid.
const MaxDigestChangeTimes = 100

// ParseTimes reads a DigestChanges value. Absent is none. A value that is
// not a comma-separated list of RFC 3339 times (at most
// MaxDigestChangeTimes) is an error: callers treat it fail-safe, as a
// spent budget, never as no changes.
func ParseTimes(value string, present bool) ([]time.Time, error) {
	if !present {
		return nil, nil
	}
	parts := strings.Split(value, ",")
	if len(parts) > MaxDigestChangeTimes {
		return nil, fmt.Errorf("invalid list of times: %d entries (at most %d)", len(parts), MaxDigestChangeTimes)
	}
	out := make([]time.Time, 0, len(parts))
	for _, p := range parts {
		t, err := parseTime(strings.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("invalid list of times %q: %q is not an RFC 3339 time", value, p)
		}
		out = append(out, t)
	}
	return out, nil
}

// FormatTimes renders times for a DigestChanges value.
func FormatTimes(ts []time.Time) string {
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = t.UTC().Format(time.RFC3339)
	}
	return strings.Join(parts, ",")
}

// MaxLockedOn bounds the digests a LockedOn value keeps (the newest).
const MaxLockedOn = 10

// ParseDigests reads a LockedOn value. Absent is none. A value that is not
// a comma-separated list of at most MaxLockedOn non-empty entries is an
// error; each entry is checked as a digest by the caller.
func ParseDigests(value string, present bool) ([]string, error) {
	if !present {
		return nil, nil
	}
	parts := strings.Split(value, ",")
	if len(parts) > MaxLockedOn {
		return nil, fmt.Errorf("invalid list of digests: %d entries (at most %d)", len(parts), MaxLockedOn)
	}
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
		if parts[i] == "" {
			return nil, fmt.Errorf("invalid list of digests %q: empty entry", value)
		}
	}
	return parts, nil
}

// FirstSeenValue is a parsed FirstSeen value.
type FirstSeenValue struct {
	Digest string
	At     time.Time
}

// String renders the annotation value.
func (f FirstSeenValue) String() string { return f.Digest + " " + f.At.UTC().Format(time.RFC3339) }

// ParseFirstSeen reads a FirstSeen value: "<digest> <RFC 3339 time>".
func ParseFirstSeen(value string) (FirstSeenValue, error) {
	d, at, ok := strings.Cut(strings.TrimSpace(value), " ")
	if !ok || d == "" {
		return FirstSeenValue{}, fmt.Errorf("invalid first-seen value %q (want \"<digest> <RFC 3339 time>\")", value)
	}
	t, err := parseTime(strings.TrimSpace(at))
	if err != nil {
		return FirstSeenValue{}, fmt.Errorf("invalid first-seen value %q: %q is not an RFC 3339 time", value, at)
	}
	return FirstSeenValue{Digest: d, At: t}, nil
}

// ParsePublished reads a Published value: "<digest> <RFC 3339 time>".
func ParsePublished(value string) (digest string, at time.Time, err error) {
	f := strings.Fields(value)
	if len(f) != 2 || f[0] == "" {
		return "", time.Time{}, fmt.Errorf("invalid published value %q (want \"<digest> <RFC 3339 time>\")", value)
	}
	t, err := parseTime(f[1])
	if err != nil {
		return "", time.Time{}, fmt.Errorf("invalid published value %q: %q is not an RFC 3339 time", value, f[1])
	}
	return f[0], t, nil
}

// SoakValue is a parsed Soak value (P1).
type SoakValue struct {
	Digest string
	Since  time.Time
	// Restarts is the sum of the container restarts of the targets' pods
	// the clock was started or last carried on with: more is a restart
	// in the window, which starts the clock over.
	Restarts int
}

// String renders the annotation value.
func (v SoakValue) String() string {
	return fmt.Sprintf("%s %s %d", v.Digest, v.Since.UTC().Format(time.RFC3339), v.Restarts)
}

// ParseSoak reads a Soak value: "<digest> <RFC 3339 time> <restarts>".
func ParseSoak(value string) (SoakValue, error) {
	f := strings.Fields(value)
	if len(f) != 3 || f[0] == "" {
		return SoakValue{}, fmt.Errorf("invalid soak value %q (want \"<digest> <RFC 3339 time> <restarts>\")", value)
	}
	t, err := parseTime(f[1])
	if err != nil {
		return SoakValue{}, fmt.Errorf("invalid soak value %q: %q is not an RFC 3339 time", value, f[1])
	}
	n, err := strconv.Atoi(f[2])
	if err != nil || n < 0 {
		return SoakValue{}, fmt.Errorf("invalid soak value %q: %q is not a restart count", value, f[2])
	}
	return SoakValue{Digest: f[0], Since: t, Restarts: n}, nil
}

// Holder is a parsed refresh-attempt-holder value.
type Holder struct {
	Instance string
	Since    time.Time
}

// String renders the annotation value.
func (h Holder) String() string { return h.Instance + " " + h.Since.UTC().Format(time.RFC3339) }

// MaxInstanceLen bounds an instance name in a Holder value.
const MaxInstanceLen = 253

// ParseHolder reads a refresh-attempt-holder value: an instance name (no
// spaces, at most MaxInstanceLen bytes) and an RFC 3339 time. Absent is the
// zero Holder. Anything else is an error: callers report it and treat the
// attempt as abandoned; the attempt counter, read fail-closed, still bounds
// the retries.
func ParseHolder(value string, present bool) (Holder, error) {
	if !present {
		return Holder{}, nil
	}
	inst, at, ok := strings.Cut(strings.TrimSpace(value), " ")
	if !ok || inst == "" || len(inst) > MaxInstanceLen || strings.ContainsFunc(inst, unicode.IsSpace) || strings.ContainsFunc(at, unicode.IsSpace) {
		return Holder{}, fmt.Errorf("invalid attempt holder %q (want \"<instance> <RFC 3339 time>\")", value)
	}
	t, err := parseTime(at)
	if err != nil {
		return Holder{}, fmt.Errorf("invalid attempt holder %q: %q is not an RFC 3339 time", value, at)
	}
	return Holder{Instance: inst, Since: t}, nil
}

// parseTime reads an RFC 3339 time whose UTC year is 1..9999: the times
// these annotations hold are written in UTC, and a time outside those years
// (year 0 with a positive offset) has no RFC 3339 form to write back.
func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, err
	}
	if y := t.UTC().Year(); y < 1 || y > 9999 {
		return time.Time{}, fmt.Errorf("year %d in UTC is out of range", y)
	}
	return t, nil
}
