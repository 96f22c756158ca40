package refresh

import (
	"fmt"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
)

// readTargets checks every target of img is readable (R7, fail-closed) and
// exists (R19); otherwise it counts the read-failure streak and skips img.
func (d *decision) readTargets(img config.Image) bool {
	ok := true
	for _, t := range img.Targets {
		w, read := d.obs.Workloads[t.Workload()]
		if !read || w.Err != nil {
			ok = false
			err := w.Err
			if !read {
				err = fmt.Errorf("not read")
			}
			d.row(img, t, StateError, fmt.Sprintf("read %s: %v", t.Workload(), err), "")
			continue
		}
		c, found := w.Containers[t.Container]
		if !found {
			ok = false
			msg := fmt.Sprintf("configuration error: %s has no container %q (target %s)", t.Workload(), t.Container, t)
			rem := "fix the container name of this target in the config"
			d.find(Finding{Severity: SeverityError, Reason: ReasonRefreshError, Image: img.Name, Target: &t, Message: msg, Remediation: rem, NeedsHuman: true})
			d.row(img, t, StateError, msg, rem)
			continue
		}
		if _, err := imageref.Parse(c.Image); err != nil {
			ok = false
			d.row(img, t, StateUnreadable, fmt.Sprintf("live image unreadable: %v", err),
				"fix the image reference of this container in its workload (or chart)")
		}
	}
	key := d.keys.ReadFailures(img.Name)
	if ok {
		d.clear(&d.p.Bookkeeping, key)
		return true
	}
	n, ceiling := d.counter(key)
	msg := fmt.Sprintf("could not read the live image of every target of %s; image skipped this tick (failure %d of %d)", img.Name, n, d.s.MaxReadFailures)
	f := Finding{Severity: SeverityWarn, Image: img.Name, Message: msg}
	if ceiling {
		f = Finding{Severity: SeverityError, Reason: ReasonRefreshError, Image: img.Name, Message: msg, NeedsHuman: true,
			Remediation: "see the target rows in `image-refresh status`: fix the workload, container name or RBAC"}
	}
	d.find(f)
	return false
}

func (d *decision) addChange(w config.Workload, c ImageChange) {
	if _, ok := d.changes[w]; !ok {
		d.order = append(d.order, w)
	}
	d.changes[w] = append(d.changes[w], c)
}

func (d *decision) allOn(img config.Image, digest string) bool {
	for _, t := range img.Targets {
		if imageref.DigestOf(d.obs.Workloads[t.Workload()].Containers[t.Container].Image) != digest {
			return false
		}
	}
	return true
}
