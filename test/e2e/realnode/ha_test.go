package realnode

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// leader waits until the release's Lease image-refresh names a holder
// other than not, and returns the holder's pod name.
func (w *world) leader(releaseNS, not string) string {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var last, holder string
	err := until(ctx, byName(w.c.Client.CoordinationV1().RESTClient(), "leases", releaseNS, "image-refresh"), &coordinationv1.Lease{}, func(o runtime.Object) (bool, error) {
		l := o.(*coordinationv1.Lease)
		if l.Spec.HolderIdentity == nil {
			return false, nil
		}
		last = *l.Spec.HolderIdentity
		pod, _, _ := strings.Cut(last, "_")
		holder = pod
		return pod != "" && pod != not, nil
	})
	if err != nil {
		w.t.Fatalf("Lease %s/image-refresh: holder %q, want a pod other than %q: %v", releaseNS, last, not, err)
	}
	return holder
}

// deleteAndWatch deletes pod with its own grace period and returns its
// last status before it was gone.
func (w *world) deleteAndWatch(ns, pod string) *corev1.Pod {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wi, err := w.c.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", pod).String()})
	if err != nil {
		w.t.Fatal(err)
	}
	defer wi.Stop()
	if err := w.c.Client.CoreV1().Pods(ns).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil {
		w.t.Fatal(err)
	}
	var last *corev1.Pod
	for ev := range wi.ResultChan() {
		if p, ok := ev.Object.(*corev1.Pod); ok {
			last = p
		}
		if ev.Type == watch.Deleted {
			return last
		}
	}
	w.t.Fatalf("pod %s/%s not gone within 2 minutes of its delete", ns, pod)
	return nil
}

// TestProduct_S1_C3_TheOtherReplicaLeadsAndHealsWhenTheLeaderIsDeleted runs
// the chart with leader election and two replicas on the real node: the
// leader's pod is deleted and shuts down cleanly on SIGTERM (exit 0), the
// other replica takes the Lease and heals the next re-render.
func TestProduct_S1_C3_TheOtherReplicaLeadsAndHealsWhenTheLeaderIsDeleted(t *testing.T) {
	w := newWorld(t)
	releaseNS := w.installProduct(map[string]any{
		"controller": map[string]any{"leaderElection": map[string]any{"enabled": true}},
	})
	if n := len(w.productPods(releaseNS)); n != 2 {
		t.Fatalf("release ir runs %d pods, want 2 with leader election", n)
	}
	first := w.leader(releaseNS, "")

	a := w.pushBuild("acme/api", "prod", "A")
	tag := w.host + "/acme/api:prod"
	w.installApp("helm3", tag)
	w.waitImage("api", tag+"@"+a, 3*time.Minute)

	gone := w.deleteAndWatch(releaseNS, first)
	if len(gone.Status.ContainerStatuses) != 1 || gone.Status.ContainerStatuses[0].State.Terminated == nil {
		t.Fatalf("the deleted leader's last status has no terminated container: %+v", gone.Status.ContainerStatuses)
	}
	if term := gone.Status.ContainerStatuses[0].State.Terminated; term.ExitCode != 0 {
		t.Errorf("the deleted leader exited %d (%s): want 0, a clean shutdown on SIGTERM", term.ExitCode, term.Reason)
	}
	next := w.leader(releaseNS, first)
	t.Logf("leader %s deleted; %s leads", first, next)

	pinned := w.deployment("api")
	w.helm("helm3", "upgrade", "app", filepath.Join("testdata", "app"), "-n", w.ns, "--reuse-values", "--set", "revision=2")
	healed := w.waitImage("api", tag+"@"+a, 2*time.Minute)
	if healed.Spec.Template.Annotations["revision"] != "2" || healed.Generation < pinned.Generation+2 {
		t.Errorf("after the upgrade: revision %q, generation %d (was %d); want 2 and the upgrade's write plus the re-pin",
			healed.Spec.Template.Annotations["revision"], healed.Generation, pinned.Generation)
	}
	p, err := w.c.Client.CoreV1().Pods(releaseNS).Get(context.Background(), next, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if logs := w.logs(p); !strings.Contains(logs, "re-pinned") {
		t.Errorf("the new leader %s did not log the re-pin:\n%s", next, logs)
	}
}

// TestProduct_S1_B1_TheAPIServerCallsTheWebhookThroughTheChartsService
// enables the chart's webhook: kube-apiserver calls the controller pod
// through the chart's Service (ClusterIP, kube-proxy on the real node) with
// the pod's own TLS, and a helm upgrade's re-render is pinned at admission:
// the bare tag is never stored.
func TestProduct_S1_B1_TheAPIServerCallsTheWebhookThroughTheChartsService(t *testing.T) {
	w := newWorld(t)
	releaseNS := w.installProduct(map[string]any{"webhook": map[string]any{"enabled": true}})
	svc, err := w.c.Client.CoreV1().Services(releaseNS).Get(context.Background(), "ir-image-refresh-webhook", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("webhook Service ClusterIP %s", svc.Spec.ClusterIP)

	a := w.pushBuild("acme/api", "prod", "A")
	tag := w.host + "/acme/api:prod"
	w.installApp("helm3", tag)
	w.waitImage("api", tag+"@"+a, 3*time.Minute)
	w.readyPod("api")
	// The webhook answers once kube-proxy on the node has the Service's
	// endpoint and the controller has the record: a server-side dry run of
	// a write of the bare tag goes through it (sideEffects None) and comes
	// back pinned.
	// No API object says when kube-proxy has programmed the Service, so
	// this is the one probe that is retried: each try is a dry run, and it
	// ends at the first pinned answer.
	var lastErr error
	probe := func(ctx context.Context) (bool, error) {
		d := w.deployment("api")
		d.Spec.Template.Spec.Containers[0].Image = tag
		out, err := w.c.Client.AppsV1().Deployments(w.ns).Update(ctx, d, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		lastErr = err
		return err == nil && out.Spec.Template.Spec.Containers[0].Image == tag+"@"+a, nil
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, 2*time.Minute, true, probe); err != nil {
		t.Fatalf("a dry-run write of the bare tag is not pinned by the webhook (%v; last: %v)\n%s", err, lastErr, w.productLogs(releaseNS))
	}
	// Every version of the Deployment stored from here on is watched: the
	// upgrade's write must be stored pinned (revision 2 with the digest),
	// never as the bare tag that the controller would then re-pin.
	before := w.deployment("api")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	wi, err := w.c.Client.AppsV1().Deployments(w.ns).Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", "api").String(), ResourceVersion: before.ResourceVersion,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer wi.Stop()
	w.helm("helm3", "upgrade", "app", filepath.Join("testdata", "app"), "-n", w.ns, "--reuse-values", "--set", "revision=2")
	var stored []string
	for ev := range wi.ResultChan() {
		d, ok := ev.Object.(*appsv1.Deployment)
		if !ok {
			continue
		}
		if rev := d.Spec.Template.Annotations["revision"]; rev == "2" {
			img := d.Spec.Template.Spec.Containers[0].Image
			stored = append(stored, img)
			if img == tag+"@"+a {
				break
			}
		}
	}
	if len(stored) != 1 || stored[0] != tag+"@"+a {
		t.Errorf("the upgrade's template (revision 2) was stored as %q; want exactly once, as %s@%s (pinned at admission)\n%s", stored, tag, a, w.productLogs(releaseNS))
	}
	// Every ReplicaSet the upgrade made exists once the Deployment settled.
	if err := testenv.WaitSettled(context.Background(), w.c.Client, "Deployment", w.ns, "api", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	rss, err := w.c.Client.AppsV1().ReplicaSets(w.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=api"})
	if err != nil {
		t.Fatal(err)
	}
	upgraded := 0
	for _, rs := range rss.Items {
		if rs.Spec.Template.Annotations["revision"] != "2" {
			continue // the install's, which ran the bare tag before the first pin
		}
		upgraded++
		if img := rs.Spec.Template.Spec.Containers[0].Image; img != tag+"@"+a {
			t.Errorf("ReplicaSet %s of the upgrade runs %s: the re-render was stored unpinned", rs.Name, img)
		}
	}
	if upgraded != 1 {
		t.Errorf("%d ReplicaSets of the upgrade's template, want 1", upgraded)
	}
}

// productLogs are the release's controller pods' logs, for a failure.
func (w *world) productLogs(releaseNS string) string {
	var b strings.Builder
	for _, p := range w.productPods(releaseNS) {
		out, err := w.c.Client.CoreV1().Pods(releaseNS).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(context.Background())
		fmt.Fprintf(&b, "--- pod %s (%v):\n%s\n", p.Name, err, out)
	}
	return b.String()
}
