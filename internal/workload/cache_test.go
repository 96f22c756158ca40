package workload_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

// The guard must know a generation bump that only image-refresh's own
// annotation write caused (R4): such a bump is judged by the status, while
// a generation another writer moved stays unobserved.
func TestExcuseOwnBumps_R4_OnlyGenerationsOwnAnnotationWritesCausedAreExcused(t *testing.T) {
	wc := workload.New(nil, 0)
	ref := config.Workload{Kind: workload.KindDeployment, Namespace: "ns", Name: "api"}
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
	ref := config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inf := deploymentCache(ctx, t, c.Config, ns)
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

// countGets counts the GETs of one Deployment through a client of its own.
type countGets struct {
	rt   http.RoundTripper
	path string
	n    atomic.Int64
}

func (c *countGets) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, c.path) {
		c.n.Add(1)
	}
	return c.rt.RoundTrip(r)
}

// Once the cache holds an own write or a later version, Cached reads from
// the cache, also when another write (a rollout's status) has moved it
// past the write's exact resourceVersion: no direct GET (issue 13: 0 API
// requests in the steady state). Before that it reads directly (R4: never
// decide on the object from before the own write).
func TestCached_C6_AfterTheWatchDeliveredAnOwnWriteTheCacheIsTrusted(t *testing.T) {
	t.Parallel()
	c, _, ns := setup(t)
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithReplicas(0))
	ref := config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"}
	cfg := rest.CopyConfig(c.Config)
	gets := &countGets{path: "/namespaces/" + ns + "/deployments/api"}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { gets.rt = rt; return gets })
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	wc := workload.New(kube, apiTimeout)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inf, err := cache.New(c.Config, cache.Options{Scheme: scheme.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}})
	if err != nil {
		t.Fatal(err)
	}
	di, err := inf.GetInformer(ctx, &appsv1.Deployment{})
	if err != nil {
		t.Fatal(err)
	}
	delivered := make(chan string, 16) // resourceVersions, in watch order
	if _, err := di.AddEventHandler(toolscache.ResourceEventHandlerFuncs{UpdateFunc: func(_, n any) {
		delivered <- n.(*appsv1.Deployment).ResourceVersion
	}}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = inf.Start(ctx) }()
	if !inf.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	wc.SetCache(inf)
	waitFor := func(rv string) {
		t.Helper()
		for testwait.Recv(t, delivered, "the watch to deliver resourceVersion "+rv) != rv {
		}
	}

	own, err := wc.UpdateAnnotations(ctx, ref, nil, map[string]*string{attemptKey: ptr("1")})
	if err != nil {
		t.Fatal(err)
	}
	// Another writer moves the object on; its event comes after the own
	// write's, so once it arrived both did.
	d, err := c.Client.AppsV1().Deployments(ns).Patch(ctx, "api", types.MergePatchType, []byte(`{"metadata":{"labels":{"moved":"on"}}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d.ResourceVersion == own.ResourceVersion {
		t.Fatalf("setup: the other write did not move the resourceVersion (%s)", d.ResourceVersion)
	}
	waitFor(d.ResourceVersion)

	before := gets.n.Load()
	obj, err := wc.Cached(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	// Cached ran and read the newest object (the proof the check below
	// is not vacuous) ...
	if obj.ResourceVersion != d.ResourceVersion || obj.Annotations[attemptKey] != "1" {
		t.Fatalf("read resourceVersion %s with attempt %q, want %s with attempt 1", obj.ResourceVersion, obj.Annotations[attemptKey], d.ResourceVersion)
	}
	// ... from the cache, not with a GET.
	if n := gets.n.Load() - before; n != 0 {
		t.Errorf("%d direct GETs after the watch delivered the own write, want 0", n)
	}
}

// Reads from the informer cache skip its deep copy (C6: a resync over
// 10,000 workloads must not copy every one), so the Object they return
// must share nothing a caller can change with the cache's own object.
func TestCached_C6_AnObjectReadFromTheCacheSharesNothingWithIt(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithReplicas(0), testenv.WithAnnotations(map[string]string{recordKey: "sha256:1"}))
	ref := config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inf := deploymentCache(ctx, t, c.Config, ns)
	wc.SetCache(inf)

	first, err := wc.Cached(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if first.Selector == nil || len(first.Selector.MatchLabels) == 0 || first.Annotations[recordKey] != "sha256:1" || len(first.Containers) == 0 {
		t.Fatalf("setup: read %+v, want a selector, the record and a container", first)
	}
	want := fmt.Sprintf("%v %v %v", first.Selector.MatchLabels, first.Annotations, first.Containers)
	for k := range first.Selector.MatchLabels {
		first.Selector.MatchLabels[k] = "changed"
	}
	first.Selector.MatchLabels["added"] = "x"
	first.Annotations[recordKey] = "changed"
	first.Containers[0].Image = "changed"

	again, err := wc.Cached(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%v %v %v", again.Selector.MatchLabels, again.Annotations, again.Containers); got != want {
		t.Errorf("a change to a read Object reached the cache:\n got %s\nwant %s", got, want)
	}
	var d appsv1.Deployment
	if err := inf.Get(ctx, types.NamespacedName{Namespace: ns, Name: "api"}, &d); err != nil {
		t.Fatal(err)
	}
	if _, ok := d.Spec.Selector.MatchLabels["added"]; ok {
		t.Errorf("the cache's selector was changed through a read Object: %v", d.Spec.Selector.MatchLabels)
	}
}

// deploymentCache starts an informer cache of ns's Deployments, as the
// controller's, and returns it synced; it stops with ctx.
func deploymentCache(ctx context.Context, t *testing.T, cfg *rest.Config, ns string) cache.Cache {
	t.Helper()
	inf, err := cache.New(cfg, cache.Options{Scheme: scheme.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}})
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
	return inf
}
