package chart

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// Pure promtool unit tests of each alert rule, on synthetic series written
// here (not scraped): for every alert, series that must raise it and
// benign series next to them that must not. The rules are the chart's
// PrometheusRule as `helm template` renders it with
// ci/monitoring-values.yaml (controller.pollInterval 5m, so the frozen
// alert looks back 600s). TestAlerts_RealControllerSeries runs the same
// rules on series the real controller exported.

// series is one promtool input series.
func series(s, values string) inputSeries { return inputSeries{Series: s, Values: values} }

func TestAlerts_Synthetic(t *testing.T) {
	groups, rulesPath := renderRules(t)
	alerts := alertsOf(groups)
	g := func(group string) map[string]string { return map[string]string{"group": group} }

	cases := []struct {
		alert string
		input []inputSeries
		evals []alertTest // ExpAlerts filled from wantAt
		// wantAt: eval time → the label sets (after the rule's aggregation)
		// that must fire then, and the value $value expands to.
		wantAt map[string][]map[string]string
		value  string
	}{
		{
			alert: "ImageRefreshLockedOut",
			input: []inputSeries{
				// Two controller replicas scraped (instance a, b): one alert.
				series(`image_refresh_group_locked_out{group="web",instance="a"}`, "1x30"),
				series(`image_refresh_group_locked_out{group="web",instance="b"}`, "1x30"),
				series(`image_refresh_group_locked_out{group="calm"}`, "0x30"),
				// Re-armed after 3 minutes.
				series(`image_refresh_group_locked_out{group="rearmed"}`, "1 1 1 0x27"),
				// Another reason of a benign group is not a lockout.
				series(`image_refresh_group_needs_attention{group="calm",reason="StalePin"}`, "1x30"),
			},
			wantAt: map[string][]map[string]string{"1m": {g("rearmed"), g("web")}, "10m": {g("web")}},
		},
		{
			alert: "ImageRefreshFrozen",
			input: []inputSeries{
				// Counted passes report RefreshFrozen every 4m; the watch
				// events between them report the group without it.
				series(`image_refresh_group_needs_attention{group="web",reason="RefreshFrozen"}`, "1 0 0 0 1 0 0 0 1 0 0 0 1 0 0 0 1 0x13"),
				series(`image_refresh_group_needs_attention{group="calm",reason="RefreshFrozen"}`, "0x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="RefreshError"}`, "1x30"),
			},
			// 18m: 0 now, 1 at 12m and 16m; 29m: nothing within 600s.
			wantAt: map[string][]map[string]string{"6m": {g("web")}, "18m": {g("web")}, "29m": nil},
		},
		{
			alert: "ImageRefreshStalePin",
			input: []inputSeries{
				series(`image_refresh_group_needs_attention{group="web",reason="StalePin"}`, "1x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="StalePin"}`, "0x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="TagFlapping"}`, "1x30"),
			},
			wantAt: map[string][]map[string]string{"1m": {g("web")}},
		},
		{
			alert: "ImageRefreshTagFlapping",
			input: []inputSeries{
				series(`image_refresh_group_needs_attention{group="web",reason="TagFlapping"}`, "1x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="TagFlapping"}`, "0x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="StalePin"}`, "1x30"),
			},
			wantAt: map[string][]map[string]string{"1m": {g("web")}},
		},
		{
			alert: "ImageRefreshDigestQuarantined",
			input: []inputSeries{
				series(`image_refresh_group_needs_attention{group="web",reason="DigestQuarantined"}`, "1x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="DigestQuarantined"}`, "0x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="TagFlapping"}`, "1x30"),
			},
			wantAt: map[string][]map[string]string{"1m": {g("web")}},
		},
		{
			alert: "ImageRefreshDigestUnverified",
			input: []inputSeries{
				series(`image_refresh_group_needs_attention{group="web",reason="DigestUnverified"}`, "1x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="DigestUnverified"}`, "0x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="DigestQuarantined"}`, "1x30"),
			},
			wantAt: map[string][]map[string]string{"1m": {g("web")}},
		},
		{
			alert: "ImageRefreshRolledBack",
			input: []inputSeries{
				series(`image_refresh_group_needs_attention{group="web",reason="RolledBack"}`, "1x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="RolledBack"}`, "0x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="DigestUnverified"}`, "1x30"),
			},
			wantAt: map[string][]map[string]string{"1m": {g("web")}},
		},
		{
			alert: "ImageRefreshPlatformMissing",
			input: []inputSeries{
				series(`image_refresh_group_needs_attention{group="web",reason="PlatformMissing"}`, "1x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="PlatformMissing"}`, "0x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="PinMissing"}`, "1x30"),
			},
			wantAt: map[string][]map[string]string{"1m": {g("web")}},
		},
		{
			alert: "ImageRefreshPinMissing",
			input: []inputSeries{
				series(`image_refresh_group_needs_attention{group="web",reason="PinMissing"}`, "1x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="PinMissing"}`, "0x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="RolledBack"}`, "1x30"),
			},
			wantAt: map[string][]map[string]string{"1m": {g("web")}},
		},
		{
			// P2: a failed push is tried again every minute; one that
			// lands within for: 10m never pages.
			alert: "ImageRefreshPromotionPublishFailed",
			input: []inputSeries{
				series(`image_refresh_group_needs_attention{group="web",reason="PromotionPublishFailed"}`, "1x30"),
				series(`image_refresh_group_needs_attention{group="blip",reason="PromotionPublishFailed"}`, "1 1 1 0x27"),
				series(`image_refresh_group_needs_attention{group="calm",reason="PromotionPublishFailed"}`, "0x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="PinMissing"}`, "1x30"),
			},
			wantAt: map[string][]map[string]string{"5m": nil, "15m": {g("web")}},
		},
		{
			alert: "ImageRefreshSuspendedWithoutEnd",
			input: []inputSeries{
				series(`image_refresh_group_needs_attention{group="web",reason="SuspendedWithoutEnd"}`, "1x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="SuspendedWithoutEnd"}`, "0x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="TagFlapping"}`, "1x30"),
			},
			wantAt: map[string][]map[string]string{"1m": {g("web")}},
		},
		{
			alert: "ImageRefreshRewriteFight",
			input: []inputSeries{
				series(`image_refresh_group_needs_attention{group="web",reason="ImageRewriteFight"}`, "1x30"),
				series(`image_refresh_rewrite_fights_total{group="web",image="api",writer="kyverno"}`, "1+1x30"),
				series(`image_refresh_group_needs_attention{group="calm",reason="ImageRewriteFight"}`, "0x30"),
				// A fight that ended: the counter stays, the finding is gone.
				series(`image_refresh_rewrite_fights_total{group="calm",image="db",writer="other"}`, "4x30"),
			},
			wantAt: map[string][]map[string]string{"1m": {g("web")}},
		},
		{
			alert: "ImageRefreshRunningStale",
			input: []inputSeries{
				series(`image_refresh_pods_off_digest{group="web",image="api",namespace="shop",workload="api",container="api"}`, "2x30"),
				series(`image_refresh_pods_off_digest{group="web",image="api",namespace="shop",workload="worker",container="api"}`, "0x30"),
				series(`image_refresh_group_needs_attention{group="web",reason="RunningStale"}`, "1x30"),
				// Mid-rollout: pods off the digest, but the group does not
				// report RunningStale (it is not settled).
				series(`image_refresh_pods_off_digest{group="rolling",image="db",namespace="data",workload="db",container="pg"}`, "3x30"),
				series(`image_refresh_group_needs_attention{group="rolling",reason="RunningStale"}`, "0x30"),
			},
			wantAt: map[string][]map[string]string{
				"10m": nil, // for: 15m
				"20m": {{"group": "web", "image": "api", "namespace": "shop", "workload": "api", "container": "api"}},
			},
			value: "2",
		},
		{
			alert: "ImageRefreshError",
			input: []inputSeries{
				series(`image_refresh_group_needs_attention{group="web",reason="RefreshError"}`, "1x30"),
				// An API timeout on one pass: gone before for: 10m.
				series(`image_refresh_group_needs_attention{group="blip",reason="RefreshError"}`, "1 1 1 0x27"),
				series(`image_refresh_group_needs_attention{group="calm",reason="RefreshError"}`, "0x30"),
			},
			wantAt: map[string][]map[string]string{"5m": nil, "15m": {g("web")}},
		},
	}
	for _, c := range cases {
		t.Run(c.alert, func(t *testing.T) {
			r, ok := alerts[c.alert]
			if !ok {
				t.Fatalf("the chart renders no %s", c.alert)
			}
			test := promTest{Name: c.alert, Interval: "1m", InputSeries: c.input}
			for at, sets := range c.wantAt {
				e := alertTest{EvalTime: at, Alertname: c.alert, ExpAlerts: []expAlert{}}
				for _, l := range sets {
					e.ExpAlerts = append(e.ExpAlerts, want(r, l, c.value))
				}
				test.AlertRuleTest = append(test.AlertRuleTest, e)
			}
			if out, err := promtoolTest(t, rulesPath, []promTest{test}); err != nil {
				t.Fatalf("promtool test rules: %v\n%s", err, out)
			}
		})
	}

	// The harness itself: a rule whose expression is broken (the lockout
	// compared with 2) fails the same promtool test.
	t.Run("a broken expression fails promtool", func(t *testing.T) {
		broken := make([]ruleGroup, len(groups))
		copy(broken, groups)
		broken[0].Rules = append([]rule(nil), groups[0].Rules...)
		found := false
		for i, r := range broken[0].Rules {
			if r.Alert == "ImageRefreshLockedOut" {
				broken[0].Rules[i].Expr = strings.Replace(r.Expr, "== 1", "== 2", 1)
				found = broken[0].Rules[i].Expr != r.Expr
			}
		}
		if !found {
			t.Fatal("could not break the lockout expression")
		}
		b, err := yaml.Marshal(map[string]any{"groups": broken})
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "broken-rules.yaml")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		test := promTest{Interval: "1m", InputSeries: []inputSeries{series(`image_refresh_group_locked_out{group="web"}`, "1x30")},
			AlertRuleTest: []alertTest{{EvalTime: "1m", Alertname: "ImageRefreshLockedOut",
				ExpAlerts: []expAlert{want(alerts["ImageRefreshLockedOut"], g("web"), "")}}}}
		out, err := promtoolTest(t, path, []promTest{test})
		if err == nil || !strings.Contains(out, "ImageRefreshLockedOut") {
			t.Fatalf("promtool passed a broken lockout rule (err %v):\n%s", err, out)
		}
	})
}
