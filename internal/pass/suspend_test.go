package pass_test

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/pass"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/statestore"
	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// TestSuspend_O1_WritesTheSuspensionOnTheAnchorAndItsCopyAndResumeTakesItOff
// suspends and resumes a group on a real apiserver: the suspension (its end,
// reason and who) is on the anchor and in the copy of the state a rollback
// cannot reach (R25), each with its Event; a resume of a group that is not
// suspended writes nothing.
func TestSuspend_O1_WritesTheSuspensionOnTheAnchorAndItsCopyAndResumeTakesItOff(t *testing.T) {
	c := testenv.Cluster(t)
	ns := testenv.Namespace(t, c.Client)
	const prefix = "image-refresh.io"
	keys := state.Keys{Prefix: prefix}
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithContainer("app", "registry.test/acme/api:prod"))
	cfg := config.Defaults()
	cfg.AnnotationPrefix = prefix
	anchor := config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"}
	g := config.Group{Name: "api", Anchor: anchor, Images: []config.Image{{Name: "api", Repository: "registry.test/acme/api", Tag: "prod"}}}
	cfg.Groups = []config.Group{g}
	r := &pass.Runner{Config: cfg, Kube: c.Client, Workloads: workload.New(c.Client, 10*time.Second)}
	ctx := context.Background()
	until := time.Date(2026, 12, 24, 18, 0, 0, 0, time.UTC)

	msg, err := r.Suspend(ctx, g, pass.Suspension{Until: until, Reason: "rolled back by hand, INC-7"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(msg, "until 2026-12-24T18:00:00Z") || !strings.Contains(msg, "INC-7") {
		t.Errorf("message %q, want the end and the reason", msg)
	}
	obj, err := r.Workloads.Get(ctx, anchor)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{keys.Suspend(): "2026-12-24T18:00:00Z", keys.SuspendReason(): "rolled back by hand, INC-7", keys.SuspendedBy(): workload.SuspendFieldManager}
	view, err := r.States().Read(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	cm, err := c.Client.CoreV1().ConfigMaps(ns).Get(ctx, statestore.Name(anchor), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the copy of the state: %v", err)
	}
	for k, v := range want {
		if obj.Annotations[k] != v || view.State[k] != v {
			t.Errorf("%s: anchor %q, state %q; want %q", k, obj.Annotations[k], view.State[k], v)
		}
		if !strings.Contains(strings.Join(mapValues(cm.Data), "\n"), v) {
			t.Errorf("the copy %s does not hold %s=%q: %v", cm.Name, k, v, cm.Data)
		}
	}
	if by := obj.AnnotationManager(keys.Suspend()); by != workload.SuspendFieldManager {
		t.Errorf("P/suspend written by %q, want %q", by, workload.SuspendFieldManager)
	}
	events := func(reason string) int {
		t.Helper()
		evs, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(obj.UID) + ",reason=" + reason})
		if err != nil {
			t.Fatal(err)
		}
		return len(evs.Items)
	}
	if n := events("Suspended"); n != 1 {
		t.Errorf("%d Suspended Events, want 1", n)
	}

	if _, err := r.Resume(ctx, g); err != nil {
		t.Fatal(err)
	}
	obj, err = r.Workloads.Get(ctx, anchor)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{keys.Suspend(), keys.SuspendReason()} {
		if v, ok := obj.Annotations[k]; ok {
			t.Errorf("after resume the anchor still has %s=%q", k, v)
		}
	}
	if n := events("Resumed"); n != 1 {
		t.Errorf("%d Resumed Events, want 1", n)
	}
	again, err := r.Resume(ctx, g)
	if err != nil || !strings.Contains(again, "not suspended; nothing to do") {
		t.Errorf("a second resume: %q, %v; want nothing to do", again, err)
	}
	if n := events("Resumed"); n != 1 {
		t.Errorf("%d Resumed Events after a resume with nothing to do, want still 1", n)
	}
}

func mapValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
