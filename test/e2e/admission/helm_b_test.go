package admission

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// Fix B with the real Helm CLI, each test once per major (subtests helm3
// and helm4: Helm 3.21 and Helm 4.3, both from hack/build-cluster.sh), the
// real API server and, for B1, the API server calling the real webhook of
// `image-refresh run --webhook-port`. The release is the chart of hbChart:
// one Deployment "web" whose template renders repo:tag. The group's anchor
// ("state") lives outside the chart, as in the render tests.

var hbGroup = "groups:\n" + e2e.OneGroup("web", "web", "state", "app")

// hbWebTarget adds the release's Deployment to the group.
var hbWebTarget = e2e.Target("Deployment", "web", "web")

// hbChart writes a chart with one Deployment "web" running image (repo:tag)
// and carrying the webhook's objectSelector label, so that helm's own
// CREATE and UPDATE reach the webhook.
func hbChart(t *testing.T, image string) string {
	return writeWebChart(t, image, 1, ", "+e2e.ManagedLabel+`: "true"`, "", nil)
}

// writeWebChart writes chart web (values: image, revision "1") whose template
// web.yaml is Deployment web of replicas, its labels app=web and
// moreLabels, running the image of the values as container web and then
// moreContainers; more holds the chart's other templates by file name. It
// returns the chart's directory.
func writeWebChart(t *testing.T, image string, replicas int, moreLabels, moreContainers string, more map[string]string) string {
	t.Helper()
	files := map[string]string{
		"Chart.yaml":  "apiVersion: v2\nname: web\nversion: 0.1.0\n",
		"values.yaml": "image: " + image + "\nrevision: \"1\"\n",
		"templates/web.yaml": fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web%s}
spec:
  replicas: %d
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
      annotations:
        revision: {{ .Values.revision | quote }}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
        - name: web
          image: {{ .Values.image }}
          imagePullPolicy: IfNotPresent
`, moreLabels, replicas) + moreContainers,
	}
	for name, text := range more {
		files["templates/"+name] = text
	}
	dir := t.TempDir()
	for name, text := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// hbSetup pushes acme/web:prod, creates the anchor "state" on the tag and
// lets one tick record the digest on it (R5). It returns the digest, the
// tag and the config.
func (e *env) hbSetup() (digest, tag, cfg string) {
	e.T.Helper()
	digest = e.Push("web", "prod")
	tag = e.Repo("web") + ":prod"
	testenv.Deployment(e.T, e.C.Client, e.NS, "state", testenv.WithContainer("app", tag), testenv.WithReplicas(1))
	e.Settle("Deployment", "state")
	// The release does not exist yet: the setup tick runs without it.
	if code, _ := e.Tick(e.Config(hbGroup)); code != 0 {
		e.T.Fatalf("setup tick exit %d", code)
	}
	if got := e.Annotations("state")[e.Key("last-refreshed-web-digest")]; got != digest {
		e.T.Fatalf("setup: recorded %q, want %q", got, digest)
	}
	return digest, tag, e.Config(hbGroup + hbWebTarget)
}

// hbStartWebhook is whStart for the web release: ready once a dry-run
// write of the bare tag to web comes back pinned.
func (e *env) hbStartWebhook(cfg, tag string, extra ...string) *e2e.RunningController {
	e.T.Helper()
	return e.WhStartProbed(cfg, "web", map[string]string{"web": tag}, extra...)
}

func TestHelm_B1_UpgradeWithTheWebhookNeverStoresTheTag(t *testing.T) {
	eachHelm(t, testHelmB1)
}

func testHelmB1(t *testing.T, e *env, h *helmCLI) {
	digest, tag, cfg := e.hbSetup()
	pinned := tag + "@" + digest
	chart := hbChart(t, tag)

	// Install without B: the release renders the bare tag; the next tick
	// pins it (fix A), and image-refresh now owns the image field.
	h.run("install", "web", chart, "-n", e.NS)
	e.Settle("Deployment", "web")
	if got := e.Image("web", "web"); got != tag {
		t.Fatalf("setup: helm installed %s, want the bare tag %s", got, tag)
	}
	if code, _ := e.Tick(cfg); code != 0 || e.Image("web", "web") != pinned {
		t.Fatalf("setup: the tick did not pin web: exit %d, %s", code, e.Image("web", "web"))
	}
	ctl := e.hbStartWebhook(cfg, tag, "--poll-interval", "1h")
	pins := whMetric(t, ctl, `image_refresh_admission_pins_total{group="web",image="web"}`)
	before := e.Deployment("web")
	history := e.WatchDeployment("web")
	bare := e.watchBareTag("web", tag)
	bare.take() // the watch lists what exists first: the install's bare-tag ReplicaSet

	// R17: under Helm 4's server-side apply the image field is owned by
	// image-refresh (the pin) and helm applies another value (the tag), so
	// the apply conflicts; the conflict is decided before admission, so the
	// webhook cannot avoid it. --force-conflicts hands the field to helm,
	// and the webhook rewrites the value helm applies before it is stored.
	// Helm 3 patches client-side (an Update): no conflict, the plain
	// upgrade goes through, and the webhook rewrites the tag it patches in.
	out, err := h.try(nil, "upgrade", "web", chart, "-n", e.NS, "--set", "revision=2")
	switch {
	case h.major >= 4 && err == nil:
		t.Errorf("Helm 4: helm upgrade without --force-conflicts succeeded; R17 (docs/field-ownership.md) says it conflicts:\n%s", out)
	case h.major >= 4:
		if !strings.Contains(out, `conflict with "image-refresh"`) {
			t.Errorf("Helm 4: helm upgrade without --force-conflicts failed, but not on the image field image-refresh owns:\n%s", out)
		}
		h.run("upgrade", "web", chart, "-n", e.NS, "--set", "revision=2", "--force-conflicts")
	case err != nil:
		t.Fatalf("Helm 3: helm upgrade failed; a client-side patch has no field conflicts: %v\n%s", err, out)
	}
	e.Settle("Deployment", "web")

	after := e.Deployment("web")
	if after.Spec.Template.Annotations["revision"] != "2" {
		t.Fatalf("setup: the upgrade did not change the pod template (revision %q)", after.Spec.Template.Annotations["revision"])
	}
	if got := e2e.WhImages(after)["web"]; got != pinned {
		t.Errorf("after helm upgrade web is stored with %s, want %s", got, pinned)
	}
	versions := history.Take()
	if len(versions) == 0 {
		t.Fatalf("the watch saw no stored version of web: the upgrade wrote nothing, so this test proves nothing")
	}
	for _, v := range versions {
		if v.Images["web"] != pinned {
			t.Errorf("a stored version of web does not hold the pin: %s", v)
		}
	}
	t.Logf("%d stored versions of web during the upgrade, all on %s; generation %d -> %d", len(versions), pinned, before.Generation, after.Generation)
	if seen := bare.take(); len(seen) > 0 {
		t.Errorf("the bare tag reached the cluster with the webhook in place: %q", seen)
	}
	if !h.wrote(after.ManagedFields) {
		t.Errorf("Helm %d did not write web with %s: %+v", h.major, h.operation(), after.ManagedFields)
	}
	if got := whMetric(t, ctl, `image_refresh_admission_pins_total{group="web",image="web"}`) - pins; got < 1 {
		t.Errorf("the webhook counted %v pins, want at least 1", got)
	}
	ctl.KickedPasses(t, e.Env, "web", "web") // fix A's passes on the upgrade
	if strings.Contains(ctl.Logs(), "is not on the pinned digest") {
		t.Errorf("fix A had a revert to heal; the webhook should have prevented it:\n%s", ctl.Logs())
	}
}

func TestHelm_B3_RollbackToARevisionBeforeADigestChangeIsHealedByFixA(t *testing.T) {
	eachHelm(t, testHelmB3)
}

func testHelmB3(t *testing.T, e *env, h *helmCLI) {
	const poll = 10 * time.Second
	old, tag, cfg := e.hbSetup()
	chart := hbChart(t, tag)

	// B2 installed: revision 1 of the release is rendered through the
	// post-renderer, so Helm stores it pinned to the digest of that day.
	h.run(append([]string{"install", "web", chart, "-n", e.NS}, h.postRenderer(cfg, "--namespace="+e.NS)...)...)
	e.Settle("Deployment", "web")
	if got := e.Image("web", "web"); got != tag+"@"+old {
		t.Fatalf("setup: helm installed %s, want %s\npost-renderer log:\n%s", got, tag+"@"+old, h.renderLog())
	}

	// A digest change: fix A (run) moves every target and the record.
	latest := e.Push("web", "prod")
	e.StartRun(cfg, "--poll-interval", poll.String(), "--poll-jitter", "0")
	moved := e.UntilDeployments(3*poll, "fix A moves every target to the new digest", func() bool {
		return e.Image("web", "web") == tag+"@"+latest && e.Image("state", "app") == tag+"@"+latest &&
			e.Annotations("state")[e.Key("last-refreshed-web-digest")] == latest
	})
	t.Logf("fix A moved web and state to the new digest %s after run started", moved.Round(time.Millisecond))
	e.Settle("Deployment", "web")
	history := e.WatchDeployment("web")

	// helm rollback re-applies revision 1's stored manifest: the old pin
	// (Helm does not run post-renderers on rollback). Helm 4 needs
	// --force-conflicts: image-refresh owns the image field now (R17);
	// Helm 3's three-way merge patch puts the old pin back without it.
	h.run(append([]string{"rollback", "web", "1", "-n", e.NS}, h.forceConflicts()...)...)
	start := time.Now()
	took := e.UntilDeployments(poll, "fix A brings web back to the current digest", func() bool {
		return e.Image("web", "web") == tag+"@"+latest
	})
	sawOld := false
	for _, v := range history.Take() {
		sawOld = sawOld || v.Images["web"] == tag+"@"+old
	}
	if !sawOld {
		t.Errorf("the rollback never stored the old digest %s: it did not revert, so this test proves nothing", old)
	}
	t.Logf("after helm rollback, web was back on %s in %s (poll interval %s; %s since rollback returned)",
		latest, took.Round(time.Millisecond), poll, time.Since(start).Round(time.Millisecond))
	if got := e.Annotations("state")[e.Key("last-refreshed-web-digest")]; got != latest {
		t.Errorf("the record moved to %s, want it to stay on %s", got, latest)
	}
}

func TestHelm_B2_TwentyUpgradesDoNotGrowReplicaSets(t *testing.T) {
	eachHelm(t, testHelmB2)
}

func testHelmB2(t *testing.T, e *env, h *helmCLI) {
	const upgrades = 20
	first, tag, cfg := e.hbSetup()
	chart := hbChart(t, tag)
	pr := h.postRenderer(cfg, "--namespace="+e.NS)

	h.run(append([]string{"install", "web", chart, "-n", e.NS}, pr...)...)
	e.Settle("Deployment", "web")
	if got := e.Image("web", "web"); got != tag+"@"+first {
		t.Fatalf("setup: helm installed %s, want %s\npost-renderer log:\n%s", got, tag+"@"+first, h.renderLog())
	}
	// Fix A runs alongside, as in production: a half-mutated template
	// would make A and B flip it on every upgrade (k8s-digester #25).
	// It polls every few seconds, so the digest change below is its move.
	const poll = 5 * time.Second
	ctl := e.StartRun(cfg, "--poll-interval", poll.String(), "--poll-jitter", "0")
	ctl.WaitPasses(t, "web", 0, 1) // the controller's first pass
	rs, gen := e.Rollouts("web"), e.Deployment("web").Generation

	start := time.Now()
	for i := range upgrades {
		h.run(append([]string{"upgrade", "web", chart, "-n", e.NS}, pr...)...)
		if g := e.Deployment("web").Generation; g != gen {
			t.Fatalf("upgrade %d of an unchanged chart changed the pod template (generation %d -> %d): %s", i+1, gen, g, e.Image("web", "web"))
		}
	}
	t.Logf("%d helm upgrades with the post-renderer in %s", upgrades, time.Since(start).Round(time.Millisecond))
	if n := e.Rollouts("web"); n != rs {
		t.Errorf("%d unchanged upgrades grew web's ReplicaSets %d -> %d", upgrades, rs, n)
	}

	// One real digest change: fix A (run) moves every target and the
	// record, then more upgrades render the new record and change nothing.
	latest := e.Push("web", "prod")
	e.UntilDeployments(4*poll, "fix A moves every target and the record to the new digest", func() bool {
		return e.Image("web", "web") == tag+"@"+latest && e.Image("state", "app") == tag+"@"+latest &&
			e.Annotations("state")[e.Key("last-refreshed-web-digest")] == latest
	})
	e.Settle("Deployment", "web")
	gen = e.Deployment("web").Generation
	for range 3 {
		h.run(append([]string{"upgrade", "web", chart, "-n", e.NS}, pr...)...)
	}
	e.Settle("Deployment", "web")
	if g := e.Deployment("web").Generation; g != gen || e.Image("web", "web") != tag+"@"+latest {
		t.Errorf("upgrades after the digest change: generation %d -> %d, image %s", gen, g, e.Image("web", "web"))
	}
	if n := e.Rollouts("web"); n != rs+1 {
		t.Errorf("web's ReplicaSets %d -> %d across %d upgrades and one digest change, want exactly one more", rs, n, upgrades+3)
	}
}

// A `helm upgrade` of a release whose image fix A pinned re-renders the
// bare tag, and so does `helm upgrade --reset-then-reuse-values` with
// nothing changed. What Helm does then differs by major
// (docs/field-ownership.md): Helm 3 patches client-side, a three-way merge
// of the last release, the new render and the live object, so it puts the
// tag back even for an unchanged render, with no conflict; Helm 4 applies
// server-side and is refused with a conflict on the field image-refresh
// owns until --force-conflicts (R17), which then puts the tag back. Either
// way one tick re-pins it and names helm as the writer (R7).
func TestHelm_R7_R17_UpgradeRevertIsRepinned(t *testing.T) {
	eachHelm(t, testHelmUpgradeRevert)
}

func testHelmUpgradeRevert(t *testing.T, e *env, h *helmCLI) {
	digest, tag, cfg := e.hbSetup()
	pinned := tag + "@" + digest
	chart := hbChart(t, tag)
	h.run("install", "web", chart, "-n", e.NS)
	e.Settle("Deployment", "web")
	if code, _ := e.Tick(cfg); code != 0 || e.Image("web", "web") != pinned {
		t.Fatalf("setup: the tick did not pin web: exit %d, %s", code, e.Image("web", "web"))
	}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"helm upgrade --set revision=2", []string{"upgrade", "web", chart, "-n", e.NS, "--set", "revision=2"}},
		{"helm upgrade --reset-then-reuse-values (an unchanged render)", []string{"upgrade", "web", chart, "-n", e.NS, "--reset-then-reuse-values"}},
	} {
		history := e.WatchDeployment("web")
		out, err := h.try(nil, c.args...)
		if h.major >= 4 {
			if err == nil || !strings.Contains(out, `conflict with "image-refresh"`) {
				t.Errorf("Helm 4: %s: err %v, want a conflict with image-refresh on the pinned image (R17):\n%s", c.name, err, out)
			}
			if got := e.Image("web", "web"); got != pinned {
				t.Errorf("Helm 4: the refused %s changed web to %s", c.name, got)
			}
			out, err = h.try(nil, append(c.args, "--force-conflicts")...)
		}
		if err != nil {
			t.Fatalf("Helm %d: %s %v: %v\n%s", h.major, c.name, h.forceConflicts(), err, out)
		}
		e.Settle("Deployment", "web")
		if got := e.Image("web", "web"); got != tag {
			t.Fatalf("Helm %d: %s %v left web on %s, want the bare tag %s (a revert)", h.major, c.name, h.forceConflicts(), got, tag)
		}
		if fields := e.Deployment("web").ManagedFields; !h.wrote(fields) {
			t.Errorf("Helm %d did not write web with %s: %+v", h.major, h.operation(), fields)
		}
		code, logs := e.Tick(cfg)
		if code != 0 || e.Image("web", "web") != pinned {
			t.Errorf("Helm %d: tick after %s: exit %d, web %s; want 0 and %s in one tick", h.major, c.name, code, e.Image("web", "web"), pinned)
		}
		if len(e2e.LogLines(logs, "INFO", "/web container web is not on the pinned digest", "last written by helm")) != 1 {
			t.Errorf("Helm %d: %s: the re-pin is not logged naming helm:\n%s", h.major, c.name, logs)
		}
		trail := imageTrail(pinned, history.Take(), "web")
		if want := []string{pinned, tag, pinned}; fmt.Sprint(trail) != fmt.Sprint(want) {
			t.Errorf("Helm %d: %s: web's image went %q, want %q (the revert, one re-pin)", h.major, c.name, trail, want)
		}
		t.Logf("Helm %d: %s %v reverted web to the tag; re-pinned in one tick", h.major, c.name, h.forceConflicts())
	}
}
