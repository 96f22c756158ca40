package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/internal/freeport"
	"github.com/image-refresh/image-refresh/internal/testenv"
)

// runningController is one `image-refresh run` running in-process.
type runningController struct {
	cancel  context.CancelFunc
	done    chan struct{}
	code    int
	mu      sync.Mutex
	logs    bytes.Buffer
	metrics string
	health  string
	base    map[string]int // image_refresh_passes_total by group when it started
}

func (c *runningController) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.logs.Write(p)
}

func (c *runningController) Logs() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.logs.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	a, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// startRun starts `image-refresh run` with the env's kubeconfig; it is
// stopped (as by SIGTERM) when the test ends.
func (e *env) startRun(cfg string, extra ...string) *runningController {
	e.t.Helper()
	c := &runningController{done: make(chan struct{}), metrics: freeAddr(e.t), health: freeAddr(e.t), base: processPasses(e.t)}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	args := append([]string{"run", "--config", cfg, "--kubeconfig", e.kubeconfig,
		"--metrics-addr", c.metrics, "--health-addr", c.health}, extra...)
	var opts []Option
	if e.clock != nil {
		opts = append(opts, WithClock(e.clock.Now))
	}
	root := NewRoot(io.Discard, c, opts...)
	root.SetArgs(args)
	go func() {
		defer close(c.done)
		err := root.ExecuteContext(ctx)
		if err != nil {
			fmt.Fprintln(c, "image-refresh:", err)
		}
		c.code = ExitCode(err)
	}()
	e.t.Cleanup(func() {
		c.stop(e.t)
		if e.t.Failed() {
			e.t.Logf("controller logs:\n%s", c.Logs())
		}
	})
	return c
}

// stop cancels the controller's context, as SIGTERM does, and waits.
func (c *runningController) stop(t *testing.T) time.Duration {
	start := time.Now()
	c.cancel()
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Errorf("controller did not stop within 30 s of SIGTERM")
	}
	return time.Since(start)
}

// eventually polls cond every 50 ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < timeout {
		if cond() {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s", what, timeout)
	return 0
}

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestRun_C1_C4_RevertIsRepinnedWithinSecondsAndProbesAndMetricsServe(t *testing.T) {
	e := newEnv(t)
	digest := e.seed()
	cfg := e.config(seedShape)
	e.pinAll(cfg) // recorded and pinned by ticks first
	pinned := e.repo("api") + ":prod@" + digest

	ctl := e.startRun(cfg, "--poll-interval", "1h")
	ctl.waitReady(t)
	ctl.waitPasses(t, "control-plane", 0, 1) // the first pass finished
	e.setImageAs("helm", "Deployment", "requests-proxy", "proxy", e.repo("api")+":prod")
	took := eventually(t, 10*time.Second, "revert re-pinned", func() bool { return e.image("requests-proxy", "proxy") == pinned })
	t.Logf("revert re-pinned %s after the reverting write settled", took.Round(time.Millisecond))
	eventually(t, 10*time.Second, "Repinned event naming helm", func() bool {
		return hasEvent(e.events("requests-proxy"), "Repinned", "helm")
	})
	_, body := get("http://" + ctl.metrics + "/metrics")
	for _, want := range []string{"image_refresh_revert_repin_seconds_count", `image_refresh_repins_total{cause="revert",group="control-plane",image="api"}`, "image_refresh_target_on_digest"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if code, _ := get("http://" + ctl.health + "/healthz"); code != 200 {
		t.Errorf("/healthz answered %d", code)
	}
	if d := ctl.stop(t); d > 10*time.Second || ctl.code != 0 {
		t.Errorf("SIGTERM: stopped after %s with exit %d, want within a few seconds and 0", d, ctl.code)
	}
}

func TestRun_C2_NewDigestReachesEveryTargetWithOneHeadPerInterval(t *testing.T) {
	e := newEnv(t)
	first := e.push("api", "prod")
	tag := e.repo("api") + ":prod"
	const n = 20
	var targets strings.Builder
	testenv.Deployment(t, e.c.Client, e.ns, "anchor", testenv.WithContainer("app", tag), testenv.WithReplicas(1))
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("w%02d", i)
		testenv.Deployment(t, e.c.Client, e.ns, name, testenv.WithContainer("app", tag), testenv.WithReplicas(1))
		fmt.Fprintf(&targets, "          - {kind: Deployment, namespace: {{ns}}, name: %s, container: app}\n", name)
	}
	cfg := e.config(`groups:
  - name: fleet
    anchor: {kind: Deployment, namespace: {{ns}}, name: anchor}
    images:
      - name: api
        repository: {{reg}}/acme/api
        tag: prod
        targets:
` + targets.String())
	e.tick(cfg) // first observation: recorded
	ctl := e.startRun(cfg, "--poll-interval", "2s", "--poll-jitter", "0")
	eventually(t, 60*time.Second, "every target pinned to the first digest", func() bool {
		return strings.HasSuffix(e.image("w19", "app"), first) && strings.HasSuffix(e.image("w00", "app"), first)
	})
	next := e.push("api", "prod")
	took := eventually(t, 60*time.Second, "every target on the new digest", func() bool {
		for i := 0; i < n; i++ {
			if !strings.HasSuffix(e.image(fmt.Sprintf("w%02d", i), "app"), next) {
				return false
			}
		}
		return true
	})
	t.Logf("new digest reached all %d targets %s after the push", n, took.Round(time.Millisecond))

	// One HEAD per poll interval, however many targets and passes: the
	// registry sees at most one HEAD per pass (plus the one of an interval
	// whose pass is still to come), not one per target. Passes also follow
	// the rollouts' watch events, many within one interval, so the wait is
	// for three passes and then for the poller's next HEAD (the proof it
	// polled while the passes were counted).
	e.reg.ResetRequests()
	from := ctl.passes(t, "fleet")
	ctl.waitPasses(t, "fleet", from, 3)
	eventually(t, 30*time.Second, "the poller's next manifest HEAD", func() bool {
		return e.reg.Count("HEAD", "/acme/api/manifests/prod") >= 1
	})
	heads := e.reg.Count("HEAD", "/acme/api/manifests/prod")
	got := ctl.passes(t, "fleet") - from
	if heads > got+1 {
		t.Errorf("%d manifest HEADs over %d resync passes for %d targets of one repo:tag, want one per interval", heads, got, n)
	}
}

func TestRun_C3_OneLeaderActsAndAnotherTakesOver(t *testing.T) {
	e := newEnv(t)
	digest := e.seed()
	cfg := e.config(seedShape)
	// The other replica runs the same group under another name, only so
	// that the one /metrics both serve counts its passes apart.
	standbyCfg := e.config(strings.Replace(seedShape, "name: control-plane", "name: control-plane-b", 1))
	e.pinAll(cfg)
	pinned := e.repo("api") + ":prod@" + digest
	elect := []string{"--poll-interval", "1h", "--leader-elect", "--leader-election-namespace", e.ns, "--leader-election-lease-duration", "3s"}
	a := e.startRun(cfg, elect...)
	eventually(t, 30*time.Second, "a leader", func() bool {
		l, err := e.c.Client.CoordinationV1().Leases(e.ns).Get(context.Background(), "image-refresh", metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != ""
	})
	b := e.startRun(standbyCfg, elect...)
	b.waitReady(t) // the standby's caches synced: it would act now if it could

	e.setImageAs("helm", "Deployment", "requests-proxy", "proxy", e.repo("api")+":prod")
	eventually(t, 15*time.Second, "revert re-pinned by the leader", func() bool { return e.image("requests-proxy", "proxy") == pinned })
	// The leader's passes after its re-pin, on events the standby saw too.
	a.kickedPasses(t, e, "control-plane", "requests-proxy")
	if a.passes(t, "control-plane") == 0 {
		t.Fatal("the leader ran no pass")
	}
	if n := b.passes(t, "control-plane-b"); n != 0 {
		t.Errorf("the standby replica ran %d passes", n)
	}
	if strings.Contains(b.Logs(), "re-pinned") || strings.Contains(b.Logs(), "is not on the pinned digest") {
		t.Errorf("the standby replica acted:\n%s", b.Logs())
	}

	a.stop(t) // the leader goes away; it releases the Lease
	e.setImageAs("helm", "Deployment", "jobs-manager", "api", e.repo("api")+":prod")
	took := eventually(t, 30*time.Second, "the other replica takes over and re-pins", func() bool { return e.image("jobs-manager", "api") == pinned })
	t.Logf("standby took over and re-pinned in %s", took.Round(time.Millisecond))
}

func TestRun_C5_AWriterThatRewritesEveryRepinIsLeftAloneAfterAFewRounds(t *testing.T) {
	e := newEnv(t)
	digest := e.seed()
	cfg := e.config(seedShape)
	e.pinAll(cfg)
	pinned := e.repo("api") + ":prod@" + digest
	// A resync every 2 s: passes keep coming after the fight is reported,
	// and the bound must hold over them.
	ctl := e.startRun(cfg, "--poll-interval", "2s", "--poll-jitter", "0", "--fight-max-repins", "3", "--fight-window", "1m")
	ctl.waitReady(t)
	ctl.waitPasses(t, "control-plane", 0, 1)

	// Another controller that puts the tag back right after every re-pin.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	rewrites := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		patch := []byte(fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":"proxy","image":%q}]}}}}`, e.repo("api")+":prod"))
		for ctx.Err() == nil {
			d, err := e.c.Client.AppsV1().Deployments(e.ns).Get(ctx, "requests-proxy", metav1.GetOptions{})
			if err == nil && d.Spec.Template.Spec.Containers[0].Image == pinned {
				if _, err := e.c.Client.AppsV1().Deployments(e.ns).Patch(ctx, "requests-proxy", types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: "rogue-controller"}); err == nil {
					rewrites++
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	eventually(t, 60*time.Second, "the fight is reported", func() bool {
		return hasEvent(e.events("jobs-manager"), "ImageRewriteFight", "rogue-controller")
	})
	ctl.waitPasses(t, "control-plane", ctl.passes(t, "control-plane"), 3)
	stop()
	<-done
	_, body := get("http://" + ctl.metrics + "/metrics")
	if v, ok := metricValue(body, "image_refresh_rewrite_fights_total", map[string]string{"group": "control-plane", "writer": "rogue-controller"}); !ok || v == "0" {
		t.Errorf("image_refresh_rewrite_fights_total{writer=rogue-controller} = %q (present %v), want > 0", v, ok)
	}
	repins := strings.Count(ctl.Logs(), "requests-proxy container proxy is not on the pinned digest")
	if repins < 3 || repins > 4 {
		t.Errorf("%d re-pins against a writer that rewrote %d times, want the bound (3)", repins, rewrites)
	}
}

// proxyImagePatch returns a webhook patch that sets requests-proxy's proxy
// container image with rewrite, when rewrite changes it.
func proxyImagePatch(rewrite func(image string) string) testenv.Mutate {
	return func(raw []byte) []testenv.PatchOp {
		var obj struct {
			Metadata struct{ Name string } `json:"metadata"`
			Spec     struct {
				Template struct {
					Spec struct {
						Containers []struct{ Name, Image string } `json:"containers"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		if json.Unmarshal(raw, &obj) != nil || obj.Metadata.Name != "requests-proxy" {
			return nil
		}
		for i, c := range obj.Spec.Template.Spec.Containers {
			if c.Name == "proxy" {
				if to := rewrite(c.Image); to != c.Image {
					return []testenv.PatchOp{{Op: "replace", Path: fmt.Sprintf("/spec/template/spec/containers/%d/image", i), Value: to}}
				}
			}
		}
		return nil
	}
}

func TestRun_C5_AWebhookThatRewritesTheDigestIsBoundedAndReported(t *testing.T) {
	e := newEnv(t)
	digest := e.seed()
	cfg := e.config(seedShape)
	e.pinAll(cfg)
	// From now on a mutating webhook strips any digest from the proxy image.
	calls := testenv.MutatingWebhook(t, e.c.Client, e.ns, proxyImagePatch(func(image string) string {
		if i := strings.LastIndexByte(image, '@'); i >= 0 {
			return image[:i]
		}
		return image
	}))
	e.setImageAs("helm", "Deployment", "requests-proxy", "proxy", e.repo("api")+":prod")
	if calls.Load() == 0 {
		t.Fatal("the test webhook was not called by the API server")
	}
	ctl := e.startRun(cfg, "--poll-interval", "1s", "--poll-jitter", "0", "--fight-max-repins", "3", "--fight-window", "1m")
	eventually(t, 60*time.Second, "an ImageRewriteFight event", func() bool {
		return hasEvent(e.events("jobs-manager"), "ImageRewriteFight", "rewrites image references")
	})
	ctl.waitPasses(t, "control-plane", ctl.passes(t, "control-plane"), 4) // four more passes: the bound must hold
	writes := strings.Count(ctl.Logs(), "was written as "+e.repo("api")+":prod@"+digest)
	if writes < 1 || writes > 3 {
		t.Errorf("%d re-pin writes against a digest-rewriting webhook, want at most --fight-max-repins (3)", writes)
	}
	if a := e.annotations("jobs-manager"); a[e.key("refresh-attempt")] != "" {
		t.Errorf("a rewritten re-pin left refresh-attempt=%q: nothing rolled, so no attempt may count", a[e.key("refresh-attempt")])
	}
}

func TestRun_R7_AMirrorWebhookCausesNoFight(t *testing.T) {
	e := newEnv(t)
	digest := e.seed()
	cfg := e.config(seedShape)
	e.pinAll(cfg)
	// A mirror webhook rewrites the registry prefix, keeping tag and digest.
	testenv.MutatingWebhook(t, e.c.Client, e.ns, proxyImagePatch(func(image string) string {
		return strings.Replace(image, e.reg.Host()+"/", "mirror.local/", 1)
	}))
	e.setImageAs("helm", "Deployment", "requests-proxy", "proxy", e.repo("api")+":prod@"+digest)
	if got := e.image("requests-proxy", "proxy"); !strings.HasPrefix(got, "mirror.local/") {
		t.Fatalf("the mirror webhook did not run: %s", got)
	}
	rv := e.deployment("requests-proxy").ResourceVersion
	ctl := e.startRun(cfg, "--poll-interval", "1s", "--poll-jitter", "0")
	ctl.waitReady(t)
	ctl.waitPasses(t, "control-plane", 0, 4) // four passes that could have fought
	if got := e.deployment("requests-proxy").ResourceVersion; got != rv {
		t.Errorf("a prefix-only rewrite was fought: requests-proxy written (rv %s -> %s)", rv, got)
	}
	if strings.Contains(ctl.Logs(), "rewrites image references") {
		t.Errorf("a mirror webhook was reported as a fight:\n%s", ctl.Logs())
	}
}
