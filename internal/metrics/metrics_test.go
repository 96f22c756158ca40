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
