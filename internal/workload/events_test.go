package workload_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

func TestEvent_R15_RecordsOnTheWorkloadAndCountsRepeats(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	// The recorder's clock, so that the repeat lands a second later
	// without waiting one out (Event timestamps have second precision).
	now := time.Now().Truncate(time.Second)
	wc.Now = func() time.Time { return now }
	testenv.Deployment(t, c.Client, ns, "api")
	obj := mustGet(t, wc, config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"})
	ctx := context.Background()
	const reason, message = "RefreshLockedOut", "3 refresh attempts did not settle; run `image-refresh rearm` to re-arm"
	list := func() []corev1.Event {
		t.Helper()
		evs, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
			// The deployment controller records its own events on it too.
			FieldSelector: "involvedObject.uid=" + string(obj.UID) + ",source=image-refresh",
		})
		if err != nil {
			t.Fatal(err)
		}
		return evs.Items
	}

	if err := wc.Event(ctx, obj, corev1.EventTypeWarning, reason, message); err != nil {
		t.Fatal(err)
	}
	evs := list()
	if len(evs) != 1 {
		t.Fatalf("%d events, want 1", len(evs))
	}
	ev := evs[0]
	wantObj := corev1.ObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "api", Namespace: ns, UID: obj.UID}
	if ev.InvolvedObject != wantObj {
		t.Errorf("involvedObject %+v, want %+v", ev.InvolvedObject, wantObj)
	}
	if ev.Type != corev1.EventTypeWarning || ev.Reason != reason || ev.Message != message || ev.Count != 1 {
		t.Errorf("event %s %s %q count %d", ev.Type, ev.Reason, ev.Message, ev.Count)
	}
	if !ev.FirstTimestamp.Equal(&metav1.Time{Time: now}) || !ev.LastTimestamp.Equal(&metav1.Time{Time: now}) {
		t.Errorf("timestamps %s / %s, want the recorder's clock %s", ev.FirstTimestamp, ev.LastTimestamp, now)
	}
	if ev.Source.Component != "image-refresh" || ev.ReportingController != "image-refresh" {
		t.Errorf("reported by %q / %q, want image-refresh", ev.Source.Component, ev.ReportingController)
	}

	now = now.Add(time.Second)
	if err := wc.Event(ctx, obj, corev1.EventTypeWarning, reason, message); err != nil {
		t.Fatal(err)
	}
	evs = list()
	if len(evs) != 1 || evs[0].Count != 2 || !evs[0].LastTimestamp.After(ev.LastTimestamp.Time) || !evs[0].LastTimestamp.Time.Equal(now) {
		t.Fatalf("after a repeat: %d events, first with count %d, lastTimestamp %s (was %s); want one with count 2, later",
			len(evs), evs[0].Count, evs[0].LastTimestamp, ev.LastTimestamp)
	}

	if err := wc.Event(ctx, obj, corev1.EventTypeWarning, reason, "another message"); err != nil {
		t.Fatal(err)
	}
	if n := len(list()); n != 2 {
		t.Errorf("%d events after a different message, want 2", n)
	}
	if err := wc.Event(ctx, obj, "Error", reason, message); err == nil {
		t.Error("an event of type Error was accepted")
	}
}
