package workload_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// object is a declared kind's object: group/version/kind, generation,
// spec.replicas and a status.
func object(apiVersion, kind string, generation int64, replicas int64, status map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": apiVersion, "kind": kind,
		"metadata": map[string]any{"name": "x", "namespace": "ns", "generation": generation},
		"spec":     map[string]any{"replicas": replicas},
	}}
	if status != nil {
		u.Object["status"] = status
	}
	return u
}

// K2, R4: a declared kind is settled when its status says it is current,
// read the way the field's tooling reads it: the generation observed (an
// integer, or Argo Rollouts' string), Argo Rollouts' phase, kstatus'
// conditions (Reconciling, Stalled, Ready) and the replica counts.
func TestDeclaredSettled_K2_R4_ReadsTheStatusAsTheFieldsToolingDoes(t *testing.T) {
	const rollout, podset = "argoproj.io/v1alpha1", "e2e.image-refresh.io/v1"
	cond := func(typ, status, msg string) []any {
		return []any{map[string]any{"type": typ, "status": status, "reason": "R", "message": msg}}
	}
	all := func(gen int64, n int64, extra map[string]any) map[string]any {
		s := map[string]any{"observedGeneration": gen, "replicas": n, "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n}
		for k, v := range extra {
			s[k] = v
		}
		return s
	}
	for _, tc := range []struct {
		name                string
		obj                 *unstructured.Unstructured
		settled, unobserved bool
		failed, reason      string
	}{
		{name: "rollout healthy", obj: object(rollout, "Rollout", 3, 2, map[string]any{"observedGeneration": "3", "phase": "Healthy"}), settled: true},
		{name: "rollout unobserved (string generation)", obj: object(rollout, "Rollout", 4, 2, map[string]any{"observedGeneration": "3", "phase": "Healthy"}), unobserved: true, reason: "observedGeneration 3 < generation 4"},
		{name: "rollout progressing", obj: object(rollout, "Rollout", 3, 2, map[string]any{"observedGeneration": "3", "phase": "Progressing", "message": "more replicas need to be updated"}), reason: "Rollout is Progressing: more replicas need to be updated"},
		{name: "rollout paused at a canary step", obj: object(rollout, "Rollout", 3, 2, map[string]any{"observedGeneration": "3", "phase": "Paused", "message": "CanaryPauseStep"}), reason: "Rollout is Paused: CanaryPauseStep"},
		{name: "rollout degraded", obj: object(rollout, "Rollout", 3, 2, map[string]any{"observedGeneration": "3", "phase": "Degraded", "message": "ProgressDeadlineExceeded"}), failed: "Degraded: ProgressDeadlineExceeded", reason: "Rollout is Degraded"},
		{name: "rollout without a status", obj: object(rollout, "Rollout", 1, 2, nil), reason: "no status.phase"},
		{name: "podset current", obj: object(podset, "PodSet", 2, 2, all(2, 2, nil)), settled: true},
		{name: "podset unobserved", obj: object(podset, "PodSet", 3, 2, all(2, 2, nil)), unobserved: true, reason: "observedGeneration 2 < generation 3"},
		{name: "podset reconciling", obj: object(podset, "PodSet", 2, 2, all(2, 2, map[string]any{"conditions": cond("Reconciling", "True", "scaling up")})), reason: "scaling up"},
		{name: "podset stalled", obj: object(podset, "PodSet", 2, 2, all(2, 2, map[string]any{"conditions": cond("Stalled", "True", "image cannot be pulled")})), failed: "image cannot be pulled", reason: "image cannot be pulled"},
		{name: "podset not ready", obj: object(podset, "PodSet", 2, 2, all(2, 2, map[string]any{"conditions": cond("Ready", "False", "1 pod not ready")})), reason: "1 pod not ready"},
		{name: "podset half updated", obj: object(podset, "PodSet", 2, 2, all(2, 2, map[string]any{"updatedReplicas": int64(1)})), reason: "1 of 2 replicas updated"},
		{name: "podset not available", obj: object(podset, "PodSet", 2, 3, all(2, 3, map[string]any{"availableReplicas": int64(2)})), reason: "2 of 3 replicas available"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := workload.DeclaredSettled(tc.obj)
			if s.Settled != tc.settled || s.Unobserved != tc.unobserved || s.FailedReason() != tc.failed || !strings.Contains(s.Reason, tc.reason) {
				t.Errorf("got settled %v, unobserved %v, failed %q, reason %q; want %v, %v, %q, a reason with %q",
					s.Settled, s.Unobserved, s.FailedReason(), s.Reason, tc.settled, tc.unobserved, tc.failed, tc.reason)
			}
		})
	}
}

// K2: a kind declared twice the same way is one kind; declared again
// otherwise, the declaration is refused and nothing of it is added.
func TestDeclare_K2_TheSameDeclarationAgainIsANoOpAnotherIsRefused(t *testing.T) {
	if err := workload.Declare([]config.DeclaredKind{testenv.PodSet, testenv.PodSet}); err == nil {
		t.Error("one config declaring PodSet twice was accepted")
	}
	if err := workload.Declare([]config.DeclaredKind{testenv.PodSet}); err != nil {
		t.Fatal(err)
	}
	if err := workload.Declare([]config.DeclaredKind{testenv.PodSet}); err != nil {
		t.Errorf("declaring PodSet again the same way: %v", err)
	}
	other := testenv.PodSet
	other.PodTemplate = "spec.podTemplate"
	extra := config.DeclaredKind{Group: "e2e.image-refresh.io", Version: "v1", Kind: "NeverAdded", PodTemplate: "spec.template"}
	err := workload.Declare([]config.DeclaredKind{extra, other})
	if !errors.Is(err, workload.ErrKindRedeclared) || !strings.Contains(err.Error(), "PodSet") {
		t.Errorf("PodSet declared again with another pod template: %v, want ErrKindRedeclared naming PodSet", err)
	}
	if _, ok := workload.LookupKind("NeverAdded"); ok {
		t.Error("a refused declaration added its other kind")
	}
	k, ok := workload.LookupKind("PodSet")
	if !ok || !k.Declared || k.Resource != "podsets" || k.PodSpecPointer() != "/spec/template/spec" || k.APIVersion() != "e2e.image-refresh.io/v1" {
		t.Errorf("PodSet's entry: %+v", k)
	}
}

// K2, R9, R16, R4: a declared kind is read, pinned and judged on the
// cluster like a built-in one: its containers and init containers are
// read from the declared pod template, one JSON patch writes every image
// and nothing else of the template, and the write is unsettled until its
// controller observes the new generation.
func TestDeclaredKind_K2_R9_R16_R4_ReadPinnedInOneWriteAndSettledByItsStatus(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	dyn := testenv.InstallPodSet(t, c.Config)
	if err := workload.Declare([]config.DeclaredKind{testenv.PodSet}); err != nil {
		t.Fatal(err)
	}
	wc.SetDynamic(dyn)
	testenv.CreatePodSet(t, dyn, ns, "shop", testenv.WithContainer("app", appTag), testenv.WithInitContainer("migrate", appTag), testenv.WithSidecar("shipper", proxyTag))
	driver := testenv.DrivePodSet(t, dyn, ns, "shop")
	driver.WaitObserved(t, 1)
	ref := config.Workload{Kind: "PodSet", Namespace: ns, Name: "shop"}

	obj := mustGet(t, wc, ref)
	var got []string
	for _, ctr := range obj.Containers {
		got = append(got, ctr.PodImage().String()+"="+ctr.Image)
	}
	want := []string{"container app=" + appTag, "init container migrate=" + appTag, "init container shipper=" + proxyTag}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("images read %q, want %q", got, want)
	}
	if !obj.Settled.Settled || obj.Selector == nil || obj.Selector.MatchLabels["app"] != "shop" {
		t.Fatalf("read: settled %+v, selector %v; want settled and spec.selector", obj.Settled, obj.Selector)
	}

	before, err := dyn.Resource(testenv.PodSetResource).Namespace(ns).Get(context.Background(), "shop", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	driver.Hold(true)
	const d = "@sha256:1111111111111111111111111111111111111111111111111111111111111111"
	wrote, err := wc.SetImages(context.Background(), obj, []workload.ImageChange{
		{Container: "app", From: appTag, To: appTag + d},
		{Container: "migrate", From: appTag, To: appTag + d},
	})
	if err != nil || !wrote {
		t.Fatalf("SetImages: wrote %v, %v", wrote, err)
	}
	after, err := dyn.Resource(testenv.PodSetResource).Namespace(ns).Get(context.Background(), "shop", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.GetGeneration() != before.GetGeneration()+1 {
		t.Errorf("generation %d → %d, want one write (R9)", before.GetGeneration(), after.GetGeneration())
	}
	// R16: the template is the one before with two image fields changed.
	wantTmpl, _, _ := unstructured.NestedMap(before.Object, "spec", "template")
	ctrs := wantTmpl["spec"].(map[string]any)["containers"].([]any)
	ctrs[0].(map[string]any)["image"] = appTag + d
	inits := wantTmpl["spec"].(map[string]any)["initContainers"].([]any)
	inits[0].(map[string]any)["image"] = appTag + d
	gotTmpl, _, _ := unstructured.NestedMap(after.Object, "spec", "template")
	if !reflect.DeepEqual(gotTmpl, wantTmpl) {
		t.Errorf("the pod template changed beyond the two images:\n got %v\nwant %v", gotTmpl, wantTmpl)
	}

	// Held: the new generation is not observed, so not settled (R4).
	obj = mustGet(t, wc, ref)
	if obj.Settled.Settled || !obj.Settled.Unobserved {
		t.Errorf("right after the write with the controller held: %+v, want unobserved", obj.Settled)
	}
	driver.Hold(false)
	driver.WaitObserved(t, after.GetGeneration())
	if obj = mustGet(t, wc, ref); !obj.Settled.Settled {
		t.Errorf("after the controller observed the write: %+v, want settled", obj.Settled)
	}
	// A stall is a failure V2 acts on at once.
	driver.Stall("the new pods cannot pull their image")
	if obj = mustGet(t, wc, ref); obj.Settled.Settled || obj.Settled.FailedReason() != "the new pods cannot pull their image" {
		t.Errorf("stalled: %+v, want failed with the condition's message", obj.Settled)
	}

	// The workload's own other writers see a normal object: a merge patch
	// of another field by another manager is not disturbed.
	if _, err := dyn.Resource(testenv.PodSetResource).Namespace(ns).Patch(context.Background(), "shop", types.MergePatchType,
		[]byte(`{"spec":{"replicas":3}}`), metav1.PatchOptions{FieldManager: "helm"}); err != nil {
		t.Fatal(err)
	}
	if obj = mustGet(t, wc, ref); obj.Containers[0].Image != appTag+d {
		t.Errorf("after another writer's patch the pin reads %s", obj.Containers[0].Image)
	}
}
