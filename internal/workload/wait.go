package workload

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// settlePollInterval is how often WaitSettled reads the workload. Polling
// a single object is simpler than a watch and cheap at this rate.
const settlePollInterval = 250 * time.Millisecond

// WaitSettled waits until the workload's rollout finished (settled.go, R4)
// or timeout passed (R14: every rollout wait is bounded by rolloutTimeout).
// It returns the last Settledness read; when it gives up, the error names
// the reason and wraps context.DeadlineExceeded (or the caller's ctx
// error). A missing workload or an RBAC denial ends the wait at once: R4
// says those are never a benign "not settled yet". Other API errors are
// retried until the timeout, and the last one is reported.
func (c *Client) WaitSettled(ctx context.Context, ref Ref, timeout time.Duration) (Settledness, error) {
	if err := ref.validate(); err != nil {
		return Settledness{}, err
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
				return last, nil
			}
		case apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
			return last, fmt.Errorf("wait for %s to settle: %w", ref, err)
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
			return last, fmt.Errorf("%s did not settle within %s (%s): %w", ref, timeout, why, ctx.Err())
		case <-tick.C:
		}
	}
}

func nearDeadline(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ok && time.Until(d) < 2*settlePollInterval
}
