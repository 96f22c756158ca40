package tick

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// k2RolloutGroup: an Argo Rollouts Rollout whose migration runs as an init
// container from the app's repo:prod; the Rollout is the anchor.
var k2RolloutGroup = testenv.RolloutKindYAML + e2e.Groups(e2e.GroupOf("web", "Rollout", "web",
	e2e.ImageOf("app", "app", "prod", e2e.Target("Rollout", "web", "app"), e2e.Target("Rollout", "web", "migrate"))))

// untilRollout waits, on a watch of the Rollout, until cond holds.
func (e *env) untilRollout(dyn dynamic.Interface, name, what string, cond func(*unstructured.Unstructured) bool) *unstructured.Unstructured {
	e.T.Helper()
	var last *unstructured.Unstructured
	r := dyn.Resource(testenv.RolloutResource).Namespace(e.NS)
	e.UntilWatched(2*time.Minute, what, func(ctx context.Context) (watch.Interface, error) {
		return r.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	}, func() bool {
		u, err := r.Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		last = u
		return cond(u)
	})
	return last
}

// TestTick_K2_ArgoRolloutsRealControllerCanariesThePinAndTheNewBuild: the
// real Argo Rollouts controller (built from its released module) runs a
// Rollout with a canary strategy. image-refresh pins its container and
// init container in one write; the tick waits while Argo Rollouts walks
// the canary steps (Progressing, Paused at the pause step) and counts the
// pin done only at phase Healthy of the new generation (K2, R4); a new
// build is canaried the same way and recorded only then (R6); and the
// ReplicaSet Argo Rollouts made for the pinned template runs the pin.
func TestTick_K2_ArgoRolloutsRealControllerCanariesThePinAndTheNewBuild(t *testing.T) {
	e := newEnv(t)
	argo := testenv.StartArgoRollouts(t, e.C, e.Kubeconfig)
	dyn, err := dynamic.NewForConfig(e.C.Config)
	if err != nil {
		t.Fatal(err)
	}
	first := e.Push("app", "prod")
	tag := e.Repo("app") + ":prod"
	testenv.CreateRollout(t, dyn, e.NS, "web", testenv.WithContainer("app", tag), testenv.WithInitContainer("migrate", tag))
	e.untilRollout(dyn, "web", "Argo Rollouts reports the new Rollout Healthy", testenv.RolloutHealthy)
	cfg := e.Config(k2RolloutGroup)

	for i, what := range []string{"recording", "pinning"} {
		if code, logs := e.Tick(cfg); code != 0 {
			t.Fatalf("%s tick (%d) exit %d\n%s", what, i+1, code, logs)
		}
	}
	u, err := dyn.Resource(testenv.RolloutResource).Namespace(e.NS).Get(context.Background(), "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pinned := tag + "@" + first
	if a, m := testenv.PodSetImage(u, "app"), testenv.PodSetImage(u, "migrate"); a != pinned || m != pinned {
		t.Fatalf("after the pin: app %s, migrate %s; want both %s", a, m, pinned)
	}
	// The tick returned once the pin's canary finished: Healthy, on the
	// generation it wrote.
	if !testenv.RolloutHealthy(u) {
		t.Errorf("the pinning tick returned before Argo Rollouts finished: status %v", u.Object["status"])
	}
	hash, _, _ := unstructured.NestedString(u.Object, "status", "currentPodHash")
	rs, err := e.C.Client.AppsV1().ReplicaSets(e.NS).List(context.Background(), metav1.ListOptions{LabelSelector: "rollouts-pod-template-hash=" + hash})
	if err != nil || len(rs.Items) != 1 || rs.Items[0].Spec.Template.Spec.InitContainers[0].Image != pinned || rs.Items[0].Status.ReadyReplicas != 2 {
		t.Errorf("Argo Rollouts' ReplicaSet of the pinned template (hash %s): %v, %+v; want one, its migration on %s, 2 ready", hash, err, rs, pinned)
	}

	// A new build: canaried by Argo Rollouts, recorded once Healthy.
	next := e.Push("app", "prod")
	code, logs := e.Tick(cfg)
	if code != 0 {
		t.Fatalf("digest-change tick exit %d\n%s", code, logs)
	}
	u, err = dyn.Resource(testenv.RolloutResource).Namespace(e.NS).Get(context.Background(), "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a, m := testenv.PodSetImage(u, "app"), testenv.PodSetImage(u, "migrate"); a != tag+"@"+next || m != tag+"@"+next {
		t.Errorf("after the new build: app %s, migrate %s; want both %s@%s", a, m, tag, next)
	}
	if got := u.GetAnnotations()[e.Key("last-refreshed-app-digest")]; got != next || !testenv.RolloutHealthy(u) {
		t.Errorf("recorded %q with the Rollout's status %v; want %s recorded once Healthy", got, u.Object["status"], next)
	}
	if !strings.Contains(argo.Logs(), "CanaryPauseStep") {
		t.Errorf("Argo Rollouts' log shows no canary pause: the Rollout was not canaried\n%s", argo.Logs())
	}
}
