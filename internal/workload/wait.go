package workload

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/image-refresh/image-refresh/internal/config"
)

// settlePollInterval is how often WaitSettled reads the workload. Polling
// a single object is simpler than a watch and cheap at this rate.
const settlePollInterval = 250 * time.Millisecond

// ErrRolloutFailed is WaitRollout's error when the rollout it waited for
// will not finish by itself (V2).
var ErrRolloutFailed = errors.New("the rollout will not finish by itself")

// WaitSettled waits until the workload's rollout finished (settled.go, R4)
// or timeout passed (R14: every rollout wait is bounded by rolloutTimeout).
// It returns the last Settledness read; when it gives up, the error names
// the reason and wraps context.DeadlineExceeded (or the caller's ctx
// error). A missing workload or an RBAC denial ends the wait at once: R4
// says those are never a benign "not settled yet". Other API errors are
// retried until the timeout, and the last one is reported.
func (c *Client) WaitSettled(ctx context.Context, ref config.Workload, timeout time.Duration) (Settledness, error) {
	st, _, err := c.wait(ctx, ref, timeout, false)
	return st, err
}

// WaitRollout waits as WaitSettled does, and also ends at the first sign
// that the rollout will not finish by itself (V2), the signs `run` reads
// from its watch events: the workload's controller reports it
// (Settledness.Failed, a Deployment's ProgressDeadlineExceeded), or a pod of
// the current template has a container that cannot run (Pod.Failing:
// CrashLoopBackOff with its last exit code, ImagePullBackOff, …). Then the
// error wraps ErrRolloutFailed, and failing holds those pods.
func (c *Client) WaitRollout(ctx context.Context, ref config.Workload, timeout time.Duration) (st Settledness, failing []Pod, err error) {
	return c.wait(ctx, ref, timeout, true)
}

func (c *Client) wait(ctx context.Context, ref config.Workload, timeout time.Duration, untilFailed bool) (Settledness, []Pod, error) {
	if err := validate(ref); err != nil {
		return Settledness{}, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(settlePollInterval)
	defer tick.Stop()
	last := Settledness{Reason: "not read yet"}
	var lastErr error
	for {
		obj, err := c.read(ctx, ref)
		switch {
		case err == nil:
			last, lastErr = obj.Settled, nil
			if last.Settled {
				return last, nil, nil
			}
			if untilFailed {
				// Failed, not FailedReason: right after the write, a status
				// the controller has not matched to the new template yet may
				// still carry an earlier rollout's deadline.
				if failing := c.failingPods(ctx, obj); last.Failed != "" || len(failing) > 0 {
					return last, failing, fmt.Errorf("%s will not settle: %w", ref, ErrRolloutFailed)
				}
			}
		case apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
			return last, nil, fmt.Errorf("wait for %s to settle: %w", ref, err)
		case ctx.Err() == nil && !nearDeadline(ctx):
			// A read cut short by the wait's own deadline (client-go's rate
			// limiter refuses to wait past it) says nothing about the
			// workload; the last reason read stays the one reported.
			lastErr = err
		}
		select {
		case <-ctx.Done():
			why := last.Reason
			if lastErr != nil {
				why = "last read failed: " + lastErr.Error()
			}
			return last, nil, fmt.Errorf("%s did not settle within %s (%s): %w", ref, timeout, why, ctx.Err())
		case <-tick.C:
		}
	}
}

// failingPods lists the pods of obj's current template with a container
// that cannot run. Pods that cannot be listed are no sign either way: the
// workload's status still decides, and rolloutTimeout bounds the wait (a
// pass reports the pods it cannot read, N1).
func (c *Client) failingPods(ctx context.Context, obj *Object) []Pod {
	pods, err := c.Pods(ctx, obj)
	if err != nil {
		return nil
	}
	return slices.DeleteFunc(pods, func(p Pod) bool { return len(p.Failing) == 0 })
}

func nearDeadline(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && time.Until(d) < 2*settlePollInterval
}
