package metrics

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// series counts the series of family on m's registry whose labels include
// every pair of want.
func series(t *testing.T, m *Metrics, family string, want map[string]string) int {
	t.Helper()
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
			have := map[string]string{}
			for _, l := range s.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			match := true
			for k, v := range want {
				match = match && have[k] == v
			}
			if match {
				n++
			}
		}
	}
	return n
}

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

	api, web := map[string]string{"group": "ns/deployment/api"}, map[string]string{"group": "ns/deployment/web"}
	for family, kept := range map[string]int{
		"image_refresh_target_on_digest": 1, "image_refresh_pods_off_digest": 1, "image_refresh_group_locked_out": 1,
		"image_refresh_group_needs_attention": 2, "image_refresh_last_tick_timestamp_seconds": 1,
	} {
		if n := series(t, m, family, api); n != 0 {
			t.Errorf("%s keeps %d series of the group let go, want none", family, n)
		}
		if n := series(t, m, family, web); n != kept {
			t.Errorf("%s has %d series of the other group, want its %d kept", family, n, kept)
		}
	}
	if n := series(t, m, "image_refresh_passes_total", api); n != 1 {
		t.Errorf("image_refresh_passes_total of the group let go: %d series, want the counter kept", n)
	}
}

// D1, D2: a target the group no longer has (a container newly ignored)
// leaves no target series behind; the group's other targets keep theirs.
func TestSetTargets_D2_DeletesTheSeriesOfATargetTheGroupNoLongerHas(t *testing.T) {
	m := New()
	api := Target{Image: "api", Namespace: "ns", Workload: "web", Container: "api"}
	side := Target{Image: "side", Namespace: "ns", Workload: "web", Container: "side"}
	set := func(group string, ts ...Target) {
		m.SetTargets(group, ts)
		for _, tg := range ts {
			m.TargetOnDigest.WithLabelValues(group, tg.Image, tg.Namespace, tg.Workload, tg.Container).Set(1)
			m.PodsOffDigest.WithLabelValues(group, tg.Image, tg.Namespace, tg.Workload, tg.Container).Set(0)
		}
	}
	set("g", api, side)
	set("h", side) // the same target in another group
	set("g", api)  // side left group g

	for _, family := range []string{"image_refresh_target_on_digest", "image_refresh_pods_off_digest"} {
		if n := series(t, m, family, map[string]string{"group": "g", "container": "side"}); n != 0 {
			t.Errorf("%s keeps the series of the target that left group g", family)
		}
		if n := series(t, m, family, map[string]string{"group": "g", "container": "api"}); n != 1 {
			t.Errorf("%s has %d series of g's remaining target, want 1", family, n)
		}
		if n := series(t, m, family, map[string]string{"group": "h", "container": "side"}); n != 1 {
			t.Errorf("%s has %d series of group h's target, want it kept", family, n)
		}
	}
}

// exposition is every series of reg as "name{label=value,…} type value
// help", in the registry's order.
func exposition(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range families {
		for _, s := range f.GetMetric() {
			var labels []string
			for _, l := range s.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			out = append(out, fmt.Sprintf("%s{%s} %s %v %q", f.GetName(), strings.Join(labels, ","), f.GetType(), s.GetGauge().GetValue(), f.GetHelp()))
		}
	}
	return out
}

// R15: a TargetGauge exposes exactly what a GaugeVec of the target labels
// does, through sets, overwrites, a target left (SetTargets) and a group
// let go (ForgetGroup); it only keeps its series in less memory.
func TestTargetGauge_R15_ExposesWhatAGaugeVecDoes(t *testing.T) {
	vecReg, gaugeReg := prometheus.NewRegistry(), prometheus.NewRegistry()
	vec := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "image_refresh_target_on_digest", Help: "1 when on digest."}, targetLabels)
	vecReg.MustRegister(vec)
	g := Register(gaugeReg, NewTargetGauge("image_refresh_target_on_digest", "1 when on digest."))

	set := func(group string, tg Target, v float64) {
		vec.WithLabelValues(group, tg.Image, tg.Namespace, tg.Workload, tg.Container).Set(v)
		g.WithLabelValues(group, tg.Image, tg.Namespace, tg.Workload, tg.Container).Set(v)
	}
	api := Target{Image: "api", Namespace: "shop", Workload: "web", Container: "api"}
	side := Target{Image: "side", Namespace: "shop", Workload: "web", Container: "side"}
	job := Target{Image: "api", Namespace: "batch", Workload: "nightly", Container: "api"}
	set("web", api, 1)
	set("web", side, 0)
	set("jobs", job, 1)
	set("other", api, 1)
	set("web", api, 0) // overwritten
	same := func(step string) {
		t.Helper()
		a, b := exposition(t, vecReg), exposition(t, gaugeReg)
		if !slices.Equal(a, b) {
			t.Fatalf("%s: the TargetGauge exposes\n%s\nthe GaugeVec\n%s", step, strings.Join(b, "\n"), strings.Join(a, "\n"))
		}
		if len(a) == 0 {
			t.Fatalf("%s: no series at all", step)
		}
	}
	same("after the sets")
	if n := len(exposition(t, gaugeReg)); n != 4 {
		t.Fatalf("%d series, want 4", n)
	}

	// A target left group web; group jobs was let go.
	vec.DeleteLabelValues("web", side.Image, side.Namespace, side.Workload, side.Container)
	g.Retain("web", map[Target]bool{api: true})
	vec.DeletePartialMatch(prometheus.Labels{"group": "jobs"})
	g.DeleteGroup("jobs")
	same("after the deletes")
	if n := len(exposition(t, gaugeReg)); n != 2 {
		t.Fatalf("%d series after the deletes, want 2", n)
	}
}
