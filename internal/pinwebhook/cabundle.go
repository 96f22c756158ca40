package pinwebhook

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	admissionregistrationv1 "k8s.io/client-go/kubernetes/typed/admissionregistration/v1"
	"k8s.io/client-go/util/retry"

	"github.com/image-refresh/image-refresh/internal/workload"
)

// caInjector keeps this replica's CA in the caBundle of every webhook of
// one MutatingWebhookConfiguration, and rotates the self-signed
// certificates before they expire: the new CA goes into the bundle first,
// and the new certificate is served from the next round on, once the API
// server has had time to load the bundle. It runs on every replica (not
// only the leader) and re-checks every interval, so a configuration
// (re)created after the process started, or a bundle another writer reset,
// is repaired within one interval.
type caInjector struct {
	certs    *SelfSigned
	client   admissionregistrationv1.MutatingWebhookConfigurationInterface
	name     string
	interval time.Duration
	timeout  time.Duration
	log      *slog.Logger

	pending *keyPair // next certificate, whose CA is in the bundle already
	state   string   // last outcome logged, to log changes only
}

func (c *caInjector) NeedLeaderElection() bool { return false }

func (c *caInjector) Start(ctx context.Context) error {
	for {
		c.sync(ctx, time.Now())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(c.interval):
		}
	}
}

func (c *caInjector) sync(ctx context.Context, now time.Time) {
	cur := c.certs.current.Load()
	switch {
	case c.pending != nil:
		if c.report(c.inject(ctx, now, cur.ca, c.pending.ca)) {
			c.certs.current.Store(c.pending)
			c.pending = nil
			c.log.Info("webhook serving certificate rotated", "configuration", c.name)
		}
	case c.certs.renewDue(cur, now):
		next, err := c.certs.issue(now)
		if err != nil {
			c.log.Error("webhook certificate rotation failed; the current one is served until it expires", "error", err.Error())
			return
		}
		if c.report(c.inject(ctx, now, cur.ca, next.ca)) {
			c.pending = next
		}
	default:
		c.report(c.inject(ctx, now, cur.ca))
	}
}

// errMissing means the configuration does not exist (yet).
var errMissing = fmt.Errorf("not found")

// report logs a change of outcome and returns whether inject succeeded.
func (c *caInjector) report(err error) bool {
	state, level, msg := "ok", slog.LevelInfo, "webhook CA is in the caBundle of the MutatingWebhookConfiguration"
	switch {
	case err == errMissing:
		state, msg = "missing", "MutatingWebhookConfiguration not found; the API server calls the webhook once it exists (its caBundle is filled in then)"
	case err != nil:
		state, level, msg = err.Error(), slog.LevelWarn, "cannot update the caBundle of the MutatingWebhookConfiguration; the API server cannot verify this replica, and admission fails open until it can"
	}
	if state != c.state {
		c.state = state
		attrs := []any{"configuration", c.name}
		if err != nil && err != errMissing {
			attrs = append(attrs, "error", err.Error())
		}
		c.log.Log(context.Background(), level, msg, attrs...)
	}
	return err == nil
}

// inject merges cas into every webhook's caBundle, writing only on change.
func (c *caInjector) inject(ctx context.Context, now time.Time, cas ...*x509.Certificate) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		mwc, err := c.client.Get(ctx, c.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return errMissing
		}
		if err != nil {
			return fmt.Errorf("read MutatingWebhookConfiguration %s: %w", c.name, err)
		}
		changed := false
		for i := range mwc.Webhooks {
			cc := &mwc.Webhooks[i].ClientConfig
			if b := mergeBundle(cc.CABundle, now, cas...); !bytes.Equal(b, cc.CABundle) {
				cc.CABundle, changed = b, true
			}
		}
		if !changed {
			return nil
		}
		if _, err := c.client.Update(ctx, mwc, metav1.UpdateOptions{FieldManager: workload.FieldManager}); err != nil {
			if apierrors.IsConflict(err) {
				return err // retried
			}
			return fmt.Errorf("update the caBundle of MutatingWebhookConfiguration %s: %w", c.name, err)
		}
		return nil
	})
}
