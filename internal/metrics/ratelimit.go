package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// RateLimit holds the gauges of the rate limits registries announce (C2).
// Labels are registry hosts only; no credential reaches a label (R20).
type RateLimit struct {
	Limit        *prometheus.GaugeVec
	Remaining    *prometheus.GaugeVec
	PollInterval *prometheus.GaugeVec
}

func newRateLimit(reg prometheus.Registerer) RateLimit {
	return RateLimit{
		Limit: Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "image_refresh_registry_ratelimit_limit",
			Help: "The registry's RateLimit-Limit from its last manifest answer that carried one.",
		}, []string{"registry"})),
		Remaining: Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "image_refresh_registry_ratelimit_remaining",
			Help: "The registry's RateLimit-Remaining from its last manifest answer that carried one.",
		}, []string{"registry"})),
		PollInterval: Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "image_refresh_registry_poll_interval_seconds",
			Help: "The poll interval in force for a registry that announced a rate limit: the configured one, or longer while its remaining budget would not last it.",
		}, []string{"registry"})),
	}
}

// RegistryRateLimit sets the rate-limit gauges of what a registry said
// about its pull budget (registry.Options.OnRateLimit).
func (m *Metrics) RegistryRateLimit(host string, limit, remaining int) {
	m.RateLimit.Limit.WithLabelValues(host).Set(float64(limit))
	m.RateLimit.Remaining.WithLabelValues(host).Set(float64(remaining))
}

// RegistryPace sets the poll interval in force; it fits
// registry.Options.OnPace.
func (m *Metrics) RegistryPace(host string, interval time.Duration) {
	m.RateLimit.PollInterval.WithLabelValues(host).Set(interval.Seconds())
}
