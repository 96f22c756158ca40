package operator

import (
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/image-refresh/image-refresh/internal/workload"
)

func settled(o client.Object) bool { return workload.SettlednessOf(o).Settled }

// ownWrite reports whether image-refresh wrote every image that changed
// from oldObj to newObj (the field manager of .image, R17): its re-pins and
// digest changes, which are not reverts (C6).
func ownWrite(oldObj, newObj client.Object) bool {
	before := workload.Images(oldObj)
	managers := workload.ImageManagers(newObj)
	for name, img := range workload.Images(newObj) {
		if before[name] != img && managers[name] != workload.FieldManager {
			return false
		}
	}
	return true
}

// imagesChanged: any image of the pod template, init containers and image
// volumes included (K1).
func imagesChanged(oldObj, newObj client.Object) bool {
	o, n := workload.PodSpec(oldObj), workload.PodSpec(newObj)
	return o == nil || n == nil || !workload.SameImages(o, n)
}

// interesting decides which watch events start a reconcile. Not every
// status update: a stuck rollout would otherwise burn an attempt per event
// instead of per interval (R10). It reacts to
//   - an image change (a revert to re-pin within seconds, C1),
//   - a workload that became settled (an unconfirmed rollout to confirm),
//   - a state annotation removed (a rearm, R18),
//   - creation and deletion.
func (c *Controller) interesting(e event.UpdateEvent) bool {
	switch {
	case imagesChanged(e.ObjectOld, e.ObjectNew):
		c.observedRevert(e.ObjectOld, e.ObjectNew)
		return true
	case !settled(e.ObjectOld) && settled(e.ObjectNew):
		return true
	}
	for k := range e.ObjectOld.GetAnnotations() {
		if _, still := e.ObjectNew.GetAnnotations()[k]; !still && c.isStateKey(k) {
			return true
		}
	}
	// O1: a suspension set, changed or ended shows in status at once, and
	// an end moved earlier is requeued for.
	for _, k := range []string{c.keys().Suspend(), c.keys().SuspendReason()} {
		if e.ObjectOld.GetAnnotations()[k] != e.ObjectNew.GetAnnotations()[k] {
			return true
		}
	}
	return false
}
