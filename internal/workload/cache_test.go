package workload_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/image-refresh/image-refresh/internal/testenv"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// The guard must know a generation bump that only image-refresh's own
// annotation write caused (R4): such a bump is judged by the status, while
// a generation another writer moved stays unobserved.
func TestExcuseOwnBumps_R4_OnlyGenerationsOwnAnnotationWritesCausedAreExcused(t *testing.T) {
	wc := workload.New(nil, 0)
	ref := workload.Ref{Kind: workload.KindDeployment, Namespace: "ns", Name: "api"}
	d := func(gen, observed int64, updated int32) *workload.Object {
		one := int32(1)
		dep := &appsv1.Deployment{}
		dep.Namespace, dep.Name, dep.Generation = ref.Namespace, ref.Name, gen
		dep.Spec.Replicas = &one
		dep.Status = appsv1.DeploymentStatus{ObservedGeneration: observed, Replicas: 1, UpdatedReplicas: updated, AvailableReplicas: 1}
		return workload.FromObject(dep)
	}
	workload.Bumped(wc, d(4, 4, 1), d(5, 4, 1)) // own write: 4 → 5
	for _, tc := range []struct {
		name         string
		obj          *workload.Object
		wantSettled  bool
		wantOwnBumps bool
	}{
		{"own bump only, status settled", d(5, 4, 1), true, true},
		{"own bump only, status not settled", d(5, 4, 0), false, true},
		{"another writer's bump after the own one", d(6, 4, 1), false, false},
		{"observed: nothing to excuse", d(5, 5, 1), true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := tc.obj
			workload.ExcuseOwnBumps(wc, obj)
			if obj.Settled.Settled != tc.wantSettled || obj.Settled.OwnBumps != tc.wantOwnBumps {
				t.Errorf("settled %v (%q), own bumps %v; want settled %v, own bumps %v",
					obj.Settled.Settled, obj.Settled.Reason, obj.Settled.OwnBumps, tc.wantSettled, tc.wantOwnBumps)
			}
			if !tc.wantSettled && !tc.wantOwnBumps && !obj.Settled.Unobserved && obj.Settled.Generation != 0 {
				t.Errorf("another writer's generation read as observed: %+v", obj.Settled)
			}
		})
	}
}

// With the informer cache (run), a read right after an own annotation write
// sees that write (never the object from before it) and is settled at once,
// without the wait a direct read needs: the bump is image-refresh's own.
func TestGetObserved_R4_FromTheCacheAnOwnAnnotationWriteIsSettledAtOnce(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithReplicas(1))
	ref := workload.Ref{Kind: "Deployment", Namespace: ns, Name: "api"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inf, err := cache.New(c.Config, cache.Options{Scheme: scheme.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inf.GetInformer(ctx, &appsv1.Deployment{}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = inf.Start(ctx) }()
	if !inf.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	wc.SetCache(inf)
	settle(t, c, ref)
	excused := 0
	for i := range 10 {
		if _, err := wc.UpdateAnnotations(ctx, ref, nil, map[string]*string{attemptKey: ptr(fmt.Sprint(i + 1))}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		obj, err := wc.GetObserved(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if obj.Annotations[attemptKey] != fmt.Sprint(i+1) {
			t.Errorf("write %d: read the object from before the write (attempt %q)", i+1, obj.Annotations[attemptKey])
		}
		if !obj.Settled.Settled {
			t.Errorf("write %d: read as %q right after an own annotation write", i+1, obj.Settled.Reason)
		}
		if obj.Settled.OwnBumps {
			excused++
		}
		t.Logf("write %d: read in %s, own bump excused: %v", i+1, time.Since(start).Round(time.Microsecond), obj.Settled.OwnBumps)
	}
	t.Logf("%d of 10 reads found the controller behind on an own write and judged by the status", excused)
}
