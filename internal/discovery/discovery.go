// Package discovery is the pure rules of label discovery: it turns labelled
// workloads into groups (SPEC D1). `run`'s watcher of the label, which calls
// it, is internal/operator/discoverer. A
// Deployment, DaemonSet, StatefulSet or CronJob labelled P/enabled=true, or
// any such workload in a namespace labelled so, is managed with no config
// entry. Discover is pure: the front ends list the objects (from the API in
// `tick`, `status` and `render`, from the informer cache in `run`) and feed
// the engine the groups it returns, exactly as they feed it the config
// file's groups (D2).
package discovery

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// Input is what Discover reads.
type Input struct {
	Prefix string
	// Namespaces holds the namespaces labelled P/enabled=true.
	Namespaces map[string]bool
	// Workloads are the candidate objects of the workload kinds: the ones
	// labelled P/enabled, and every one of a labelled namespace. Others are
	// ignored.
	Workloads []client.Object
	// Configured are the config file's groups: they win for the workloads
	// they name (D2).
	Configured []config.Group
}

// Note is something discovery left out, and why: the front ends log it.
type Note struct {
	Workload  config.Workload
	Container string // "" for the whole workload
	Msg       string
}

func (n Note) String() string {
	if n.Container == "" {
		return fmt.Sprintf("%s: %s", n.Workload, n.Msg)
	}
	t := config.Target{Kind: n.Workload.Kind, Namespace: n.Workload.Namespace, Name: n.Workload.Name, Container: n.Container}
	return fmt.Sprintf("%s: %s", t, n.Msg)
}

// Result is the discovered groups, sorted by name, and the notes.
type Result struct {
	Groups []config.Group
	Notes  []Note
	// Managed holds every workload that is labelled in (or in a labelled
	// namespace), whether or not a configured group claimed it.
	Managed map[config.Workload]bool
}

// Managed reports whether obj is opted in by the label k.Enabled(), given
// whether its namespace is.
func Managed(k state.Keys, obj client.Object, namespaceLabelled bool) bool {
	switch obj.GetLabels()[k.Enabled()] {
	case "true":
		return true
	case "false":
		return false
	}
	return namespaceLabelled
}

// candidate is one managed workload with the containers it contributes.
type candidate struct {
	w          config.Workload
	containers []discoveredContainer
	onFailed   config.OnFailedRollout // the workload's P/on-failed-rollout (V2)
}

type discoveredContainer struct {
	name string
	ref  imageref.Reference
}

// Discover returns the groups of the managed workloads in in (D1).
func Discover(in Input) Result {
	k := state.Keys{Prefix: in.Prefix}
	claimed := map[config.Workload]string{}
	for _, g := range in.Configured {
		for _, w := range g.Workloads() {
			claimed[w] = g.Name
		}
	}
	res := Result{Managed: map[config.Workload]bool{}}
	type groupKey struct{ namespace, name string }
	byGroup := map[groupKey][]candidate{}
	var standalone []candidate
	seen := map[config.Workload]bool{}
	for _, obj := range in.Workloads {
		kind, ok := workload.KindOf(obj)
		if !ok || !Managed(k, obj, in.Namespaces[obj.GetNamespace()]) {
			continue
		}
		w := config.Workload{Kind: kind.Name, Namespace: obj.GetNamespace(), Name: obj.GetName()}
		if seen[w] {
			continue
		}
		seen[w] = true
		res.Managed[w] = true
		if g, ok := claimed[w]; ok {
			res.Notes = append(res.Notes, Note{Workload: w, Msg: fmt.Sprintf("named by the configured group %s, which wins over the discovery label (docs/discovery.md)", g)})
			continue
		}
		c, notes := containersOf(k, w, obj)
		res.Notes = append(res.Notes, notes...)
		if len(c.containers) == 0 {
			continue
		}
		name := value(obj, k.DiscoveryGroup())
		if name == "" {
			standalone = append(standalone, c)
			continue
		}
		if msgs := validation.IsDNS1123Label(name); len(msgs) > 0 {
			res.Notes = append(res.Notes, Note{Workload: w, Msg: fmt.Sprintf("%s %q is not a valid group name (DNS-1123 label: %s); managed as its own group",
				k.DiscoveryGroup(), name, strings.Join(msgs, "; "))})
			standalone = append(standalone, c)
			continue
		}
		key := groupKey{w.Namespace, name}
		byGroup[key] = append(byGroup[key], c)
	}
	for _, c := range standalone {
		res.Groups = append(res.Groups, build(in.Prefix, StandaloneName(c.w), []candidate{c}))
	}
	for key, cs := range byGroup {
		res.Groups = append(res.Groups, build(in.Prefix, key.namespace+"/"+key.name, cs))
	}
	slices.SortFunc(res.Groups, func(a, b config.Group) int { return strings.Compare(a.Name, b.Name) })
	slices.SortStableFunc(res.Notes, func(a, b Note) int { return strings.Compare(a.String(), b.String()) })
	return res
}

// StandaloneName names the group of a workload that is its own group:
// "namespace/kind/name", kind in lower case. A group joined with P/group
// is "namespace/NAME"; neither can collide with a configured group's name,
// which is a DNS-1123 label (no '/').
func StandaloneName(w config.Workload) string {
	return w.Namespace + "/" + strings.ToLower(w.Kind) + "/" + w.Name
}

// value reads a discovery key from the annotations, then the labels.
func value(obj client.Object, key string) string {
	if v, ok := obj.GetAnnotations()[key]; ok {
		return strings.TrimSpace(v)
	}
	return strings.TrimSpace(obj.GetLabels()[key])
}

func containersOf(k state.Keys, w config.Workload, obj client.Object) (candidate, []Note) {
	c := candidate{w: w}
	var notes []Note
	switch v := config.OnFailedRollout(value(obj, k.OnFailedRollout())); v {
	case "", config.OnFailedRolloutHold, config.OnFailedRolloutRollback:
		c.onFailed = v
	default:
		notes = append(notes, Note{Workload: w, Msg: fmt.Sprintf("%s %q is not one of hold, rollback; hold applies (docs/config.md, onFailedRollout)", k.OnFailedRollout(), v)})
	}
	ignored := map[string]bool{}
	for _, n := range strings.Split(value(obj, k.IgnoreContainers()), ",") {
		if n = strings.TrimSpace(n); n != "" {
			ignored[n] = true
		}
	}
	spec := workload.PodSpec(obj)
	if spec == nil {
		return c, nil
	}
	// Every image of the pod template: containers, init containers (native
	// sidecars included) and image volumes (K1).
	for _, ctr := range workload.PodImages(spec) {
		if ignored[ctr.Key] {
			continue
		}
		ref, err := imageref.Parse(ctr.Image)
		switch {
		case err != nil:
			notes = append(notes, Note{Workload: w, Container: ctr.Key, Msg: fmt.Sprintf("not managed: %v", err)})
			continue
		case ref.Tag == "" && ref.Digest != "":
			// No tag to follow: the operator pinned it (R2).
			notes = append(notes, Note{Workload: w, Container: ctr.Key,
				Msg: "not managed: pinned by digest with no tag (an operator pin, R2); write repo:tag@digest to have it refreshed"})
			continue
		case ref.Tag == "":
			ref.Tag = "latest" // what the kubelet pulls for a bare repository
		}
		c.containers = append(c.containers, discoveredContainer{name: ctr.Key, ref: ref})
	}
	return c, notes
}

// build makes one group of the candidates: the alphabetically first
// workload (by name, then kind) is the anchor; one image per distinct
// repository:tag, named for the first container that runs it.
func build(prefix, name string, cs []candidate) config.Group {
	slices.SortFunc(cs, func(a, b candidate) int {
		if c := strings.Compare(a.w.Name, b.w.Name); c != 0 {
			return c
		}
		return strings.Compare(a.w.Kind, b.w.Kind)
	})
	g := config.Group{Name: name, Anchor: cs[0].w, Discovered: true, OnFailedRollout: cs[0].onFailed}
	index := map[string]int{} // repository:tag → index in g.Images
	names := map[string]bool{}
	for _, c := range cs {
		for _, ctr := range c.containers {
			key := ctr.ref.Repository + ":" + ctr.ref.Tag
			t := config.Target{Kind: c.w.Kind, Namespace: c.w.Namespace, Name: c.w.Name, Container: ctr.name}
			if i, ok := index[key]; ok {
				g.Images[i].Targets = append(g.Images[i].Targets, t)
				continue
			}
			short := ctr.name
			if v, ok := t.Volume(); ok {
				short = v // an image volume's name, not its key
			}
			n := imageName(prefix, names, short, c.w.Name+"-"+short, key)
			names[n] = true
			index[key] = len(g.Images)
			g.Images = append(g.Images, config.Image{Name: n, Repository: ctr.ref.Repository, Tag: ctr.ref.Tag, Targets: []config.Target{t}})
		}
	}
	return g
}

// imageName picks the <image> of the state annotation keys: the first
// candidate that is a free, valid name whose keys are valid, else a name
// derived from the repository:tag's hash.
func imageName(prefix string, taken map[string]bool, candidates ...string) string {
	key := candidates[len(candidates)-1]
	for _, n := range candidates[:len(candidates)-1] {
		if !taken[n] && validImageName(prefix, n) {
			return n
		}
	}
	sum := sha256.Sum256([]byte(key))
	return "img-" + hex.EncodeToString(sum[:])[:10]
}

func validImageName(prefix, name string) bool {
	if len(validation.IsDNS1123Label(name)) > 0 {
		return false
	}
	for _, part := range state.ImageKeyNames(name) {
		if len(content.IsLabelKey(prefix+"/"+part)) > 0 {
			return false
		}
	}
	return true
}
