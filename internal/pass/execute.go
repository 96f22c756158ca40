package pass

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/refresh"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// Execute carries out a plan in the order the rules require:
// bookkeeping (R13), skip-streak clear (R4), then the repin — attempt
// persisted before re-imaging (R10), one write per workload (R9), wait for
// every rollout (R14 rolloutTimeout), clear the attempt in its own write,
// then record digests (R6). Every failure becomes a finding on the plan, so
// the report, the events and the exit code say what happened.
func (r *Runner) Execute(ctx context.Context, p *refresh.Plan, snap Snapshot) {
	anchor := p.Anchor
	if !r.writeBookkeeping(ctx, p, anchor) {
		return
	}
	r.clearSkipStreak(ctx, p, anchor)
	r.publish(ctx, p, snap)
	if p.Repin == nil {
		return
	}
	writeCopy, ok := r.persistAttempt(ctx, p, anchor)
	if !ok {
		return
	}
	ended := false // the attempt was cleared, or is another process's now
	defer func() {
		if !ended {
			r.release(ctx, p, anchor)
		}
	}()
	ended = r.reimage(ctx, p, snap, anchor, writeCopy)
}

// writeBookkeeping writes the plan's bookkeeping (R13); false when it
// failed, and nothing else is written.
func (r *Runner) writeBookkeeping(ctx context.Context, p *refresh.Plan, anchor config.Workload) bool {
	if p.Bookkeeping.Empty() {
		return true
	}
	if _, err := r.States().Update(ctx, anchor, p.Bookkeeping.Expect, p.Bookkeeping.Set); err != nil {
		if errors.Is(err, workload.ErrChanged) {
			r.lostRace(p, err, "nothing was written")
			return false
		}
		r.fail(p, "write bookkeeping annotations on %s: %v", p.Anchor, err)
		return false
	}
	return true
}

// clearSkipStreak clears the skip streak of a settled group (R4): failing
// to is a WARN, not fatal.
func (r *Runner) clearSkipStreak(ctx context.Context, p *refresh.Plan, anchor config.Workload) {
	if p.ClearSkip.Empty() {
		return
	}
	if _, err := r.States().Update(ctx, anchor, p.ClearSkip.Expect, p.ClearSkip.Set); err != nil {
		p.Findings = append(p.Findings, refresh.Finding{Severity: refresh.SeverityWarn,
			Message: fmt.Sprintf("could not clear the skip streak on %s: %v", p.Anchor, err)})
	}
}

// persistAttempt writes the repin's attempt on the anchor before anything
// is re-imaged (R10); ok is false when it failed, and nothing is
// re-imaged. In `run` (Async) the attempt's copy (R25) is left to
// writeCopy, which reimage runs beside the image patches: a revert's
// re-pin then waits for the anchor's write alone, as before the copy
// existed (issue 38). A tick writes the copy here, before any image.
func (r *Runner) persistAttempt(ctx context.Context, p *refresh.Plan, anchor config.Workload) (writeCopy func(), ok bool) {
	rp := p.Repin
	writeCopy = func() {}
	if rp.AttemptWrite.Empty() {
		return writeCopy, true
	}
	var err error
	if rp.Async {
		_, writeCopy, err = r.States().UpdateThenCopy(ctx, anchor, rp.AttemptWrite.Expect, rp.AttemptWrite.Set)
	} else {
		_, err = r.States().Update(ctx, anchor, rp.AttemptWrite.Expect, rp.AttemptWrite.Set)
	}
	if err != nil {
		if errors.Is(err, workload.ErrChanged) {
			r.lostRace(p, err, "nothing was re-imaged")
			return writeCopy, false
		}
		r.fail(p, "persist the attempt counter on %s before re-imaging: %v; nothing was re-imaged", p.Anchor, err)
		return writeCopy, false
	}
	return writeCopy, true
}

// reimage writes the repin's image changes (R9), beside writeCopy, the
// attempt's copy (persistAttempt), which is done before any other state
// write, and ends the attempt: at once when admission rewrote every one of
// them (C5), by the pass that sees the rollout settled in `run` (C6), or
// after waiting for the rollouts in a tick. It reports whether the attempt
// ended; if not, Execute releases it.
func (r *Runner) reimage(ctx context.Context, p *refresh.Plan, snap Snapshot, anchor config.Workload, writeCopy func()) (ended bool) {
	rp := p.Repin
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		writeCopy()
	}()
	rewrites, failed := r.applyChanges(ctx, p, snap)
	<-copied
	if failed {
		return false
	}
	if rewrites > 0 && rewrites == len(rp.Changes) && !rp.AttemptWrite.Empty() {
		if _, err := r.States().Update(ctx, anchor, rp.ClearWrite.Expect, rp.ClearWrite.Set); err != nil {
			r.fail(p, "release the attempt counter on %s after a rewritten re-pin: %v", p.Anchor, err)
			return false
		}
		return true
	}
	if rp.Async {
		// run (C6): the holder on the anchor times the rollout, and the
		// pass that sees it settled confirms it; this worker is free.
		for i := range p.Rows {
			if p.Rows[i].State == refresh.StateDrifted {
				p.Rows[i].State, p.Rows[i].Message = refresh.StateNotSettled, "re-pinned this pass; the rollout is in progress"
			}
		}
		return true
	}
	if !r.waitSettled(ctx, p, snap.Observation.Group.OnFailedRollout == config.OnFailedRolloutRollback) {
		return false
	}
	if ended, ok := r.clearAttempt(ctx, p, anchor); !ok {
		return ended
	}
	r.recordDigests(ctx, p, anchor)
	return true
}

// applyChanges writes the repin's image changes and reports how many
// admission rewrote (C5) and whether a write failed.
func (r *Runner) applyChanges(ctx context.Context, p *refresh.Plan, snap Snapshot) (rewrites int, failed bool) {
	rp := p.Repin
	for _, res := range r.applyAll(ctx, p, snap, rp.Changes, rp.Async) {
		p.Findings = append(p.Findings, res.findings...)
		switch err := res.err; {
		case errors.Is(err, workload.ErrRewritten):
			// C5: the write landed and admission put another image back.
			// Nothing rolls, so the attempt is released below; the finding
			// is loud and names what happened.
			rewrites++
			p.Findings = append(p.Findings, refresh.Finding{Severity: refresh.SeverityWarn, Reason: refresh.ReasonRewriteFight, NeedsHuman: true,
				Message:     fmt.Sprintf("the environment rewrites image references: %v", err),
				Remediation: "a mutating admission webhook changes the image digest image-refresh writes: exempt these workloads from it, or let it keep the digest (rewriting only the registry prefix is fine)"})
		case errors.Is(err, errNotTried):
		case err != nil:
			r.fail(p, "%v", err)
			failed = true
		}
	}
	return rewrites, failed
}

// waitSettled waits for every rollout of the repin (R14 rolloutTimeout);
// false when one did not settle, and the digest record stays. A group
// that rolls back (V2) ends the wait of a digest change at the first sign
// that it will not finish, as `run` does, and the plan names it
// (WaitFailure): the rollback need not wait out rolloutTimeout.
func (r *Runner) waitSettled(ctx context.Context, p *refresh.Plan, rollsBack bool) bool {
	rp := p.Repin
	for _, w := range rp.Wait {
		var (
			st      workload.Settledness
			failing []workload.Pod
			err     error
		)
		if rollsBack && !rp.Rollback {
			st, failing, err = r.Workloads.WaitRollout(ctx, w, r.Config.RolloutTimeout)
		} else {
			st, err = r.Workloads.WaitSettled(ctx, w, r.Config.RolloutTimeout)
		}
		if err != nil || !st.Settled {
			why := st.Reason
			if err != nil {
				why = err.Error() // names the workload, the timeout and the reason
			}
			if errors.Is(err, workload.ErrRolloutFailed) {
				p.WaitFailure = strings.Join(refresh.FailureSignals(w, st.Failed, runningPods(failing)), "; ")
				why = fmt.Sprintf("%s will not settle (%s)", w, p.WaitFailure)
			}
			next := "the next tick retries"
			switch {
			case rp.Rollback:
				next = "the rollback itself did not settle"
			case rollsBack:
				next = "onFailedRollout: rollback puts a failed digest change back at once"
			}
			r.fail(p, "rollout not settled: %s; the digest record is unchanged and %s (attempt %d of %d)",
				why, next, rp.Attempt, r.Config.MaxRefreshAttempts)
			p.WaitFailed = true
			return false
		}
	}
	return true
}

// clearAttempt clears the attempt of a settled rollout in its own write.
// ok is false when it was not cleared: ended tells whether the attempt is
// another process's now (C3) rather than still this one's.
func (r *Runner) clearAttempt(ctx context.Context, p *refresh.Plan, anchor config.Workload) (ended, ok bool) {
	rp := p.Repin
	if _, err := r.States().Update(ctx, anchor, rp.ClearWrite.Expect, rp.ClearWrite.Set); err != nil {
		if errors.Is(err, workload.ErrChanged) {
			// C3: another process took the attempt over or confirmed it
			// while this one waited; the digest records are its to write
			// (or the next pass's, which records what every target runs).
			p.Findings = append(p.Findings, refresh.Finding{Severity: refresh.SeverityWarn,
				Message: fmt.Sprintf("the rollout settled, but the attempt on %s changed while this pass waited (%v): another image-refresh process took it over or confirmed it; the digest records are left to it", p.Anchor, err)})
			return true, false
		}
		r.fail(p, "clear the attempt counter on %s after a settled rollout: %v", p.Anchor, err)
		return false, false
	}
	return true, true
}

// recordDigests records the rolled-out digests once the attempt is cleared
// (R6), and reports the targets pinned.
func (r *Runner) recordDigests(ctx context.Context, p *refresh.Plan, anchor config.Workload) {
	rp := p.Repin
	if !rp.RecordWrite.Empty() {
		if _, err := r.States().Update(ctx, anchor, rp.RecordWrite.Expect, rp.RecordWrite.Set); err != nil {
			if errors.Is(err, workload.ErrChanged) {
				// C3: another process's pass saw the attempt cleared and
				// recorded what every target runs first.
				r.lostRace(p, err, "the digest records are another process's")
				return
			}
			r.fail(p, "record the rolled-out digests on %s: %v", p.Anchor, err)
			return
		}
	}
	for i := range p.Rows {
		if p.Rows[i].State == refresh.StateDrifted {
			p.Rows[i].State, p.Rows[i].Message = refresh.StatePinned, "re-pinned this tick; the rollout settled"
		}
	}
	if rp.Unfinished {
		p.Findings = append(p.Findings, refresh.Finding{Severity: refresh.SeverityInfo,
			Message: fmt.Sprintf("the rollout of group %s under attempt %d settled; attempt counter cleared", p.Group, rp.Attempt)})
	}
}

// asyncPatches bounds the image patches of one re-pin that `run` has in
// flight at once: a new digest of a repo:tag with 100 targets is 100
// patches, and one after the other they take seconds (each a round trip
// through admission and etcd). The client's rate limiter (APIQPS, APIBurst)
// still bounds the API load.
const asyncPatches = 16

// errNotTried marks a workload whose patch was not sent because an earlier
// one failed.
var errNotTried = errors.New("not re-imaged: an earlier write of this pass failed")

// applied is the outcome of one workload's patch.
type applied struct {
	findings []refresh.Finding
	err      error
}

// applyAll writes each workload's images (R9). `tick` writes them in order
// and stops at the first failure; `run` (async, C6: nothing waits for the
// rollouts) has up to asyncPatches in flight and starts no new one after a
// failure. The outcomes come back in the order of changes, so the report
// reads the same either way.
func (r *Runner) applyAll(ctx context.Context, p *refresh.Plan, snap Snapshot, changes []refresh.WorkloadChange, async bool) []applied {
	out := make([]applied, len(changes))
	width := 1
	if async {
		width = asyncPatches
	}
	var (
		wg      sync.WaitGroup
		stopped atomic.Bool
		slots   = make(chan struct{}, width)
	)
	for i, wc := range changes {
		slots <- struct{}{}
		if stopped.Load() {
			<-slots
			out[i].err = errNotTried
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			out[i].findings, out[i].err = r.apply(ctx, p.Group, p.Anchor, snap, wc)
			if out[i].err != nil && !errors.Is(out[i].err, workload.ErrRewritten) {
				stopped.Store(true)
			}
		}()
	}
	wg.Wait()
	return out
}

// apply writes one workload's image changes in one patch (R9) and reports
// each re-pin with who wrote the reference it replaced.
func (r *Runner) apply(ctx context.Context, group string, anchor config.Workload, snap Snapshot, wc refresh.WorkloadChange) ([]refresh.Finding, error) {
	obj, ok := snap.Objects[wc.Workload]
	if !ok {
		return nil, fmt.Errorf("%s was not read; nothing written", wc.Workload)
	}
	changes := make([]workload.ImageChange, 0, len(wc.Images))
	for _, c := range wc.Images {
		changes = append(changes, workload.ImageChange{Container: c.Container, From: c.From, To: c.To})
	}
	if _, err := r.Workloads.SetImages(ctx, obj, changes); err != nil {
		if errors.Is(err, workload.ErrRewritten) {
			if r.OnRepin != nil {
				r.OnRepin(group, wc) // counts toward the fight bound (C5)
			}
			return nil, err
		}
		if errors.Is(err, workload.ErrChanged) {
			return nil, fmt.Errorf("%s changed after it was read; nothing re-imaged there, the next tick decides again: %w", wc.Workload, err)
		}
		return nil, fmt.Errorf("re-image %s: %w", wc.Workload, err)
	}
	if r.OnRepin != nil {
		r.OnRepin(group, wc)
	}
	var findings []refresh.Finding
	for _, c := range wc.Images {
		// R7: neutral wording, since a fresh install's second tick looks the
		// same as a revert; the writer tells them apart.
		reason, msg := refresh.ReasonRepinned, fmt.Sprintf("%s container %s is not on the pinned digest: fresh install, or a re-render reverted the pin (image last written by %s); re-pinned %s → %s",
			wc.Workload, c.Container, c.WrittenBy(), c.From, c.To)
		switch c.Cause {
		case refresh.CauseDigestChange:
			reason, msg = refresh.ReasonDigestChanged, fmt.Sprintf("re-imaged %s container %s: %s → %s (the registry moved the tag)",
				wc.Workload, c.Container, c.From, c.To)
		case refresh.CauseRollback:
			reason, msg = refresh.ReasonRolledBack, fmt.Sprintf("rolled %s container %s back: %s → %s (the rollout of the new digest failed)",
				wc.Workload, c.Container, c.From, c.To)
		}
		findings = append(findings, refresh.Finding{Severity: refresh.SeverityInfo, Reason: reason, Image: c.Image,
			Target:  &config.Target{Kind: wc.Workload.Kind, Namespace: wc.Workload.Namespace, Name: wc.Workload.Name, Container: c.Container},
			Message: msg})
		if r.Metrics != nil {
			r.Metrics.Repins.WithLabelValues(group, c.Image, string(c.Cause)).Inc()
		}
		evType := "Normal"
		if c.Cause == refresh.CauseRollback {
			evType = "Warning"
		}
		r.event(ctx, obj, evType, reason, msg)
		if a, ok := snap.Objects[anchor]; ok && wc.Workload != anchor {
			r.event(ctx, a, evType, reason, msg)
		}
	}
	return findings, nil
}

// lostRace reports a compare-and-swap on the anchor's state that lost: a
// value this pass read changed before it wrote. Another image-refresh
// process (C3) or writer acted first; the next pass decides on fresh state,
// so it is a WARN, not an error of the cluster.
func (r *Runner) lostRace(p *refresh.Plan, err error, what string) {
	p.Findings = append(p.Findings, refresh.Finding{Severity: refresh.SeverityWarn,
		Message: fmt.Sprintf("the state on %s changed after this pass read it (%v): another image-refresh process or writer acted first; %s and the next pass decides again", p.Anchor, err, what)})
}

// release drops this process's attempt holder when its attempt ends without
// being cleared (a rollout that did not settle, a failed write, the tick
// deadline), so that the next pass of any process retries it at once (R11)
// rather than waiting out the holder's time (C3). It runs on a context of
// its own, as the pass's may be past its deadline; the workload client
// bounds each of its API calls by apiTimeout (R14). A failed release only
// delays another process's retry until the holder expires.
func (r *Runner) release(ctx context.Context, p *refresh.Plan, anchor config.Workload) {
	rw := p.Repin.ReleaseWrite
	if rw.Empty() {
		return
	}
	if _, err := r.States().Update(context.WithoutCancel(ctx), anchor, rw.Expect, rw.Set); err != nil && !errors.Is(err, workload.ErrChanged) {
		p.Findings = append(p.Findings, refresh.Finding{Severity: refresh.SeverityWarn,
			Message: fmt.Sprintf("could not release the attempt holder on %s: %v; another image-refresh process retries only after it expires", p.Anchor, err)})
	}
}

func (r *Runner) fail(p *refresh.Plan, format string, args ...any) {
	p.Failed = errors.Join(p.Failed, fmt.Errorf(format, args...))
	p.Findings = append(p.Findings, refresh.Finding{Severity: refresh.SeverityError, Reason: refresh.ReasonRefreshError,
		NeedsHuman: true, Message: fmt.Sprintf(format, args...)})
}
