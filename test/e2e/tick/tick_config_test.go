package tick

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"

	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/running"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// withPin returns the seed shape with an operator pin on image api.
func withPin(digest string) string {
	return strings.Replace(e2e.SeedShape, "        tag: prod\n", "        tag: prod\n        pinnedDigest: "+digest+"\n", 1)
}

func TestTick_R2_StalePinIsReportedAndClearedWhenRemoved(t *testing.T) {
	e := newEnv(t)
	old := e.Seed()
	latest := e.Push("api", "prod")
	tag := e.Repo("api") + ":prod"
	stale := e.Config(withPin(old))
	rvProxy := e.Deployment("requests-proxy").ResourceVersion
	rollouts := e.Rollouts("jobs-manager")

	code, logs := e.Tick(stale)
	if code != 1 {
		t.Errorf("tick with a stale operator pin: exit %d, want 1", code)
	}
	if got := e.Annotations("jobs-manager")[e.Key("stale-pin-api")]; got != latest {
		t.Errorf("stale-pin annotation %q, want the registry's latest %q", got, latest)
	}
	if ev := e.Events("jobs-manager"); !e2e.HasEvent(ev, "StalePin", old) || !e2e.HasEvent(ev, "StalePin", latest) {
		t.Errorf("no StalePin event naming the pin and the latest digest; events: %q", ev)
	}
	if lines := e2e.LogLines(logs, "WARN", old, latest, "remediation="); len(lines) == 0 {
		t.Errorf("no WARN line with the pin, the latest digest and a remediation:\n%s", logs)
	}
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := e.Image(w[0], w[1]); got != tag {
			t.Errorf("%s/%s re-imaged to %s under an operator pin, want it left on %s", w[0], w[1], got, tag)
		}
	}
	if got := e.Deployment("requests-proxy").ResourceVersion; got != rvProxy {
		t.Errorf("requests-proxy written under an operator pin (resourceVersion %s -> %s)", rvProxy, got)
	}
	if n := e.Rollouts("jobs-manager"); n != rollouts {
		t.Errorf("jobs-manager rolled out under an operator pin (%d -> %d ReplicaSets)", rollouts, n)
	}
	if _, ok := e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")]; ok {
		t.Errorf("a digest was recorded for an operator-pinned image")
	}

	// The operator moves the pin to the latest digest: the finding clears.
	// The targets still run the bare tag: not pinned, and said so (R2, R15).
	code, logs = e.Tick(e.Config(withPin(latest)))
	if code != 0 {
		t.Errorf("tick with a current operator pin: exit %d, want 0", code)
	}
	if lines := e2e.LogLines(logs, "INFO", "NOTE:", "requests-proxy", "not the operator pin "+latest); len(lines) != 1 {
		t.Errorf("want one NOTE that requests-proxy does not run the operator pin %s:\n%s", latest, logs)
	}
	if v, ok := e.Annotations("jobs-manager")[e.Key("stale-pin-api")]; ok {
		t.Errorf("stale-pin annotation %q left after the pin matched the latest", v)
	}

	// Stale again, then the operator removes the pin.
	if code, _ := e.Tick(stale); code != 1 {
		t.Errorf("tick with the stale pin again: exit %d, want 1", code)
	}
	if code, _ := e.Tick(e.Config(e2e.SeedShape)); code != 0 {
		t.Errorf("tick after the pin was removed: exit %d, want 0", code)
	}
	a := e.Annotations("jobs-manager")
	if v, ok := a[e.Key("stale-pin-api")]; ok {
		t.Errorf("stale-pin annotation %q left after the pin was removed", v)
	}
	if got := a[e.Key("last-refreshed-api-digest")]; got != latest {
		t.Errorf("after the pin was removed the image is followed again: record %q, want %q", got, latest)
	}
}

// ownedPaths returns the leaf field paths of a FieldsV1 set, "/"-joined.
func ownedPaths(prefix string, node map[string]any, out *[]string) {
	if len(node) == 0 {
		*out = append(*out, prefix)
		return
	}
	for k, v := range node {
		child, _ := v.(map[string]any)
		ownedPaths(prefix+"/"+k, child, out)
	}
}

func TestTick_R16_R17_OnlyImageFieldsChangeUnderTheImageRefreshManager(t *testing.T) {
	e := newEnv(t)
	digest := e.Push("api", "prod")
	tag := e.Repo("api") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "jobs-manager",
		testenv.WithContainer("api", tag), testenv.WithContainer("sidecar", "example.invalid/sidecar:v1"),
		testenv.WithRecreate(), testenv.WithAnnotations(map[string]string{"team": "payments"}))
	e.Settle("Deployment", "jobs-manager")
	cfg := e.Config("groups:\n" + e2e.OneGroup("control-plane", "api", "jobs-manager", "api"))
	before := e.Deployment("jobs-manager")
	for i := range 2 {
		if code, _ := e.Tick(cfg); code != 0 {
			t.Fatalf("tick %d exit %d", i+1, code)
		}
	}
	after := e.Deployment("jobs-manager")
	if got := after.Spec.Template.Spec.Containers[0].Image; got != tag+"@"+digest {
		t.Fatalf("api not pinned: %s", got)
	}

	// R16: the spec is the same but for the managed image.
	spec := after.Spec.DeepCopy()
	spec.Template.Spec.Containers[0].Image = before.Spec.Template.Spec.Containers[0].Image
	if !apiequality.Semantic.DeepEqual(before.Spec, *spec) {
		b, _ := json.MarshalIndent(before.Spec, "", " ")
		a, _ := json.MarshalIndent(spec, "", " ")
		t.Errorf("R16: the spec changed beyond the managed image:\nbefore %s\nafter (image restored) %s", b, a)
	}
	for _, c := range after.Spec.Template.Spec.Containers {
		if c.ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("R16: container %s imagePullPolicy %q, want IfNotPresent", c.Name, c.ImagePullPolicy)
		}
	}
	if got := after.Spec.Template.Spec.Containers[1].Image; got != "example.invalid/sidecar:v1" {
		t.Errorf("R16: the unmanaged sidecar was re-imaged to %s", got)
	}
	if !apiequality.Semantic.DeepEqual(before.Labels, after.Labels) {
		t.Errorf("R16: labels changed: %v -> %v", before.Labels, after.Labels)
	}
	for k, v := range after.Annotations {
		if strings.HasPrefix(k, e.Prefix+"/") || k == "deployment.kubernetes.io/revision" {
			continue
		}
		if before.Annotations[k] != v {
			t.Errorf("R16: annotation %s=%q, was %q", k, v, before.Annotations[k])
		}
	}
	if after.Annotations["team"] != "payments" {
		t.Errorf("R16: annotation team dropped: %v", after.Annotations)
	}

	// R17: image-refresh owns the managed image, and nothing else but its
	// state annotations.
	imagePath := `/f:spec/f:template/f:spec/f:containers/k:{"name":"api"}/f:image`
	var owned []string
	for _, mf := range after.ManagedFields {
		if mf.Manager != workload.FieldManager || mf.FieldsV1 == nil {
			continue
		}
		var fields map[string]any
		if err := json.Unmarshal(mf.FieldsV1.Raw, &fields); err != nil {
			t.Fatal(err)
		}
		ownedPaths("", fields, &owned)
	}
	found := false
	for _, p := range owned {
		switch {
		case p == imagePath:
			found = true
		case strings.HasPrefix(p, "/f:metadata/f:annotations"):
			if strings.HasPrefix(p, "/f:metadata/f:annotations/f:") && !strings.HasPrefix(p, "/f:metadata/f:annotations/f:"+e.Prefix+"/") {
				t.Errorf("R17: %s owns a foreign annotation: %s", workload.FieldManager, p)
			}
		default:
			t.Errorf("R17: %s owns %s, beyond the image and its annotations", workload.FieldManager, p)
		}
	}
	if !found {
		t.Errorf("R17: manager %s does not own %s; it owns %q (managedFields %v)", workload.FieldManager, imagePath, owned, after.ManagedFields)
	}
}

func TestTick_SeedPrefixReadsTheScriptsState(t *testing.T) {
	e := newEnv(t)
	e.Prefix = "tracebloc.io"
	digest := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	if !strings.HasPrefix(e2e.ReadFile(t, cfg), "annotationPrefix: tracebloc.io\n") {
		t.Fatalf("config does not use the seed's prefix:\n%s", e2e.ReadFile(t, cfg))
	}
	// The seed's script already recorded the digest.
	e.Annotate("jobs-manager", map[string]*string{"tracebloc.io/last-refreshed-api-digest": e2e.Ptr(digest)})
	e.Settle("Deployment", "jobs-manager")

	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("tick exit %d", code)
	}
	want := e.Repo("api") + ":prod@" + digest
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := e.Image(w[0], w[1]); got != want {
			t.Errorf("%s/%s runs %s after one tick, want %s (the script's record is the state)", w[0], w[1], got, want)
		}
	}
	for _, n := range []string{"jobs-manager", "requests-proxy"} {
		for k := range e.Annotations(n) {
			if strings.HasPrefix(k, "image-refresh.io/") {
				t.Errorf("%s carries %s: state must live under tracebloc.io only", n, k)
			}
		}
	}
	a := e.Annotations("jobs-manager")
	if got := a["tracebloc.io/last-refreshed-api-digest"]; got != digest {
		t.Errorf("tracebloc.io record %q, want %q", got, digest)
	}
	if v, ok := a["tracebloc.io/refresh-attempt"]; ok {
		t.Errorf("tracebloc.io/refresh-attempt %q left after a settled rollout", v)
	}
}

func TestTick_InvalidConfigExits2AndWritesNothing(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	rvs, events := e.ResourceVersions(), e.OwnEvents()
	target := func(name, container string) string {
		return fmt.Sprintf("          - {kind: Deployment, namespace: {{ns}}, name: %s, container: %s}\n", name, container)
	}
	for name, tc := range map[string]struct {
		body, want string
	}{
		"an unknown key is named": {
			body: "maxRetries: 3\n" + e2e.SeedShape,
			want: `unknown key "maxRetries"`,
		},
		"a target without a container names the field": {
			body: strings.Replace(e2e.SeedShape, target("requests-proxy", "proxy"),
				"          - {kind: Deployment, namespace: {{ns}}, name: requests-proxy}\n", 1),
			want: "groups[0].images[0].targets[1].container: missing",
		},
		"a bad duration names the field": {
			body: "apiTimeout: 5 minutes\n" + e2e.SeedShape,
			want: `apiTimeout: invalid duration "5 minutes"`,
		},
		"an unsupported kind names the field": {
			body: strings.Replace(e2e.SeedShape, target("requests-proxy", "proxy"),
				"          - {kind: Job, namespace: {{ns}}, name: requests-proxy, container: proxy}\n", 1),
			want: `groups[0].images[0].targets[1].kind: kind "Job" is not supported`,
		},
		"a duplicate image name names the field": {
			body: e2e.SeedShape + `      - name: api
        repository: {{reg}}/acme/worker
        tag: prod
        targets:
          - {kind: Deployment, namespace: {{ns}}, name: worker, container: app}
`,
			want: `groups[0].images[1].name: duplicate image name "api"`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := &env{e.WithT(t)}
			cfg := e.Config(tc.body)
			code, out, errOut := e.Run("tick", "--config", cfg, "--kubeconfig", e.Kubeconfig)
			if code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("message does not say %q:\n%s", tc.want, errOut)
			}
			if out != "" {
				t.Errorf("stdout %q, want nothing", out)
			}
			e.AssertUnchanged("an invalid config", rvs, events)
		})
	}
	cfg := e.Config(e2e.SeedShape)
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"an unknown flag exits 2":        {[]string{"tick", "--config", cfg, "--kubeconfig", e.Kubeconfig, "--bogus"}, "unknown flag: --bogus"},
		"no --config without discovery":  {[]string{"tick", "--kubeconfig", e.Kubeconfig, "--discovery=false"}, "--config is required with --discovery=false"},
		"a watched namespace not a name": {[]string{"tick", "--kubeconfig", e.Kubeconfig, "--watch-namespaces", "Not_A_Namespace"}, `--watch-namespaces: "Not_A_Namespace"`},
		"an unknown log format exits 2":  {[]string{"tick", "--config", cfg, "--kubeconfig", e.Kubeconfig, "--log-format", "xml"}, "--log-format"},
		"a stray argument is refused":    {[]string{"tick", "--config", cfg, "--kubeconfig", e.Kubeconfig, "now"}, "now"},
		"a missing config file exits 2":  {[]string{"tick", "--config", filepath.Join(t.TempDir(), "nope.yaml"), "--kubeconfig", e.Kubeconfig}, "nope.yaml"},
		"status -o with a bad format":    {[]string{"status", "--config", cfg, "--kubeconfig", e.Kubeconfig, "-o", "yaml"}, `"yaml"`},
		"rearm without --group exits 2":  {[]string{"rearm", "--config", cfg, "--kubeconfig", e.Kubeconfig}, "--group is required"},
		"rearm of an unknown group is 2": {[]string{"rearm", "--config", cfg, "--kubeconfig", e.Kubeconfig, "--group", "nope"}, `no group "nope"`},
	} {
		t.Run(name, func(t *testing.T) {
			e := &env{e.WithT(t)}
			code, _, errOut := e.Run(tc.args...)
			if code != 2 {
				t.Errorf("%v: exit %d, want 2:\n%s", tc.args, code, errOut)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("%v: message does not say %q:\n%s", tc.args, tc.want, errOut)
			}
			e.AssertUnchanged(strings.Join(tc.args[:1], " "), rvs, events)
		})
	}
}

func TestTick_DryRunWritesNothing(t *testing.T) {
	e := newEnv(t)
	digest, cfg := e.Pinned()
	tag := e.Repo("api") + ":prod"
	e.SetImageAs("helm", "Deployment", "jobs-manager", "api", tag)
	rvs, events := e.ResourceVersions(), e.OwnEvents()

	code, out, logs := e.Run("tick", "--config", cfg, "--kubeconfig", e.Kubeconfig, "--dry-run")
	t.Logf("dry-run stdout:\n%s\nlogs:\n%s", out, logs)
	if code != 0 {
		t.Errorf("tick --dry-run exit %d, want 0", code)
	}
	want := fmt.Sprintf("re-image Deployment %s/jobs-manager container api: %s -> %s@%s (revert)", e.NS, tag, tag, digest)
	if !strings.Contains(out, want) {
		t.Errorf("the plan on stdout lacks %q:\n%s", want, out)
	}
	if strings.Contains(out, "requests-proxy container proxy") {
		t.Errorf("the plan re-images requests-proxy, which is on the digest:\n%s", out)
	}
	if got := e.Image("jobs-manager", "api"); got != tag {
		t.Errorf("--dry-run re-imaged jobs-manager to %s", got)
	}
	e.AssertUnchanged("tick --dry-run", rvs, events)
}

func TestTick_R15_MetricsFileNamesTheState(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.Tick(cfg)
	onDigest := func(t *testing.T, text string) {
		t.Helper()
		for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
			labels := map[string]string{"group": "control-plane", "image": "api", "namespace": e.NS, "workload": w[0], "container": w[1]}
			if v, ok := running.MetricValue(text, "image_refresh_target_on_digest", labels); v != "1" {
				t.Errorf("image_refresh_target_on_digest%v = %q (present %v), want 1:\n%s", labels, v, ok, text)
			}
		}
	}
	metricsTick := func(t *testing.T, cfg string, wantCode int) string {
		t.Helper()
		path := filepath.Join(t.TempDir(), "image-refresh.prom")
		if code, _ := e.WithT(t).Tick(cfg, "--metrics-file", path); code != wantCode {
			t.Errorf("tick exit %d, want %d", code, wantCode)
		}
		return e2e.ReadFile(t, path)
	}

	t.Run("the tick that pins reports the targets on the digest", func(t *testing.T) {
		text := metricsTick(t, cfg, 0)
		if got := e.WithT(t).Image("requests-proxy", "proxy"); got != e.Repo("api")+":prod@"+digest {
			t.Fatalf("not pinned: %s", got)
		}
		if v, _ := running.MetricValue(text, "image_refresh_repins_total", map[string]string{"group": "control-plane", "image": "api"}); v != "2" {
			t.Errorf("image_refresh_repins_total = %q, want 2", v)
		}
		onDigest(t, text)
	})
	t.Run("a steady tick reports the targets on the digest", func(t *testing.T) {
		text := metricsTick(t, cfg, 0)
		onDigest(t, text)
		if v, _ := running.MetricValue(text, "image_refresh_group_needs_attention", map[string]string{"group": "control-plane", "reason": "StalePin"}); v != "0" {
			t.Errorf("needs_attention{StalePin} = %q in steady state, want 0", v)
		}
	})
	t.Run("a stale operator pin names StalePin", func(t *testing.T) {
		e.WithT(t).Push("api", "prod")
		text := metricsTick(t, e.WithT(t).Config(withPin(digest)), 1)
		if v, ok := running.MetricValue(text, "image_refresh_group_needs_attention", map[string]string{"group": "control-plane", "reason": "StalePin"}); v != "1" {
			t.Errorf(`image_refresh_group_needs_attention{group="control-plane",reason="StalePin"} = %q (present %v), want 1:`+"\n%s", v, ok, text)
		}
		if !strings.Contains(text, `image_refresh_group_needs_attention{group="control-plane",reason="StalePin"} 1`) {
			t.Errorf("the file lacks the exact sample line:\n%s", text)
		}
	})
}
