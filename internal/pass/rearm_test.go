package pass_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/pass"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// TestRearm_R18_ClearsTheLockoutKeysInOneSwapAndRecordsAnEvent re-arms a
// locked-out group on a real apiserver: the attempt, the lockout marker and
// the image's quarantine go, its record stays, a RefreshRearmed Event is on
// the anchor; a second re-arm finds nothing to clear and records nothing.
func TestRearm_R18_ClearsTheLockoutKeysInOneSwapAndRecordsAnEvent(t *testing.T) {
	c := testenv.Cluster(t)
	ns := testenv.Namespace(t, c.Client)
	const prefix = "tracebloc.io"
	keys := state.Keys{Prefix: prefix}
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithContainer("app", "registry.test/acme/api:prod"),
		testenv.WithAnnotations(map[string]string{
			keys.Attempt():       "3",
			keys.Flap():          "true",
			keys.LockedOn("api"): "sha256:aa",
			keys.Record("api"):   "sha256:bb",
			keys.SuspendReason(): "kept: not a rearm key",
		}))
	cfg := config.Defaults()
	cfg.AnnotationPrefix = prefix
	anchor := config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"}
	g := config.Group{Name: "api", Anchor: anchor, Images: []config.Image{{Name: "api", Repository: "registry.test/acme/api", Tag: "prod"}}}
	cfg.Groups = []config.Group{g}
	r := &pass.Runner{Config: cfg, Kube: c.Client, Workloads: workload.New(c.Client, 10*time.Second)}
	ctx := context.Background()

	got, err := r.Rearm(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{keys.Attempt(), keys.Flap(), keys.LockedOn("api")}
	slices.Sort(want)
	cleared := slices.Sorted(slices.Values(got.Cleared))
	if !slices.Equal(cleared, want) {
		t.Errorf("cleared %v, want %v", got.Cleared, want)
	}
	obj, err := r.Workloads.Get(ctx, anchor)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range want {
		if v, ok := obj.Annotations[k]; ok {
			t.Errorf("after rearm the anchor still has %s=%q", k, v)
		}
	}
	for _, k := range []string{keys.Record("api"), keys.SuspendReason()} {
		if _, ok := obj.Annotations[k]; !ok {
			t.Errorf("rearm removed %s, which it must keep", k)
		}
	}
	events := func() int {
		t.Helper()
		evs, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.uid=" + string(obj.UID) + ",reason=RefreshRearmed",
		})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, ev := range evs.Items {
			if ev.Message == got.Message {
				n++
			}
		}
		return n
	}
	if n := events(); n != 1 {
		t.Fatalf("%d RefreshRearmed events with message %q, want 1", n, got.Message)
	}

	again, err := r.Rearm(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Cleared) != 0 || again.Message == "" {
		t.Errorf("a second rearm cleared %v (message %q), want nothing to do", again.Cleared, again.Message)
	}
	if n := events(); n != 1 {
		t.Errorf("%d RefreshRearmed events after a rearm with nothing to do, want still 1", n)
	}
}
