package statestore_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/statestore"
	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

const prefix = "tracebloc.io"

// requests counts API requests by "METHOD resource" (resource: the path
// segment after the namespace, e.g. configmaps or deployments).
type requests struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *requests) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
		resource := ""
		for i, p := range parts {
			if p == "namespaces" && i+2 < len(parts) {
				resource = parts[i+2]
			}
		}
		r.mu.Lock()
		r.n[req.Method+" "+resource]++
		r.mu.Unlock()
		return rt.RoundTrip(req)
	})
}

func (r *requests) take() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.n
	r.n = map[string]int{}
	return out
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// copies is the reader a store takes the copies from in `run`. It
// answers from the API through a client of its own (not counted), so a
// test decides what it shows: the current copy, or (stale) the copy as
// it was when hold was called, as an informer that has not delivered the
// last write yet shows it.
type copies struct {
	kube kubernetes.Interface
	mu   sync.Mutex
	held *corev1.ConfigMap
	stop bool
}

func (c *copies) Get(ctx context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	c.mu.Lock()
	held, stop := c.held, c.stop
	c.mu.Unlock()
	cm := held
	if !stop {
		var err error
		if cm, err = c.kube.CoreV1().ConfigMaps(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{}); err != nil {
			return err
		}
	}
	cm.DeepCopyInto(obj.(*corev1.ConfigMap))
	return nil
}

func (c *copies) List(context.Context, client.ObjectList, ...client.ListOption) error {
	panic("not used")
}

// hold makes the reader show the copy as it is now from then on.
func (c *copies) hold(t *testing.T, ns, name string) {
	t.Helper()
	cm, err := c.kube.CoreV1().ConfigMaps(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.held, c.stop = cm, true
	c.mu.Unlock()
}

func setup(t *testing.T) (*statestore.Store, *requests, *copies, config.Workload) {
	t.Helper()
	c := testenv.Cluster(t)
	ns := testenv.Namespace(t, c.Client)
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithContainer("app", "registry.test/acme/api:prod"))
	counted := &requests{n: map[string]int{}}
	rc := rest.CopyConfig(c.Config)
	rc.WrapTransport = counted.wrap
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	cache := &copies{kube: c.Client}
	s := &statestore.Store{Prefix: prefix, Kube: kube, Workloads: workload.New(kube, 10*time.Second)}
	s.SetCache(cache)
	return s, counted, cache, config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"}
}

func ptr(s string) *string { return &s }

func update(t *testing.T, s *statestore.Store, ref config.Workload, set map[string]*string) *workload.Object {
	t.Helper()
	out, err := s.Update(context.Background(), ref, nil, set)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestUpdate_R25_AStateWriteInRunReadsTheCopyFromTheCache(t *testing.T) {
	t.Parallel()
	s, counted, _, ref := setup(t)
	keys := state.Keys{Prefix: prefix}
	update(t, s, ref, map[string]*string{keys.Attempt(): ptr("1")}) // creates the copy
	counted.take()

	update(t, s, ref, map[string]*string{keys.Attempt(): nil})
	got := counted.take()
	// One GET and PATCH of the anchor per try (a 409 from the
	// controller-manager's status write is retried, more often under load),
	// one PUT of the copy, and no GET of it.
	tries := got["PATCH deployments"]
	if tries < 1 || got["GET deployments"] != tries || got["PUT configmaps"] != 1 || got["GET configmaps"] != 0 || len(got) != 3 {
		t.Fatalf("requests of a state write: %v, want GET and PATCH of the anchor per try, one PUT of the copy and no GET of it (the copy from the cache)", got)
	}
}

func TestUpdate_R25_ACacheWithoutTheOwnLastWriteIsNotTrusted(t *testing.T) {
	t.Parallel()
	s, counted, cache, ref := setup(t)
	keys := state.Keys{Prefix: prefix}
	update(t, s, ref, map[string]*string{keys.Attempt(): ptr("1")})
	cache.hold(t, ref.Namespace, statestore.Name(ref)) // the cache stops here
	update(t, s, ref, map[string]*string{keys.Attempt(): ptr("2")})
	counted.take()

	// The cache lacks the write of attempt 2: the copy is read from the
	// API, and its write lands on the first try.
	update(t, s, ref, map[string]*string{keys.Attempt(): ptr("3")})
	got := counted.take()
	// The copy is read from the API on each try of the anchor's write (a
	// 409 is retried), and written once.
	if tries := got["PATCH deployments"]; tries < 1 || got["GET configmaps"] != tries || got["PUT configmaps"] != 1 {
		t.Fatalf("requests of a state write after an own write the cache lacks: %v, want a GET of the copy per try of the anchor's PATCH and one PUT of it", got)
	}
	assertCopy(t, s, ref, keys.Attempt(), "3")
}

func TestUpdate_R25_ARewoundAnchorIsWrittenOnTheCopyReadFromTheAPI(t *testing.T) {
	t.Parallel()
	s, counted, cache, ref := setup(t)
	keys := state.Keys{Prefix: prefix}
	rec := keys.Record("api")
	old := update(t, s, ref, map[string]*string{rec: ptr("sha256:old")})
	update(t, s, ref, map[string]*string{rec: ptr("sha256:mid")})
	cache.hold(t, ref.Namespace, statestore.Name(ref)) // shows sha256:mid
	// Another process writes sha256:new, which this store's cache has not
	// delivered: nothing of its own is missing from it.
	other := &statestore.Store{Prefix: prefix, Kube: cache.kube, Workloads: workload.New(cache.kube, 10*time.Second)}
	update(t, other, ref, map[string]*string{rec: ptr("sha256:new")})

	// A rollback puts the first write's annotations back on the anchor.
	rewind := map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		rec: old.Annotations[rec], keys.Generation(): old.Annotations[keys.Generation()]}}}
	patchJSON(t, s.Kube, ref, rewind)
	counted.take()

	// The cached copy (mid) is newer than the anchor (old): it would
	// decide, so the copy is read from the API (new), and the write lands
	// on new, not on what the cache shows.
	attempt := keys.Attempt()
	out, err := s.Update(context.Background(), ref, map[string]*string{rec: ptr("sha256:new")}, map[string]*string{attempt: ptr("1")})
	if err != nil {
		t.Fatal(err)
	}
	if got := counted.take(); got["PATCH deployments"] < 1 || got["GET configmaps"] != got["PATCH deployments"] {
		t.Fatalf("requests of a state write on a rewound anchor: %v, want the copy read from the API on each try of the anchor's PATCH", got)
	}
	if out.Annotations[rec] != "sha256:new" || out.Annotations[attempt] != "1" {
		t.Fatalf("anchor after the write: record %q attempt %q, want sha256:new and 1", out.Annotations[rec], out.Annotations[attempt])
	}
	assertCopy(t, s, ref, rec, "sha256:new")
}

func patchJSON(t *testing.T, kube kubernetes.Interface, ref config.Workload, patch map[string]any) {
	t.Helper()
	data, err := json.Marshal(patch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.AppsV1().Deployments(ref.Namespace).Patch(context.Background(), ref.Name, types.MergePatchType, data, metav1.PatchOptions{FieldManager: "kubectl-rollout"}); err != nil {
		t.Fatal(err)
	}
}

func assertCopy(t *testing.T, s *statestore.Store, ref config.Workload, key, want string) {
	t.Helper()
	cm, err := s.Kube.CoreV1().ConfigMaps(ref.Namespace).Get(context.Background(), statestore.Name(ref), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := (state.Keys{Prefix: prefix}).FromData(cm.Data).Values[key]
	if got != want {
		t.Fatalf("copy's %s = %q, want %q (data %v)", key, got, want, cm.Data)
	}
}
