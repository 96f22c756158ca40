package pass

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/metrics"
	"github.com/image-refresh/image-refresh/internal/refresh"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// Result is what one pass over every group did.
type Result struct {
	Plans []*refresh.Plan
}

// NeedsHuman reports whether any group needs a human (exit 1, R15).
func (r Result) NeedsHuman() bool {
	for _, p := range r.Plans {
		if p.NeedsHuman() {
			return true
		}
	}
	return false
}

// AllGroups runs one reconcile pass over every group, bounded by the config's
// tick deadline (R14). With dryRun it decides and reports, and writes
// nothing: no annotation, no image, no event.
func (r *Runner) AllGroups(ctx context.Context, dryRun bool) Result {
	ctx, cancel := context.WithTimeout(ctx, r.Config.EffectiveTickTimeout())
	defer cancel()
	latest := &PassSource{Resolver: r.Resolver}
	var rolling map[string]bool
	if dryRun && r.Config.MaxConcurrentRollouts > 0 {
		// status shows what `run` would do: which groups wait for a
		// rollout slot (R24). A tick rolls one group at a time anyway.
		rolling = r.RollingGroups(ctx)
	}
	var res Result
	// P1: a leader passes before its followers, which read the soak its
	// pass keeps.
	for _, g := range config.PromotionOrder(r.Config.Groups) {
		opts := GroupOptions{DryRun: dryRun, RollingElsewhere: Elsewhere(rolling, g.Name)}
		p := r.Group(ctx, g, latest, opts)
		if p.WaitFailed && g.OnFailedRollout == config.OnFailedRolloutRollback && !p.Repin.Rollback {
			// V2: the rollout this tick waited for failed; the group's
			// next pass, now, rolls it back (its attempt is released),
			// for what the wait saw when the wait ended on it.
			res.Plans = append(res.Plans, p)
			opts.WaitFailure = p.WaitFailure
			p = r.Group(ctx, g, latest, opts)
		}
		res.Plans = append(res.Plans, p)
	}
	return res
}

// RollingGroups reads every group's anchor: a group whose attempt counter
// is set and below maxRefreshAttempts has a rollout in flight (R24). An
// anchor that cannot be read counts as not rolling; its own pass reports it.
func (r *Runner) RollingGroups(ctx context.Context) map[string]bool {
	rolling := map[string]bool{}
	for _, g := range r.Config.Groups {
		obj, err := r.Workloads.Get(ctx, g.Anchor)
		if err != nil {
			continue
		}
		if v, err := r.States().Read(ctx, obj); err == nil && r.Rolling(v.State) {
			rolling[g.Name] = true
		}
	}
	return rolling
}

// Rolling reports whether an anchor's annotations say that its group has a
// rollout in flight: an attempt counter set and below maxRefreshAttempts.
func (r *Runner) Rolling(anchor map[string]string) bool {
	return refresh.RollingOnAnchor(r.Config.AnnotationPrefix, r.Config.MaxRefreshAttempts, anchor)
}

// Elsewhere lists the groups of rolling other than group, sorted.
func Elsewhere(rolling map[string]bool, group string) []string {
	var out []string
	for g, on := range rolling {
		if on && g != group {
			out = append(out, g)
		}
	}
	slices.Sort(out)
	return out
}

// GroupOptions tune one group pass.
type GroupOptions struct {
	DryRun bool
	// Fights are targets to leave alone (C5), from the controller's memory.
	Fights map[config.Target]string
	// SkipUncounted: see refresh.Observation.SkipUncounted.
	SkipUncounted bool
	// NoWait: see refresh.Settings.NoWait (the controller).
	NoWait bool
	// Reverted: see refresh.Observation.Reverted (C6).
	Reverted map[config.Workload]refresh.Revert
	// RollingElsewhere: see refresh.Observation.RollingElsewhere (R24).
	RollingElsewhere []string
	// WaitFailure: see refresh.Observation.WaitFailure (V2).
	WaitFailure string
}

// settings returns SettingsFrom of the Runner's config, computed once per
// config: its HolderTTL counts every workload of every group
// (EffectiveTickTimeout), which a pass over one group must not redo — at
// 10,000 workloads that was half of a resync's CPU (C6).
func (r *Runner) settings() refresh.Settings {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.settingsOf != r.Config {
		r.cachedSettings = refresh.SettingsFrom(r.Config, r.ConfigPath)
		r.settingsOf = r.Config
	}
	return r.cachedSettings
}

// Group runs one reconcile pass over one group: observe, decide, execute
// (unless DryRun), report. It returns the plan with every finding.
func (r *Runner) Group(ctx context.Context, g config.Group, latest Latest, opts GroupOptions) *refresh.Plan {
	settings := r.settings()
	settings.Instance = r.Instance
	if r.Now != nil {
		settings.Now = r.Now
	}
	settings.NoWait = opts.NoWait
	settings.PinFormat = g.PinFormat(settings.PinFormat)
	decide := func() (Snapshot, *refresh.Plan) {
		snap := r.Observe(ctx, g, latest)
		snap.Observation.Fights = opts.Fights
		snap.Observation.SkipUncounted = opts.SkipUncounted
		snap.Observation.Reverted = opts.Reverted
		snap.Observation.RollingElsewhere = opts.RollingElsewhere
		snap.Observation.WaitFailure = opts.WaitFailure
		snap.Observation.CountedAsks = r.counted(g)
		return snap, refresh.Decide(settings, snap.Observation)
	}
	snap, plan := decide()
	if !opts.DryRun && r.staleAnswer(ctx, g, latest, snap, plan) {
		snap, plan = decide()
	}
	if snap.State.Rewound {
		plan.Findings = append([]refresh.Finding{rewound(plan, snap)}, plan.Findings...)
	}
	if !opts.DryRun {
		r.Execute(ctx, plan, snap)
		r.restore(ctx, plan, snap)
		r.countAsks(g, plan)
	}
	r.report(ctx, plan, snap, opts.DryRun)
	return plan
}

// rewound is the INFO that a pass decided on the copy of the group's
// state because the anchor's was older (R25): a rollback put an older
// ReplicaSet's annotations back on the anchor. The image the rollback wrote
// is the operator's write, judged as any other (R7); no attempt or holder
// it brought back counts.
func rewound(p *refresh.Plan, snap Snapshot) refresh.Finding {
	v := snap.State
	return refresh.Finding{Severity: refresh.SeverityInfo, Message: fmt.Sprintf(
		"the state annotations on %s are older than their copy in ConfigMap %s (generation %d < %d): a rollback such as `kubectl rollout undo` put back an older ReplicaSet's annotations; this pass decides on the copy and writes it back to the anchor, and the image the rollback wrote is the operator's",
		p.Anchor, v.Copy, v.AnchorGeneration, v.CopyGeneration)}
}

// restore writes the current state back to a rewound anchor when the
// pass's own writes did not (R25): a plan with no state write, or one that
// failed before its first. A no-op when a write of the pass restored it.
func (r *Runner) restore(ctx context.Context, p *refresh.Plan, snap Snapshot) {
	if !snap.State.Rewound {
		return
	}
	if _, err := r.States().Update(ctx, p.Anchor, nil, nil); err != nil {
		p.Findings = append(p.Findings, refresh.Finding{Severity: refresh.SeverityWarn,
			Message: fmt.Sprintf("could not write the state back to %s after a rollback rewound it: %v; the next pass decides on the copy and tries again", p.Anchor, err)})
	}
}

// countAsks remembers the failed registry asks whose failures the pass
// stored on the anchor (Plan.CountedAsks), so that the next passes, which
// read the same cached answer of the poller until it asks again, do not
// count them again (R1: the streak counts failed asks, not passes).
func (r *Runner) countAsks(g config.Group, plan *refresh.Plan) {
	if plan.Failed != nil || len(plan.CountedAsks) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.countedAsks == nil {
		r.countedAsks = map[string]map[string]uint64{}
	}
	if r.countedAsks[g.Name] == nil {
		r.countedAsks[g.Name] = map[string]uint64{}
	}
	maps.Copy(r.countedAsks[g.Name], plan.CountedAsks)
}

// counted returns a copy of the asks counted for g (Observation.CountedAsks).
func (r *Runner) counted(g config.Group) map[string]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.countedAsks[g.Name])
}

// Refresher is a Latest whose answers may be older than the pass that reads
// them: the controller's poller, which asks once per interval (C2).
type Refresher interface {
	// Refresh asks the registry now and keeps the answer.
	Refresh(ctx context.Context, img config.Image) refresh.Resolution
}

// staleAnswer asks the registry again, before a plan re-images a target
// away from a digest it runs, for each image that plan would do that to,
// and reports whether any answer differs from the one the plan was decided
// on. Another image-refresh process (two instances without leader
// election, C3) may have rolled a digest that this process's poller has not
// seen yet: re-pinning to the older answer would roll the group back and
// forth. One HEAD per such image, and only when a digest a target runs is
// about to be replaced; a PassSource's answers are this pass's and never
// stale.
func (r *Runner) staleAnswer(ctx context.Context, g config.Group, latest Latest, snap Snapshot, plan *refresh.Plan) bool {
	f, ok := latest.(Refresher)
	if !ok || plan.Repin == nil {
		return false
	}
	asked := map[string]bool{}
	stale := false
	for _, wc := range plan.Repin.Changes {
		for _, c := range wc.Images {
			from := imageref.DigestOf(c.From)
			if from == "" || from == imageref.DigestOf(c.To) || asked[c.Image] {
				continue
			}
			asked[c.Image] = true
			i := slices.IndexFunc(g.Images, func(img config.Image) bool { return img.Name == c.Image })
			if i < 0 {
				continue
			}
			img := g.Images[i]
			was := snap.Observation.Latest[c.Image]
			now := f.Refresh(ctx, img)
			if now.Digest != was.Digest || (now.Err == nil) != (was.Err == nil) {
				r.Log.Info("the registry's answer changed since the last poll; deciding again before re-imaging",
					"group", g.Name, "image", c.Image, "was", was.Digest, "now", now.Digest)
				stale = true
			}
		}
	}
	return stale
}

// report tells the operator: a log line per finding (with the
// remediation), a Warning Event on the anchor for each non-benign one, and
// the metrics (R15).
func (r *Runner) report(ctx context.Context, p *refresh.Plan, snap Snapshot, dryRun bool) {
	anchor := snap.Objects[p.Anchor]
	told := r.tellOnce(p, dryRun)
	for _, f := range p.Findings {
		if f.Once != "" && !told[f.Once] {
			continue
		}
		attrs := []any{"group", p.Group}
		if f.Image != "" {
			attrs = append(attrs, "image", f.Image)
		}
		if f.Target != nil {
			attrs = append(attrs, "target", f.Target.String())
		}
		if f.Reason != "" {
			attrs = append(attrs, "reason", f.Reason)
		}
		if f.Remediation != "" {
			attrs = append(attrs, "remediation", f.Remediation)
		}
		if dryRun {
			attrs = append(attrs, "dryRun", true)
		}
		msg := f.Message
		if f.Severity == refresh.SeverityNote {
			msg = "NOTE: " + msg
		}
		r.Log.Log(ctx, level(f.Severity), msg, attrs...)
		if (f.NeedsHuman || f.Event) && !dryRun && anchor != nil {
			msg := f.Message
			if f.Remediation != "" {
				msg += ". Remediation: " + f.Remediation
			}
			r.event(ctx, anchor, "Warning", f.Reason, msg)
		}
	}
	if r.Metrics == nil {
		return
	}
	m := r.Metrics
	locked := 0.0
	if p.LockedOut {
		locked = 1
	}
	m.GroupLockedOut.WithLabelValues(p.Group).Set(locked)
	var targets []metrics.Target
	for _, img := range snap.Observation.Group.Images {
		for _, t := range img.Targets {
			targets = append(targets, metrics.Target{Image: img.Name, Namespace: t.Namespace, Workload: t.Name, Container: t.Container})
		}
	}
	m.SetTargets(p.Group, targets)
	for _, reason := range []string{refresh.ReasonRefreshLockedOut, refresh.ReasonRefreshFrozen, refresh.ReasonStalePin, refresh.ReasonRefreshError, refresh.ReasonTagFlapping, refresh.ReasonDigestQuarantined, refresh.ReasonRewriteFight, refresh.ReasonRunningStale, refresh.ReasonDigestUnverified, refresh.ReasonRolledBack, refresh.ReasonPlatformMissing, refresh.ReasonPinMissing, refresh.ReasonSuspendedWithoutEnd, refresh.ReasonPromotionPublishFailed} {
		v := 0.0
		for _, f := range p.Findings {
			if (f.NeedsHuman || f.Event) && f.Reason == reason {
				v = 1
			}
		}
		m.NeedsAttention.WithLabelValues(p.Group, reason).Set(v)
	}
	if p.NeedsHuman() {
		m.ReconcileErrors.WithLabelValues(p.Group).Inc()
	}
	for _, f := range p.Findings {
		if f.Reason == refresh.ReasonRearmedByNewDigest && !dryRun {
			m.RearmedByNewDigest.WithLabelValues(p.Group).Inc()
		}
	}
	for _, row := range p.Rows {
		t := row.TargetRef()
		on := 0.0
		if row.State == refresh.StatePinned {
			on = 1
		}
		m.TargetOnDigest.WithLabelValues(p.Group, row.Image, t.Namespace, t.Name, t.Container).Set(on)
		m.PodsOffDigest.WithLabelValues(p.Group, row.Image, t.Namespace, t.Name, t.Container).Set(float64(row.PodsOff))
	}
	m.LastTick.WithLabelValues(p.Group).Set(float64(time.Now().Unix()))
	m.Passes.WithLabelValues(p.Group).Inc()
}

// tellOnce returns the Once keys of p's findings to tell: those the
// group's last pass did not report. A dry run tells them all and
// remembers nothing.
func (r *Runner) tellOnce(p *refresh.Plan, dryRun bool) map[string]bool {
	now := map[string]bool{}
	for _, f := range p.Findings {
		if f.Once != "" {
			now[f.Once] = true
		}
	}
	if dryRun {
		return now
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.told == nil {
		r.told = map[string]map[string]bool{}
	}
	last := r.told[p.Group]
	r.told[p.Group] = maps.Clone(now)
	for k := range now {
		if last[k] {
			delete(now, k)
		}
	}
	return now
}

func (r *Runner) event(ctx context.Context, obj *workload.Object, typ, reason, msg string) {
	if reason == "" {
		reason = refresh.ReasonRefreshError
	}
	var rec workload.Recorder = r.Workloads
	if r.Events != nil {
		rec = r.Events
	}
	if err := rec.Event(ctx, obj, typ, reason, msg); err != nil {
		r.Log.Warn("could not record an event", "object", obj.Ref.String(), "reason", reason, "error", err)
	}
}

func level(s refresh.Severity) slog.Level {
	switch s {
	case refresh.SeverityWarn:
		return slog.LevelWarn
	case refresh.SeverityError:
		return slog.LevelError
	}
	return slog.LevelInfo
}

// InstanceName names this process in the attempt holder it writes: the host
// name (a pod's name in a cluster) and a random suffix, because a restarted
// process is not the one that wrote the holder before it.
func InstanceName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "image-refresh"
	}
	host = strings.Map(func(r rune) rune {
		if r <= ' ' || r > '~' {
			return '-'
		}
		return r
	}, host)
	if len(host) > 200 {
		host = host[:200]
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return host + "-" + hex.EncodeToString(b)
}
