package discoverer

import (
	"context"
	"net/http"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// nothing is a client.Reader that finds nothing.
type nothing struct{}

func (nothing) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return nil
}
func (nothing) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

// TestCaches_D1_AReadDoesNotWaitForANamespaceCacheToStart: while a pass
// starts the cache of a newly labelled namespace (its informers, its
// sync), the controller's reads are routed as before, not held behind
// the router's mutex; once it synced, the namespace's reads go to it.
func TestCaches_D1_AReadDoesNotWaitForANamespaceCacheToStart(t *testing.T) {
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(corev1.SchemeGroupVersion.WithKind("Pod"), meta.RESTScopeNamespace)
	n := &Caches{
		rc: &rest.Config{Host: "http://127.0.0.1:1"}, scheme: scheme.Scheme,
		mapper: mapper, httpClient: http.DefaultClient,
		main: nil, api: nothing{}, covered: map[string]bool{}, caches: map[string]*namespaceCache{},
		watch: func(cache.Cache) error { return nil },
	}
	entered, release := make(chan struct{}), make(chan struct{})
	n.trigger = func(context.Context, cache.Cache) error {
		close(entered)
		<-release
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	stuck, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	defer cancel()
	defer n.start(ctx)()
	synced := make(chan error, 1)
	go func() { synced <- n.sync(ctx, map[string]bool{"shop": true}, false) }()
	select {
	case <-entered:
	case err := <-synced:
		t.Fatalf("sync ended before it added the handlers: %v", err)
	}
	read := make(chan error, 1)
	go func() {
		var pods corev1.PodList // outside the caches: from the API
		read <- n.List(ctx, &pods, client.InNamespace("shop"))
	}()
	select {
	case err := <-read:
		if err != nil {
			t.Fatal(err)
		}
	case <-stuck.Done():
		// The read is in memory (nothing): it ends at once unless the
		// router's mutex holds it behind the start. The bound only keeps a
		// broken router from hanging the test binary.
		close(release)
		<-synced
		t.Fatal("a read waited for the cache of a labelled namespace to start")
	}
	close(release)
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if _, ok := n.reader("shop", &corev1.PodList{}).(cache.Cache); !ok {
		t.Errorf("after the sync, the reads of namespace shop do not go to its cache")
	}
}
