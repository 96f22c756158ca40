package chart

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/image-refresh/image-refresh/internal/workload"
)

// The chart names the workload kinds in three places that Helm cannot
// derive from the code: the kind → resource and kind → API group tables and
// the discovery RBAC rules (_helpers.tpl), the webhook's rules
// (webhook.yaml), and the kind enums of the values schema. Each must say
// exactly what internal/workload's kind table says, so that a kind added
// there and forgotten in one of them fails here.

// chartFile reads a file of the chart.
func chartFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// defineBlock returns the body of {{- define "name" -}} … {{- end }}.
func defineBlock(t *testing.T, tpl, name string) string {
	t.Helper()
	re := regexp.MustCompile(`(?s)\{\{-? define "` + regexp.QuoteMeta(name) + `" -?\}\}(.*?)\n\{\{-? end -?\}\}`)
	m := re.FindStringSubmatch(tpl)
	if m == nil {
		t.Fatalf("_helpers.tpl: no define %q", name)
	}
	return m[1]
}

// dictPairs parses the pairs of a template's (dict "k1" "v1" "k2" "v2" …).
func dictPairs(t *testing.T, where, body string) map[string]string {
	t.Helper()
	m := regexp.MustCompile(`\(dict ((?:"[^"]*"\s*)+)\)`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("%s: no (dict …) table", where)
	}
	words := regexp.MustCompile(`"([^"]*)"`).FindAllStringSubmatch(m[1], -1)
	if len(words)%2 != 0 {
		t.Fatalf("%s: odd number of words in (dict …)", where)
	}
	out := map[string]string{}
	for i := 0; i < len(words); i += 2 {
		out[words[i][1]] = words[i+1][1]
	}
	return out
}

// rbacResources parses every "apiGroups: [g] … resources: [a, b]" pair of a
// YAML text (RBAC and webhook rules) into group → sorted resources; a rule
// whose lists are template expressions ({{ … }}) is left out.
func rbacResources(t *testing.T, where, text string) map[string][]string {
	t.Helper()
	re := regexp.MustCompile(`apiGroups:\s*\[([^\]]*)\]\s*\n(?:\s*apiVersions:.*\n)?\s*resources:\s*\[([^\]]*)\]`)
	out := map[string][]string{}
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		if strings.Contains(m[0], "{{") {
			continue
		}
		for _, g := range splitList(m[1]) {
			out[g] = append(out[g], splitList(m[2])...)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no apiGroups/resources rules found", where)
	}
	for g := range out {
		slices.Sort(out[g])
		out[g] = slices.Compact(out[g])
	}
	return out
}

func splitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.Trim(strings.TrimSpace(f), `"'`); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// kindTable is what internal/workload says: names, kind → resource,
// kind → group, and group → sorted resources.
func kindTable(t *testing.T) (names []string, resource, group map[string]string, byGroup map[string][]string) {
	t.Helper()
	resource, group, byGroup = map[string]string{}, map[string]string{}, map[string][]string{}
	for _, k := range workload.Kinds() {
		names = append(names, k.Name)
		resource[k.Name], group[k.Name] = k.Resource, k.Group
		byGroup[k.Group] = append(byGroup[k.Group], k.Resource)
	}
	if len(names) == 0 {
		t.Fatal("workload.Kinds() is empty")
	}
	for g := range byGroup {
		slices.Sort(byGroup[g])
	}
	return names, resource, group, byGroup
}

func TestChart_KindsMatchTheKindTable_HelpersTables(t *testing.T) {
	_, resource, group, _ := kindTable(t)
	tpl := chartFile(t, "templates/_helpers.tpl")
	if got := dictPairs(t, `_helpers.tpl "image-refresh.resource"`, defineBlock(t, tpl, "image-refresh.resource")); !maps.Equal(got, resource) {
		t.Errorf(`_helpers.tpl "image-refresh.resource" = %v, the kind table says %v`, got, resource)
	}
	if got := dictPairs(t, `_helpers.tpl "image-refresh.apiGroup"`, defineBlock(t, tpl, "image-refresh.apiGroup")); !maps.Equal(got, group) {
		t.Errorf(`_helpers.tpl "image-refresh.apiGroup" = %v, the kind table says %v`, got, group)
	}
}

func TestChart_KindsMatchTheKindTable_DiscoveryRules(t *testing.T) {
	_, _, _, byGroup := kindTable(t)
	body := defineBlock(t, chartFile(t, "templates/_helpers.tpl"), "image-refresh.discoveryRules")
	got := rbacResources(t, `_helpers.tpl "image-refresh.discoveryRules"`, body)
	// The discovery rules also grant pods and events (core group); every
	// group of the kind table must list exactly its kinds' resources.
	for g, want := range byGroup {
		if !slices.Equal(got[g], want) {
			t.Errorf(`_helpers.tpl "image-refresh.discoveryRules": apiGroup %q lists %v, the kind table says %v`, g, got[g], want)
		}
	}
}

func TestChart_KindsMatchTheKindTable_WebhookRules(t *testing.T) {
	_, _, _, byGroup := kindTable(t)
	text := chartFile(t, "templates/webhook.yaml")
	i := strings.Index(text, "kind: MutatingWebhookConfiguration")
	if i < 0 {
		t.Fatal("webhook.yaml: no MutatingWebhookConfiguration")
	}
	// Only the webhook's own rules: the RBAC after the next document
	// grants other objects. Its configured-groups webhook takes the
	// resources from "image-refresh.watched" (the tables above); the
	// discovery webhooks list every kind.
	section := text[i:]
	if j := strings.Index(section, "\n---"); j >= 0 {
		section = section[:j]
	}
	if got := rbacResources(t, "webhook.yaml", section); !maps.EqualFunc(got, byGroup, slices.Equal) {
		t.Errorf("webhook.yaml rules = %v, the kind table says %v", got, byGroup)
	}
}

// The values schema names the kinds twice: the anchor's and the targets'
// kind take any kind name (a built-in one or one config.kinds declares,
// K2), and config.kinds' own kind must not be a built-in one.
func TestChart_KindsMatchTheKindTable_ValuesSchemaKinds(t *testing.T) {
	names, _, _, _ := kindTable(t)
	var schema any
	if err := json.Unmarshal([]byte(chartFile(t, "values.schema.json")), &schema); err != nil {
		t.Fatal(err)
	}
	patterns, nots := 0, 0
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if props, ok := v["properties"].(map[string]any); ok {
				if kind, ok := props["kind"].(map[string]any); ok {
					if p, ok := kind["pattern"].(string); ok {
						patterns++
						re := regexp.MustCompile(p)
						for _, n := range append(slices.Clone(names), "Rollout") {
							if !re.MatchString(n) {
								t.Errorf("values.schema.json %s/properties/kind pattern %q refuses %s", path, p, n)
							}
						}
						if not, ok := kind["not"].(map[string]any); ok {
							nots++
							var got []string
							for _, e := range not["enum"].([]any) {
								got = append(got, e.(string))
							}
							if !slices.Equal(got, names) {
								t.Errorf("values.schema.json %s: config.kinds refuses %v as a kind, the kind table's built-in kinds are %v", path, got, names)
							}
						}
					}
				}
			}
			for k, c := range v {
				walk(path+"/"+k, c)
			}
		case []any:
			for _, c := range v {
				walk(path+"/[]", c)
			}
		}
	}
	walk("", schema)
	if patterns < 3 || nots != 1 {
		t.Fatalf("values.schema.json: %d kind patterns (want the anchor's, the targets' and config.kinds') and %d built-in exclusions (want 1)", patterns, nots)
	}
}

// K2: the chart grants what a kind config.kinds declares needs, from the
// declaration alone: get and patch on the named objects of the groups,
// list and watch in the controller, discovery's rules, and the webhooks'
// rules under the kind's own group and version; a kind a group names
// that is neither built in nor declared fails the render, naming where.
func TestChart_K2_DeclaredKindsGetTheirRBACAndWebhookRules(t *testing.T) {
	h := newHelm(t)
	values := map[string]any{
		"mode":    "controller",
		"webhook": map[string]any{"enabled": true},
		"image":   map[string]any{"repository": "registry.example.com/ops/image-refresh"},
		"config": map[string]any{
			"kinds": []any{map[string]any{"group": "argoproj.io", "version": "v1alpha1", "kind": "Rollout", "podTemplate": "spec.template"}},
			"groups": []any{map[string]any{
				"name":   "shop",
				"anchor": map[string]any{"kind": "Rollout", "namespace": "shop", "name": "web"},
				"images": []any{map[string]any{"name": "web", "repository": "registry.example.com/acme/web", "tag": "prod",
					"targets": []any{map[string]any{"kind": "Rollout", "namespace": "shop", "name": "web", "container": "web"}}}},
			}},
		},
	}
	m := h.template(valuesFile(t, values))
	has := func(rules []rbacv1.PolicyRule, verb, name string) bool {
		for _, r := range rules {
			if slices.Contains(r.APIGroups, "argoproj.io") && slices.Contains(r.Resources, "rollouts") && slices.Contains(r.Verbs, verb) &&
				(name == "" || slices.Contains(r.ResourceNames, name)) {
				return true
			}
		}
		return false
	}
	role := rolesByNamespace(m)["shop"][release+"-image-refresh"]
	for _, v := range []struct{ verb, name string }{{"get", "web"}, {"patch", "web"}, {"list", ""}, {"watch", ""}} {
		if !has(role, v.verb, v.name) {
			t.Errorf("the Role in shop does not grant %s on argoproj.io rollouts %s: %+v", v.verb, v.name, role)
		}
	}
	if has(role, "get", "other") {
		t.Error("the Role grants get on Rollouts the config does not name")
	}
	discovered := false
	for _, cr := range all[*rbacv1.ClusterRole](m) {
		discovered = discovered || has(cr.Rules, "patch", "") && has(cr.Rules, "watch", "")
	}
	if !discovered {
		t.Error("no ClusterRole lets discovery list, watch and patch the declared Rollouts")
	}
	mwc := one[*admissionregistrationv1.MutatingWebhookConfiguration](t, m)
	for _, wh := range mwc.Webhooks {
		found := false
		for _, r := range wh.Rules {
			found = found || slices.Equal(r.APIGroups, []string{"argoproj.io"}) && slices.Equal(r.APIVersions, []string{"v1alpha1"}) && slices.Equal(r.Resources, []string{"rollouts"})
		}
		if !found {
			t.Errorf("webhook %s has no rule for argoproj.io/v1alpha1 rollouts: %+v", wh.Name, wh.Rules)
		}
	}

	// Undeclared, the Rollout is a kind image-refresh cannot pin.
	values["config"].(map[string]any)["kinds"] = []any{}
	out, err := h.render(valuesFile(t, values))
	if err == nil || !strings.Contains(out, "/config/groups/0/anchor/kind: Rollout is not a kind image-refresh can pin") {
		t.Errorf("helm template with an undeclared Rollout: %v\n%s", err, out)
	}
}
