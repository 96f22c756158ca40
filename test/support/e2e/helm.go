package e2e

import (
	"context"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/test/support/testwait"
)

// DeployHistory records every version of one Deployment the API server
// stored (a watch from the current resourceVersion on): its
// resourceVersion, generation, container images and annotations, and when
// the watch delivered it.
type DeployHistory struct {
	Mu       sync.Mutex
	Versions []DeployVersion
	Seen     map[string]bool // every resourceVersion delivered, and the first
	E        *Env
	Name     string
	Cancel   context.CancelFunc
	Done     chan struct{}
	changed  chan struct{} // closed and replaced on each version the watch delivers
}

// DeployVersion is one version of a Deployment a watch saw.
type DeployVersion struct {
	Rv          string
	Generation  int64
	Images      map[string]string
	Annotations map[string]string
	At          time.Time
}

// String is the version as a test failure prints it.
func (v DeployVersion) String() string {
	return fmt.Sprintf("rv %s gen %d %v", v.Rv, v.Generation, v.Images)
}

// WatchDeployment records every version of Deployment name from now on,
// until Stop or the end of the test.
func (e *Env) WatchDeployment(name string) *DeployHistory {
	e.T.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := &DeployHistory{Cancel: cancel, Done: make(chan struct{}), E: e, Name: name, changed: make(chan struct{})}
	rv := e.Deployment(name).ResourceVersion
	h.Seen = map[string]bool{rv: true}
	w, err := e.C.Client.AppsV1().Deployments(e.NS).Watch(ctx, metav1.ListOptions{
		FieldSelector: "metadata.name=" + name, ResourceVersion: rv,
	})
	if err != nil {
		e.T.Fatal(err)
	}
	go func() {
		defer close(h.Done)
		defer w.Stop()
		for ev := range w.ResultChan() {
			if d, ok := ev.Object.(*appsv1.Deployment); ok {
				h.Mu.Lock()
				h.Versions = append(h.Versions, DeployVersion{d.ResourceVersion, d.Generation, WhImages(d), d.Annotations, time.Now()})
				h.Seen[d.ResourceVersion] = true
				close(h.changed)
				h.changed = make(chan struct{})
				h.Mu.Unlock()
			}
		}
	}()
	e.T.Cleanup(h.Stop)
	return h
}

// Take returns every version seen so far (once the watch delivered the
// one the API server holds now) and forgets them.
func (h *DeployHistory) Take() []DeployVersion {
	h.E.T.Helper()
	// The version the API server holds now: the watch delivers it (or
	// did), and announces each version it delivers.
	rv := h.E.Deployment(h.Name).ResourceVersion
	bound := time.NewTimer(60 * time.Second) // a hang, not a window
	defer bound.Stop()
	for {
		h.Mu.Lock()
		seen, changed := h.Seen[rv], h.changed
		h.Mu.Unlock()
		if seen {
			break
		}
		select {
		case <-changed:
		case <-h.Done:
			h.E.T.Fatalf("the watch of %s ended before it delivered resourceVersion %s", h.Name, rv)
		case <-bound.C:
			h.E.T.Fatalf("the watch of %s did not deliver resourceVersion %s within 60s", h.Name, rv)
		}
	}
	h.Mu.Lock()
	defer h.Mu.Unlock()
	out := h.Versions
	h.Versions = nil
	return out
}

// First returns the earliest version seen so far that match accepts,
// without forgetting any.
func (h *DeployHistory) First(match func(DeployVersion) bool) (DeployVersion, bool) {
	h.Mu.Lock()
	defer h.Mu.Unlock()
	for _, v := range h.Versions {
		if match(v) {
			return v, true
		}
	}
	return DeployVersion{}, false
}

// Await waits until a version match accepts was seen and returns the
// earliest, as First: checked at once and again on each version the watch
// delivers, not on a timer; the test's deadline bounds a hang. It fails at
// once if the watch ended first.
func (h *DeployHistory) Await(what string, match func(DeployVersion) bool) DeployVersion {
	h.E.T.Helper()
	var v DeployVersion
	testwait.Until(h.E.T, what, h.changes, func() bool {
		var ok bool
		if v, ok = h.First(match); ok {
			return true
		}
		select {
		case <-h.Done:
			h.E.T.Fatalf("%s: the watch of %s ended", what, h.Name)
		default:
		}
		return false
	})
	return v
}

// changes is closed at the next version the watch delivers.
func (h *DeployHistory) changes() <-chan struct{} {
	h.Mu.Lock()
	defer h.Mu.Unlock()
	return h.changed
}

// Stop ends the watch.
func (h *DeployHistory) Stop() {
	h.Cancel()
	<-h.Done
}
