package admission

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/internal/cli"
	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/running"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

const (
	pinsSeries   = `image_refresh_admission_pins_total{group="control-plane",image="api"}`
	errorsSeries = `image_refresh_admission_errors_total`
)

// whStart starts the webhook for the seed's shape: it returns once a
// dry-run re-render of requests-proxy to the tag comes back pinned.
func (e *env) whStart(cfg string, extra ...string) *e2e.RunningController {
	e.T.Helper()
	return e.WhStartProbed(cfg, "requests-proxy", map[string]string{"proxy": e.Repo("api") + ":prod"}, extra...)
}

// whMetric reads one series from the controller's /metrics (0 when absent).
func whMetric(t *testing.T, ctl *e2e.RunningController, series string) float64 {
	t.Helper()
	_, body := running.Get("http://" + ctl.Metrics + "/metrics")
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
	e.T.Helper()
	list, err := e.C.Client.AppsV1().ReplicaSets(e.NS).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + deploy})
	if err != nil {
		e.T.Fatal(err)
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
	digest, cfg := e.Pinned()
	tag, pinned := e.Repo("api")+":prod", e.Repo("api")+":prod@"+digest
	e.WhLabel("jobs-manager", "requests-proxy")
	ctl := e.whStart(cfg, "--poll-interval", "1h")
	before := e.Deployment("requests-proxy")
	bareBefore := e.whBareTagReplicaSets("requests-proxy", before.UID, tag) // the seed's first rollout
	pins := whMetric(t, ctl, pinsSeries)

	stored := e.WhWrite("helm", "requests-proxy", map[string]string{"proxy": tag})
	if got := e2e.WhImages(stored)["proxy"]; got != pinned {
		t.Fatalf("helm's re-render to %s was stored as %s, want %s", tag, got, pinned)
	}
	if stored.Generation != before.Generation {
		t.Errorf("the pod template changed (generation %d -> %d): a rollout for nothing", before.Generation, stored.Generation)
	}
	// The deployment controller has seen the write (a ReplicaSet for a new
	// template is created before observedGeneration moves to it).
	e.UntilDeployments(60*time.Second, "the deployment controller observed the write", func() bool {
		return e.Deployment("requests-proxy").Status.ObservedGeneration >= stored.Generation
	})
	if bare := e.whBareTagReplicaSets("requests-proxy", before.UID, tag); len(bare) != len(bareBefore) {
		t.Errorf("ReplicaSets with the bare tag %s: %v, before the write %v", tag, bare, bareBefore)
	}
	if got := whMetric(t, ctl, pinsSeries) - pins; got != 1 {
		t.Errorf("%s grew by %v, want 1", pinsSeries, got)
	}
	ctl.KickedPasses(t, e.Env, "control-plane", "requests-proxy") // fix A's passes on the stored write
	if strings.Contains(ctl.Logs(), "is not on the pinned digest") {
		t.Errorf("fix A had a revert to re-pin; the webhook should have prevented it:\n%s", ctl.Logs())
	}
}

func TestWebhook_B1_CreateOfAManagedTargetIsPinned(t *testing.T) {
	e := newEnv(t)
	digest, cfg := e.Pinned()
	tag, pinned := e.Repo("api")+":prod", e.Repo("api")+":prod@"+digest
	e.WhLabel("jobs-manager", "requests-proxy")
	ctl := e.whStart(cfg, "--poll-interval", "1h")
	pins := whMetric(t, ctl, pinsSeries)

	// helm uninstall + install of the target's release: delete, re-create.
	old := e.Deployment("requests-proxy")
	deps := e.C.Client.AppsV1().Deployments(e.NS)
	if err := deps.Delete(context.Background(), "requests-proxy", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.UntilDeployments(30*time.Second, "requests-proxy deleted", func() bool {
		_, err := deps.Get(context.Background(), "requests-proxy", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	fresh := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "requests-proxy", Namespace: e.NS, Labels: old.Labels},
		Spec:       *old.Spec.DeepCopy(),
	}
	fresh.Spec.Template.Spec.Containers[0].Image = tag
	stored, err := deps.Create(context.Background(), fresh, metav1.CreateOptions{FieldManager: "helm"})
	if err != nil {
		t.Fatal(err)
	}
	if got := e2e.WhImages(stored)["proxy"]; got != pinned {
		t.Fatalf("the re-created Deployment was stored with %s, want %s", got, pinned)
	}
	e.Settle("Deployment", "requests-proxy")
	if bare := e.whBareTagReplicaSets("requests-proxy", stored.UID, tag); len(bare) != 0 {
		t.Errorf("the re-created Deployment rolled out the bare tag: ReplicaSets %v", bare)
	}
	if got := whMetric(t, ctl, pinsSeries) - pins; got != 1 {
		t.Errorf("%s grew by %v, want 1", pinsSeries, got)
	}
}

func TestWebhook_B1_LeavesEverythingElseAlone(t *testing.T) {
	e := newEnv(t)
	digest := e.Push("api", "prod")
	tools := e.Push("tools", "prod")
	api, tag := e.Repo("api"), e.Repo("api")+":prod"
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
		{"operator-pinned", [][2]string{{"app", e.Repo("tools") + ":prod@" + tools}}},
		{"web", [][2]string{{"web", e.Repo("web") + ":prod@" + other}}},
	}
	for _, w := range workloads {
		var opts []testenv.Option
		for _, c := range w.images {
			opts = append(opts, testenv.WithContainer(c[0], c[1]))
		}
		testenv.Deployment(t, e.C.Client, e.NS, w.name, append(opts, testenv.WithReplicas(1))...)
		e.WhLabel(w.name)
	}
	cfg := e.Config(`groups:
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
	e.Tick(cfg) // first observation (acme/web:prod does not exist: never recorded)
	e.Tick(cfg) // pinned
	if got := e.Image("requests-proxy", "proxy"); got != pinned {
		t.Fatalf("setup: requests-proxy not pinned: %s", got)
	}
	// A record left over from before the operator pinned tools: the webhook
	// must still leave the operator's image alone (R2).
	e.Annotate("jobs-manager", map[string]*string{e.Key("last-refreshed-tools-digest"): e2e.Ptr(other)})
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
			map[string]string{"web": e.Repo("web") + ":prod"}, map[string]string{"web": e.Repo("web") + ":prod"}, 0},
		{"an operator-pinned image is left alone (R2)", "operator-pinned", "helm",
			map[string]string{"app": e.Repo("tools") + ":prod"}, map[string]string{"app": e.Repo("tools") + ":prod"}, 0},
		{"another tag is left alone", "other-tag", "helm",
			map[string]string{"app": api + ":staging"}, map[string]string{"app": api + ":staging"}, 0},
		{"image-refresh's own write is left alone (R6 writes latest before it records it)", "own-write", "image-refresh",
			map[string]string{"app": tag + "@" + other}, map[string]string{"app": tag + "@" + other}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := &env{e.WithT(t)}
			pins := whMetric(t, ctl, pinsSeries)
			stored := e2e.WhImages(e.WhWrite(c.manager, c.deploy, c.write))
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
	digest, cfg := e.Pinned()
	tag, pinned := e.Repo("api")+":prod", e.Repo("api")+":prod@"+digest
	e.WhLabel("jobs-manager", "requests-proxy")
	ctl := e.whStart(cfg, "--poll-interval", "1h")
	ctl.Stop(t) // the webhook is down; the configuration still points at it

	start := time.Now()
	stored := e.WhWrite("helm", "requests-proxy", map[string]string{"proxy": tag})
	took := time.Since(start)
	if got := e2e.WhImages(stored)["proxy"]; got != tag {
		t.Fatalf("with the webhook down the write was stored as %s, want it as written (%s)", got, tag)
	}
	if took > 5*time.Second {
		t.Errorf("a deploy with the webhook down took %s; failurePolicy Ignore should let it through at once", took)
	}
	t.Logf("deploy with the webhook down admitted in %s", took.Round(time.Millisecond))
	e.Settle("Deployment", "requests-proxy")

	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("healing tick exit %d", code)
	}
	if got := e.Image("requests-proxy", "proxy"); got != pinned {
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
			old, cfg := e.Pinned()
			latest := e.Push("api", "prod")
			e.Tick(cfg) // R6: every target on latest, recorded
			if got := e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")]; got != latest {
				t.Fatalf("setup: record %s, want %s", got, latest)
			}
			repo := e.Repo("api")
			e.WhLabel("jobs-manager", "requests-proxy")
			ctl := e.whStart(cfg, "--poll-interval", poll.String(), "--poll-jitter", "0")
			// The passes the informers' first events queued are done (a pass
			// would heal the lagging record below before the webhook reads
			// it); the next resync is a poll interval away, and a write of
			// the record starts no pass.
			ctl.KickedPasses(t, e.Env, "control-plane", "jobs-manager")

			// The record lags the live spec: a rollout to latest that has
			// not finished. requests-proxy is held unsettled (a replica that
			// is not available for an hour) until the webhook has written:
			// the annotation write below bumps the anchor's generation, and
			// the pass its settling starts would otherwise heal the record
			// before the webhook reads it (R4 skips the unsettled group).
			e.holdUnsettled("requests-proxy", true)
			e.Annotate("jobs-manager", map[string]*string{e.Key("last-refreshed-api-digest"): e2e.Ptr(old)})
			// The webhook's cache announces nothing: dry runs probe it.
			testwait.Eventually(t, time.Minute, "the webhook reads the lagging record", func() bool {
				d, err := e.WhTry("helm", "requests-proxy", map[string]string{"proxy": repo + ":prod"}, true)
				return err == nil && e2e.WhImages(d)["proxy"] == repo+":prod@"+old
			})
			stored := e.WhWrite("helm", "requests-proxy", map[string]string{"proxy": c.write(repo, old)})
			if got, want := e2e.WhImages(stored)["proxy"], c.stored(repo, old); got != want {
				t.Fatalf("stored %s, want %s (B reads the lagging record)", got, want)
			}
			if got := e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")]; got != old {
				t.Fatalf("the record moved to %s while requests-proxy was held unsettled, want it still lagging at %s", got, old)
			}
			e.holdUnsettled("requests-proxy", false)
			took := e.UntilDeployments(2*time.Minute, "fix A brings every target and the record to latest", func() bool {
				return e.Image("jobs-manager", "api") == repo+":prod@"+latest &&
					e.Image("requests-proxy", "proxy") == repo+":prod@"+latest &&
					e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")] == latest
			})
			t.Logf("healed %s after requests-proxy was let settle (poll interval %s)", took.Round(time.Millisecond), poll)
			ctl.KickedPasses(t, e.Env, "control-plane", "requests-proxy") // passes after fix A's writes, which a fight would follow
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
	e.T.Helper()
	d, err := e.C.Client.AppsV1().Deployments(e.NS).Get(context.Background(), deploy, metav1.GetOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	patch := `{"spec":{"minReadySeconds":0}}`
	if on {
		patch = fmt.Sprintf(`{"spec":{"replicas":%d,"minReadySeconds":3600,"progressDeadlineSeconds":7200}}`, *d.Spec.Replicas+1)
	}
	if _, err := e.C.Client.AppsV1().Deployments(e.NS).Patch(context.Background(), deploy, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		e.T.Fatal(err)
	}
}

func TestWebhook_B1_InconsistentFlagsExit2(t *testing.T) {
	e := newEnv(t)
	cfg := e.Config(e2e.SeedShape)
	for _, args := range [][]string{
		{"--webhook-port", "70000"},
		{"--webhook-port", "9443", "--webhook-self-signed=false"},
		{"--webhook-port", "9443", "--webhook-cert-dir", t.TempDir()},
		{"--webhook-port", "9443", "--webhook-config-name", ""},
	} {
		root := cli.NewRoot(io.Discard, io.Discard)
		root.SetArgs(append([]string{"run", "--config", cfg, "--kubeconfig", e.Kubeconfig}, args...))
		err := root.ExecuteContext(context.Background())
		if code := cli.ExitCode(err); code != cli.ExitInvalid || !strings.Contains(err.Error(), "--webhook-") {
			t.Errorf("run %v: exit %d (%v), want %d naming the webhook flag", args, code, err, cli.ExitInvalid)
		}
	}
}
