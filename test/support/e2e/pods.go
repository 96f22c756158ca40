package e2e

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ownPods runs reconcile over the pods labelled app=app of ns until ctx
// ends, as a controller does: at once, on every event of a watch of them,
// and on every wake-up; only while the API server cannot be watched, or
// after reconcile returned a timer (a failed read or write), does it retry
// on a timer.
func ownPods(ctx context.Context, client kubernetes.Interface, ns, app string, wake <-chan struct{}, reconcile func(context.Context) <-chan time.Time) {
	pods := client.CoreV1().Pods(ns)
	for ctx.Err() == nil {
		w, err := pods.Watch(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		retry := reconcile(ctx)
		for open := true; open && ctx.Err() == nil; {
			select {
			case <-ctx.Done():
			case _, open = <-w.ResultChan():
			case <-wake:
			case <-retry:
			}
			if open {
				retry = reconcile(ctx)
			}
		}
		w.Stop()
	}
}
