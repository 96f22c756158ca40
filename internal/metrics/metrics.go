// Package metrics defines image-refresh's Prometheus metrics (R15, C4).
// One-shot ticks can write them to a node-exporter textfile; the controller
// serves them on /metrics.
package metrics

import (
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics is one registry with every image-refresh metric.
type Metrics struct {
	gatherer         prometheus.Gatherer
	TargetOnDigest   *TargetGauge
	PodsOffDigest    *TargetGauge
	GroupLockedOut   *prometheus.GaugeVec
	NeedsAttention   *prometheus.GaugeVec
	Repins           *prometheus.CounterVec
	RegistryRequests *prometheus.CounterVec
	ReconcileErrors  *prometheus.CounterVec
	LastTick         *prometheus.GaugeVec
	Passes           *prometheus.CounterVec
	RevertRepin      prometheus.Histogram
	Fights           *prometheus.CounterVec
	// RearmedByNewDigest counts lockouts a new digest re-armed (R23).
	RearmedByNewDigest *prometheus.CounterVec
	AdmissionPins      *prometheus.CounterVec
	AdmissionErrors    prometheus.Counter
	// Verifications counts signature lookups of new digests by policy and
	// result: verified, unverified, error (V1). A digest is looked up once
	// per policy, so this counts new digests, not passes.
	Verifications *prometheus.CounterVec
	// PromotionPublishes counts the promotion attestations this
	// installation tried to publish (P2), by group, image and result:
	// published, failed (each failed try; it is tried again).
	PromotionPublishes *prometheus.CounterVec
	RateLimit          RateLimit
}

// Target names one target in the labels of the target series.
type Target struct{ Image, Namespace, Workload, Container string }

// ForgetGroup deletes the gauges of a group image-refresh no longer manages
// (a discovered group whose label was removed, D2). They would otherwise
// keep the group's last state until the process restarts, and a locked-out
// or needs-attention 1 would keep an alert firing for a group nobody asks
// image-refresh to manage. Counters stay: rate() over them is unaffected.
func (m *Metrics) ForgetGroup(group string) {
	l := prometheus.Labels{"group": group}
	for _, v := range []*prometheus.GaugeVec{m.GroupLockedOut, m.NeedsAttention, m.LastTick} {
		v.DeletePartialMatch(l)
	}
	for _, v := range []*TargetGauge{m.TargetOnDigest, m.PodsOffDigest} {
		v.DeleteGroup(group)
	}
}

// SetTargets tells the group's targets now (its config, or what discovery
// found): the target series of a target the group no longer has (a
// container newly in ignore-containers, an image removed) are deleted, so
// that they do not keep its last state.
func (m *Metrics) SetTargets(group string, targets []Target) {
	now := make(map[Target]bool, len(targets))
	for _, t := range targets {
		now[t] = true
	}
	for _, v := range []*TargetGauge{m.TargetOnDigest, m.PodsOffDigest} {
		v.Retain(group, now)
	}
}

// New registers every metric on a fresh registry (one-shot ticks).
func New() *Metrics {
	reg := prometheus.NewRegistry()
	return NewOn(reg, reg)
}

// NewOn registers every metric on reg (the controller passes
// controller-runtime's registry, which /metrics serves).
func NewOn(reg prometheus.Registerer, g prometheus.Gatherer) *Metrics {
	m := &Metrics{
		gatherer: g,
		TargetOnDigest: NewTargetGauge("image_refresh_target_on_digest",
			"1 when the target container runs the recorded digest, else 0."),
		PodsOffDigest: NewTargetGauge("image_refresh_pods_off_digest",
			"Pods of the target's current template whose runtime reports another digest than the target should run."),
		GroupLockedOut: gaugeVec("image_refresh_group_locked_out",
			"1 while the group's refresh is locked out; re-arm with `image-refresh rearm`.", "group"),
		NeedsAttention: gaugeVec("image_refresh_group_needs_attention",
			"1 while the group has a non-benign finding with this event reason.", "group", "reason"),
		Repins: counterVec("image_refresh_repins_total",
			"Targets re-pinned, by cause (revert, digest-change, first-install).", "group", "image", "cause"),
		RegistryRequests: counterVec("image_refresh_registry_requests_total",
			"Registry manifest requests by registry host and HTTP status (0: no answer).", "registry", "code"),
		ReconcileErrors: counterVec("image_refresh_reconcile_errors_total",
			"Ticks of a group that ended with a finding needing a human.", "group"),
		LastTick: gaugeVec("image_refresh_last_tick_timestamp_seconds",
			"Unix time of the group's last completed tick.", "group"),
		Passes: counterVec("image_refresh_passes_total",
			"Completed passes over the group: one per tick; in run, one per reconcile (watch event, poll change, resync).", "group"),
	}
	m.RevertRepin = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "image_refresh_revert_repin_seconds",
		Help:    "Seconds from observing the write that took a target off its digest to the re-pin write.",
		Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	})
	m.Fights = counterVec("image_refresh_rewrite_fights_total",
		"Targets left alone because another writer rewrote them right after each re-pin.", "group", "image", "writer")
	m.RearmedByNewDigest = counterVec("image_refresh_rearmed_by_new_digest_total",
		"Lockouts re-armed by themselves because the registry published a digest they did not lock on.", "group")
	m.AdmissionPins = counterVec("image_refresh_admission_pins_total",
		"Container images the admission webhook pinned to the recorded digest: reverts prevented before they were stored.", "group", "image")
	m.AdmissionErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "image_refresh_admission_errors_total",
		Help: "Admission requests the webhook allowed unchanged because of an internal error (it fails open); fix A re-pins what they missed.",
	})
	m.Verifications = counterVec("image_refresh_verifications_total",
		"Signature lookups of a new digest against its repository's verification policy, by result: verified, unverified, error.", "policy", "result")
	m.PromotionPublishes = counterVec("image_refresh_promotion_publishes_total",
		"Promotion attestations this installation tried to publish for a digest its group soaked (P2), by result: published, failed (each try; a failed one is tried again).", "group", "image", "result")
	m.PromotionPublishes = Register(reg, m.PromotionPublishes)
	m.TargetOnDigest = Register(reg, m.TargetOnDigest)
	m.PodsOffDigest = Register(reg, m.PodsOffDigest)
	m.GroupLockedOut = Register(reg, m.GroupLockedOut)
	m.NeedsAttention = Register(reg, m.NeedsAttention)
	m.Repins = Register(reg, m.Repins)
	m.RegistryRequests = Register(reg, m.RegistryRequests)
	m.ReconcileErrors = Register(reg, m.ReconcileErrors)
	m.LastTick = Register(reg, m.LastTick)
	m.Passes = Register(reg, m.Passes)
	m.RevertRepin = Register(reg, m.RevertRepin)
	m.Fights = Register(reg, m.Fights)
	m.RearmedByNewDigest = Register(reg, m.RearmedByNewDigest)
	m.AdmissionPins = Register(reg, m.AdmissionPins)
	m.AdmissionErrors = Register(reg, m.AdmissionErrors)
	m.Verifications = Register(reg, m.Verifications)
	m.RateLimit = newRateLimit(reg)
	return m
}

// RegistryRequest counts one registry answer; it fits registry.Options.OnRequest.
func (m *Metrics) RegistryRequest(host string, status int) {
	m.RegistryRequests.WithLabelValues(host, strconv.Itoa(status)).Inc()
}

// WriteTextfile writes every metric in the text format to path, for the
// node-exporter textfile collector (one-shot ticks have no /metrics).
func (m *Metrics) WriteTextfile(path string) error {
	return prometheus.WriteToTextfile(path, m.gatherer)
}

// Register adds c to reg, or returns the collector already registered under
// the same name: two controllers in one process (tests) share the
// process-wide registry controller-runtime serves.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic(err)
	}
	return c
}

// gaugeVec is a GaugeVec of name, help and the labels.
func gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

// counterVec is a CounterVec of name, help and the labels.
func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}
