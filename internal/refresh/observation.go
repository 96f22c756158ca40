// Package refresh is the decision engine: from what a tick observed (anchor
// annotations, workloads, registry answers) it decides what to write, what
// to wait for and what to tell the operator, as a Plan. It talks to nothing:
// every front end (tick, status, dry-run, the controller) reads the cluster,
// calls Decide, and carries the plan out, so each SPEC rule lives here once.
//
// Decide (decide.go) reads the group's attempt and lockout, then decides
// each image and gates the group; the rules live by family:
//
//	resolve.go   the registry's answer (R1), an operator pin (R2), the first observation (R5)
//	targets.go   per target: read (R7, R19), re-pin or why not (R6–R9, R3, C5)
//	policy.go    the rollout policy: churn, age, quarantine, windows, slots (R21–R24)
//	attempts.go  the attempt and its holder (R10, R11, C3, C6)
//	gate.go      the group's gate: settled guard and lockout (R4, R12)
//	running.go   what the pods run (N1)
//	suspend.go   an operator's suspension (O1)
//	verify.go    only a verified digest is recorded or rolled (V1)
//	rollback.go  a failed digest change put back and quarantined (V2)
//	platforms.go a digest that lacks a platform the nodes need (V3)
//	pins.go      a pinned digest the registry no longer holds (V4)
//	promotion.go a follower waits until its leader soaked the digest (P1)
package refresh

import (
	"fmt"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/gitops"
	"github.com/image-refresh/image-refresh/internal/imageref"
)

// Settings are the config values the rules need.
type Settings struct {
	Prefix          string
	MaxAttempts     int
	MaxSkipTicks    int
	MaxReadFailures int
	FirstInstall    config.FirstInstall
	PinFormat       imageref.PinFormat
	// MaxDigestChanges record moves per image within DigestChangeWindow
	// (0: unbounded) before a flapping tag is held on its recorded digest.
	MaxDigestChanges   int
	DigestChangeWindow time.Duration
	// MinDigestAge holds a new digest until it was first seen that long
	// ago (R22); 0 rolls it at once.
	MinDigestAge time.Duration
	// RolloutWindows limit when a digest change may start rolling out
	// (R24); none: any time.
	RolloutWindows []config.RolloutWindow
	// MaxConcurrentRollouts caps the groups rolling out a digest change at
	// once (R24, run); 0: unlimited. See Observation.RollingElsewhere.
	MaxConcurrentRollouts int
	// Now is the clock the rollout policy (R21, R22, R24) is counted on.
	Now func() time.Time
	// RearmCommand renders the command that re-arms a group (R18); every
	// lockout message names it.
	RearmCommand func(group string) string
	// ResumeCommand renders the command that ends a group's suspension
	// (O1); nil: "image-refresh resume --group GROUP".
	ResumeCommand func(group string) string
	// Instance names this image-refresh process in the attempt holder it
	// writes (state.Keys.Holder); "" writes and heeds no holder.
	Instance string
	// HolderTTL is how long another process's attempt on an unsettled group
	// is left alone: its pass ends by then (the tick deadline, R14).
	HolderTTL time.Duration
	// NoWait is `run`: a pass never waits for a rollout (C6). It writes the
	// attempt and the images and returns; a later pass confirms the attempt
	// once the group settled, or counts it as failed once RolloutTimeout
	// passed since its write (the holder's time, on the anchor), as a
	// tick's wait would.
	NoWait         bool
	RolloutTimeout time.Duration
	// FailOnRunningStale makes a running-stale target (N1) need a human:
	// exit 1 in a tick.
	FailOnRunningStale bool
}

// holderSlack covers clock skew between the machines two image-refresh
// processes run on.
const holderSlack = 10 * time.Second

// holderWriteGrace is how long another process's fresh attempt on a group
// that still reads settled is left alone: the time between its attempt
// write and its image writes, two API calls in a row. Holder times have
// whole seconds, so the grace is 1 to 2 s of real time.
const holderWriteGrace = 2 * time.Second

// SettingsFrom takes the settings from a validated config; configPath is
// the file the rearm command should name.
func SettingsFrom(cfg *config.Config, configPath string) Settings {
	return Settings{
		Prefix:                cfg.AnnotationPrefix,
		MaxAttempts:           cfg.MaxRefreshAttempts,
		MaxSkipTicks:          cfg.MaxSkipTicks,
		MaxReadFailures:       cfg.MaxReadFailures,
		FirstInstall:          cfg.FirstInstall,
		PinFormat:             cfg.PinFormat,
		MaxDigestChanges:      cfg.MaxDigestChanges,
		DigestChangeWindow:    cfg.DigestChangeWindow,
		MinDigestAge:          cfg.MinDigestAge,
		RolloutWindows:        cfg.RolloutWindows,
		MaxConcurrentRollouts: cfg.MaxConcurrentRollouts,
		Now:                   time.Now,
		HolderTTL:             cfg.EffectiveTickTimeout() + holderSlack,
		RolloutTimeout:        cfg.RolloutTimeout,
		FailOnRunningStale:    cfg.FailOnRunningStale,
		RearmCommand: func(group string) string {
			if configPath == "" { // discovery alone (D1)
				return fmt.Sprintf("image-refresh rearm --group %s", group)
			}
			return fmt.Sprintf("image-refresh rearm --config %s --group %s", configPath, group)
		},
		ResumeCommand: func(group string) string {
			if configPath == "" {
				return fmt.Sprintf("image-refresh resume --group %s", group)
			}
			return fmt.Sprintf("image-refresh resume --config %s --group %s", configPath, group)
		},
	}
}

// Observation is everything one tick of one group read.
type Observation struct {
	Group config.Group
	// Anchor holds the anchor's annotations; AnchorErr is set when the anchor
	// could not be read (then nothing can be recorded at all).
	Anchor    map[string]string
	AnchorErr error
	// Workloads has one entry per config.Group.Workloads().
	Workloads map[config.Workload]Workload
	// Latest has one entry per image name: the registry's answer (R1).
	Latest map[string]Resolution
	// MirrorProof answers R3 for targets whose live repository is served by
	// another registry than the configured one (see NeedsMirrorProof).
	MirrorProof map[config.Target]Proof
	// Fights names, per target, the field manager that rewrote it right
	// after each of the last re-pins (C5): such a target is left alone and
	// reported.
	Fights map[config.Target]string
	// SkipUncounted makes a not-settled group a skip that does not count
	// toward maxSkipTicks (R4): the controller reconciles on every watch
	// event, and the streak counts intervals, as a tick's would.
	SkipUncounted bool
	// Reverted holds, per workload, the last write the controller saw
	// change its images (C6): a revert made while the workload was settled
	// on its pin is re-pinned without waiting for the rollout it started.
	Reverted map[config.Workload]Revert
	// Pods holds, per target workload, the pods of its current template
	// (N1); nil: not read (the check is skipped).
	Pods map[config.Workload]PodsRead
	// WaitFailure, in the pass a tick runs right after its wait for a
	// rollout ended on a failure (V2), is what that wait saw
	// (Plan.WaitFailure): the pods this pass read may have moved on since.
	WaitFailure string
	// RollingElsewhere names the other groups with a rollout in flight
	// (R24, maxConcurrentRollouts): the controller's view across groups.
	RollingElsewhere []string
	// CountedAsks holds, per image, the failed registry ask
	// (Resolution.Ask) whose failure an earlier pass of the group already
	// counted toward maxReadFailures (R1), as the earlier plans said
	// (Plan.CountedAsks): the controller passes on every watch event, and
	// the streak counts failed asks of the registry, as a tick's would, not
	// passes that re-read one cached failure.
	CountedAsks map[string]uint64
	// SuspendedBy is the field manager of the anchor's P/suspend
	// annotation (O1), "" when none, unknown, or image-refresh's own (a
	// pass that put a suspension back after a rollback, R25: P/suspended-by
	// then says who).
	SuspendedBy string
	// Platforms maps an expected digest that is an image index to its
	// platform manifests' digests: a pod of a multi-arch pin reports one.
	Platforms map[string][]string
	// Verification holds, per image whose repository a verification policy
	// matches, V1's answer for the registry's digest when that digest is
	// not the record yet (the record was verified when it was recorded).
	Verification map[string]Verification
	// Leader is, for a group that follows another (P1), what the leader's
	// anchor says; nil for any other group.
	Leader *Leader
	// Followers names the groups that follow this one (P1): its pass
	// keeps the soak clock they read.
	Followers []string
	// Promotions holds, for a group that follows a signer in another
	// cluster (P2, promotion.attestedBy), per image, what was found of the
	// promotion attestation of the registry's digest when that digest is
	// not the record yet.
	Promotions map[string]PromotionEvidence
	// Needs holds, per image name, the platforms that the nodes its
	// targets can run on need, one node named per platform (V3): present
	// only for an image whose new digest (or V2 rollback target) this
	// pass checks; absent: nothing to check.
	Needs map[string][]PlatformNeed
	// Served holds, per digest looked up, the platforms it serves (V3):
	// an index's manifests', or a single manifest's config's; an empty
	// list names none.
	Served map[string][]Platform
	// PinChecks holds V4's answers for the digests PinsToCheck lists; nil:
	// nothing was checked this pass (the interval has not passed).
	PinChecks map[PinRef]PinCheck
}

// Verification is the outcome of verifying an image's registry answer
// against its repository's verification policy (V1).
type Verification struct {
	// Policy names the policy that matched the repository.
	Policy string
	// Digest is the digest verified: the registry's answer.
	Digest   string
	Verified bool
	// Verdict says in one line what was found and why each signature was
	// rejected (or which one verified).
	Verdict string
	// Memo is what the anchor keeps for a verified digest that is not the
	// record yet (state.Keys.Verified): policy, key fingerprint, digest.
	Memo string
	// Attestations names the required attestations (predicate types, V5)
	// that did not count, when the signature itself verified; "" else.
	Attestations string
}

// PromotionEvidence is what a follower of another cluster found of one
// digest's promotion attestation (P2).
type PromotionEvidence struct {
	// Digest is the digest looked up; Signer the attestedBy name.
	Digest string
	Signer string
	// Attested: a valid promotion attestation from the signer was found;
	// At is its time (when the signer's soak ended).
	Attested bool
	At       time.Time
	// Rejected: attestations were found and none counted (forged, wrong
	// key, another digest, another installation).
	Rejected bool
	// Verdict says in one line what was found.
	Verdict string
	// Err is the registry read that failed (R1): no verdict.
	Err error
	// Recheck, for a digest without a valid attestation, is when it is
	// looked up again: `run` passes the group then.
	Recheck time.Time
}

// Revert is one write that changed a workload's container images, as the
// controller's watch saw it: the object before and after (C6).
type Revert struct {
	// BeforeSettled: the object before the write was settled.
	BeforeSettled bool
	// Before and After map container name → image.
	Before, After map[string]string
}

// Workload is one workload as read.
type Workload struct {
	// Err is the API error of the read (NotFound, Forbidden, timeout…).
	Err     error
	Settled bool
	Reason  string // why not settled
	// Failed says why its rollout will not finish by itself, as its
	// controller reports it (ProgressDeadlineExceeded), V2.
	Failed     string
	Containers map[string]Container
}

// Container is one image of the pod template (a container's, an init
// container's or an image volume's, K1): its live reference and who last
// wrote it.
type Container struct {
	Image string
	// Slot says what holds the image for people: "" for a container,
	// "init container", "image volume".
	Slot    string
	Manager string // field manager of .image, from managedFields
	// GitOps is the GitOps controller behind Manager, with its
	// application (O2); nil for any other writer.
	GitOps *gitops.Writer
}

// Resolution is the registry's answer for repository:tag.
type Resolution struct {
	Digest string
	Err    error
	// Ask numbers the registry ask that gave this answer (the controller's
	// poller counts its asks per repository:tag); 0 is an ask of this pass
	// (a tick's own).
	Ask uint64
}

// Proof is the answer to "does this other registry hold the digest?" (R3).
type Proof struct {
	Has bool
	Err error
}

// NeedsMirrorProof reports whether pinning live (the target's current
// image) to a digest of img needs R3's proof, and the repository to ask:
// the live reference is served by another repository than the configured
// one (a private mirror). A live image that does not parse needs none: it
// is unreadable.
func NeedsMirrorProof(img config.Image, live string) (repo string, needed bool) {
	ref, err := imageref.Parse(live)
	if err != nil {
		return "", false
	}
	want, err1 := imageref.CanonicalRepository(img.Repository)
	got, err2 := imageref.CanonicalRepository(ref.Repository)
	if err1 != nil || err2 != nil || want == got {
		return "", false
	}
	return ref.Repository, true
}
