package admission

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/running"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

// Cluster faults (docs/reliability.md): a pod that runs but never becomes
// Ready, a Deployment scaled to 0, a workload that Helm deletes and
// re-creates, a helm rollback, and two `run` instances without leader
// election. Each test checks that nothing is lost (no digest record moved
// without a settled rollout, no pin to a digest the registry did not serve,
// no annotation dropped), that the group converges once the fault clears,
// that nothing rolls more than once (ReplicaSets and stored versions
// counted), and what the operator is told.

// tickRaw runs one `tick` and, unlike env.tick, does not wait for the
// namespace to settle afterwards: under a fault that keeps a rollout from
// settling that wait would only add its own timeout. It says how long the
// tick took.
func (e *env) tickRaw(cfg string) (int, string, time.Duration) {
	e.T.Helper()
	start := time.Now()
	code, _, logs := e.Run("tick", "--config", cfg, "--kubeconfig", e.Kubeconfig)
	took := time.Since(start)
	e.T.Logf("tick exit %d in %s:\n%s", code, took.Round(time.Millisecond), logs)
	return code, logs, took
}

// pods returns the pods of a Deployment's label app=name.
func (e *env) pods(app string) []corev1.Pod {
	e.T.Helper()
	list, err := e.C.Client.CoreV1().Pods(e.NS).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		e.T.Fatal(err)
	}
	return list.Items
}

// eventsOf returns "reason: message" of every Event on the object with
// this UID: a re-created workload's name also matches its predecessor's.
func (e *env) eventsOf(uid types.UID) []string {
	e.T.Helper()
	return e.EventsWhere(func(ev corev1.Event) bool { return ev.InvolvedObject.UID == uid })
}

// imageTrail is the sequence of images a container had across stored
// versions of a Deployment, starting from start, with repeats collapsed:
// every step after the first is one write that changed the image.
func imageTrail(start string, versions []e2e.DeployVersion, container string) []string {
	trail := []string{start}
	for _, v := range versions {
		if img, ok := v.Images[container]; ok && img != trail[len(trail)-1] {
			trail = append(trail, img)
		}
	}
	return trail
}

func TestCluster_R4_R10_PodThatNeverBecomesReadyLocksOutAndRearmConverges(t *testing.T) {
	const gate = "lb.acme.example/target-healthy"
	e := newEnv(t)
	first := e.Push("web", "prod")
	tag := e.Repo("web") + ":prod"
	// The gate's owner runs from the start, as a load balancer controller
	// does: a pod whose gate nobody sets is never Ready. minReadySeconds: a
	// new pod counts as available only once Ready for 4 s.
	testenv.Deployment(t, e.C.Client, e.NS, "web", testenv.WithContainer("web", tag), testenv.WithReplicas(1),
		testenv.WithReadinessGate(gate), testenv.WithMinReadySeconds(4), testenv.WithAnnotations(map[string]string{e2e.OwnerKey: "team-web"}))
	lb := e.StartGateOwner("web", gate)
	e.Settle("Deployment", "web")
	cfg := e.Config("rolloutTimeout: 5s\nmaxRefreshAttempts: 2\n" + e2e.CfWebGroup)
	e.PinAll(cfg)
	if got := e.Image("web", "web"); got != tag+"@"+first {
		t.Fatalf("setup: web runs %s, want %s", got, tag+"@"+first)
	}
	rs := e.Rollouts("web")
	recKey, attemptKey, flapKey := e.Key("last-refreshed-web-digest"), e.Key("refresh-attempt"), e.Key("refresh-flap-detected")
	rearm := "image-refresh rearm --config " + cfg + " --group web"

	// The registry publishes a build whose pods start and run, but which
	// the load balancer never reports healthy.
	next := e.Push("web", "prod")
	lb.Fail(next)

	// Tick 1: re-images (R6), waits rolloutTimeout, fails loudly.
	code, logs, took := e.tickRaw(cfg)
	if code != 1 || took < 5*time.Second {
		t.Errorf("tick with a rollout whose pod never becomes Ready: exit %d after %s, want 1 after rolloutTimeout (5s)", code, took)
	}
	if len(e2e.LogLines(logs, "ERROR", "rollout not settled", "did not settle within 5s", "the digest record is unchanged", "attempt 1 of 2")) != 1 {
		t.Errorf("no ERROR naming the unsettled rollout, the timeout and the attempt:\n%s", logs)
	}
	if got := e.Image("web", "web"); got != tag+"@"+next {
		t.Fatalf("web not re-imaged to the registry's new digest: %s", got)
	}
	// The fault is what this test claims: the new pod runs and is not Ready;
	// the old one keeps serving (maxUnavailable 0).
	var running, unready int
	for _, p := range e.pods("web") {
		if strings.HasSuffix(p.Spec.Containers[0].Image, "@"+next) {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
			if e2e.PodCondition(&p, corev1.PodReady) == corev1.ConditionFalse {
				unready++
			}
		}
	}
	if running != 1 || unready != 1 {
		t.Fatalf("setup: %d pods of the new build Running and %d not Ready, want 1 and 1: the fault did not happen", running, unready)
	}
	if d := e.Deployment("web"); d.Status.AvailableReplicas != 1 {
		t.Errorf("available replicas %d during the stuck rollout, want the old pod (1)", d.Status.AvailableReplicas)
	}
	a := e.StateOf("web")
	if a[attemptKey] != "1" || a[recKey] != first {
		t.Errorf("after tick 1: attempt %q record %q, want 1 and the old digest (no record without a settled rollout)", a[attemptKey], a[recKey])
	}
	if !e2e.HasEvent(e.Events("web"), "RefreshError", "rollout not settled") {
		t.Errorf("no RefreshError Event on the anchor: %q", e.Events("web"))
	}

	// Tick 2: R11 waits for the same rollout again under attempt 2.
	code, logs, took = e.tickRaw(cfg)
	if code != 1 || took < 5*time.Second {
		t.Errorf("tick 2: exit %d after %s, want 1 after rolloutTimeout", code, took)
	}
	if len(e2e.LogLines(logs, "WARN", "never confirmed settling")) != 1 || len(e2e.LogLines(logs, "ERROR", "attempt 2 of 2")) != 1 {
		t.Errorf("tick 2 does not say it waits again for the unconfirmed rollout (attempt 2 of 2):\n%s", logs)
	}
	if a := e.StateOf("web"); a[attemptKey] != "2" || a[recKey] != first {
		t.Errorf("after tick 2: attempt %q record %q, want 2 and the old digest", a[attemptKey], a[recKey])
	}

	// Tick 3: at maxRefreshAttempts: locked out, loudly, without waiting.
	code, logs, took = e.tickRaw(cfg)
	if code != 1 || took > 4*time.Second {
		t.Errorf("locked-out tick: exit %d after %s, want 1 at once", code, took)
	}
	if len(e2e.LogLines(logs, "WARN", "LOCKED OUT", "remediation=", rearm)) != 1 {
		t.Errorf("no LOCKED OUT WARN naming %q:\n%s", rearm, logs)
	}
	if a := e.StateOf("web"); a[flapKey] != "2" || a[recKey] != first {
		t.Errorf("after the lockout: flap marker %q record %q, want 2 and the old digest", a[flapKey], a[recKey])
	}
	if !e2e.HasEvent(e.Events("web"), "RefreshLockedOut", rearm) {
		t.Errorf("no RefreshLockedOut Event naming the rearm command: %q", e.Events("web"))
	}

	// The fault clears: the load balancer reports the new pods healthy.
	lb.Fail("")
	healed := time.Now()
	e.Settle("Deployment", "web")
	settledAfter := time.Since(healed)
	// R12: latched, the group stays loud and records nothing by itself.
	if code, logs := e.Tick(cfg); code != 1 || !strings.Contains(logs, "LOCKED OUT") {
		t.Errorf("latched tick after the fix: exit %d, want 1 and LOCKED OUT:\n%s", code, logs)
	}
	if got := e.StateOf("web")[recKey]; got != first {
		t.Errorf("a locked-out group moved its record to %s", got)
	}
	if code, out, errOut := e.Run("rearm", "--config", cfg, "--kubeconfig", e.Kubeconfig, "--group", "web"); code != 0 {
		t.Fatalf("rearm exit %d: %s%s", code, out, errOut)
	}
	e.Settle("Deployment", "web")
	code, logs = e.Tick(cfg)
	if code != 0 {
		t.Fatalf("tick after rearm: exit %d, want 0", code)
	}
	converged := time.Since(healed)
	if len(e2e.LogLines(logs, "INFO", "recorded "+recKey+"="+next, "every target already runs it")) != 1 {
		t.Errorf("the converging tick does not say it recorded the digest the target runs:\n%s", logs)
	}
	a = e.StateOf("web")
	if a[recKey] != next || a[attemptKey] != "" || a[flapKey] != "" || a[e2e.OwnerKey] != "team-web" {
		t.Errorf("after rearm and one tick: %v, want record %s, no attempt, no flap marker, %s kept", a, next, e2e.OwnerKey)
	}
	if n := e.Rollouts("web"); n != rs+1 {
		t.Errorf("web's ReplicaSets %d -> %d across 3 failed ticks, a fix and a rearm, want exactly one more", rs, n)
	}
	rvs, events := e.ResourceVersions(), e.OwnEvents()
	if code, _ := e.Tick(cfg); code != 0 {
		t.Errorf("tick after convergence: exit %d", code)
	}
	e.AssertUnchanged("a tick after convergence", rvs, events)
	t.Logf("settled %s after the gate turned True; converged %s after it (1 latched tick, rearm, 1 tick)",
		settledAfter.Round(100*time.Millisecond), converged.Round(100*time.Millisecond))
}

func TestCluster_R6_ScaledToZeroDeploymentIsPinned(t *testing.T) {
	e := newEnv(t)
	first := e.Push("api", "prod")
	tag := e.Repo("api") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "api", testenv.WithContainer("api", tag), testenv.WithReplicas(1),
		testenv.WithAnnotations(map[string]string{e2e.OwnerKey: "team-api"}))
	testenv.Deployment(t, e.C.Client, e.NS, "worker", testenv.WithContainer("worker", tag), testenv.WithReplicas(0))
	e.Settle("Deployment", "api")
	e.observed("worker")
	cfg := e.Config(e2e.Groups(e2e.GroupOf("api", "Deployment", "api", e2e.ImageOf("api", "api", "prod", e2e.Target("Deployment", "api", "api"), e2e.Target("Deployment", "worker", "worker")))))
	rs := e.Rollouts("worker")
	recKey := e.Key("last-refreshed-api-digest")

	if code, _ := e.Tick(cfg); code != 0 || e.Image("worker", "worker") != tag || e.Rollouts("worker") != rs {
		t.Fatalf("first observation: exit %d, worker %s, ReplicaSets %d -> %d; want 0, untouched", code, e.Image("worker", "worker"), rs, e.Rollouts("worker"))
	}
	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("pinning tick: exit %d", code)
	}
	if got := e.Image("worker", "worker"); got != tag+"@"+first {
		t.Errorf("the scaled-to-0 worker is not pinned: %s", got)
	}
	if n := e.Rollouts("worker"); n != rs+1 {
		t.Errorf("pinning the scaled-to-0 worker: ReplicaSets %d -> %d, want one more (its template changed)", rs, n)
	}

	next := e.Push("api", "prod")
	start := time.Now()
	code, logs := e.Tick(cfg)
	took := time.Since(start)
	if code != 0 {
		t.Fatalf("digest change with a scaled-to-0 target: exit %d, want 0", code)
	}
	if got := e.Image("worker", "worker"); got != tag+"@"+next {
		t.Errorf("the scaled-to-0 worker is not re-imaged: %s", got)
	}
	if len(e2e.LogLines(logs, "INFO", "re-imaged", "/worker container worker", "@"+next)) != 1 || !e2e.HasEvent(e.Events("worker"), "DigestChanged", next) {
		t.Errorf("the re-image of the worker is not logged and evented:\n%s", logs)
	}
	a := e.StateOf("api")
	if a[recKey] != next || a[e.Key("refresh-attempt")] != "" || a[e2e.OwnerKey] != "team-api" {
		t.Errorf("after the digest change: %v, want record %s, no attempt, %s kept", a, next, e2e.OwnerKey)
	}
	if n := e.Rollouts("worker"); n != rs+2 {
		t.Errorf("worker's ReplicaSets %d -> %d after the pin and one digest change, want exactly two more", rs, n)
	}
	if p := e.pods("worker"); len(p) != 0 {
		t.Errorf("a scaled-to-0 Deployment got %d pods", len(p))
	}

	// Scaled back up, the worker runs the pinned digest: no rollout, no tick.
	if _, err := e.C.Client.AppsV1().Deployments(e.NS).Patch(context.Background(), "worker", types.MergePatchType, []byte(`{"spec":{"replicas":2}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Settle("Deployment", "worker")
	pods := e.pods("worker")
	for _, p := range pods {
		if got := p.Spec.Containers[0].Image; got != tag+"@"+next {
			t.Errorf("pod %s of the scaled-up worker runs %s, want %s", p.Name, got, tag+"@"+next)
		}
	}
	if len(pods) != 2 || e.Rollouts("worker") != rs+2 {
		t.Errorf("scaled up: %d pods, ReplicaSets %d; want 2 pods and no new ReplicaSet (%d)", len(pods), e.Rollouts("worker"), rs+2)
	}
	rvs, events := e.ResourceVersions(), e.OwnEvents()
	if code, _ := e.Tick(cfg); code != 0 {
		t.Errorf("tick after the scale-up: exit %d", code)
	}
	e.AssertUnchanged("a tick after the scale-up", rvs, events)
	t.Logf("digest change with a scaled-to-0 target: 1 tick, %s (the settle is the controller observing the new generation)", took.Round(time.Millisecond))
}

// observed waits until the Deployment controller observed a Deployment's
// current generation: all there is to wait for at 0 replicas. It does not
// use the product's definition of settled, which the test checks.
func (e *env) observed(deploy string) {
	e.T.Helper()
	e.UntilDeployments(30*time.Second, deploy+" observed", func() bool {
		d := e.Deployment(deploy)
		return d.Status.ObservedGeneration == d.Generation
	})
}

// gone waits until Deployment deploy, its ReplicaSets and its pods are
// gone (the garbage collector deletes the ReplicaSets once the Deployment
// is, then their pods): a watch of each in turn, as each stays gone once
// it is.
func (e *env) gone(deploy string) {
	e.T.Helper()
	what := deploy + ", its ReplicaSets and pods gone"
	e.UntilDeployments(60*time.Second, what, func() bool {
		_, err := e.C.Client.AppsV1().Deployments(e.NS).Get(context.Background(), deploy, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	byApp := metav1.ListOptions{LabelSelector: "app=" + deploy}
	e.UntilWatched(60*time.Second, what, func(ctx context.Context) (watch.Interface, error) {
		return e.C.Client.AppsV1().ReplicaSets(e.NS).Watch(ctx, byApp)
	}, func() bool { return e.Rollouts(deploy) == 0 })
	e.UntilWatched(60*time.Second, what, func(ctx context.Context) (watch.Interface, error) {
		return e.C.Client.CoreV1().Pods(e.NS).Watch(ctx, byApp)
	}, func() bool { return len(e.pods(deploy)) == 0 })
}

// helmReinstall uninstalls a release and installs it again, the way an
// operator starts a release over: the Deployment is deleted (its
// ReplicaSets and pods with it, once the garbage collector ran) and
// created anew from the chart, with no webhook (B1) to pin it on the way
// in. It returns the old and the new UID.
func (e *env) helmReinstall(h *helmCLI, release, chart, deploy string) (types.UID, types.UID) {
	e.T.Helper()
	old := e.Deployment(deploy).UID
	h.run("uninstall", release, "-n", e.NS)
	e.gone(deploy)
	h.run("install", release, chart, "-n", e.NS)
	e.Settle("Deployment", deploy)
	return old, e.Deployment(deploy).UID
}

func TestCluster_R7_RecreatedByHelmIsRepinned(t *testing.T) {
	eachHelm(t, testClusterRecreatedByHelm)
}

func testClusterRecreatedByHelm(t *testing.T, e *env, h *helmCLI) {
	digest, tag, cfg := e.hbSetup() // the anchor "state" lives outside the release
	pinned := tag + "@" + digest
	chart := hbChart(t, tag)
	h.run("install", "web", chart, "-n", e.NS)
	e.Settle("Deployment", "web")
	if code, _ := e.Tick(cfg); code != 0 || e.Image("web", "web") != pinned {
		t.Fatalf("setup: the tick did not pin web: exit %d, %s", code, e.Image("web", "web"))
	}
	state := e.StateOf("state")

	oldUID, newUID := e.helmReinstall(h, "web", chart, "web")
	if oldUID == newUID || e.Image("web", "web") != tag || e.Rollouts("web") != 1 {
		t.Fatalf("setup: web not re-created on the bare tag: uid %s -> %s, %s, %d ReplicaSets", oldUID, newUID, e.Image("web", "web"), e.Rollouts("web"))
	}

	start := time.Now()
	code, logs := e.Tick(cfg)
	took := time.Since(start)
	if code != 0 || e.Image("web", "web") != pinned {
		t.Fatalf("tick after the re-create: exit %d, web %s; want 0 and %s in one tick", code, e.Image("web", "web"), pinned)
	}
	if len(e2e.LogLines(logs, "INFO", "/web container web is not on the pinned digest", "last written by helm")) != 1 {
		t.Errorf("the re-pin is not logged naming helm as the writer:\n%s", logs)
	}
	if !e2e.HasEvent(e.eventsOf(newUID), "Repinned", "helm") || !e2e.HasEvent(e.Events("state"), "Repinned", "/web container web") {
		t.Errorf("no Repinned Event naming helm on the new web and on the anchor: web %q, state %q", e.eventsOf(newUID), e.Events("state"))
	}
	if n := e.Rollouts("web"); n != 2 {
		t.Errorf("the re-created web has %d ReplicaSets after its re-pin, want 2 (the install's, the pin's)", n)
	}
	if got := e.StateOf("state"); fmt.Sprint(got) != fmt.Sprint(state) {
		t.Errorf("the anchor's annotations changed across the re-create of another target:\nbefore %v\nafter  %v", state, got)
	}
	rvs, events := e.ResourceVersions(), e.OwnEvents()
	if code, _ := e.Tick(cfg); code != 0 {
		t.Errorf("tick after the re-pin: exit %d", code)
	}
	e.AssertUnchanged("a tick after the re-pin", rvs, events)
	t.Logf("re-created target re-pinned in 1 tick (%s), record kept", took.Round(time.Millisecond))
}

// When Helm re-creates the anchor, the group's state goes with it: the
// record, the ever-pinned marker, any attempt count. The next tick is a
// first observation again (R5: record, touch nothing), the one after pins
// (R7, wording of a fresh install). Nothing wedges, and a digest the
// registry moved to while the anchor was gone is the one recorded.
func TestCluster_R5_R7_AnchorRecreatedByHelmIsObservedAgainThenPinned(t *testing.T) {
	eachHelm(t, testClusterAnchorRecreatedByHelm)
}

func testClusterAnchorRecreatedByHelm(t *testing.T, e *env, h *helmCLI) {
	first := e.Push("web", "prod")
	tag := e.Repo("web") + ":prod"
	chart := hbChart(t, tag)
	cfg := e.Config(e2e.CfWebGroup)
	h.run("install", "web", chart, "-n", e.NS)
	e.Settle("Deployment", "web")
	e.PinAll(cfg)
	recKey, everKey := e.Key("last-refreshed-web-digest"), e.Key("ever-pinned-web")
	if got := e.Image("web", "web"); got != tag+"@"+first || e.StateOf("web")[recKey] != first {
		t.Fatalf("setup: web %s, record %q; want pinned to and recorded at %s", got, e.StateOf("web")[recKey], first)
	}
	if _, ok := e.StateOf("web")[everKey]; !ok {
		t.Fatalf("setup: no %s marker to lose: %v", everKey, e.StateOf("web"))
	}

	h.run("uninstall", "web", "-n", e.NS)
	next := e.Push("web", "prod") // the registry moves while the release is gone
	e.gone("web")
	h.run("install", "web", chart, "-n", e.NS)
	e.Settle("Deployment", "web")
	if s := e.StateOf("web"); len(s) != 0 || e.Image("web", "web") != tag {
		t.Fatalf("setup: the re-created anchor has state %v and runs %s, want none and the bare tag", s, e.Image("web", "web"))
	}

	code, logs := e.Tick(cfg)
	if code != 0 || e.Image("web", "web") != tag || e.Rollouts("web") != 1 {
		t.Errorf("first tick after the re-create: exit %d, web %s, %d ReplicaSets; want 0, untouched (R5)", code, e.Image("web", "web"), e.Rollouts("web"))
	}
	if len(e2e.LogLines(logs, "INFO", "first observation", next)) != 1 {
		t.Errorf("the tick does not log a first observation of the registry's current digest %s:\n%s", next, logs)
	}
	if got := e.StateOf("web")[recKey]; got != next {
		t.Errorf("first observation recorded %q, want the registry's current %s", got, next)
	}
	code, logs = e.Tick(cfg)
	if code != 0 || e.Image("web", "web") != tag+"@"+next {
		t.Fatalf("second tick after the re-create: exit %d, web %s; want 0 and %s", code, e.Image("web", "web"), tag+"@"+next)
	}
	if len(e2e.LogLines(logs, "INFO", "/web container web is not on the pinned digest", "fresh install")) != 1 {
		t.Errorf("the pin is not logged with R7's neutral wording:\n%s", logs)
	}
	if !e2e.HasEvent(e.eventsOf(e.Deployment("web").UID), "Repinned", "@"+next) {
		t.Errorf("no Repinned Event on the re-created anchor: %q", e.eventsOf(e.Deployment("web").UID))
	}
	a := e.StateOf("web")
	if a[recKey] != next || a[everKey] != "true" || a[e.Key("refresh-attempt")] != "" {
		t.Errorf("after the pin: %v, want record %s, %s=true, no attempt", a, next, everKey)
	}
	if n := e.Rollouts("web"); n != 2 {
		t.Errorf("the re-created anchor has %d ReplicaSets, want 2 (the install's, the pin's)", n)
	}
	t.Logf("re-created anchor: 1 tick of first observation (no rollout), pinned at the 2nd tick")
}

func TestCluster_R7_HelmRollbackIsRepinned(t *testing.T) {
	eachHelm(t, testClusterHelmRollback)
}

func testClusterHelmRollback(t *testing.T, e *env, h *helmCLI) {
	first, tag, cfg := e.hbSetup()
	chart := hbChart(t, tag)
	// Revision 1 renders the bare tag; fix A pins it.
	h.run("install", "web", chart, "-n", e.NS)
	e.Settle("Deployment", "web")
	if code, _ := e.Tick(cfg); code != 0 || e.Image("web", "web") != tag+"@"+first {
		t.Fatalf("setup: web not pinned: exit %d, %s", code, e.Image("web", "web"))
	}
	// Revision 2 renders the digest of that day (a CI that pins values).
	h.run("upgrade", "web", chart, "-n", e.NS, "--set", "image="+tag+"@"+first)
	e.Settle("Deployment", "web")
	// The registry moves; fix A moves web and the record.
	latest := e.Push("web", "prod")
	if code, _ := e.Tick(cfg); code != 0 || e.Image("web", "web") != tag+"@"+latest {
		t.Fatalf("setup: the digest change did not reach web: exit %d, %s", code, e.Image("web", "web"))
	}
	rs := e.Rollouts("web")
	state := e.StateOf("state")
	if state[e.Key("last-refreshed-web-digest")] != latest {
		t.Fatalf("setup: record %q, want %s", state[e.Key("last-refreshed-web-digest")], latest)
	}

	for _, c := range []struct{ revision, renders string }{{"2", tag + "@" + first}, {"1", tag}} {
		history := e.WatchDeployment("web")
		// Helm 4 applies server-side; the image field is image-refresh's
		// since the pin, so the rollback needs --force-conflicts (R17).
		// Helm 3's three-way merge patch reverts it without.
		h.run(append([]string{"rollback", "web", c.revision, "-n", e.NS}, h.forceConflicts()...)...)
		e.Settle("Deployment", "web")
		if got := e.Image("web", "web"); got != c.renders {
			t.Fatalf("setup: rollback to revision %s left web on %s, want %s", c.revision, got, c.renders)
		}
		start := time.Now()
		code, logs := e.Tick(cfg)
		took := time.Since(start)
		if code != 0 || e.Image("web", "web") != tag+"@"+latest {
			t.Errorf("tick after rollback to revision %s: exit %d, web %s; want 0 and %s in one tick", c.revision, code, e.Image("web", "web"), tag+"@"+latest)
		}
		if len(e2e.LogLines(logs, "INFO", "/web container web is not on the pinned digest", "last written by helm")) != 1 {
			t.Errorf("rollback to revision %s: the re-pin is not logged naming helm:\n%s", c.revision, logs)
		}
		trail := imageTrail(tag+"@"+latest, history.Take(), "web")
		if want := []string{tag + "@" + latest, c.renders, tag + "@" + latest}; fmt.Sprint(trail) != fmt.Sprint(want) {
			t.Errorf("rollback to revision %s: web's image went %q, want %q (the rollback, one re-pin)", c.revision, trail, want)
		}
		// Both templates existed before: their ReplicaSets are reused.
		if n := e.Rollouts("web"); n != rs {
			t.Errorf("rollback to revision %s and its re-pin: ReplicaSets %d -> %d, want none new", c.revision, rs, n)
		}
		t.Logf("rollback to revision %s (%s) re-pinned to the latest digest in 1 tick (%s)", c.revision, c.renders, took.Round(time.Millisecond))
	}
	if got := e.StateOf("state"); fmt.Sprint(got) != fmt.Sprint(state) {
		t.Errorf("the anchor's annotations changed across two rollbacks:\nbefore %v\nafter  %v", state, got)
	}
}

// C3 by mistake: two `run` processes on one cluster without
// --leader-elect. One polls every second, the other every six, so the slow
// one decides on an answer up to six seconds old while the fast one rolls
// the new digest. The compare-and-swap on the anchor's annotations (each
// write carries the resourceVersion it read and the values it expects), the
// attempt holder and the fresh ask before re-imaging away from a running
// digest must keep every change to one rollout: no back and forth, no
// stacked attempts, no lockout, no ERROR.
func TestCluster_C3_TwoInstancesWithoutLeaderElectionRollEachChangeOnce(t *testing.T) {
	e := newEnv(t)
	first := e.Push("api", "prod")
	tag := e.Repo("api") + ":prod"
	for _, name := range []string{"web", "worker"} {
		testenv.Deployment(t, e.C.Client, e.NS, name, testenv.WithContainer("app", tag), testenv.WithReplicas(2), testenv.WithMinReadySeconds(1))
		e.Settle("Deployment", name)
	}
	group := e2e.Groups(e2e.GroupOf("%s", "Deployment", "web", e2e.ImageOf("api", "api", "prod", e2e.Target("Deployment", "web", "app"), e2e.Target("Deployment", "worker", "app"))))
	// The same group under two names, one per instance, only so that the
	// one /metrics both serve counts each one's passes apart (no state
	// image-refresh keeps in the cluster carries a group name).
	cfg, slowCfg := e.Config(fmt.Sprintf(group, "fleet")), e.Config(fmt.Sprintf(group, "fleet-slow"))
	e.PinAll(cfg)
	if e.Image("web", "app") != tag+"@"+first || e.Image("worker", "app") != tag+"@"+first {
		t.Fatalf("precondition: not pinned to %s: web %s, worker %s", first, e.Image("web", "app"), e.Image("worker", "app"))
	}
	hist := map[string]*e2e.DeployHistory{"web": e.WatchDeployment("web"), "worker": e.WatchDeployment("worker")}

	fast := e.StartRun(cfg, "--poll-interval", "1s", "--poll-jitter", "0")
	slow := e.StartRun(slowCfg, "--poll-interval", "6s", "--poll-jitter", "0")
	groups := map[*e2e.RunningController]string{fast: "fleet", slow: "fleet-slow"}
	for c, group := range groups {
		testwait.Eventually(t, 30*time.Second, "controller ready", func() bool {
			code, _ := running.Get("http://" + c.Health + "/readyz")
			return code == 200
		})
		c.WaitPasses(t, group, 0, 1) // its first pass
	}

	state := func() map[string]string { return e.StateOf("web") }
	converged := func(digest string) func() bool {
		return func() bool {
			s := state()
			return e.Image("web", "app") == tag+"@"+digest && e.Image("worker", "app") == tag+"@"+digest &&
				s[e.Key("last-refreshed-api-digest")] == digest && s[e.Key("refresh-attempt")] == "" && s[e.Key("refresh-attempt-holder")] == ""
		}
	}
	maxAttempt := 0
	// watchAttempt keeps the highest attempt seen until each instance ran
	// two more passes: the second began after the first ended, so after
	// the call, and the slow one decides on its poller's answer, which may
	// still be the one from before the push.
	watchAttempt := func() {
		from := map[*e2e.RunningController]int{}
		for c, group := range groups {
			from[c] = c.Passes(t, group)
		}
		// The pass counters are metrics, which announce nothing: polled.
		testwait.Eventually(t, 2*time.Minute, "two more passes of each instance", func() bool {
			if n := atoiOr0(state()[e.Key("refresh-attempt")]); n > maxAttempt {
				maxAttempt = n
			}
			for c, group := range groups {
				if c.Passes(t, group) < from[c]+2 {
					return false
				}
			}
			return true
		})
	}

	// 1. The registry moves the tag: one rollout to the new digest.
	next := e.Push("api", "prod")
	start := time.Now()
	took := e.UntilDeployments(90*time.Second, "both targets on the new digest, recorded, attempt cleared", func() bool {
		if n := atoiOr0(state()[e.Key("refresh-attempt")]); n > maxAttempt {
			maxAttempt = n
		}
		return converged(next)()
	})
	watchAttempt() // the slow poller's stale answer has had its chance
	if !converged(next)() {
		t.Fatalf("after the digest change the group did not stay converged: %v, web %s, worker %s", state(), e.Image("web", "app"), e.Image("worker", "app"))
	}
	t.Logf("digest change: converged %s after the push (both instances running)", took.Round(100*time.Millisecond))

	// 2. A re-render reverts web to the tag: re-pinned once.
	e.SetImageAs("helm", "Deployment", "web", "app", tag)
	took = e.UntilDeployments(60*time.Second, "the revert re-pinned", converged(next))
	watchAttempt()
	if !converged(next)() {
		t.Fatalf("after the revert the group did not stay converged: %v", state())
	}
	t.Logf("revert: re-pinned in %s; whole scenario %s", took.Round(100*time.Millisecond), time.Since(start).Round(time.Second))

	wantTrail := map[string][]string{
		"web":    {tag + "@" + first, tag + "@" + next, tag, tag + "@" + next},
		"worker": {tag + "@" + first, tag + "@" + next},
	}
	for name, h := range hist {
		if got := imageTrail(tag+"@"+first, h.Take(), "app"); !slices.Equal(got, wantTrail[name]) {
			t.Errorf("%s's image went %v, want %v: every change rolls once", name, got, wantTrail[name])
		}
	}
	if maxAttempt > 1 {
		t.Errorf("refresh-attempt reached %d: the instances stacked attempts on one rollout", maxAttempt)
	}
	for name, c := range map[string]*e2e.RunningController{"fast": fast, "slow": slow} {
		logs := c.Logs()
		for _, bad := range []string{"level=ERROR", "LOCKED OUT"} {
			if strings.Contains(logs, bad) {
				t.Errorf("the %s instance logged %s:\n%s", name, bad, logs)
			}
		}
	}
	if a := state(); a[e2e.OwnerKey] != "" {
		t.Errorf("unexpected owner key %v", a)
	}
}

func atoiOr0(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// C3: a `run` whose poller is behind the registry (another process rolled
// the new digest first: here a `tick`, with `run`'s poll interval 1 h)
// sees targets on a digest newer than its answer. Before re-imaging a
// target away from the digest it runs, the pass asks the registry again, so
// it records the newer digest instead of rolling the group back.
func TestCluster_C3_ARunBehindTheRegistryNeverRollsTheGroupBack(t *testing.T) {
	e := newEnv(t)
	first := e.Push("web", "prod")
	tag := e.Repo("web") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "web", testenv.WithContainer("web", tag), testenv.WithReplicas(2))
	e.Settle("Deployment", "web")
	cfg := e.Config(e2e.CfWebGroup)
	e.PinAll(cfg)
	ctl := e.StartRun(cfg, "--poll-interval", "1h")
	testwait.Eventually(t, 30*time.Second, "controller ready", func() bool {
		code, _ := running.Get("http://" + ctl.Health + "/readyz")
		return code == 200
	})
	ctl.WaitPasses(t, "web", 0, 1) // its first pass, on the first digest
	hist := e.WatchDeployment("web")

	next := e.Push("web", "prod")
	if code, logs := e.Tick(cfg); code != 0 || e.Image("web", "web") != tag+"@"+next {
		t.Fatalf("the tick did not roll the new digest: exit %d, web %s\n%s", code, e.Image("web", "web"), logs)
	}
	ctl.KickedPasses(t, e.Env, "web", "web") // the controller's passes on the tick's writes
	if got, want := imageTrail(tag+"@"+first, hist.Take(), "web"), []string{tag + "@" + first, tag + "@" + next}; !slices.Equal(got, want) {
		t.Errorf("web's image went %v, want %v: the controller rolled the group back to its stale answer", got, want)
	}
	if got := e.StateOf("web")[e.Key("last-refreshed-web-digest")]; got != next {
		t.Errorf("record %q, want %s", got, next)
	}
	if lines := e2e.LogLines(ctl.Logs(), "INFO", "the registry's answer changed since the last poll", next); len(lines) == 0 {
		t.Errorf("the controller never asked the registry again before re-imaging away from %s:\n%s", next, ctl.Logs())
	}
}

// C6, R10, R14: a pass of `run` never waits for a rollout, and a rollout
// that has not settled rolloutTimeout after its write counts as a failed
// attempt, as in a tick: the deadline is the holder's time on the anchor,
// so the passes in between (every second here) neither wait nor stack
// attempts, and the last failed attempt locks the group out (R10).
func TestRun_C6_R10_ARolloutNotSettledWithinRolloutTimeoutIsAFailedAttempt(t *testing.T) {
	const gate = "lb.acme.example/target-healthy"
	e := newEnv(t)
	e.Push("web", "prod")
	tag := e.Repo("web") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "web", testenv.WithContainer("web", tag), testenv.WithReplicas(1),
		testenv.WithReadinessGate(gate), testenv.WithMinReadySeconds(4))
	lb := e.StartGateOwner("web", gate)
	e.Settle("Deployment", "web")
	e.PinAll(e.Config(e2e.CfWebGroup))
	cfg := e.Config("rolloutTimeout: 4s\nmaxRefreshAttempts: 2\n" + e2e.CfWebGroup)
	ctl := e.StartRun(cfg, "--poll-interval", "1s", "--poll-jitter", "0")
	ctl.WaitReady(t)

	hist := e.WatchDeployment("web")
	next := e.Push("web", "prod")
	lb.Fail(next) // its pods run but never become Ready
	attemptKey, holderKey, flapKey := e.Key("refresh-attempt"), e.Key("refresh-attempt-holder"), e.Key("refresh-flap-detected")
	held := hist.Await("the re-image under attempt 1 with a holder", func(v e2e.DeployVersion) bool {
		return v.Images["web"] == tag+"@"+next && v.Annotations[attemptKey] == "1" && v.Annotations[holderKey] != ""
	})
	second := hist.Await("attempt 2 after attempt 1's deadline", func(v e2e.DeployVersion) bool { return v.Annotations[attemptKey] == "2" })
	took := second.At.Sub(held.At)
	t.Logf("attempt 2 seen %s after attempt 1 (rolloutTimeout 4s; passes every second in between)", took.Round(100*time.Millisecond))
	if second.Annotations[holderKey] == "" || second.Annotations[holderKey] == held.Annotations[holderKey] {
		t.Errorf("attempt 2's holder %q, want a new one (a new deadline)", second.Annotations[holderKey])
	}
	// Each holder carries the time its attempt was decided (whole seconds;
	// the deadline, holder time + rolloutTimeout, is one too): attempt 2 is
	// decided no earlier than attempt 1's deadline. When the watch delivered
	// the two writes is no measure of it on a loaded machine.
	h1, err1 := state.ParseHolder(held.Annotations[holderKey], true)
	h2, err2 := state.ParseHolder(second.Annotations[holderKey], true)
	if err1 != nil || err2 != nil {
		t.Fatalf("holders: %v, %v", err1, err2)
	}
	if d := h2.Since.Sub(h1.Since); d < 4*time.Second {
		t.Errorf("attempt 2 was decided at %s, %s after attempt 1 (%s): before its 4 s deadline", h2.Since.Format(time.RFC3339), d, h1.Since.Format(time.RFC3339))
	}
	e.UntilDeployments(60*time.Second, "locked out after attempt 2's deadline", func() bool { return e.StateOf("web")[flapKey] == "2" })
	if got := e.StateOf("web")[attemptKey]; got != "2" {
		t.Errorf("refresh-attempt = %q after the lockout, want 2 (no attempt past maxRefreshAttempts)", got)
	}
	// The pass logs after its writes: wait for its lockout line, then for
	// two more passes (the first may be the lockout's own, counted after
	// its line), which must not repeat the ERROR.
	ctl.UntilLogged(t, "the lockout WARN", func(logs string) bool { return len(e2e.LogLines(logs, "WARN", "LOCKED OUT")) > 0 })
	ctl.WaitPasses(t, "web", ctl.Passes(t, "web"), 2)
	if n := len(e2e.LogLines(ctl.Logs(), "ERROR", "rollout not settled within rolloutTimeout 4s")); n != 2 {
		t.Errorf("%d ERROR lines for a rollout past its deadline, want 2 (one per attempt):\n%s", n, ctl.Logs())
	}
}
