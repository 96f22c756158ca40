package refresh

import (
	"fmt"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/gitops"
)

// Plan is what one tick of one group does, in order:
//  1. Bookkeeping (always, R13): first-observation records, stale-pin
//     findings, streak counters, the lockout marker.
//  2. ClearSkip (own write; a failure is a WARN, R4).
//  3. Repin, when set: persist the attempt, re-image, wait, then clear the
//     attempt and record digests in their own writes (R10, R6).
//
// Findings are told to the operator (log, event, metric, status); Rows are
// the `status` view. Status and --dry-run show exactly this plan.
type Plan struct {
	Group       string
	Anchor      config.Workload
	Rows        []Row
	Findings    []Finding
	Bookkeeping Write
	ClearSkip   Write
	Repin       *Repin
	LockedOut   bool
	// Queued: a digest change waits for a rollout slot (R24,
	// maxConcurrentRollouts); nothing was re-imaged.
	Queued     bool
	Attempts   int
	SkipStreak int
	// CountedAsks holds, per image, the failed registry ask (Resolution.Ask,
	// not 0) that this plan's bookkeeping counts toward maxReadFailures
	// (R1): once it landed, the next passes pass it back as
	// Observation.CountedAsks.
	CountedAsks map[string]uint64
	// SkipCounted: the group is not settled and this pass's bookkeeping
	// grows its skip streak (R4); the controller counts the next skip only
	// an interval later (Observation.SkipUncounted).
	SkipCounted bool
	// WaitUntil, when set, is when the attempt in flight reaches its
	// deadline (NoWait): the controller runs the group again then.
	WaitUntil time.Time
	// WakeAt, when set, is when a hold of the rollout policy ends by
	// itself (a soak's end, P1; minDigestAge, R22): the controller runs the
	// group again then, not at its next resync.
	WakeAt time.Time
	// Publish lists the promotion attestations this plan publishes (P2):
	// the group ran the digest settled and healthy for
	// promotion.publish.soak and none was published for it yet. The
	// executor signs and pushes each, then records it
	// (state.Keys.Published); a push that fails is a WARN and is retried.
	Publish []Publication
	// SoakPending: the group is settled on its record, but its pods do not
	// all report it Ready yet, so its soak clock (P1) has not started; the
	// controller looks again soon, as no event of its workloads may follow.
	SoakPending bool
	// InFlight: the group has a rollout in flight once this plan is
	// carried out (R24, NoWait): it writes an attempt and images and
	// returns, or its attempt is still rolling within its deadline. It
	// holds a slot of maxConcurrentRollouts unless the executor failed.
	InFlight bool
	// Suspended is set while the group is suspended (O1): the plan writes
	// nothing to its targets. The controller runs the group again when it
	// ends (Suspension.Until).
	Suspended *Suspension
	// Failed holds what the executor could not do (a write the API server
	// refused, a rollout that did not settle): the controller returns it to
	// its workqueue, which backs off.
	Failed error
	// WaitFailed: the executor waited for the repin's rollout (a tick) and
	// it did not settle within rolloutTimeout, or will not (WaitFailure).
	WaitFailed bool
	// WaitFailure: the failure signals (FailureSignals) the wait ended on
	// before rolloutTimeout, "" when it did not (V2).
	WaitFailure string
}

// Publication is one promotion attestation to publish (P2).
type Publication struct {
	Image      string
	Repository string
	Digest     string
	// Since is when the group began to run the digest settled and
	// healthy; Soak how long it had to.
	Since time.Time
	Soak  time.Duration
}

// NeedsHuman reports whether any finding is not benign: one-shot mode then
// exits 1 (R15).
func (p *Plan) NeedsHuman() bool {
	for _, f := range p.Findings {
		if f.NeedsHuman {
			return true
		}
	}
	return false
}

// Write is a compare-and-swap on anchor annotations: Expect holds the values
// the decision was based on (nil = absent), Set the new values (nil =
// delete). The executor writes nothing when Expect no longer holds, so two
// instances cannot both act on one read.
type Write struct {
	Expect map[string]*string
	Set    map[string]*string
}

// Empty reports whether the write changes nothing.
func (w Write) Empty() bool { return len(w.Set) == 0 }

func (w *Write) set(key string, value *string, read map[string]string) {
	if w.Set == nil {
		w.Set, w.Expect = map[string]*string{}, map[string]*string{}
	}
	w.Set[key] = value
	if v, ok := read[key]; ok {
		w.Expect[key] = &v
	} else {
		w.Expect[key] = nil
	}
}

// Repin re-images targets under the attempt counter (R10).
type Repin struct {
	// AttemptWrite persists attempt+1 and this process as its holder before
	// any re-image.
	AttemptWrite Write
	// ReleaseWrite drops this process's holder when the attempt ends
	// without settling, so the next pass (of any process) retries at once.
	ReleaseWrite Write
	// Changes has one entry per workload: all its containers in one write (R9).
	Changes []WorkloadChange
	// Wait lists the workloads whose rollout must settle.
	Wait []config.Workload
	// ClearWrite clears the attempt and flap marker once all settled.
	ClearWrite Write
	// RecordWrite records digests (R6) and ever-pinned markers (R5) after
	// ClearWrite, only when every rollout settled.
	RecordWrite Write
	// Unfinished is set when this repin only re-waits for an earlier,
	// unconfirmed rollout (R11).
	Unfinished bool
	// Attempt is the attempt number this repin runs under.
	Attempt int
	// Rollback: this repin puts a failed digest change back (V2).
	Rollback bool
	// Async: the executor writes the attempt and the images and returns;
	// the rollout's completion is a later pass's to confirm (NoWait).
	Async bool
}

// WorkloadChange is the one write to one workload.
type WorkloadChange struct {
	Workload config.Workload
	Images   []ImageChange
}

// ImageChange moves one container to a pinned reference.
type ImageChange struct {
	Image     string // config image name
	Container string
	From, To  string
	Cause     Cause
	// Writer is the field manager that last wrote the live image: for a
	// revert, who reverted (e.g. "helm").
	Writer string
	// GitOps is the GitOps controller behind Writer, with its application
	// (O2); nil for any other writer.
	GitOps *gitops.Writer
}

// WrittenBy names who last wrote the replaced reference, for messages: the
// GitOps tool and its application, or the field manager.
func (c ImageChange) WrittenBy() string { return writerName(c.Writer, c.GitOps) }

func writerName(manager string, g *gitops.Writer) string {
	if g != nil {
		return fmt.Sprintf("%s, field manager %s", g, manager)
	}
	return orUnknown(manager)
}

// Cause says why a target is re-pinned (metric label, event text).
type Cause string

const (
	CauseRevert       Cause = "revert"
	CauseDigestChange Cause = "digest-change"
	CauseFirstInstall Cause = "first-install"
	// CauseRollback: a failed digest-change rollout is put back on the
	// recorded digest (V2).
	CauseRollback Cause = "rollback"
)

// Severity of a finding, as logged.
type Severity string

const (
	SeverityInfo  Severity = "INFO"
	SeverityNote  Severity = "NOTE"
	SeverityWarn  Severity = "WARN"
	SeverityError Severity = "ERROR"
)

// Event reasons (Kubernetes Events on the anchor).
const (
	ReasonRepinned           = "Repinned"
	ReasonDigestChanged      = "DigestChanged"
	ReasonRefreshLockedOut   = "RefreshLockedOut"
	ReasonRefreshFrozen      = "RefreshFrozen"
	ReasonStalePin           = "StalePin"
	ReasonRefreshError       = "RefreshError"
	ReasonRewriteFight       = "ImageRewriteFight"
	ReasonTagFlapping        = "TagFlapping"
	ReasonDigestQuarantined  = "DigestQuarantined"
	ReasonRearmedByNewDigest = "RearmedByNewDigest"
	ReasonRunningStale       = "RunningStale"
	ReasonDigestUnverified   = "DigestUnverified"
	ReasonRolledBack         = "RolledBack"
	// ReasonPinMissing: the registry no longer holds a pinned digest or
	// the digest V2 rolls back to (V4).
	ReasonPinMissing = "PinMissing"
	// ReasonPromotionPublishFailed: a promotion attestation could not be
	// signed or pushed (P2); it is tried again.
	ReasonPromotionPublishFailed = "PromotionPublishFailed"
	// ReasonPromotionPublished: a promotion attestation was published
	// (P2).
	ReasonPromotionPublished = "PromotionPublished"
	// ReasonPlatformMissing: a new digest lacks a platform the nodes its
	// targets can run on need (V3).
	ReasonPlatformMissing = "PlatformMissing"
	// ReasonSuspendedWithoutEnd: a group suspended without an end for
	// longer than SuspendedWithoutEndAfter (O1).
	ReasonSuspendedWithoutEnd = "SuspendedWithoutEnd"
)

// Finding is one thing the operator is told. Non-benign findings
// (NeedsHuman) get a log line with the remediation, an Event on the anchor,
// a metric and a status row, and make one-shot mode exit 1 (R15).
type Finding struct {
	Severity    Severity
	Reason      string // event reason; "" for log-only findings
	Image       string
	Target      *config.Target
	Message     string
	Remediation string
	NeedsHuman  bool
	// Writer names, for a fight (C5), the writer that rewrote the target.
	Writer string
	// Event: an Event on the anchor even when not NeedsHuman (N1's
	// running-stale, which exits 1 only on request).
	Event bool
	// Once, when set, keys a benign finding that tells of a change of
	// state (a finding cleared, a hold ended) or of a state that lasts (a
	// current operator pin): a front end that runs passes one after
	// another (`run`) logs it only on the first of consecutive passes
	// that report the key, so it is said once, not on every pass.
	Once string
}

// State of one target in `status`.
type State string

const (
	StatePinned          State = "pinned"
	StateDrifted         State = "drifted"
	StateFirstObserved   State = "first-observed"
	StateLockedOut       State = "locked-out"
	StateNotSettled      State = "not-settled"
	StateStalePin        State = "stale-pin"
	StateInert           State = "inert"
	StateTagFlapping     State = "tag-flapping"  // R21
	StateQuarantined     State = "quarantined"   // R23
	StateWaiting         State = "waiting"       // R22
	StateWindowClosed    State = "window-closed" // R24
	StateQueued          State = "queued"        // R24
	StateUnreadable      State = "unreadable"
	StateError           State = "error"
	StateRunningStale    State = "running-stale"
	StateUnverified      State = "unverified"       // V1
	StateRolledBack      State = "rolled-back"      // V2
	StateSuspended       State = "suspended"        // O1
	StatePinMissing      State = "pin-missing"      // V4
	StatePlatformMissing State = "platform-missing" // V3
)

// Beside is a state that holds beside a row's State, with its own message
// and fix.
type Beside struct {
	State       State  `json:"state"`
	Message     string `json:"message"`
	Remediation string `json:"remediation,omitempty"`
}

// Row is one (group, image, target) line of `status`.
type Row struct {
	Group      string `json:"group"`
	Image      string `json:"image"`
	Repository string `json:"repository"`
	Tag        string `json:"tag"`
	Target     string `json:"target"`
	// Slot is what holds the target's image when it is not a container:
	// "init container" or "image volume" (K1).
	Slot     string `json:"slot,omitempty"`
	Latest   string `json:"latest"`
	Recorded string `json:"recorded"`
	Live     string `json:"live"`
	State    State  `json:"state"`
	// Also are the other states that hold beside State (O2): State is the
	// cause (a target off its pin, with its writer and its fix), Also its
	// effects (its pods run a stale build).
	Also        []Beside `json:"also,omitempty"`
	Attempts    int      `json:"attempts"`
	SkipStreak  int      `json:"skipStreak"`
	Message     string   `json:"message"`
	Remediation string   `json:"remediation,omitempty"`
	// Running is what the target's pods run (N1): "3/3" on the expected
	// digest, "2/3 (node-2 …)" naming the first pod off it, "" when not
	// checked.
	Running     string `json:"running,omitempty"`
	PodsOn      int    `json:"podsOn"`
	PodsOff     int    `json:"podsOff"`
	PodsUnknown int    `json:"podsUnknown"`

	target config.Target
}

// TargetRef returns the row's target.
func (r Row) TargetRef() config.Target { return r.target }
