package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// TargetGauge is a gauge with one series per target of a group, labelled
// group, image, namespace, workload and container. It exposes exactly what
// a GaugeVec of those labels does, but keeps each series as one map entry
// (its label values, which the config's targets already hold, and the
// value) and builds the series only when scraped: a GaugeVec keeps a
// metric, its label pairs and a copy of its label values for every series,
// about 800 bytes each, 16 MiB for the two target gauges of 10,000
// targets (issue 38, docs/performance.md).
type TargetGauge struct {
	desc *prometheus.Desc

	mu     sync.RWMutex
	groups map[string]map[Target]float64 // group → target → value
}

// targetLabels are the labels of a TargetGauge's series, in order.
var targetLabels = []string{"group", "image", "namespace", "workload", "container"}

// NewTargetGauge is a TargetGauge named name.
func NewTargetGauge(name, help string) *TargetGauge {
	return &TargetGauge{desc: prometheus.NewDesc(name, help, targetLabels, nil), groups: map[string]map[Target]float64{}}
}

// TargetSeries is one series of a TargetGauge.
type TargetSeries struct {
	g     *TargetGauge
	group string
	t     Target
}

// WithLabelValues is the series of these label values, as GaugeVec's.
func (g *TargetGauge) WithLabelValues(group, image, namespace, workload, container string) TargetSeries {
	return TargetSeries{g: g, group: group, t: Target{Image: image, Namespace: namespace, Workload: workload, Container: container}}
}

// Set sets the series' value, creating the series.
func (s TargetSeries) Set(v float64) {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	ts := s.g.groups[s.group]
	if ts == nil {
		ts = map[Target]float64{}
		s.g.groups[s.group] = ts
	}
	ts[s.t] = v
}

// Retain deletes the series of group's targets not in keep.
func (g *TargetGauge) Retain(group string, keep map[Target]bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for t := range g.groups[group] {
		if !keep[t] {
			delete(g.groups[group], t)
		}
	}
	if len(g.groups[group]) == 0 {
		delete(g.groups, group)
	}
}

// DeleteGroup deletes every series of group.
func (g *TargetGauge) DeleteGroup(group string) {
	g.mu.Lock()
	delete(g.groups, group)
	g.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (g *TargetGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

// Collect implements prometheus.Collector: every series, built now.
func (g *TargetGauge) Collect(ch chan<- prometheus.Metric) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	for group, ts := range g.groups {
		for t, v := range ts {
			ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, v, group, t.Image, t.Namespace, t.Workload, t.Container)
		}
	}
}
