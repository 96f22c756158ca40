// Package config reads the image-refresh config file into a validated Config.
// Every problem in a file is reported at once, each naming its field path and
// line, so an operator fixes a config in one run. A Config returned without
// error is complete and valid; callers treat it as read-only.
package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/image-refresh/image-refresh/internal/imageref"
)

// Defaults of the optional settings.
const (
	DefaultAnnotationPrefix   = "image-refresh.io"
	DefaultRolloutTimeout     = 10 * time.Minute
	DefaultRegistryTimeout    = 15 * time.Second
	DefaultAPITimeout         = 15 * time.Second
	DefaultMaxRefreshAttempts = 3
	DefaultMaxSkipTicks       = 8
	DefaultMaxReadFailures    = 8
	DefaultMaxDigestChanges   = 3
	DefaultDigestChangeWindow = time.Hour
	DefaultPinCheckInterval   = time.Hour
	DefaultFirstInstall       = FirstInstallPinNextTick
	DefaultPinFormat          = imageref.PinTagAndDigest

	// tickSlack is added to the derived tick deadline for the API and
	// registry calls around the rollout waits (R14).
	tickSlack = 2 * time.Minute
)

// The workload kinds image-refresh can pin. They are named here, in the
// pure package the engine reads, and nowhere else: internal/workload's
// table has one entry for each, in this order (it refuses to start
// otherwise), with the kind's API and accessors.
const (
	KindDeployment  = "Deployment"
	KindDaemonSet   = "DaemonSet"
	KindStatefulSet = "StatefulSet"
	KindCronJob     = "CronJob"
)

// kindNames is the order messages list the kinds in.
var kindNames = []string{KindDeployment, KindDaemonSet, KindStatefulSet, KindCronJob}

// KindNames lists the kinds' names: "Deployment", ….
func KindNames() []string { return slices.Clone(kindNames) }

// SupportedKind reports whether kind is one of KindNames.
func SupportedKind(kind string) bool { return slices.Contains(kindNames, kind) }

// DeclaredKind is a workload kind beyond the built-in four, declared under
// `kinds:` (K2): a custom resource with a pod template, such as Argo
// Rollouts' Rollout. Once declared, targets, anchors and discovery use it
// by its Kind name like a built-in kind.
type DeclaredKind struct {
	Group   string `yaml:"group"`
	Version string `yaml:"version"`
	Kind    string `yaml:"kind"`
	// PodTemplate is the dotted path of the pod template (a
	// PodTemplateSpec: metadata and spec) from the object's root:
	// "spec.template".
	PodTemplate string `yaml:"podTemplate"`
	// Resource is the plural resource name; "" is the kind's usual plural
	// ("rollouts"), which the API server's discovery confirms at start.
	Resource string `yaml:"resource,omitempty"`
	// Selector is the dotted path of the label selector of the kind's
	// pods, whose running images N1 checks; "" is "selector" beside the
	// pod template ("spec.selector"), "-" is none (no pods to check).
	Selector string `yaml:"selector,omitempty"`
}

// String names the kind with its API group and version:
// "Rollout (argoproj.io/v1alpha1)".
func (k DeclaredKind) String() string {
	return fmt.Sprintf("%s (%s/%s)", k.Kind, k.Group, k.Version)
}

// PodTemplatePath is PodTemplate split at its dots.
func (k DeclaredKind) PodTemplatePath() []string { return strings.Split(k.PodTemplate, ".") }

// SelectorPath is the path of the pods' label selector: Selector split at
// its dots, its default, or nil for "-".
func (k DeclaredKind) SelectorPath() []string {
	switch k.Selector {
	case "-":
		return nil
	case "":
		p := k.PodTemplatePath()
		return append(slices.Clone(p[:len(p)-1]), "selector")
	}
	return strings.Split(k.Selector, ".")
}

// KindNames lists the kinds targets and anchors of c may name: the
// built-in ones, then those c declares.
func (c *Config) KindNames() []string {
	out := KindNames()
	for _, k := range c.Kinds {
		out = append(out, k.Kind)
	}
	return out
}

// Workload names one workload object.
type Workload struct {
	Kind      string `yaml:"kind"` // one of KindNames, or a kind declared under kinds: (K2)
	Namespace string `yaml:"namespace"`
	Name      string `yaml:"name"`
}

// String gives "Deployment tb/api", the form used in logs and errors.
func (w Workload) String() string {
	return fmt.Sprintf("%s %s/%s", w.Kind, w.Namespace, w.Name)
}

// Target is one container of one workload that runs an image.
type Target struct {
	Kind      string `yaml:"kind"` // one of KindNames, or a kind declared under kinds: (K2)
	Namespace string `yaml:"namespace"`
	Name      string `yaml:"name"`
	// Container names the image reference of the pod template this target
	// is: a container's or an init container's name (they share one name
	// space in a pod), or VolumePrefix and the name of an image volume
	// (volumes[].image.reference), which the config writes `volume: NAME`
	// (K1).
	Container string `yaml:"container"`
	// VolumeName is the file's `volume: NAME`, which Parse moves into
	// Container as VolumeKey(NAME); it is always empty in a parsed Config.
	VolumeName string `yaml:"volume,omitempty"`
}

// VolumePrefix marks a Target.Container that names an image volume:
// "volume:models". A container name is a DNS-1123 label, so it never
// holds a colon.
const VolumePrefix = "volume:"

// VolumeKey is the Target.Container of the image volume name.
func VolumeKey(name string) string { return VolumePrefix + name }

// Volume returns the image volume's name when the target is one.
func (t Target) Volume() (string, bool) { return strings.CutPrefix(t.Container, VolumePrefix) }

// Workload returns the workload the target's container belongs to.
func (t Target) Workload() Workload {
	return Workload{Kind: t.Kind, Namespace: t.Namespace, Name: t.Name}
}

// String renders the target as "Deployment tb/tb-jobs-manager container
// api", or "… image volume models".
func (t Target) String() string {
	if v, ok := t.Volume(); ok {
		return fmt.Sprintf("%s image volume %s", t.Workload(), v)
	}
	return fmt.Sprintf("%s container %s", t.Workload(), t.Container)
}

// Image is a repository and tag, and the containers that run it.
type Image struct {
	// Name is the <image> part of the state annotation keys.
	Name       string `yaml:"name"`
	Repository string `yaml:"repository"`
	Tag        string `yaml:"tag"`
	// PinnedDigest, when set, is the operator's pin: the image is not
	// refreshed, only checked for a stale pin (R2).
	PinnedDigest string   `yaml:"pinnedDigest"`
	Targets      []Target `yaml:"targets"`
}

// Registry holds per-host connection settings.
type Registry struct {
	Host string `yaml:"host"`
	// Insecure allows plain HTTP and unverified TLS: loopback and labs only.
	Insecure bool `yaml:"insecure"`
	// CAFile is a PEM bundle trusted in addition to the system roots; a
	// relative path is relative to the working directory. Load checks it is
	// readable; Parse cannot (it has no filesystem access).
	CAFile string `yaml:"caFile"`
}

// Group is a set of images whose bookkeeping lives on one anchor workload:
// one attempt counter and one lockout (R10).
type Group struct {
	Name   string   `yaml:"name"`
	Anchor Workload `yaml:"anchor"`
	Images []Image  `yaml:"images"`
	// OnFailedRollout says what happens when a digest-change rollout of
	// the group fails (V2): hold (R10's lockout; "" is hold) or rollback.
	OnFailedRollout OnFailedRollout `yaml:"onFailedRollout,omitempty"`
	// Promotion makes the group follow another (P1): it moves to a new
	// digest only once the leader group ran it settled and healthy for the
	// soak. nil: the group moves as soon as the registry does.
	Promotion *Promotion `yaml:"promotion,omitempty"`
	// Discovered: internal/discovery made the group from labelled
	// workloads (D1); never set from a config file. Its pins keep the tag
	// (discovery.PinFormat), and its images resolve with the pull secrets
	// of its pods' ServiceAccounts too (R20).
	Discovered bool `yaml:"-"`
}

// Workloads returns the anchor and then every distinct target workload, in
// the order first listed. These are the workloads the settled guard checks
// (R4).
func (g Group) Workloads() []Workload {
	out := []Workload{g.Anchor}
	seen := map[Workload]bool{g.Anchor: true}
	for _, img := range g.Images {
		for _, t := range img.Targets {
			if w := t.Workload(); !seen[w] {
				seen[w] = true
				out = append(out, w)
			}
		}
	}
	return out
}

// Promotion is a group's place behind another (P1), or behind a signer in
// another cluster (P2), and what it publishes for others (P2).
type Promotion struct {
	// After names the leader group, of the same config (P1).
	After string `yaml:"after"`
	// AttestedBy names the installation, in another cluster, whose signed
	// promotion attestation a digest needs before this group moves to it
	// (P2); exclusive with After.
	AttestedBy *AttestedBy `yaml:"attestedBy,omitempty"`
	// Soak is how long the leader must have run a digest settled and
	// healthy before this group moves to it; 0 moves once the leader runs
	// it settled and healthy. Under AttestedBy it is the extra wait after
	// the attestation's time.
	Soak time.Duration `yaml:"soak"`
	// Publish makes this group's installation publish a signed promotion
	// attestation for each digest the group ran settled and healthy for
	// Publish.Soak (P2), signed with PromotionSigning's key.
	Publish *PromotionPublish `yaml:"publish,omitempty"`
	// Images maps each image name of this group to the leader's image of
	// the same repository and tag; set by validation.
	Images map[string]string `yaml:"-"`
}

// AttestedBy is the signer a cross-cluster follower trusts (P2): the
// installation's name, which the attestation's predicate must carry, and
// the keys or keyless identities it signs with (V1's trust rules).
type AttestedBy struct {
	Name   string        `yaml:"name"`
	Cosign *CosignPolicy `yaml:"cosign"`
	// Policy is the verification policy validation derives from it: the
	// cosign trust, and one required attestation of
	// PromotionPredicateType whose predicate names the installation (V5's
	// reader checks it). Load reads its keys.
	Policy *VerificationPolicy `yaml:"-"`
}

// PromotionPublish is what a leader publishes (P2).
type PromotionPublish struct {
	// Soak is how long the group must have run a digest settled and
	// healthy before its promotion attestation is published.
	Soak time.Duration `yaml:"soak"`
}

// PromotionSigning is the key promotion attestations are signed with
// (P2): a PEM private key file (PKCS#8, EC or PKCS#1, or cosign's
// encrypted cosign.key) and, for an encrypted one, a file holding its
// password. Load reads both; internal/verify parses them.
type PromotionSigning struct {
	KeyFile      string `yaml:"keyFile"`
	PasswordFile string `yaml:"passwordFile,omitempty"`
	Key          []byte `yaml:"-"`
	Password     []byte `yaml:"-"`
}

// PromotionPredicateType is the in-toto predicate type of a promotion
// attestation (P2).
const PromotionPredicateType = "https://image-refresh.dev/promotion/v1"

// OnFailedRollout is a group's answer to a failed digest-change rollout (V2).
type OnFailedRollout string

const (
	// OnFailedRolloutHold keeps R10: the next attempt waits again, and the
	// group locks out after maxRefreshAttempts.
	OnFailedRolloutHold OnFailedRollout = "hold"
	// OnFailedRolloutRollback puts every target that moved back on the
	// group's recorded digest and quarantines the failed digest.
	OnFailedRolloutRollback OnFailedRollout = "rollback"
)

// FirstInstall says what happens when an image has no recorded digest (R5).
type FirstInstall string

const (
	// FirstInstallPinNextTick records latest, and R7 pins the targets on the
	// next tick: one extra rollout after install.
	FirstInstallPinNextTick FirstInstall = "pin-next-tick"
	// FirstInstallOnlyAfterEverPinned pins only images image-refresh has
	// pinned before, so a fresh install never rolls.
	FirstInstallOnlyAfterEverPinned FirstInstall = "only-after-ever-pinned"
)

// Config is the validated content of a config file.
type Config struct {
	// AnnotationPrefix is P in the state annotation keys; "tracebloc.io"
	// keeps the seed script's keys.
	AnnotationPrefix string `yaml:"annotationPrefix"`
	// RolloutTimeout bounds each rollout wait (R14).
	RolloutTimeout time.Duration `yaml:"rolloutTimeout"`
	// RegistryTimeout bounds one registry call (R14).
	RegistryTimeout time.Duration `yaml:"registryTimeout"`
	// APITimeout bounds one Kubernetes API call (R14).
	APITimeout time.Duration `yaml:"apiTimeout"`
	// TickTimeout bounds a whole tick (R14); 0 derives it, see
	// EffectiveTickTimeout.
	TickTimeout time.Duration `yaml:"tickTimeout"`
	// MaxRefreshAttempts is the lockout ceiling (R10).
	MaxRefreshAttempts int `yaml:"maxRefreshAttempts"`
	// MaxSkipTicks is the settled-guard skip streak ceiling (R4).
	MaxSkipTicks int `yaml:"maxSkipTicks"`
	// MaxReadFailures is the ceiling of the live-image read (R7) and
	// registry resolve (R1) failure streaks.
	MaxReadFailures int `yaml:"maxReadFailures"`
	// MaxDigestChanges bounds how often one image's digest record moves
	// within DigestChangeWindow: a tag that flips between digests causes at
	// most this many rollouts per window; beyond it the image is held on
	// its recorded digest, loudly. A DigestChangeWindow of 0 turns the
	// bound off.
	MaxDigestChanges   int           `yaml:"maxDigestChanges"`
	DigestChangeWindow time.Duration `yaml:"digestChangeWindow"`
	// MinDigestAge holds a new digest until image-refresh has seen the tag
	// point to it for at least this long (R22); 0 rolls it at once.
	MinDigestAge time.Duration `yaml:"minDigestAge"`
	// RolloutWindows limit when digest-change rollouts start (R24); none:
	// any time. A revert re-pin is always allowed.
	RolloutWindows []RolloutWindow `yaml:"rolloutWindows"`
	// MaxConcurrentRollouts caps, in run, the groups rolling out a digest
	// change at once across the controller (R24); 0: unlimited.
	MaxConcurrentRollouts int `yaml:"maxConcurrentRollouts"`
	// PinCheckInterval is how often `run` checks that every pinned digest
	// and V2 rollback target still exists in its registry (V4); a tick
	// checks on every tick.
	PinCheckInterval time.Duration `yaml:"pinCheckInterval"`
	// FailOnRunningStale makes a target whose pods run another digest than
	// its pin (N1, running-stale) exit a tick 1. Off by default: the pin
	// already fixes the next rollout, and the state is reported anyway.
	FailOnRunningStale bool               `yaml:"failOnRunningStale"`
	FirstInstall       FirstInstall       `yaml:"firstInstall"`
	PinFormat          imageref.PinFormat `yaml:"pinFormat"`
	Registries         []Registry         `yaml:"registries"`
	// Verification are the signature policies of V1; the first whose
	// repositories match an image applies to it (VerificationFor).
	Verification []VerificationPolicy `yaml:"verification"`
	// Installation names this installation of image-refresh (one cluster's)
	// in the promotion attestations it publishes (P2).
	Installation string `yaml:"installation,omitempty"`
	// PromotionSigning is the key those attestations are signed with (P2).
	PromotionSigning *PromotionSigning `yaml:"promotionSigning,omitempty"`
	// Kinds declares workload kinds beyond the built-in four (K2).
	Kinds  []DeclaredKind `yaml:"kinds"`
	Groups []Group        `yaml:"groups"`
}

// Defaults returns a Config with every optional setting at its default and
// no groups: valid, and the config of discovery alone (D1) when no
// file is given.
func Defaults() *Config {
	return &Config{
		AnnotationPrefix:   DefaultAnnotationPrefix,
		RolloutTimeout:     DefaultRolloutTimeout,
		RegistryTimeout:    DefaultRegistryTimeout,
		APITimeout:         DefaultAPITimeout,
		MaxRefreshAttempts: DefaultMaxRefreshAttempts,
		MaxSkipTicks:       DefaultMaxSkipTicks,
		MaxReadFailures:    DefaultMaxReadFailures,
		MaxDigestChanges:   DefaultMaxDigestChanges,
		DigestChangeWindow: DefaultDigestChangeWindow,
		PinCheckInterval:   DefaultPinCheckInterval,
		FirstInstall:       DefaultFirstInstall,
		PinFormat:          DefaultPinFormat,
	}
}

// PinFormat is how the group's pins are written: a discovered group's
// always keep the tag (repo:tag@digest), so that its targets stay
// discoverable (D1); a configured group's follow the config's pinFormat.
// tick, run, the webhook and render all ask this.
func (g Group) PinFormat(configured imageref.PinFormat) imageref.PinFormat {
	if g.Discovered {
		return imageref.PinTagAndDigest
	}
	return configured
}
