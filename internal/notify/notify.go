// Package notify serves the push notifications of `run` (issue 18): a
// registry tells image-refresh that it published a repository:tag, and the
// poller asks the registry for that repository:tag now instead of at its
// next interval. A notification is only a hint: the digest in its body is
// never read, the answer still comes from a registry HEAD (R1), so a forged
// notification costs one HEAD and changes nothing.
//
// Each sender has its own path (Senders). A request is authenticated by a
// shared secret, in the first of these it carries: "Authorization: Bearer
// <secret>", the path prefix /hooks/<secret>/, or, for GitHub, the HMAC of
// the body in X-Hub-Signature-256. The secret is never logged, counted or
// put in an error (R20).
package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/metrics"
)

// MaxBody is the largest body accepted: a Distribution envelope of a push
// is a few KiB, a GitHub package event a few tens.
const MaxBody = 1 << 20

// SettleDelay is how long after a notification the registry is asked.
// CNCF Distribution sends a manifest's push event before it moves the tag
// to the manifest, so an ask at once can still get the old digest, and the
// next chance would be an interval later.
const SettleDelay = 500 * time.Millisecond

// Kicker makes the images match accepts due after delay
// (poller.Poller.Kick).
type Kicker interface {
	Kick(match func(config.Image) bool, delay time.Duration) (keys []string, running bool)
}

// Handler is the HTTP handler of the notification endpoint.
type Handler struct {
	// Delay is passed to every Kick; NewHandler sets SettleDelay.
	Delay   time.Duration
	secret  []byte
	kicker  Kicker
	log     *slog.Logger
	metrics *Metrics
	senders map[string]Sender
	// canonical caches imageref.CanonicalRepository by repository as
	// written in the config.
	canonical sync.Map
}

// NewHandler serves every sender; secret must not be empty.
func NewHandler(secret string, k Kicker, m *Metrics, log *slog.Logger) *Handler {
	h := &Handler{Delay: SettleDelay, secret: []byte(secret), kicker: k, log: log, metrics: m, senders: map[string]Sender{}}
	for _, s := range Senders() {
		h.senders[s.Name] = s
	}
	return h
}

// route splits the path into the sender and the secret it carries, if any:
// "/distribution" or "/hooks/<secret>/distribution".
func route(path string) (sender, pathSecret string, ok bool) {
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	switch {
	case len(parts) == 1:
		return parts[0], "", true
	case len(parts) == 3 && parts[0] == "hooks" && parts[1] != "":
		return parts[2], parts[1], true
	}
	return "", "", false
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name, pathSecret, ok := route(r.URL.Path)
	s, known := h.senders[name]
	if !ok || !known {
		// The path is not logged: it may carry a secret (R20).
		http.NotFound(w, r)
		return
	}
	h.metrics.Received.WithLabelValues(s.Name).Inc()
	if r.Method != http.MethodPost {
		h.reject(w, s, "method", http.StatusMethodNotAllowed)
		return
	}
	authed := pathSecret != "" && h.equal([]byte(pathSecret))
	if !authed {
		if tok, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); found {
			authed = h.equal([]byte(strings.TrimSpace(tok)))
		}
	}
	// GitHub signs the body: it is read (size-limited) before the check.
	sig := r.Header.Get("X-Hub-Signature-256")
	if !authed && !(s.hmac && sig != "") {
		h.reject(w, s, "auth", http.StatusUnauthorized)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			h.reject(w, s, "size", http.StatusRequestEntityTooLarge)
			return
		}
		h.reject(w, s, "malformed", http.StatusBadRequest)
		return
	}
	if !authed && !h.validSignature(sig, body) {
		h.reject(w, s, "auth", http.StatusUnauthorized)
		return
	}
	hints, err := s.parse(r.Header, body)
	if err != nil {
		h.log.Warn("push notification: unreadable body", "sender", s.Name, "error", err)
		h.reject(w, s, "malformed", http.StatusBadRequest)
		return
	}
	for _, hint := range hints {
		keys, running := h.kicker.Kick(h.matcher(hint), h.Delay)
		if !running {
			// A standby replica: the sender retries, and may reach the
			// leader then.
			h.reject(w, s, "standby", http.StatusServiceUnavailable)
			return
		}
		if len(keys) == 0 {
			h.metrics.Hints.WithLabelValues(s.Name, "ignored-unknown").Inc()
			h.log.Debug("push notification for a repository:tag image-refresh does not manage", "sender", s.Name, "image", hint.String())
			continue
		}
		h.metrics.Hints.WithLabelValues(s.Name, "accepted").Inc()
		h.log.Info("push notification: asking the registry now", "sender", s.Name, "image", hint.String(), "polled", keys)
	}
	w.WriteHeader(http.StatusAccepted)
}

func (h *Handler) reject(w http.ResponseWriter, s Sender, reason string, status int) {
	h.metrics.Rejected.WithLabelValues(s.Name, reason).Inc()
	http.Error(w, http.StatusText(status), status)
}

// equal compares a presented secret with the shared one in constant time
// (of the secret's length too: both are hashed first).
func (h *Handler) equal(presented []byte) bool {
	a, b := sha256.Sum256(presented), sha256.Sum256(h.secret)
	return hmac.Equal(a[:], b[:])
}

// validSignature checks GitHub's "sha256=<hex HMAC-SHA256 of the body>".
func (h *Handler) validSignature(sig string, body []byte) bool {
	got, ok := strings.CutPrefix(sig, "sha256=")
	if !ok {
		return false
	}
	want := hmac.New(sha256.New, h.secret)
	want.Write(body)
	raw, err := hex.DecodeString(got)
	return err == nil && hmac.Equal(raw, want.Sum(nil))
}

// matcher accepts the images the hint names: the same registry host,
// repository and tag once both are normalised as image references are
// ("acme/api", "docker.io/acme/api" and "index.docker.io/acme/api" are one
// repository; "nginx" is "docker.io/library/nginx").
func (h *Handler) matcher(hint Hint) func(config.Image) bool {
	want, err := imageref.CanonicalRepository(hint.Repository)
	if err != nil {
		return func(config.Image) bool { return false }
	}
	return func(img config.Image) bool {
		return img.Tag == hint.Tag && h.canonicalOf(img.Repository) == want
	}
}

func (h *Handler) canonicalOf(repo string) string {
	if c, ok := h.canonical.Load(repo); ok {
		return c.(string)
	}
	c, err := imageref.CanonicalRepository(repo)
	if err != nil {
		c = "" // matches no hint
	}
	h.canonical.Store(repo, c)
	return c
}

// Metrics counts notifications by sender (no label carries a secret or a
// path).
type Metrics struct {
	Received *prometheus.CounterVec // every request on a sender's path
	Rejected *prometheus.CounterVec // by reason: auth, size, malformed, method, standby
	Hints    *prometheus.CounterVec // by result: accepted, ignored-unknown
}

// NewMetrics registers the counters on reg, or reuses the ones already
// registered there (several `run` in one test process).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	return &Metrics{
		Received: metrics.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "image_refresh_notify_received_total",
			Help: "Push notification requests received, by sender.",
		}, []string{"sender"})),
		Rejected: metrics.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "image_refresh_notify_rejected_total",
			Help: "Push notification requests refused, by sender and reason (auth, size, malformed, method, standby).",
		}, []string{"sender", "reason"})),
		Hints: metrics.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "image_refresh_notify_hints_total",
			Help: "repository:tags named by push notifications, by sender and result (accepted: polled now; ignored-unknown: not managed).",
		}, []string{"sender", "result"})),
	}
}
