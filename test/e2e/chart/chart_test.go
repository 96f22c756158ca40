package chart

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/image-refresh/image-refresh/internal/cli"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// chartDir is charts/image-refresh, found from the package directory.
func chartDir(t testing.TB) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "..", "charts", "image-refresh"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "Chart.yaml")); err != nil {
		t.Fatalf("chart not found: %v", err)
	}
	return dir
}

// helm runs a real Helm CLI that hack/build-cluster.sh builds (Helm 4 as
// helm, Helm 3 as helm3), with its cache, config and data in the test's own
// directory and the local cluster's admin kubeconfig.
type helm struct {
	t          testing.TB
	bin, home  string
	kubeconfig string
}

// newHelm is Helm 4.
func newHelm(t testing.TB) *helm { return newHelmMajor(t, 4) }

// helmMajors are the Helm majors the install tests run under, by subtest
// name.
var helmMajors = []struct {
	name  string
	major int
}{{"helm3", 3}, {"helm4", 4}}

// newHelmMajor is the Helm CLI of that major; the test fails if the binary
// is missing or of another major.
func newHelmMajor(t testing.TB, major int) *helm {
	t.Helper()
	dir, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	name := "helm"
	if major == 3 {
		name = "helm3"
	}
	h := &helm{t: t, bin: filepath.Join(dir, name), home: t.TempDir(), kubeconfig: testenv.Cluster(t).Kubeconfig}
	out, err := h.run("version", "--template", "{{.Version}}")
	if err != nil {
		t.Fatalf("%s (Helm %d): %v\n%s\nrun hack/build-cluster.sh", h.bin, major, err, out)
	}
	if want := fmt.Sprintf("v%d.", major); !strings.HasPrefix(out, want) {
		t.Fatalf("%s is Helm %q, want %s*", h.bin, out, want)
	}
	return h
}

// run returns helm's combined output and its error.
func (h *helm) run(args ...string) (string, error) {
	h.t.Helper()
	cmd := exec.Command(h.bin, args...)
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+h.kubeconfig,
		"HELM_CACHE_HOME="+filepath.Join(h.home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(h.home, "config"),
		"HELM_DATA_HOME="+filepath.Join(h.home, "data"),
	)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// valuesFile writes values (marshalled as YAML) to a file and returns its path.
func valuesFile(t testing.TB, values any) string {
	t.Helper()
	b, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// ciValues is one of the chart's ci/*-values.yaml files.
func ciValues(t testing.TB, name string) string {
	return filepath.Join(chartDir(t), "ci", name+"-values.yaml")
}

const (
	release   = "rel"
	releaseNS = "ops"
)

// template renders the chart as release "rel" in namespace "ops" with the
// values files in order, and fails the test if Helm fails.
func (h *helm) template(files ...string) *manifest {
	h.t.Helper()
	out, err := h.render(files...)
	if err != nil {
		h.t.Fatalf("helm template: %v\n%s", err, out)
	}
	return parseManifest(h.t, out)
}

func (h *helm) render(files ...string) (string, error) {
	args := []string{"template", release, chartDir(h.t), "--namespace", releaseNS}
	for _, f := range files {
		args = append(args, "-f", f)
	}
	return h.run(args...)
}

// object is what every typed Kubernetes object satisfies.
type object interface {
	runtime.Object
	metav1.Object
}

// manifest is a rendered chart: the raw text of each document and its
// object, decoded strictly into its typed Go struct.
type manifest struct {
	objects []object
	raw     []string
}

// kinds the chart may render; anything else is a test failure.
func newTyped(kind string) (object, bool) {
	switch kind {
	case "ServiceAccount":
		return &corev1.ServiceAccount{}, true
	case "ConfigMap":
		return &corev1.ConfigMap{}, true
	case "Service":
		return &corev1.Service{}, true
	case "Ingress":
		return &networkingv1.Ingress{}, true
	case "CronJob":
		return &batchv1.CronJob{}, true
	case "Deployment":
		return &appsv1.Deployment{}, true
	case "Role":
		return &rbacv1.Role{}, true
	case "RoleBinding":
		return &rbacv1.RoleBinding{}, true
	case "ClusterRole":
		return &rbacv1.ClusterRole{}, true
	case "ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}, true
	case "MutatingWebhookConfiguration":
		return &admissionregistrationv1.MutatingWebhookConfiguration{}, true
	case "ServiceMonitor":
		return &serviceMonitor{}, true
	case "PrometheusRule":
		return &prometheusRule{}, true
	}
	return nil, false
}

// parseManifest decodes every document of helm's output; an unknown field
// (a typo in a template) fails the test.
func parseManifest(t testing.TB, out string) *manifest {
	t.Helper()
	m := &manifest{}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(out, -1) {
		var u map[string]any
		if err := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(doc), 4096).Decode(&u); err != nil {
			if errors.Is(err, io.EOF) {
				continue
			}
			t.Fatalf("rendered document does not parse: %v\n%s", err, doc)
		}
		if len(u) == 0 {
			continue
		}
		kind, _ := u["kind"].(string)
		obj, ok := newTyped(kind)
		if !ok {
			t.Fatalf("unexpected kind %q rendered:\n%s", kind, doc)
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u, obj, true); err != nil {
			t.Fatalf("%s does not decode strictly: %v\n%s", kind, err, doc)
		}
		m.objects = append(m.objects, obj)
		m.raw = append(m.raw, doc)
	}
	if len(m.objects) == 0 {
		t.Fatalf("nothing rendered:\n%s", out)
	}
	return m
}

// all returns every rendered object of type T.
func all[T object](m *manifest) []T {
	var out []T
	for _, o := range m.objects {
		if v, ok := o.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// one returns the only rendered object of type T; it fails unless there is
// exactly one.
func one[T object](t testing.TB, m *manifest) T {
	t.Helper()
	objs := all[T](m)
	if len(objs) != 1 {
		var zero T
		t.Fatalf("want exactly one %T, got %d", zero, len(objs))
	}
	return objs[0]
}

// rolesByNamespace returns the rules of every Role, by namespace and name.
func rolesByNamespace(m *manifest) map[string]map[string][]rbacv1.PolicyRule {
	out := map[string]map[string][]rbacv1.PolicyRule{}
	for _, r := range all[*rbacv1.Role](m) {
		if out[r.Namespace] == nil {
			out[r.Namespace] = map[string][]rbacv1.PolicyRule{}
		}
		out[r.Namespace][r.Name] = r.Rules
	}
	return out
}

// cliFlags runs `image-refresh <sub> --help` in-process and returns the
// long flag names its help lists.
func cliFlags(t testing.TB, sub string) []string {
	t.Helper()
	var out, errOut bytes.Buffer
	root := cli.NewRoot(&out, &errOut)
	root.SetArgs([]string{sub, "--help"})
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("image-refresh %s --help: %v\n%s", sub, err, errOut.String())
	}
	_, flagsPart, ok := strings.Cut(out.String(), "\nFlags:\n")
	if !ok {
		t.Fatalf("image-refresh %s --help lists no flags:\n%s", sub, out.String())
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`).FindAllStringSubmatch(flagsPart, -1) {
		names = append(names, m[1])
	}
	return names
}

// checkArgs fails unless args (a container's, subcommand first) name a
// real subcommand and only flags it has, with values it accepts.
func checkArgs(t testing.TB, args []string, wantSub string) {
	t.Helper()
	if len(args) == 0 || args[0] != wantSub {
		t.Fatalf("container args %q: want subcommand %q first", args, wantSub)
	}
	known := cliFlags(t, wantSub)
	for _, a := range args[1:] {
		if !strings.HasPrefix(a, "--") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !slices.Contains(known, name) {
			t.Errorf("the chart passes %s, which `image-refresh %s --help` does not list (it has: %s)", a, wantSub, strings.Join(known, ", "))
		}
	}
	// Parse with the command's own flag set: every value must be of the
	// flag's type (a duration, an int) and nothing may be left over.
	cmd, _, err := cli.NewRoot(io.Discard, io.Discard).Find([]string{wantSub})
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.ParseFlags(args[1:]); err != nil {
		t.Errorf("image-refresh %s refuses the chart's args %q: %v", wantSub, args[1:], err)
	} else if rest := cmd.Flags().Args(); len(rest) > 0 {
		t.Errorf("image-refresh %s would get positional arguments %q from the chart (it takes none)", wantSub, rest)
	}
}

// configMap returns the chart's config ConfigMap: the only one that is not
// the Grafana dashboard's.
func configMap(t testing.TB, m *manifest) *corev1.ConfigMap {
	t.Helper()
	var out []*corev1.ConfigMap
	for _, cm := range all[*corev1.ConfigMap](m) {
		if cm.Labels["grafana_dashboard"] == "" {
			out = append(out, cm)
		}
	}
	if len(out) != 1 {
		t.Fatalf("want exactly one config ConfigMap, got %d", len(out))
	}
	return out[0]
}

// configOf returns config.yaml of the rendered ConfigMap.
func configOf(t testing.TB, m *manifest) []byte {
	t.Helper()
	cm := configMap(t, m)
	text, ok := cm.Data["config.yaml"]
	if !ok {
		t.Fatalf("ConfigMap %s has no config.yaml", cm.Name)
	}
	return []byte(text)
}

func argValue(args []string, flag string) (string, bool) {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1], true
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

func fmtRules(rules []rbacv1.PolicyRule) string {
	var b strings.Builder
	for _, r := range rules {
		fmt.Fprintf(&b, "\n  %v %v %v names=%v", r.APIGroups, r.Resources, r.Verbs, r.ResourceNames)
	}
	return b.String()
}
