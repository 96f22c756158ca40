package metrics

import (
	"testing"
)

// D2: a group let go leaves no gauge behind (a locked-out 1 would keep its
// alert firing); other groups' gauges and every counter stay.
func TestForgetGroup_D2_DeletesTheGroupsGaugesOnly(t *testing.T) {
	m := New()
	for _, g := range []string{"ns/deployment/api", "ns/deployment/web"} {
		m.TargetOnDigest.WithLabelValues(g, "api", "ns", "api", "api").Set(1)
		m.PodsOffDigest.WithLabelValues(g, "api", "ns", "api", "api").Set(0)
		m.GroupLockedOut.WithLabelValues(g).Set(1)
		m.NeedsAttention.WithLabelValues(g, "RefreshLockedOut").Set(1)
		m.NeedsAttention.WithLabelValues(g, "StalePin").Set(0)
		m.LastTick.WithLabelValues(g).Set(1)
		m.Passes.WithLabelValues(g).Inc()
	}
	m.ForgetGroup("ns/deployment/api")

	families, err := m.gatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]map[string]int{} // family → group → series
	for _, f := range families {
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "group" {
					if series[f.GetName()] == nil {
						series[f.GetName()] = map[string]int{}
					}
					series[f.GetName()][l.GetValue()]++
				}
			}
		}
	}
	for family, web := range map[string]int{
		"image_refresh_target_on_digest": 1, "image_refresh_pods_off_digest": 1, "image_refresh_group_locked_out": 1,
		"image_refresh_group_needs_attention": 2, "image_refresh_last_tick_timestamp_seconds": 1,
	} {
		if n := series[family]["ns/deployment/api"]; n != 0 {
			t.Errorf("%s keeps %d series of the group let go, want none", family, n)
		}
		if n := series[family]["ns/deployment/web"]; n != web {
			t.Errorf("%s has %d series of the other group, want its %d kept", family, n, web)
		}
	}
	if n := series["image_refresh_passes_total"]["ns/deployment/api"]; n != 1 {
		t.Errorf("image_refresh_passes_total of the group let go: %d series, want the counter kept", n)
	}
}

// D1, D2: a target the group no longer has (a container newly ignored)
// leaves no target series behind; the group's other targets keep theirs.
func TestSetTargets_D2_DeletesTheSeriesOfATargetTheGroupNoLongerHas(t *testing.T) {
	m := New()
	api := Target{Image: "api", Namespace: "ns", Workload: "web", Container: "api"}
	side := Target{Image: "side", Namespace: "ns", Workload: "web", Container: "side"}
	other := Target{Image: "side", Namespace: "ns", Workload: "web", Container: "side"} // same target, other group
	set := func(group string, ts ...Target) {
		m.SetTargets(group, ts)
		for _, tg := range ts {
			m.TargetOnDigest.WithLabelValues(group, tg.Image, tg.Namespace, tg.Workload, tg.Container).Set(1)
			m.PodsOffDigest.WithLabelValues(group, tg.Image, tg.Namespace, tg.Workload, tg.Container).Set(0)
		}
	}
	set("g", api, side)
	set("h", other)
	set("g", api) // side left the group

	count := func(family, group, container string) int {
		families, err := m.gatherer.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range families {
			if f.GetName() != family {
				continue
			}
			for _, s := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range s.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["group"] == group && labels["container"] == container {
					n++
				}
			}
		}
		return n
	}
	for _, family := range []string{"image_refresh_target_on_digest", "image_refresh_pods_off_digest"} {
		if n := count(family, "g", "side"); n != 0 {
			t.Errorf("%s keeps the series of the target that left group g", family)
		}
		if n := count(family, "g", "api"); n != 1 {
			t.Errorf("%s has %d series of g's remaining target, want 1", family, n)
		}
		if n := count(family, "h", "side"); n != 1 {
			t.Errorf("%s has %d series of group h's target, want it kept", family, n)
		}
	}
}
