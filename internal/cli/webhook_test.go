package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/internal/testenv"
	"github.com/image-refresh/image-refresh/internal/webhook"
)

// managedLabel is the objectSelector label of docs/webhook.md.
const managedLabel = "image-refresh.io/managed"

const (
	pinsSeries   = `image_refresh_admission_pins_total{group="control-plane",image="api"}`
	errorsSeries = `image_refresh_admission_errors_total`
)

// whLabel adds the objectSelector label to Deployments, as the operator does.
func (e *env) whLabel(names ...string) {
	e.t.Helper()
	patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, managedLabel))
	for _, n := range names {
		if _, err := e.c.Client.AppsV1().Deployments(e.ns).Patch(context.Background(), n, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			e.t.Fatal(err)
		}
	}
}

// whStart starts the webhook for the seed's shape: it returns once a
// dry-run re-render of requests-proxy to the tag comes back pinned.
func (e *env) whStart(cfg string, extra ...string) *runningController {
	e.t.Helper()
	return e.whStartProbed(cfg, "requests-proxy", map[string]string{"proxy": e.repo("api") + ":prod"}, extra...)
}

// whStartProbed installs the MutatingWebhookConfiguration of docs/webhook.md
// for this namespace, pointing at https://127.0.0.1:PORT/mutate-workloads
// and without a caBundle, then starts `run --webhook-port PORT`, which fills
// the caBundle in (self-signed). It returns once the API server calls the
// webhook: a dry-run re-render of probe's containers to the given images
// comes back pinned.
func (e *env) whStartProbed(cfg, probe string, images map[string]string, extra ...string) *runningController {
	e.t.Helper()
	_, port, _ := net.SplitHostPort(freeAddr(e.t))
	name := "image-refresh-" + e.ns
	url := "https://127.0.0.1:" + port + webhook.Path
	none, ignore, ifNeeded := admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.Ignore, admissionregistrationv1.IfNeededReinvocationPolicy
	timeout := int32(3)
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:         "workloads.image-refresh.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{"apps"}, APIVersions: []string{"v1"}, Resources: []string{"deployments", "daemonsets", "statefulsets"}},
			}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{managedLabel: "true"}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": e.ns}},
			FailurePolicy:           &ignore,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			ReinvocationPolicy:      &ifNeeded,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	mwcs := e.c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := mwcs.Create(context.Background(), mwc, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = mwcs.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	ctl := e.startRun(cfg, append([]string{"--webhook-port", port, "--webhook-host", "127.0.0.1", "--webhook-config-name", name}, extra...)...)
	eventually(e.t, 30*time.Second, "run put its CA in the caBundle", func() bool {
		got, err := mwcs.Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && strings.Contains(string(got.Webhooks[0].ClientConfig.CABundle), "BEGIN CERTIFICATE")
	})
	eventually(e.t, 30*time.Second, "the API server calls the webhook", func() bool {
		d, err := e.whTry("helm", probe, images, true)
		if err != nil {
			return false
		}
		got := whImages(d)
		for c := range images {
			if !strings.Contains(got[c], "@") {
				return false
			}
		}
		return true
	})
	return ctl
}

// whWrite re-renders containers' images the way another writer (field
// manager) does and returns the object as the API server stored it.
func (e *env) whWrite(manager, deploy string, images map[string]string) *appsv1.Deployment {
	e.t.Helper()
	d, err := e.whTry(manager, deploy, images, false)
	if err != nil {
		e.t.Fatalf("%s writing %s: %v", manager, deploy, err)
	}
	return d
}

func (e *env) whTry(manager, deploy string, images map[string]string, dryRun bool) (*appsv1.Deployment, error) {
	var cs []map[string]string
	for n, img := range images {
		cs = append(cs, map[string]string{"name": n, "image": img})
	}
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"containers": cs}}}})
	opts := metav1.PatchOptions{FieldManager: manager}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return e.c.Client.AppsV1().Deployments(e.ns).Patch(context.Background(), deploy, types.StrategicMergePatchType, patch, opts)
}

// whImages maps container name → image of a stored Deployment.
func whImages(d *appsv1.Deployment) map[string]string {
	out := map[string]string{}
	for _, c := range d.Spec.Template.Spec.Containers {
		out[c.Name] = c.Image
	}
	return out
}

// whMetric reads one series from the controller's /metrics (0 when absent).
func whMetric(t *testing.T, ctl *runningController, series string) float64 {
	t.Helper()
	_, body := get("http://" + ctl.metrics + "/metrics")
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", line, err)
			}
			return f
		}
	}
	return 0
}

// whBareTagReplicaSets names the ReplicaSets owned by the Deployment with
// uid whose pod template runs image (the bare tag).
func (e *env) whBareTagReplicaSets(deploy string, uid types.UID, image string) []string {
	e.t.Helper()
	list, err := e.c.Client.AppsV1().ReplicaSets(e.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + deploy})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, rs := range list.Items {
		owned := false
		for _, o := range rs.OwnerReferences {
			owned = owned || o.UID == uid
		}
		for _, c := range rs.Spec.Template.Spec.Containers {
			if owned && c.Image == image {
				out = append(out, rs.Name)
			}
		}
	}
	return out
}

func TestWebhook_B1_UpdateBackToTheTagIsPinnedAtAdmission(t *testing.T) {
	e := newEnv(t)
	digest, cfg := e.pinned()
	tag, pinned := e.repo("api")+":prod", e.repo("api")+":prod@"+digest
	e.whLabel("jobs-manager", "requests-proxy")
	ctl := e.whStart(cfg, "--poll-interval", "1h")
	before := e.deployment("requests-proxy")
	bareBefore := e.whBareTagReplicaSets("requests-proxy", before.UID, tag) // the seed's first rollout
	pins := whMetric(t, ctl, pinsSeries)

	stored := e.whWrite("helm", "requests-proxy", map[string]string{"proxy": tag})
	if got := whImages(stored)["proxy"]; got != pinned {
		t.Fatalf("helm's re-render to %s was stored as %s, want %s", tag, got, pinned)
	}
	if stored.Generation != before.Generation {
		t.Errorf("the pod template changed (generation %d -> %d): a rollout for nothing", before.Generation, stored.Generation)
	}
	// The deployment controller has seen the write (a ReplicaSet for a new
	// template is created before observedGeneration moves to it).
	eventually(t, 60*time.Second, "the deployment controller observed the write", func() bool {
		return e.deployment("requests-proxy").Status.ObservedGeneration >= stored.Generation
	})
	if bare := e.whBareTagReplicaSets("requests-proxy", before.UID, tag); len(bare) != len(bareBefore) {
		t.Errorf("ReplicaSets with the bare tag %s: %v, before the write %v", tag, bare, bareBefore)
	}
	if got := whMetric(t, ctl, pinsSeries) - pins; got != 1 {
		t.Errorf("%s grew by %v, want 1", pinsSeries, got)
	}
	ctl.kickedPasses(t, e, "control-plane", "requests-proxy") // fix A's passes on the stored write
	if strings.Contains(ctl.Logs(), "is not on the pinned digest") {
		t.Errorf("fix A had a revert to re-pin; the webhook should have prevented it:\n%s", ctl.Logs())
	}
}

func TestWebhook_B1_CreateOfAManagedTargetIsPinned(t *testing.T) {
	e := newEnv(t)
	digest, cfg := e.pinned()
	tag, pinned := e.repo("api")+":prod", e.repo("api")+":prod@"+digest
	e.whLabel("jobs-manager", "requests-proxy")
	ctl := e.whStart(cfg, "--poll-interval", "1h")
	pins := whMetric(t, ctl, pinsSeries)

	// helm uninstall + install of the target's release: delete, re-create.
	old := e.deployment("requests-proxy")
	deps := e.c.Client.AppsV1().Deployments(e.ns)
	if err := deps.Delete(context.Background(), "requests-proxy", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "requests-proxy deleted", func() bool {
		_, err := deps.Get(context.Background(), "requests-proxy", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	fresh := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "requests-proxy", Namespace: e.ns, Labels: old.Labels},
		Spec:       *old.Spec.DeepCopy(),
	}
	fresh.Spec.Template.Spec.Containers[0].Image = tag
	stored, err := deps.Create(context.Background(), fresh, metav1.CreateOptions{FieldManager: "helm"})
	if err != nil {
		t.Fatal(err)
	}
	if got := whImages(stored)["proxy"]; got != pinned {
		t.Fatalf("the re-created Deployment was stored with %s, want %s", got, pinned)
	}
	e.settle("Deployment", "requests-proxy")
	if bare := e.whBareTagReplicaSets("requests-proxy", stored.UID, tag); len(bare) != 0 {
		t.Errorf("the re-created Deployment rolled out the bare tag: ReplicaSets %v", bare)
	}
	if got := whMetric(t, ctl, pinsSeries) - pins; got != 1 {
		t.Errorf("%s grew by %v, want 1", pinsSeries, got)
	}
}

func TestWebhook_B1_LeavesEverythingElseAlone(t *testing.T) {
	e := newEnv(t)
	digest := e.push("api", "prod")
	tools := e.push("tools", "prod")
	api, tag := e.repo("api"), e.repo("api")+":prod"
	pinned := tag + "@" + digest
	other := "sha256:" + strings.Repeat("0", 64)
	workloads := []struct {
		name   string
		images [][2]string
	}{
		{"jobs-manager", [][2]string{{"api", tag}}},
		{"requests-proxy", [][2]string{{"proxy", tag}}},
		{"two-containers", [][2]string{{"api", tag}, {"sidecar", pinned}}},
		{"unmanaged", [][2]string{{"app", pinned}}},
		{"mirror-user", [][2]string{{"app", tag}}},
		{"other-tag", [][2]string{{"app", tag}}},
		{"own-write", [][2]string{{"app", tag}}},
		{"operator-pinned", [][2]string{{"app", e.repo("tools") + ":prod@" + tools}}},
		{"web", [][2]string{{"web", e.repo("web") + ":prod@" + other}}},
	}
	for _, w := range workloads {
		var opts []testenv.Option
		for _, c := range w.images {
			opts = append(opts, testenv.WithContainer(c[0], c[1]))
		}
		testenv.Deployment(t, e.c.Client, e.ns, w.name, append(opts, testenv.WithReplicas(1))...)
		e.whLabel(w.name)
	}
	cfg := e.config(`groups:
  - name: control-plane
    anchor: {kind: Deployment, namespace: {{ns}}, name: jobs-manager}
    images:
      - name: api
        repository: {{reg}}/acme/api
        tag: prod
        targets:
          - {kind: Deployment, namespace: {{ns}}, name: jobs-manager, container: api}
          - {kind: Deployment, namespace: {{ns}}, name: requests-proxy, container: proxy}
          - {kind: Deployment, namespace: {{ns}}, name: two-containers, container: api}
          - {kind: Deployment, namespace: {{ns}}, name: mirror-user, container: app}
          - {kind: Deployment, namespace: {{ns}}, name: other-tag, container: app}
          - {kind: Deployment, namespace: {{ns}}, name: own-write, container: app}
      - name: tools
        repository: {{reg}}/acme/tools
        tag: prod
        pinnedDigest: ` + tools + `
        targets:
          - {kind: Deployment, namespace: {{ns}}, name: operator-pinned, container: app}
  - name: late
    anchor: {kind: Deployment, namespace: {{ns}}, name: web}
    images:
      - name: web
        repository: {{reg}}/acme/web
        tag: prod
        targets:
          - {kind: Deployment, namespace: {{ns}}, name: web, container: web}
`)
	e.tick(cfg) // first observation (acme/web:prod does not exist: never recorded)
	e.tick(cfg) // pinned
	if got := e.image("requests-proxy", "proxy"); got != pinned {
		t.Fatalf("setup: requests-proxy not pinned: %s", got)
	}
	// A record left over from before the operator pinned tools: the webhook
	// must still leave the operator's image alone (R2).
	e.annotate("jobs-manager", map[string]*string{e.key("last-refreshed-tools-digest"): ptr(other)})
	ctl := e.whStart(cfg, "--poll-interval", "1h")
	errs := whMetric(t, ctl, errorsSeries)

	cases := []struct {
		name, deploy, manager string
		write, want           map[string]string
		pins                  float64
	}{
		{"control: the managed container of a managed workload is pinned", "requests-proxy", "helm",
			map[string]string{"proxy": tag}, map[string]string{"proxy": pinned}, 1},
		{"another container of a managed workload is left as written", "two-containers", "helm",
			map[string]string{"api": tag, "sidecar": tag}, map[string]string{"api": pinned, "sidecar": tag}, 1},
		{"a workload that is not in the config is left alone", "unmanaged", "helm",
			map[string]string{"app": tag}, map[string]string{"app": tag}, 0},
		{"a mirror repository is left alone (R3: no proof the mirror holds the digest)", "mirror-user", "helm",
			map[string]string{"app": "mirror.local/acme/api:prod"}, map[string]string{"app": "mirror.local/acme/api:prod"}, 0},
		{"an image without a recorded digest is left alone (R5)", "web", "helm",
			map[string]string{"web": e.repo("web") + ":prod"}, map[string]string{"web": e.repo("web") + ":prod"}, 0},
		{"an operator-pinned image is left alone (R2)", "operator-pinned", "helm",
			map[string]string{"app": e.repo("tools") + ":prod"}, map[string]string{"app": e.repo("tools") + ":prod"}, 0},
		{"another tag is left alone", "other-tag", "helm",
			map[string]string{"app": api + ":staging"}, map[string]string{"app": api + ":staging"}, 0},
		{"image-refresh's own write is left alone (R6 writes latest before it records it)", "own-write", "image-refresh",
			map[string]string{"app": tag + "@" + other}, map[string]string{"app": tag + "@" + other}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := e.withT(t)
			pins := whMetric(t, ctl, pinsSeries)
			stored := whImages(e.whWrite(c.manager, c.deploy, c.write))
			for n, want := range c.want {
				if stored[n] != want {
					t.Errorf("container %s stored as %s, want %s", n, stored[n], want)
				}
			}
			if got := whMetric(t, ctl, pinsSeries) - pins; got != c.pins {
				t.Errorf("%s grew by %v, want %v", pinsSeries, got, c.pins)
			}
		})
	}
	if got := whMetric(t, ctl, errorsSeries) - errs; got != 0 {
		t.Errorf("%s grew by %v: the webhook failed open instead of deciding", errorsSeries, got)
	}
}

func TestWebhook_B1_FailsOpen(t *testing.T) {
	e := newEnv(t)
	digest, cfg := e.pinned()
	tag, pinned := e.repo("api")+":prod", e.repo("api")+":prod@"+digest
	e.whLabel("jobs-manager", "requests-proxy")
	ctl := e.whStart(cfg, "--poll-interval", "1h")
	ctl.stop(t) // the webhook is down; the configuration still points at it

	start := time.Now()
	stored := e.whWrite("helm", "requests-proxy", map[string]string{"proxy": tag})
	took := time.Since(start)
	if got := whImages(stored)["proxy"]; got != tag {
		t.Fatalf("with the webhook down the write was stored as %s, want it as written (%s)", got, tag)
	}
	if took > 5*time.Second {
		t.Errorf("a deploy with the webhook down took %s; failurePolicy Ignore should let it through at once", took)
	}
	t.Logf("deploy with the webhook down admitted in %s", took.Round(time.Millisecond))
	e.settle("Deployment", "requests-proxy")

	if code, _ := e.tick(cfg); code != 0 {
		t.Fatalf("healing tick exit %d", code)
	}
	if got := e.image("requests-proxy", "proxy"); got != pinned {
		t.Errorf("fix A left %s after the missed admission, want %s", got, pinned)
	}
}

func TestWebhook_B3_FixAHealsARecordThatLags(t *testing.T) {
	// The poll interval, and with it the resync, is an hour away: whatever
	// heals the lagging record is the pass the write's watch event starts
	// (fix A), not a resync, so the wait below is bounded by the machine,
	// not by a poll window.
	const poll = time.Hour
	cases := []struct {
		name string
		// write is what the other writer renders; stored is what the
		// webhook lets through with the lagging record (old).
		write, stored func(repo, old string) string
	}{
		{"a re-render to the tag is pinned to the lagging record, then fix A moves it to latest",
			func(repo, _ string) string { return repo + ":prod" },
			func(repo, old string) string { return repo + ":prod@" + old }},
		{"helm rollback re-applies an old pinned manifest that matches the lagging record; fix A moves it to latest",
			func(repo, old string) string { return repo + ":prod@" + old },
			func(repo, old string) string { return repo + ":prod@" + old }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			old, cfg := e.pinned()
			latest := e.push("api", "prod")
			e.tick(cfg) // R6: every target on latest, recorded
			if got := e.annotations("jobs-manager")[e.key("last-refreshed-api-digest")]; got != latest {
				t.Fatalf("setup: record %s, want %s", got, latest)
			}
			repo := e.repo("api")
			e.whLabel("jobs-manager", "requests-proxy")
			ctl := e.whStart(cfg, "--poll-interval", poll.String(), "--poll-jitter", "0")
			// The passes the informers' first events queued are done (a pass
			// would heal the lagging record below before the webhook reads
			// it); the next resync is a poll interval away, and a write of
			// the record starts no pass.
			ctl.kickedPasses(t, e, "control-plane", "jobs-manager")

			// The record lags the live spec: a rollout to latest that has
			// not finished. requests-proxy is held unsettled (a replica that
			// is not available for an hour) until the webhook has written:
			// the annotation write below bumps the anchor's generation, and
			// the pass its settling starts would otherwise heal the record
			// before the webhook reads it (R4 skips the unsettled group).
			e.holdUnsettled("requests-proxy", true)
			e.annotate("jobs-manager", map[string]*string{e.key("last-refreshed-api-digest"): ptr(old)})
			eventually(t, time.Minute, "the webhook reads the lagging record", func() bool {
				d, err := e.whTry("helm", "requests-proxy", map[string]string{"proxy": repo + ":prod"}, true)
				return err == nil && whImages(d)["proxy"] == repo+":prod@"+old
			})
			stored := e.whWrite("helm", "requests-proxy", map[string]string{"proxy": c.write(repo, old)})
			if got, want := whImages(stored)["proxy"], c.stored(repo, old); got != want {
				t.Fatalf("stored %s, want %s (B reads the lagging record)", got, want)
			}
			if got := e.annotations("jobs-manager")[e.key("last-refreshed-api-digest")]; got != old {
				t.Fatalf("the record moved to %s while requests-proxy was held unsettled, want it still lagging at %s", got, old)
			}
			e.holdUnsettled("requests-proxy", false)
			took := eventually(t, 2*time.Minute, "fix A brings every target and the record to latest", func() bool {
				return e.image("jobs-manager", "api") == repo+":prod@"+latest &&
					e.image("requests-proxy", "proxy") == repo+":prod@"+latest &&
					e.annotations("jobs-manager")[e.key("last-refreshed-api-digest")] == latest
			})
			t.Logf("healed %s after requests-proxy was let settle (poll interval %s)", took.Round(time.Millisecond), poll)
			ctl.kickedPasses(t, e, "control-plane", "requests-proxy") // passes after fix A's writes, which a fight would follow
			if strings.Contains(ctl.Logs(), "rewrites image references") {
				t.Errorf("the webhook fought fix A's own write:\n%s", ctl.Logs())
			}
		})
	}
}

// holdUnsettled keeps deploy unsettled (on) or lets it settle (off)
// without touching its pod template: one more replica, and no replica
// counts as available before it has been ready for an hour.
func (e *env) holdUnsettled(deploy string, on bool) {
	e.t.Helper()
	d, err := e.c.Client.AppsV1().Deployments(e.ns).Get(context.Background(), deploy, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	patch := `{"spec":{"minReadySeconds":0}}`
	if on {
		patch = fmt.Sprintf(`{"spec":{"replicas":%d,"minReadySeconds":3600,"progressDeadlineSeconds":7200}}`, *d.Spec.Replicas+1)
	}
	if _, err := e.c.Client.AppsV1().Deployments(e.ns).Patch(context.Background(), deploy, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func TestWebhook_B1_InconsistentFlagsExit2(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(seedShape)
	for _, args := range [][]string{
		{"--webhook-port", "70000"},
		{"--webhook-port", "9443", "--webhook-self-signed=false"},
		{"--webhook-port", "9443", "--webhook-cert-dir", t.TempDir()},
		{"--webhook-port", "9443", "--webhook-config-name", ""},
	} {
		root := NewRoot(io.Discard, io.Discard)
		root.SetArgs(append([]string{"run", "--config", cfg, "--kubeconfig", e.kubeconfig}, args...))
		err := root.ExecuteContext(context.Background())
		if code := ExitCode(err); code != ExitInvalid || !strings.Contains(err.Error(), "--webhook-") {
			t.Errorf("run %v: exit %d (%v), want %d naming the webhook flag", args, code, err, ExitInvalid)
		}
	}
}
