package run

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/running"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

func TestRun_C1_C4_RevertIsRepinnedWithinSecondsAndProbesAndMetricsServe(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg) // recorded and pinned by ticks first
	pinned := e.Repo("api") + ":prod@" + digest

	ctl := e.StartRun(cfg, "--poll-interval", "1h")
	ctl.WaitReady(t)
	ctl.WaitPasses(t, "control-plane", 0, 1) // the first pass finished
	e.SetImageAs("helm", "Deployment", "requests-proxy", "proxy", e.Repo("api")+":prod")
	took := e.UntilDeployments(10*time.Second, "revert re-pinned", func() bool { return e.Image("requests-proxy", "proxy") == pinned })
	t.Logf("revert re-pinned %s after the reverting write settled", took.Round(time.Millisecond))
	e.UntilEvents(10*time.Second, "Repinned event naming helm", func() bool {
		return e2e.HasEvent(e.Events("requests-proxy"), "Repinned", "helm")
	})
	_, body := running.Get("http://" + ctl.Metrics + "/metrics")
	for _, want := range []string{"image_refresh_revert_repin_seconds_count", `image_refresh_repins_total{cause="revert",group="control-plane",image="api"}`, "image_refresh_target_on_digest"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if code, _ := running.Get("http://" + ctl.Health + "/healthz"); code != 200 {
		t.Errorf("/healthz answered %d", code)
	}
	if d := ctl.Stop(t); d > 10*time.Second || ctl.Code() != 0 {
		t.Errorf("SIGTERM: stopped after %s with exit %d, want within a few seconds and 0", d, ctl.Code())
	}
}

func TestRun_C2_NewDigestReachesEveryTargetWithOneHeadPerInterval(t *testing.T) {
	e := newEnv(t)
	first := e.Push("api", "prod")
	tag := e.Repo("api") + ":prod"
	const n = 20
	var targets strings.Builder
	testenv.Deployment(t, e.C.Client, e.NS, "anchor", testenv.WithContainer("app", tag), testenv.WithReplicas(1))
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("w%02d", i)
		testenv.Deployment(t, e.C.Client, e.NS, name, testenv.WithContainer("app", tag), testenv.WithReplicas(1))
		fmt.Fprintf(&targets, "          - {kind: Deployment, namespace: {{ns}}, name: %s, container: app}\n", name)
	}
	cfg := e.Config(e2e.Groups(e2e.GroupOf("fleet", "Deployment", "anchor", e2e.ImageOf("api", "api", "prod"))) + targets.String())
	e.Tick(cfg) // first observation: recorded
	ctl := e.StartRun(cfg, "--poll-interval", "2s", "--poll-jitter", "0")
	e.UntilDeployments(60*time.Second, "every target pinned to the first digest", func() bool {
		return strings.HasSuffix(e.Image("w19", "app"), first) && strings.HasSuffix(e.Image("w00", "app"), first)
	})
	next := e.Push("api", "prod")
	took := e.UntilDeployments(60*time.Second, "every target on the new digest", func() bool {
		for i := 0; i < n; i++ {
			if !strings.HasSuffix(e.Image(fmt.Sprintf("w%02d", i), "app"), next) {
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
	e.Reg.ResetRequests()
	from := ctl.Passes(t, "fleet")
	ctl.WaitPasses(t, "fleet", from, 3)
	e.Reg.Await(t, "the poller's next manifest HEAD", func() bool {
		return e.Reg.Count("HEAD", "/acme/api/manifests/prod") >= 1
	})
	heads := e.Reg.Count("HEAD", "/acme/api/manifests/prod")
	got := ctl.Passes(t, "fleet") - from
	if heads > got+1 {
		t.Errorf("%d manifest HEADs over %d resync passes for %d targets of one repo:tag, want one per interval", heads, got, n)
	}
}

func TestRun_C3_OneLeaderActsAndAnotherTakesOver(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	// The other replica runs the same group under another name, only so
	// that the one /metrics both serve counts its passes apart.
	standbyCfg := e.Config(strings.Replace(e2e.SeedShape, "name: control-plane", "name: control-plane-b", 1))
	e.PinAll(cfg)
	pinned := e.Repo("api") + ":prod@" + digest
	elect := []string{"--poll-interval", "1h", "--leader-elect", "--leader-election-namespace", e.NS, "--leader-election-lease-duration", "3s"}
	a := e.StartRun(cfg, elect...)
	lease := func(ctx context.Context) (watch.Interface, error) {
		return e.C.Client.CoordinationV1().Leases(e.NS).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=image-refresh"})
	}
	a.UntilWatched(t, 30*time.Second, "a leader", lease, func() bool {
		l, err := e.C.Client.CoordinationV1().Leases(e.NS).Get(context.Background(), "image-refresh", metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != ""
	})
	b := e.StartRun(standbyCfg, elect...)
	b.WaitReady(t) // the standby's caches synced: it would act now if it could

	e.SetImageAs("helm", "Deployment", "requests-proxy", "proxy", e.Repo("api")+":prod")
	e.UntilDeployments(15*time.Second, "revert re-pinned by the leader", func() bool { return e.Image("requests-proxy", "proxy") == pinned })
	// The leader's passes after its re-pin, on events the standby saw too.
	a.KickedPasses(t, e.Env, "control-plane", "requests-proxy")
	if a.Passes(t, "control-plane") == 0 {
		t.Fatal("the leader ran no pass")
	}
	if n := b.Passes(t, "control-plane-b"); n != 0 {
		t.Errorf("the standby replica ran %d passes", n)
	}
	if strings.Contains(b.Logs(), "re-pinned") || strings.Contains(b.Logs(), "is not on the pinned digest") {
		t.Errorf("the standby replica acted:\n%s", b.Logs())
	}

	a.Stop(t) // the leader goes away; it releases the Lease
	e.SetImageAs("helm", "Deployment", "jobs-manager", "api", e.Repo("api")+":prod")
	took := b.UntilWatched(t, 30*time.Second, "the other replica takes over and re-pins", e.WatchDeployments(), func() bool { return e.Image("jobs-manager", "api") == pinned })
	t.Logf("standby took over and re-pinned in %s", took.Round(time.Millisecond))
}

func TestRun_C5_AWriterThatRewritesEveryRepinIsLeftAloneAfterAFewRounds(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg)
	pinned := e.Repo("api") + ":prod@" + digest
	// A resync every 2 s: passes keep coming after the fight is reported,
	// and the bound must hold over them.
	ctl := e.StartRun(cfg, "--poll-interval", "2s", "--poll-jitter", "0", "--fight-max-repins", "3", "--fight-window", "1m")
	ctl.WaitReady(t)
	ctl.WaitPasses(t, "control-plane", 0, 1)

	// Another controller that puts the tag back right after every re-pin.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	rewrites := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		patch := []byte(fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":"proxy","image":%q}]}}}}`, e.Repo("api")+":prod"))
		// It watches requests-proxy (a new watch starts with the object as
		// it is) and answers every write that pins it.
		for ctx.Err() == nil {
			w, err := e.C.Client.AppsV1().Deployments(e.NS).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=requests-proxy"})
			if err != nil {
				continue
			}
			for ev := range w.ResultChan() {
				d, ok := ev.Object.(*appsv1.Deployment)
				if !ok || d.Spec.Template.Spec.Containers[0].Image != pinned {
					continue
				}
				if _, err := e.C.Client.AppsV1().Deployments(e.NS).Patch(ctx, "requests-proxy", types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: "rogue-controller"}); err == nil {
					rewrites++
				}
			}
			w.Stop()
		}
	}()
	e.UntilEvents(60*time.Second, "the fight is reported", func() bool {
		return e2e.HasEvent(e.Events("jobs-manager"), "ImageRewriteFight", "rogue-controller")
	})
	ctl.WaitPasses(t, "control-plane", ctl.Passes(t, "control-plane"), 3)
	stop()
	<-done
	_, body := running.Get("http://" + ctl.Metrics + "/metrics")
	if v, ok := running.MetricValue(body, "image_refresh_rewrite_fights_total", map[string]string{"group": "control-plane", "writer": "rogue-controller"}); !ok || v == "0" {
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
	digest := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg)
	// From now on a mutating webhook strips any digest from the proxy image.
	calls := testenv.MutatingWebhook(t, e.C.Client, e.NS, proxyImagePatch(func(image string) string {
		if i := strings.LastIndexByte(image, '@'); i >= 0 {
			return image[:i]
		}
		return image
	}))
	e.SetImageAs("helm", "Deployment", "requests-proxy", "proxy", e.Repo("api")+":prod")
	if calls.Load() == 0 {
		t.Fatal("the test webhook was not called by the API server")
	}
	ctl := e.StartRun(cfg, "--poll-interval", "1s", "--poll-jitter", "0", "--fight-max-repins", "3", "--fight-window", "1m")
	e.UntilEvents(60*time.Second, "an ImageRewriteFight event", func() bool {
		return e2e.HasEvent(e.Events("jobs-manager"), "ImageRewriteFight", "rewrites image references")
	})
	ctl.WaitPasses(t, "control-plane", ctl.Passes(t, "control-plane"), 4) // four more passes: the bound must hold
	writes := strings.Count(ctl.Logs(), "was written as "+e.Repo("api")+":prod@"+digest)
	if writes < 1 || writes > 3 {
		t.Errorf("%d re-pin writes against a digest-rewriting webhook, want at most --fight-max-repins (3)", writes)
	}
	if a := e.Annotations("jobs-manager"); a[e.Key("refresh-attempt")] != "" {
		t.Errorf("a rewritten re-pin left refresh-attempt=%q: nothing rolled, so no attempt may count", a[e.Key("refresh-attempt")])
	}
}

func TestRun_R7_AMirrorWebhookCausesNoFight(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.PinAll(cfg)
	// A mirror webhook rewrites the registry prefix, keeping tag and digest.
	testenv.MutatingWebhook(t, e.C.Client, e.NS, proxyImagePatch(func(image string) string {
		return strings.Replace(image, e.Reg.Host()+"/", "mirror.local/", 1)
	}))
	e.SetImageAs("helm", "Deployment", "requests-proxy", "proxy", e.Repo("api")+":prod@"+digest)
	if got := e.Image("requests-proxy", "proxy"); !strings.HasPrefix(got, "mirror.local/") {
		t.Fatalf("the mirror webhook did not run: %s", got)
	}
	rv := e.Deployment("requests-proxy").ResourceVersion
	ctl := e.StartRun(cfg, "--poll-interval", "1s", "--poll-jitter", "0")
	ctl.WaitReady(t)
	ctl.WaitPasses(t, "control-plane", 0, 4) // four passes that could have fought
	if got := e.Deployment("requests-proxy").ResourceVersion; got != rv {
		t.Errorf("a prefix-only rewrite was fought: requests-proxy written (rv %s -> %s)", rv, got)
	}
	if strings.Contains(ctl.Logs(), "rewrites image references") {
		t.Errorf("a mirror webhook was reported as a fight:\n%s", ctl.Logs())
	}
}
