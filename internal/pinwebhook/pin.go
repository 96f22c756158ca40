// Package pinwebhook is fix B's mutating admission webhook (SPEC B1), served by
// `image-refresh run`: on CREATE and UPDATE of a managed target it rewrites
// `repo:tag` (or `repo:tag@<another digest>`) to the pin of the group's
// recorded digest, read from memory (the manager's informer cache of the
// anchors), so that a re-render never stores the bare tag. It never calls
// the registry and never blocks a deploy: any internal error allows the
// request unchanged, and fix A (R7) heals whatever it missed (B3).
package pinwebhook

import (
	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/refresh"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// Container is one container of an admitted pod template.
type Container struct {
	Name  string `json:"name"`
	Image string `json:"image"`
}

// Pin is one container image the webhook rewrites.
type Pin struct {
	Group, Image string // config group and image name
	Target       config.Target
	At           workload.PodImage // where in the pod spec (K1)
	From, To     string
}

// binding ties a managed container to the image (and group) it runs.
type binding struct {
	group config.Group
	image config.Image
}

// targetIndex maps every target of groups to its bindings.
func targetIndex(groups []config.Group) map[config.Target][]binding {
	out := map[config.Target][]binding{}
	for _, g := range groups {
		for _, img := range g.Images {
			for _, t := range img.Targets {
				out[t] = append(out[t], binding{group: g, image: img})
			}
		}
	}
	return out
}

// pinFor returns the reference an admitted container image is rewritten
// to, or false to leave it as written; the rule is fix B's one decision,
// refresh.PinRendered. recorded is the group's recorded digest of img (""
// when none).
func pinFor(img config.Image, live, recorded string, format imageref.PinFormat) (string, bool) {
	to, skip := refresh.PinRendered(img, live, recorded, recorded != "", format)
	return to, skip == refresh.SkipNone
}
