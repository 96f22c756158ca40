package chart

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/test/support/running"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// scrape is one read of /metrics: the value of every image_refresh_*
// series, keyed by the series as the text format writes it
// (name{label="value",…}), which is also promtool's series notation.
type scrape map[string]float64

// scrapeMetrics reads /metrics; ok is false while nothing serves it yet.
// A line that does not parse fails the test.
func scrapeMetrics(t *testing.T, addr string) (_ scrape, ok bool) {
	t.Helper()
	code, body := running.Get("http://" + addr + "/metrics")
	if code != http.StatusOK {
		return nil, false
	}
	return parseExposition(t, body), true
}

// parseExposition reads the image_refresh_* samples of the Prometheus text
// format (what /metrics serves and `tick --metrics-file` writes).
func parseExposition(t *testing.T, body string) scrape {
	t.Helper()
	out := scrape{}
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "image_refresh_") {
			continue
		}
		i := strings.LastIndex(line, " ")
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("/metrics line %q does not parse: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

var groupLabel = regexp.MustCompile(`[{,]group="([^"]*)"`)

// groupOf is the group label of a series, "" when it has none.
func groupOf(series string) string {
	if m := groupLabel.FindStringSubmatch(series); m != nil {
		return m[1]
	}
	return ""
}

// inputFrom turns successive scrapes into promtool input series, one sample
// per interval: the scraped values in order ("_" where a scrape lacked the
// series), then the last one held, to n samples in all. Series of groups
// other than groups are left out: /metrics is the process-wide registry,
// which other tests in this process also fill.
func inputFrom(scrapes []scrape, groups map[string]bool, n int) []inputSeries {
	all := map[string]bool{}
	for _, s := range scrapes {
		for k := range s {
			if g := groupOf(k); g == "" || groups[g] {
				all[k] = true
			}
		}
	}
	var names []string
	for k := range all {
		names = append(names, k)
	}
	sort.Strings(names)
	var out []inputSeries
	for _, k := range names {
		var vals []string
		last := "_"
		for _, s := range scrapes {
			if v, ok := s[k]; ok {
				last = strconv.FormatFloat(v, 'f', -1, 64)
				vals = append(vals, last)
			} else {
				vals = append(vals, "_")
			}
		}
		for len(vals) < n {
			vals = append(vals, last)
		}
		out = append(out, inputSeries{Series: k, Values: strings.Join(vals, " ")})
	}
	return out
}

// TestAlerts_RealControllerSeries runs the real `image-refresh run` on the
// local cluster with four groups: obs-locked is locked out (its anchor's
// refresh-attempt at maxRefreshAttempts, as after three rollouts that never
// settled), obs-stale has an operator pin that is not the registry's
// latest (stale-pin), obs-frozen has a rollout that never finishes
// (not-settled at maxSkipTicks: RefreshFrozen), obs-calm is pinned
// (benign). It scrapes the
// controller's /metrics over three passes, turns the scraped series into
// promtool input series, and runs `promtool test rules` with the chart's
// rendered PrometheusRule: the lockout alert fires for obs-locked only, the
// stale-pin alert for obs-stale only, the frozen alert for obs-frozen only,
// and no alert fires for obs-calm, nor any other alert at all. The same holds for the file a `tick
// --metrics-file` writes in that state (mode cronjob). The timeline is
// promtool's (one sample a minute, the last scrape held for 30 minutes, so
// every `for` elapses); the values are the controller's and the tick's.
func TestAlerts_RealControllerSeries(t *testing.T) {
	start := time.Now()
	groups, rulesPath := renderRules(t)
	alerts := alertsOf(groups)
	promtool(t) // built before the cluster part starts

	ctx := context.Background()
	c := testenv.Cluster(t)
	reg := testregistry.Start(t)
	ns := testenv.Namespace(t, c.Client)
	deploys := []string{"api", "calm", "stale", "frozen"}
	for _, name := range deploys {
		reg.MustPushRandomImage(t, "acme/"+name, "prod")
		testenv.Deployment(t, c.Client, ns, name, testenv.WithContainer(name, reg.Host()+"/acme/"+name+":prod"), testenv.WithReplicas(1))
	}
	for _, name := range deploys {
		if err := testenv.WaitSettled(ctx, c.Client, "Deployment", ns, name, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	group := func(name, deploy, extra string) string {
		return fmt.Sprintf(`  - name: %s
    anchor: {kind: Deployment, namespace: %s, name: %s}
    images:
      - name: %s
        repository: %s/acme/%s
        tag: prod%s
        targets:
          - {kind: Deployment, namespace: %s, name: %s, container: %s}
`, name, ns, deploy, deploy, reg.Host(), deploy, extra, ns, deploy, deploy)
	}
	cfg := fmt.Sprintf("rolloutTimeout: 30s\nregistryTimeout: 3s\nmaxSkipTicks: 2\nregistries:\n  - {host: %q, insecure: true}\ngroups:\n", reg.Host()) +
		group("obs-locked", "api", "") + group("obs-calm", "calm", "") +
		group("obs-stale", "stale", "\n        pinnedDigest: sha256:"+strings.Repeat("1", 64)) +
		group("obs-frozen", "frozen", "")
	cfgPath := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}

	// Two ticks record and pin obs-locked, obs-calm and obs-frozen
	// (firstInstall pin-next-tick); obs-stale makes them exit 1.
	for range 2 {
		code, logs := runCLI(ctx, []string{"tick", "--config", cfgPath, "--kubeconfig", c.Kubeconfig, "--log-format", "text"})
		if code != 1 || !strings.Contains(logs, "StalePin") {
			t.Fatalf("setup tick: exit %d, want 1 with StalePin:\n%s", code, logs)
		}
	}
	for _, name := range []string{"api", "calm", "frozen"} {
		if err := testenv.WaitSettled(ctx, c.Client, "Deployment", ns, name, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		d, err := c.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if img := d.Spec.Template.Spec.Containers[0].Image; !strings.Contains(img, "@sha256:") {
			t.Fatalf("setup: %s not pinned: %s", name, img)
		}
	}
	// obs-locked: three attempts that never confirmed settling.
	patch := `{"metadata":{"annotations":{"image-refresh.io/refresh-attempt":"3"}}}`
	if _, err := c.Client.AppsV1().Deployments(ns).Patch(ctx, "api", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// obs-frozen: a rollout that can never finish (no node matches), so
	// the controller's counted passes reach maxSkipTicks (2).
	patch = `{"spec":{"template":{"spec":{"nodeSelector":{"no-such-node":"true"}}}}}`
	if _, err := c.Client.AppsV1().Deployments(ns).Patch(ctx, "frozen", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("setup: %s", time.Since(start).Round(time.Millisecond))

	clusterStart := time.Now()
	ctl := running.Start(t, []string{"run", "--config", cfgPath, "--kubeconfig", c.Kubeconfig, "--log-format", "text",
		"--poll-interval", "1s", "--poll-jitter", "0"})
	metricsAddr := ctl.Metrics
	passes := func(s scrape, group string) float64 {
		return s[fmt.Sprintf(`image_refresh_passes_total{group=%q}`, group)]
	}
	all := []string{"obs-locked", "obs-calm", "obs-stale", "obs-frozen"}
	frozen := `image_refresh_group_needs_attention{group="obs-frozen",reason="RefreshFrozen"}`
	var scrapes []scrape
	ctl.Eventually(t, 30*time.Second, "every group reported by a pass", func() bool {
		s, ok := scrapeMetrics(t, metricsAddr)
		if !ok {
			return false
		}
		for _, g := range all {
			if passes(s, g) == 0 {
				return false
			}
		}
		scrapes = append(scrapes[:0], s)
		return true
	})
	// Two more scrapes, each after every group made another pass (resync
	// 1s); the last one once obs-frozen reports RefreshFrozen, which the
	// passes that a watch event starts between two counted ones do not
	// (those series go into promtool as scraped).
	for i := range 2 {
		prev := scrapes[len(scrapes)-1]
		ctl.Eventually(t, 30*time.Second, "another pass of every group", func() bool {
			s, ok := scrapeMetrics(t, metricsAddr)
			if !ok {
				return false
			}
			for _, g := range all {
				if passes(s, g) <= passes(prev, g) {
					return false
				}
			}
			if i == 1 && s[frozen] != 1 {
				return false
			}
			scrapes = append(scrapes, s)
			return true
		})
	}
	t.Logf("controller run and 3 scrapes: %s", time.Since(clusterStart).Round(time.Millisecond))

	last := scrapes[len(scrapes)-1]
	for series, v := range map[string]float64{
		`image_refresh_group_locked_out{group="obs-locked"}`:                                1,
		`image_refresh_group_locked_out{group="obs-calm"}`:                                  0,
		`image_refresh_group_locked_out{group="obs-stale"}`:                                 0,
		`image_refresh_group_needs_attention{group="obs-stale",reason="StalePin"}`:          1,
		`image_refresh_group_needs_attention{group="obs-locked",reason="RefreshLockedOut"}`: 1,
		`image_refresh_group_needs_attention{group="obs-calm",reason="RefreshLockedOut"}`:   0,
		`image_refresh_group_needs_attention{group="obs-calm",reason="StalePin"}`:           0,
		`image_refresh_group_needs_attention{group="obs-calm",reason="RefreshFrozen"}`:      0,
		frozen: 1,
		fmt.Sprintf(`image_refresh_target_on_digest{container="calm",group="obs-calm",image="calm",namespace=%q,workload="calm"}`, ns): 1,
	} {
		if got, ok := last[series]; !ok || got != v {
			t.Errorf("scraped %s = %v (present %v), want %v", series, got, ok, v)
		}
	}

	mine := map[string]bool{}
	for _, g := range all {
		mine[g] = true
	}
	input := inputFrom(scrapes, mine, 31)
	var lines []string
	for _, s := range input {
		lines = append(lines, s.Series+"  "+s.Values[:min(len(s.Values), 40)])
	}
	t.Logf("promtool input series from the controller's /metrics:\n%s", strings.Join(lines, "\n"))

	fire := map[string][]map[string]string{
		"ImageRefreshLockedOut": {{"group": "obs-locked"}},
		"ImageRefreshStalePin":  {{"group": "obs-stale"}},
		"ImageRefreshFrozen":    {{"group": "obs-frozen"}},
	}
	test := promTest{Name: "series exported by the real controller", Interval: "1m", InputSeries: input}
	var names []string
	for name := range alerts {
		names = append(names, name)
	}
	sort.Strings(names)
	evals := func() []alertTest {
		var out []alertTest
		for _, name := range names {
			e := alertTest{EvalTime: "20m", Alertname: name, ExpAlerts: []expAlert{}}
			for _, l := range fire[name] {
				e.ExpAlerts = append(e.ExpAlerts, want(alerts[name], l, ""))
			}
			out = append(out, e)
		}
		return out
	}
	test.AlertRuleTest = evals()

	// Mode cronjob: the same states, as `tick --metrics-file` writes them
	// for node-exporter's textfile collector (one file per run, held until
	// the next tick).
	ctl.Stop(t)
	file := filepath.Join(t.TempDir(), "image-refresh.prom")
	code, logs := runCLI(ctx, []string{"tick", "--config", cfgPath, "--kubeconfig", c.Kubeconfig, "--log-format", "text", "--metrics-file", file})
	if code != 1 || !strings.Contains(logs, "LOCKED OUT") {
		t.Fatalf("tick on the locked-out group: exit %d, want 1 and LOCKED OUT:\n%s", code, logs)
	}
	body, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	tickInput := inputFrom([]scrape{parseExposition(t, string(body))}, mine, 31)
	tickTest := promTest{Name: "series a tick wrote with --metrics-file", Interval: "1m", InputSeries: tickInput, AlertRuleTest: evals()}
	if out, err := promtoolTest(t, rulesPath, []promTest{test, tickTest}); err != nil {
		t.Fatalf("promtool test rules on the controller's and the tick's series: %v\n%s", err, out)
	}
	t.Logf("total %s", time.Since(start).Round(time.Millisecond))
}
