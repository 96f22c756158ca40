// Package metrics defines image-refresh's Prometheus metrics (SPEC R15, C4).
// One-shot ticks can write them to a node-exporter textfile; the controller
// serves them on /metrics.
package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics is one registry with every image-refresh metric.
type Metrics struct {
	Registry         *prometheus.Registry
	TargetOnDigest   *prometheus.GaugeVec
	GroupLockedOut   *prometheus.GaugeVec
	NeedsAttention   *prometheus.GaugeVec
	Repins           *prometheus.CounterVec
	RegistryRequests *prometheus.CounterVec
	ReconcileErrors  *prometheus.CounterVec
	LastTick         *prometheus.GaugeVec
}

// New registers every metric on a fresh registry.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		TargetOnDigest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "image_refresh_target_on_digest",
			Help: "1 when the target container runs the recorded digest, else 0.",
		}, []string{"group", "image", "namespace", "workload", "container"}),
		GroupLockedOut: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "image_refresh_group_locked_out",
			Help: "1 while the group's refresh is locked out (R10); re-arm with `image-refresh rearm`.",
		}, []string{"group"}),
		NeedsAttention: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "image_refresh_group_needs_attention",
			Help: "1 while the group has a non-benign finding with this event reason (R15).",
		}, []string{"group", "reason"}),
		Repins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "image_refresh_repins_total",
			Help: "Targets re-pinned, by cause (revert, digest-change, first-install).",
		}, []string{"group", "image", "cause"}),
		RegistryRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "image_refresh_registry_requests_total",
			Help: "Registry manifest requests by registry host and HTTP status (0: no answer).",
		}, []string{"registry", "code"}),
		ReconcileErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "image_refresh_reconcile_errors_total",
			Help: "Ticks of a group that ended with a finding needing a human.",
		}, []string{"group"}),
		LastTick: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "image_refresh_last_tick_timestamp_seconds",
			Help: "Unix time of the group's last completed tick.",
		}, []string{"group"}),
	}
	m.Registry.MustRegister(m.TargetOnDigest, m.GroupLockedOut, m.NeedsAttention, m.Repins, m.RegistryRequests, m.ReconcileErrors, m.LastTick)
	return m
}

// RegistryRequest counts one registry answer; it fits registry.Options.OnRequest.
func (m *Metrics) RegistryRequest(host string, status int) {
	m.RegistryRequests.WithLabelValues(host, strconv.Itoa(status)).Inc()
}

// WriteTextfile writes every metric in the text format to path, for the
// node-exporter textfile collector (one-shot ticks have no /metrics).
func (m *Metrics) WriteTextfile(path string) error {
	return prometheus.WriteToTextfile(path, m.Registry)
}
