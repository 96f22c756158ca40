package chart

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/image-refresh/image-refresh/internal/metrics"
)

// serviceMonitor and prometheusRule are the fields of prometheus-operator's
// monitoring.coreos.com/v1 kinds that the chart renders; parseManifest
// decodes them strictly, so a misspelt field fails like in any other kind.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector"`
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port              string           `json:"port"`
			Path              string           `json:"path"`
			Interval          string           `json:"interval,omitempty"`
			ScrapeTimeout     string           `json:"scrapeTimeout,omitempty"`
			HonorLabels       bool             `json:"honorLabels"`
			Relabelings       []map[string]any `json:"relabelings,omitempty"`
			MetricRelabelings []map[string]any `json:"metricRelabelings,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

func (s *serviceMonitor) DeepCopyObject() runtime.Object { c := *s; return &c }

type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Groups []ruleGroup `json:"groups"`
	} `json:"spec"`
}

func (p *prometheusRule) DeepCopyObject() runtime.Object { c := *p; return &c }

// ruleGroup is a Prometheus rule group, as in a PrometheusRule's spec and
// in a rules file of `promtool`.
type ruleGroup struct {
	Name  string `json:"name"`
	Rules []rule `json:"rules"`
}

type rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// alertStates is every alert the chart ships, with the docs/states page its
// runbook_url names: one per state that needs a human.
var alertStates = map[string]string{
	"ImageRefreshLockedOut":              "locked-out",
	"ImageRefreshFrozen":                 "not-settled",
	"ImageRefreshStalePin":               "stale-pin",
	"ImageRefreshTagFlapping":            "tag-flapping",
	"ImageRefreshDigestQuarantined":      "quarantined",
	"ImageRefreshDigestUnverified":       "unverified",
	"ImageRefreshRolledBack":             "rolled-back",
	"ImageRefreshPlatformMissing":        "platform-missing",
	"ImageRefreshPinMissing":             "pin-missing",
	"ImageRefreshPromotionPublishFailed": "promotion-publish-failed",
	"ImageRefreshSuspendedWithoutEnd":    "suspended",
	"ImageRefreshRewriteFight":           "error",
	"ImageRefreshRunningStale":           "running-stale",
	"ImageRefreshError":                  "error",
}

// renderRules renders the chart with ci/monitoring-values.yaml plus files
// and returns the rule groups of its only PrometheusRule, and the path of a
// promtool rules file holding exactly those groups.
func renderRules(t *testing.T, files ...string) ([]ruleGroup, string) {
	t.Helper()
	m := newHelm(t).template(append([]string{ciValues(t, "monitoring")}, files...)...)
	pr := one[*prometheusRule](t, m)
	b, err := yaml.Marshal(map[string]any{"groups": pr.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "image-refresh-rules.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return pr.Spec.Groups, path
}

func alertsOf(groups []ruleGroup) map[string]rule {
	out := map[string]rule{}
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out[r.Alert] = r
			}
		}
	}
	return out
}

var (
	promtoolOnce sync.Once
	promtoolBin  string
	promtoolErr  error
)

// promtool is the path of a promtool binary, built once from the
// github.com/prometheus/prometheus module by hack/promtool.sh and cached
// under the tools cache. The test fails, with the script's output, if it
// cannot be built.
func promtool(t *testing.T) string {
	t.Helper()
	promtoolOnce.Do(func() {
		script := filepath.Join(chartDir(t), "..", "..", "hack", "promtool.sh")
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(script)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			promtoolErr = fmt.Errorf("hack/promtool.sh: %v\n%s", err, stderr.String())
			return
		}
		promtoolBin = strings.TrimSpace(stdout.String())
	})
	if promtoolErr != nil {
		t.Fatalf("promtool is needed to test the chart's alert rules and could not be built: %v", promtoolErr)
	}
	return promtoolBin
}

var (
	monitoringCheckOnce sync.Once
	monitoringCheckBin  string
	monitoringCheckErr  error
)

// monitoringCheck checks the ServiceMonitors and PrometheusRules in
// rendered by decoding them strictly into prometheus-operator's own Go
// types: hack/monitoringcheck, its own module (the operator's API stays
// out of image-refresh's go.mod), built once with `go build` and cached.
func monitoringCheck(t *testing.T, rendered string) {
	t.Helper()
	monitoringCheckOnce.Do(func() {
		monitoringCheckBin, monitoringCheckErr = buildMonitoringCheck(filepath.Join(chartDir(t), "..", "..", "hack", "monitoringcheck"))
	})
	if monitoringCheckErr != nil {
		t.Fatal(monitoringCheckErr)
	}
	cmd := exec.Command(monitoringCheckBin)
	cmd.Stdin = strings.NewReader(rendered)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the rendered ServiceMonitor/PrometheusRule do not decode into prometheus-operator's types: %v\n%s", err, out)
	}
	t.Logf("prometheus-operator types: %s", strings.TrimSpace(string(out)))
}

// buildMonitoringCheck builds the command in dir once into the tools cache
// ($XDG_CACHE_HOME or ~/.cache, image-refresh/tools), keyed by a hash of its
// go.mod, go.sum and main.go, and returns its path.
func buildMonitoringCheck(dir string) (string, error) {
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return "", err
		}
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(cache, "image-refresh", "tools", fmt.Sprintf("monitoringcheck-%x", h.Sum(nil)[:6]), "monitoringcheck")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	tmp := fmt.Sprintf("%s.%d.tmp", bin, os.Getpid())
	cmd := exec.Command("go", "build", "-o", tmp, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build in hack/monitoringcheck: %v\n%s", err, out)
	}
	return bin, os.Rename(tmp, bin) // whole, so a concurrent test never runs half a binary
}

// promtoolTest writes tests (a promtool rule unit-test file, with
// rule_files set to rules) and runs `promtool test rules` on it.
func promtoolTest(t *testing.T, rules string, tests []promTest) (string, error) {
	t.Helper()
	file := map[string]any{
		"rule_files":          []string{rules},
		"evaluation_interval": "1m",
		"tests":               tests,
	}
	b, err := yaml.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "alerts_test.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool(t), "test", "rules", path).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s\n--- %s:\n%s", out, filepath.Base(path), b), err
	}
	return string(out), nil
}

// promTest is one test of a promtool rule unit-test file.
type promTest struct {
	Name          string        `json:"name,omitempty"`
	Interval      string        `json:"interval"`
	InputSeries   []inputSeries `json:"input_series"`
	AlertRuleTest []alertTest   `json:"alert_rule_test"`
}

type inputSeries struct {
	Series string `json:"series"`
	Values string `json:"values"`
}

type alertTest struct {
	EvalTime  string     `json:"eval_time"`
	Alertname string     `json:"alertname"`
	ExpAlerts []expAlert `json:"exp_alerts"`
}

type expAlert struct {
	ExpLabels      map[string]string `json:"exp_labels"`
	ExpAnnotations map[string]string `json:"exp_annotations"`
}

// want is the alert r must raise for the series labels (after its own
// aggregation) and value: its labels plus the series', and its annotations
// with $labels and $value expanded. promtool compares both in full, so a
// template that names a label the expression drops fails the test.
func want(r rule, labels map[string]string, value string) expAlert {
	l := map[string]string{}
	for k, v := range r.Labels {
		l[k] = v
	}
	for k, v := range labels {
		l[k] = v
	}
	a := map[string]string{}
	for k, v := range r.Annotations {
		for name, lv := range labels {
			v = strings.ReplaceAll(v, "{{ $labels."+name+" }}", lv)
		}
		a[k] = strings.ReplaceAll(v, "{{ $value }}", value)
	}
	return expAlert{ExpLabels: l, ExpAnnotations: a}
}

// exportedMetrics is every metric name the controller exports, from the
// descriptors of internal/metrics' collectors; a histogram's series names
// (_bucket, _sum, _count) are included.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	// Every exported collector field, also in nested structs (RateLimit).
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		for i := range v.NumField() {
			f := v.Field(i)
			if !v.Type().Field(i).IsExported() {
				continue
			}
			if f.Kind() == reflect.Struct {
				walk(f)
				continue
			}
			c, ok := f.Interface().(prometheus.Collector)
			if !ok || f.IsNil() {
				continue
			}
			ch := make(chan *prometheus.Desc, 4)
			go func() { c.Describe(ch); close(ch) }()
			for d := range ch {
				name := fqName.FindStringSubmatch(d.String())
				if name == nil {
					t.Fatalf("no fqName in %s", d)
				}
				out[name[1]] = true
				if _, hist := c.(prometheus.Histogram); hist {
					for _, s := range []string{"_bucket", "_sum", "_count"} {
						out[name[1]+s] = true
					}
				}
			}
		}
	}
	walk(reflect.ValueOf(metrics.New()).Elem())
	if len(out) < 10 {
		t.Fatalf("only %d metric names found in internal/metrics: %v", len(out), out)
	}
	return out
}

// metricNames returns the image_refresh_* names a PromQL expression uses.
func metricNames(expr string) []string {
	return regexp.MustCompile(`\bimage_refresh_[a-zA-Z0-9_:]*`).FindAllString(expr, -1)
}

// checkExprMetrics fails for an expression that uses a metric the
// controller does not export, or none of its metrics at all.
func checkExprMetrics(t *testing.T, what, expr string, exported map[string]bool) {
	t.Helper()
	names := metricNames(expr)
	if len(names) == 0 {
		t.Errorf("%s uses no image_refresh_* metric: %s", what, expr)
	}
	for _, n := range names {
		if !exported[n] {
			t.Errorf("%s uses %s, which internal/metrics does not export: %s", what, n, expr)
		}
	}
}

// TestAlerts_RulesAreValidAndNameTheirState renders the PrometheusRule,
// checks its groups with `promtool check rules`, and checks each alert:
// one per state that needs a human, each with a severity, a summary and a
// description naming the group, a runbook_url on the state's page under
// metrics.prometheusRule.runbookBaseURL (a page that exists in docs/states),
// and an expression on metrics the controller exports.
func TestAlerts_RulesAreValidAndNameTheirState(t *testing.T) {
	groups, path := renderRules(t)
	if out, err := exec.Command(promtool(t), "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	exported := exportedMetrics(t)
	alerts := alertsOf(groups)
	var names []string
	for name := range alerts {
		names = append(names, name)
	}
	sort.Strings(names)
	var wantNames []string
	for name := range alertStates {
		wantNames = append(wantNames, name)
	}
	sort.Strings(wantNames)
	if !slices.Equal(names, wantNames) {
		t.Fatalf("alerts %v, want %v", names, wantNames)
	}
	docs := filepath.Join(chartDir(t), "..", "..", "docs", "states")
	for name, r := range alerts {
		state := alertStates[name]
		if r.Labels["severity"] == "" || r.Labels["team"] != "platform" {
			t.Errorf("%s labels %v: want a severity and additionalRuleLabels' team", name, r.Labels)
		}
		if !strings.Contains(r.Annotations["summary"], "{{ $labels.") || !strings.Contains(r.Annotations["description"], "{{ $labels.group }}") {
			t.Errorf("%s annotations do not name the group: %v", name, r.Annotations)
		}
		if got, w := r.Annotations["runbook_url"], "https://github.com/image-refresh/image-refresh/blob/main/docs/states/"+state+".md"; got != w {
			t.Errorf("%s runbook_url %q, want %q", name, got, w)
		}
		if _, err := os.Stat(filepath.Join(docs, state+".md")); err != nil {
			t.Errorf("%s: runbook page %v", name, err)
		}
		checkExprMetrics(t, name, r.Expr, exported)
	}

	// The knobs: an alert disabled, a severity and a for overridden, another
	// runbook base, and extra rules appended.
	groups, _ = renderRules(t, valuesFile(t, map[string]any{"metrics": map[string]any{"prometheusRule": map[string]any{
		"runbookBaseURL": "https://docs.example.com/image-refresh/states/",
		"alerts": map[string]any{
			"ImageRefreshStalePin":  map[string]any{"enabled": false},
			"ImageRefreshLockedOut": map[string]any{"severity": "page", "for": "2m"},
		},
		"extraRules": []any{map[string]any{"alert": "Mine", "expr": "vector(1)"}},
	}}}))
	alerts = alertsOf(groups)
	if _, ok := alerts["ImageRefreshStalePin"]; ok {
		t.Errorf("a disabled alert is rendered")
	}
	if r := alerts["ImageRefreshLockedOut"]; r.Labels["severity"] != "page" || r.For != "2m" ||
		r.Annotations["runbook_url"] != "https://docs.example.com/image-refresh/states/locked-out.md" {
		t.Errorf("overrides not applied: %+v", r)
	}
	if _, ok := alerts["Mine"]; !ok {
		t.Errorf("extraRules not appended")
	}
}

// TestChart_MonitoringObjects checks what the monitoring values render:
// the ServiceMonitor and PrometheusRule decode strictly into
// prometheus-operator's own types (hack/monitoringcheck), the metrics
// Service selects the controller's pods and targets the container's
// metrics port, the ServiceMonitor selects only that Service,
// and the dashboard ConfigMap carries the sidecar's label; by default none
// of them is rendered, and the ServiceMonitor refuses mode cronjob (a tick
// serves no /metrics).
func TestChart_MonitoringObjects(t *testing.T) {
	h := newHelm(t)
	rendered, err := h.render(ciValues(t, "monitoring"))
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, rendered)
	}
	m := parseManifest(t, rendered)
	monitoringCheck(t, rendered)
	var svc *corev1.Service
	for _, s := range all[*corev1.Service](m) {
		if s.Name == "rel-image-refresh-metrics" {
			svc = s
		}
	}
	if svc == nil {
		t.Fatal("no metrics Service rendered")
	}
	var md mode
	for _, each := range modes {
		if each.values == "monitoring" {
			md = each
		}
	}
	if md.values == "" {
		t.Fatal("no mode of render_test.go renders ci/monitoring-values.yaml")
	}
	pod := checkDeployment(t, m, md)
	d := one[*appsv1.Deployment](t, m)
	for k, v := range svc.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("the metrics Service selects %s=%s, the controller's pods have %q", k, v, d.Spec.Template.Labels[k])
		}
	}
	var port *corev1.ContainerPort
	for i, p := range pod.Containers[0].Ports {
		if p.Name == "metrics" {
			port = &pod.Containers[0].Ports[i]
		}
	}
	if port == nil || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.StrVal != "metrics" || svc.Spec.Ports[0].Name != "metrics" {
		t.Fatalf("metrics Service ports %+v, container port %+v", svc.Spec.Ports, port)
	}
	if got, ok := argValue(pod.Containers[0].Args, "--metrics-addr"); !ok || got != fmt.Sprintf(":%d", port.ContainerPort) {
		t.Errorf("--metrics-addr %q, container port %d", got, port.ContainerPort)
	}
	sm := one[*serviceMonitor](t, m)
	if sm.Labels["release"] != "kube-prometheus-stack" || len(sm.Spec.Endpoints) != 1 ||
		sm.Spec.Endpoints[0].Port != "metrics" || sm.Spec.Endpoints[0].Path != "/metrics" || !sm.Spec.Endpoints[0].HonorLabels ||
		!slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{releaseNS}) {
		t.Errorf("ServiceMonitor %+v", sm)
	}
	for _, s := range all[*corev1.Service](m) {
		selected := true
		for k, v := range sm.Spec.Selector.MatchLabels {
			selected = selected && s.Labels[k] == v
		}
		if selected != (s.Name == svc.Name) {
			t.Errorf("the ServiceMonitor selects Service %s: %v", s.Name, selected)
		}
	}
	var dash *corev1.ConfigMap
	for _, cm := range all[*corev1.ConfigMap](m) {
		if cm.Name == "rel-image-refresh-dashboard" {
			dash = cm
		}
	}
	if dash == nil || dash.Labels["grafana_dashboard"] != "1" || dash.Annotations["grafana_folder"] != "Platform" {
		t.Fatalf("dashboard ConfigMap %+v", dash)
	}
	file, err := os.ReadFile(filepath.Join(chartDir(t), "dashboards", "image-refresh.json"))
	if err != nil {
		t.Fatal(err)
	}
	if dash.Data["image-refresh.json"] != strings.TrimSuffix(string(file), "\n") {
		t.Errorf("the ConfigMap's image-refresh.json is not dashboards/image-refresh.json")
	}

	for _, md := range []string{"controller", "cronjob"} {
		m := h.template(ciValues(t, md))
		if n := len(all[*serviceMonitor](m)) + len(all[*prometheusRule](m)); n != 0 {
			t.Errorf("%s: %d monitoring objects rendered by default", md, n)
		}
		for _, s := range all[*corev1.Service](m) {
			if strings.HasSuffix(s.Name, "-metrics") {
				t.Errorf("%s: metrics Service rendered by default", md)
			}
		}
	}
	cronjob := valuesFile(t, map[string]any{"mode": "cronjob"})
	if out, err := h.render(ciValues(t, "monitoring"), cronjob); err == nil || !strings.Contains(out, "metrics.serviceMonitor.enabled needs mode: controller") {
		t.Errorf("ServiceMonitor in mode cronjob: err %v\n%s", err, out)
	}
	rulesOnly := valuesFile(t, map[string]any{"mode": "cronjob", "metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": false}}})
	m = h.template(ciValues(t, "monitoring"), rulesOnly)
	if len(all[*prometheusRule](m)) != 1 || len(all[*serviceMonitor](m)) != 0 {
		t.Errorf("mode cronjob: want the PrometheusRule (textfile metrics) and no ServiceMonitor")
	}
}

// TestDashboard_IsJSONOnExportedMetrics: dashboards/image-refresh.json is
// valid JSON, every PromQL expression in it (panel targets and template
// variable queries) uses only metric names internal/metrics exports, every
// panel expression parses (promtool check rules), and every exported
// metric is on the dashboard.
func TestDashboard_IsJSONOnExportedMetrics(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir(t), "dashboards", "image-refresh.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&dash); err != nil {
		t.Fatalf("dashboards/image-refresh.json is not valid JSON: %v", err)
	}
	if dec.More() {
		t.Fatalf("dashboards/image-refresh.json has data after the dashboard")
	}
	if dash["uid"] != "image-refresh" || dash["title"] == "" {
		t.Errorf("dashboard uid %v title %v", dash["uid"], dash["title"])
	}
	exported := exportedMetrics(t)
	var exprs []string
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["type"] == "datasource" {
				return // a data source variable: its query is a plugin id
			}
			for k, c := range v {
				if s, ok := c.(string); ok && (k == "expr" || (k == "query" && strings.Contains(path, "templating"))) {
					exprs = append(exprs, s)
					checkExprMetrics(t, path+"."+k, s, exported)
					continue
				}
				walk(path+"."+k, c)
			}
		case []any:
			for i, c := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), c)
			}
		}
	}
	walk("", dash)
	if len(exprs) < 10 {
		t.Fatalf("only %d PromQL expressions found in the dashboard", len(exprs))
	}
	// Every panel expression parses as PromQL: promtool checks them as
	// recording rules, with Grafana's variables replaced by values.
	var records []rule
	for i, e := range exprs {
		if strings.HasPrefix(e, "label_values(") {
			continue // Grafana's variable query, not PromQL
		}
		e = strings.NewReplacer("$__rate_interval", "5m", "$group", ".*").Replace(e)
		records = append(records, rule{Record: fmt.Sprintf("dashboard:expr_%d", i), Expr: e})
	}
	rb, err := yaml.Marshal(map[string]any{"groups": []ruleGroup{{Name: "dashboard", Rules: records}}})
	if err != nil {
		t.Fatal(err)
	}
	rulesPath := filepath.Join(t.TempDir(), "dashboard-exprs.yaml")
	if err := os.WriteFile(rulesPath, rb, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool(t), "check", "rules", rulesPath).CombinedOutput(); err != nil {
		t.Errorf("a dashboard expression is not valid PromQL: %v\n%s", err, out)
	}
	// Every exported metric is on the dashboard somewhere.
	used := map[string]bool{}
	for _, e := range exprs {
		for _, n := range metricNames(e) {
			used[strings.TrimSuffix(n, "_bucket")] = true
		}
	}
	for n := range exported {
		if !used[n] && !strings.HasSuffix(n, "_bucket") && !strings.HasSuffix(n, "_sum") && !strings.HasSuffix(n, "_count") {
			t.Errorf("the dashboard shows nothing of %s", n)
		}
	}
}

// TestChart_MonitoringSchemaRejectsBadValues: values.schema.json refuses
// an unknown monitoring key, an alert the chart does not ship, a `for` that
// is not a Prometheus duration and a label that is not a string, naming the
// field.
func TestChart_MonitoringSchemaRejectsBadValues(t *testing.T) {
	h := newHelm(t)
	for name, tc := range map[string]struct {
		metrics map[string]any
		want    string
	}{
		"an unknown serviceMonitor key":         {map[string]any{"serviceMonitor": map[string]any{"intervall": "30s"}}, "/metrics/serviceMonitor"},
		"an alert the chart does not ship":      {map[string]any{"prometheusRule": map[string]any{"alerts": map[string]any{"ImageRefreshHeld": map[string]any{"enabled": false}}}}, "/metrics/prometheusRule/alerts"},
		"a Go duration as for":                  {map[string]any{"prometheusRule": map[string]any{"alerts": map[string]any{"ImageRefreshError": map[string]any{"for": "1.5h"}}}}, "/metrics/prometheusRule/alerts/ImageRefreshError/for"},
		"a scrape interval that is no duration": {map[string]any{"serviceMonitor": map[string]any{"interval": "often"}}, "/metrics/serviceMonitor/interval"},
		"a label that is not a string":          {map[string]any{"grafanaDashboard": map[string]any{"labels": map[string]any{"x": 1}}}, "/metrics/grafanaDashboard/labels/x"},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := h.render(ciValues(t, "controller"), valuesFile(t, map[string]any{"metrics": tc.metrics}))
			if err == nil || !strings.Contains(out, tc.want) {
				t.Errorf("helm template: err %v, want a schema error naming %s:\n%s", err, tc.want, out)
			}
		})
	}
}
