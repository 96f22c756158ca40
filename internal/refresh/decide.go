package refresh

import (
	"fmt"
	"strconv"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/state"
)

// decision carries one Decide call's working state.
type decision struct {
	s       Settings
	obs     Observation
	keys    state.Keys
	p       *Plan
	ann     map[string]string
	pending Write // digest records and ever-pinned markers, after a settled rollout
	changes map[config.Workload][]ImageChange
	order   []config.Workload
	locked  bool // locked out (R10), after R23's re-arm by a new digest
	rearmed bool // this pass re-armed the group by a new digest (R23)
}

// Decide applies the rules of SPEC.md to one group's observation.
func Decide(s Settings, obs Observation) *Plan {
	d := &decision{
		s: s, obs: obs, keys: state.Keys{Prefix: s.Prefix}, ann: obs.Anchor,
		p:       &Plan{Group: obs.Group.Name, Anchor: obs.Group.Anchor},
		changes: map[config.Workload][]ImageChange{},
	}
	if obs.AnchorErr != nil {
		d.anchorUnreadable()
		return d.p
	}
	locked := d.readAttempt()
	if locked {
		d.rearmed = d.rearmByNewDigest()
		locked = !d.rearmed
	}
	d.locked = locked
	d.readSkipStreak()
	blocked, notSettled := d.readWorkloads()
	for _, img := range obs.Group.Images {
		d.image(img)
	}
	d.gate(locked, blocked, notSettled)
	d.running()
	d.suspend()
	d.pins()
	d.soak()
	d.p.InFlight = d.rolloutInFlight()
	return d.p
}

// rolloutInFlight reports whether the plan leaves a rollout in flight
// (Plan.InFlight, R24): it re-images and returns (NoWait), or it leaves an
// attempt that is still rolling within its deadline alone.
func (d *decision) rolloutInFlight() bool {
	p := d.p
	if p.Repin != nil {
		return p.Repin.Async
	}
	return p.Attempts > 0 && !p.LockedOut && !p.WaitUntil.IsZero()
}

func (d *decision) value(key string) (string, bool) {
	v, ok := d.ann[key]
	return v, ok
}

func (d *decision) now() time.Time {
	if d.s.Now == nil {
		return time.Now()
	}
	return d.s.Now()
}

func (d *decision) find(f Finding) { d.p.Findings = append(d.p.Findings, f) }

// rearm is the remediation every lockout names (R18).
func (d *decision) rearm() string { return d.s.RearmCommand(d.p.Group) }

func (d *decision) anchorUnreadable() {
	g := d.obs.Group
	msg := fmt.Sprintf("read anchor %s of group %s: %v", g.Anchor, g.Name, d.obs.AnchorErr)
	d.find(Finding{Severity: SeverityError, Reason: ReasonRefreshError, Message: msg, NeedsHuman: true,
		Remediation: "make sure the anchor workload exists and image-refresh may get and patch it (RBAC)"})
	for _, img := range g.Images {
		for _, t := range img.Targets {
			d.row(img, t, StateError, msg, "make sure the anchor workload exists and image-refresh may get and patch it (RBAC)")
		}
	}
}

func (d *decision) clear(w *Write, key string) {
	if _, ok := d.value(key); ok {
		w.set(key, nil, d.ann)
	}
}

// counter increments a per-image failure streak and reports whether it
// reached its ceiling; an invalid stored value counts as at the ceiling.
func (d *decision) counter(key string) (n int, atCeiling bool) {
	v, ok := d.value(key)
	old, err := state.ParseCounter(v, ok)
	if err != nil {
		old = d.s.MaxReadFailures
	}
	n = old + 1
	d.p.Bookkeeping.set(key, ptr(strconv.Itoa(n)), d.ann)
	return n, n >= d.s.MaxReadFailures
}

// image decides one image of the group: resolve it (R1), check an operator
// pin (R2), record a first observation (R5), read every target (R7, R19),
// then decide each target against the record (R6–R9, R21–R24).
func (d *decision) image(img config.Image) {
	staleKey := d.keys.StalePin(img.Name)
	if img.PinnedDigest == "" {
		// R2: the pin was removed, so its finding goes, registry or not.
		d.clearStalePin(img, staleKey, "its pinnedDigest was removed; image-refresh follows the tag again")
	}
	latest, ok := d.resolve(img)
	if !ok {
		return
	}
	// R2: an operator pin is not refreshed, only checked.
	if img.PinnedDigest != "" {
		d.operatorPin(img, latest, staleKey)
		return
	}
	recorded, ok := d.record(img, latest)
	if !ok {
		return
	}
	d.rememberVerified(img, recorded, latest)
	d.forgetRolledBack(img, latest)
	// R7/R19: every target must be readable, else the image is skipped.
	if !d.readTargets(img) {
		return
	}
	d.targets(img, recorded, latest)
}

func (d *decision) row(img config.Image, t config.Target, st State, msg, rem string) {
	recorded := d.ann[d.keys.Record(img.Name)]
	live, slot := "", ""
	if w, ok := d.obs.Workloads[t.Workload()]; ok {
		live, slot = w.Containers[t.Container].Image, w.Containers[t.Container].Slot
	}
	d.p.Rows = append(d.p.Rows, Row{
		Group: d.p.Group, Image: img.Name, Repository: img.Repository, Tag: img.Tag, Target: TargetString(t, slot), Slot: slot,
		Latest: d.obs.Latest[img.Name].Digest, Recorded: recorded, Live: live, State: st,
		Attempts: d.p.Attempts, SkipStreak: d.p.SkipStreak, Message: msg, Remediation: rem, target: t,
	})
}

// TargetString names a target for people, with what holds its image:
// "Deployment shop/api init container migrate" (K1); slot as
// Container.Slot.
func TargetString(t config.Target, slot string) string {
	if slot != "init container" {
		return t.String() // "… container api", "… image volume models"
	}
	return fmt.Sprintf("%s init container %s", t.Workload(), t.Container)
}

// named is TargetString of a target as read.
func (d *decision) named(t config.Target) string {
	return TargetString(t, d.obs.Workloads[t.Workload()].Containers[t.Container].Slot)
}

func ptr(s string) *string { return &s }

func orUnknown(s string) string {
	if s == "" {
		return "an unknown writer"
	}
	return s
}
