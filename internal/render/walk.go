package render

import (
	"fmt"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// site is one managed container found in the stream.
type site struct {
	doc    int
	target config.Target
	group  string
	image  config.Image
	// pinFormat is the group's (managed.pinFormat).
	pinFormat imageref.PinFormat
	node      *yaml.Node // the image scalar, aliases resolved
	// shared says why the scalar's text cannot be changed on its own (it is
	// reached through an alias, carries an anchor, a tag or block style);
	// "" when it can.
	shared string
}

func (s site) where() string { return fmt.Sprintf("document %d: %s", s.doc, s.target) }

// maxListDepth bounds the nesting of List kinds that is followed.
const maxListDepth = 4

// walker visits the objects of one document.
type walker struct {
	s         *Stream
	doc       int
	namespace string
}

// object visits one object: a managed workload, or a List of objects.
func (w *walker) object(n *yaml.Node, depth int) {
	if n.Kind != yaml.MappingNode {
		return
	}
	kind, _ := field(n, "kind")
	apiVersion, _ := field(n, "apiVersion")
	if strings.HasSuffix(scalar(kind), "List") && depth < maxListDepth {
		// Aliases are not followed here: a list of aliases to lists would
		// multiply the work at each level.
		if items, how := field(n, "items"); items != nil && how == "" && items.Kind == yaml.SequenceNode {
			for _, item := range items.Content {
				if item.Kind != yaml.AliasNode {
					w.object(item, depth+1)
				}
			}
		}
		return
	}
	k, ok := workload.LookupKind(scalar(kind))
	if !ok || scalar(apiVersion) != k.APIVersion() {
		return
	}
	meta, _ := field(n, "metadata")
	name, _ := field(meta, "name")
	ns, _ := field(meta, "namespace")
	namespace, defaulted := scalar(ns), false
	if namespace == "" {
		namespace, defaulted = w.namespace, true
	}

	shared := ""
	cur := n
	for _, key := range k.PodSpecPath {
		next, how := field(cur, key)
		if next == nil {
			return
		}
		if how != "" {
			shared = fmt.Sprintf("its %s is written through a YAML %s, so its text is shared", key, how)
		}
		cur, _ = resolve(next)
	}
	// Every image of the pod spec: containers, init containers and image
	// volumes (K1).
	for _, slot := range []struct{ list, noun string }{{"containers", "container"}, {"initContainers", "init container"}, {"volumes", "image volume"}} {
		list, how := field(cur, slot.list)
		if list == nil {
			continue
		}
		listShared := shared
		if how != "" {
			listShared = fmt.Sprintf("its %s is written through a YAML %s, so its text is shared", slot.list, how)
		}
		list, _ = resolve(list)
		if list.Kind != yaml.SequenceNode {
			continue
		}
		for _, item := range list.Content {
			w.item(k, namespace, scalar(name), defaulted, slot.list == "volumes", slot.noun, listShared, item)
		}
	}
}

// item visits one entry of a pod spec's containers, initContainers or
// volumes.
func (w *walker) item(k *workload.Kind, namespace, name string, defaulted, volume bool, noun, shared string, item *yaml.Node) {
	ctr, aliased := resolve(item)
	cname, _ := field(ctr, "name")
	key := scalar(cname)
	holder := ctr // the mapping that holds the image scalar
	if volume {
		src, how := field(ctr, "image")
		if src == nil {
			return // not an image volume
		}
		if how != "" {
			shared = "the volume's image is written through a YAML " + how
		}
		holder, _ = resolve(src)
		key = config.VolumeKey(key)
	}
	t := config.Target{Kind: k.Name, Namespace: namespace, Name: name, Container: key}
	m, ok := w.s.targets[t]
	if !ok {
		if defaulted {
			w.hint(t)
		}
		return
	}
	st := site{doc: w.doc, target: t, group: m.group, image: m.image, pinFormat: m.pinFormat, shared: shared}
	if aliased {
		st.shared = "the " + noun + " is a YAML alias, so its text is shared"
	}
	imageKey := "image"
	if volume {
		imageKey = "reference"
	}
	img, how := field(holder, imageKey)
	if img == nil {
		w.s.notes = append(w.s.notes, Note{Group: m.group, Image: m.image.Name, Where: st.where(), Reason: "the " + noun + " has no " + imageKey + " field", Warning: true})
		return
	}
	if how != "" {
		st.shared = "the image is written through a YAML " + how
	}
	st.node, aliased = resolve(img)
	switch {
	case aliased:
		st.shared = "the image is a YAML alias (*" + img.Value + "), so its text is shared"
	case st.node.Anchor != "":
		st.shared = "the image carries a YAML anchor (&" + st.node.Anchor + ") that other nodes may alias"
	case st.node.Kind != yaml.ScalarNode:
		st.shared = "the image is not a scalar"
	case st.node.Style&yaml.TaggedStyle != 0:
		st.shared = "the image has an explicit YAML tag"
	case st.node.Style&(yaml.LiteralStyle|yaml.FoldedStyle) != 0:
		st.shared = "the image is a block scalar"
	}
	w.s.sites = append(w.s.sites, st)
}

// hint notes a container of a document without metadata.namespace that is
// not a target in the default namespace but is one in another: most likely
// the release namespace was not passed (--namespace, HELM_NAMESPACE).
func (w *walker) hint(t config.Target) {
	var others []string
	for cand := range w.s.targets {
		if cand.Kind == t.Kind && cand.Name == t.Name && cand.Container == t.Container {
			others = append(others, cand.Namespace)
		}
	}
	if len(others) == 0 {
		return
	}
	sort.Strings(others)
	first := t
	first.Namespace = others[0]
	group, image := w.s.targets[first].group, w.s.targets[first].image.Name
	w.s.notes = append(w.s.notes, Note{
		Group: group, Image: image, Where: fmt.Sprintf("document %d: %s", w.doc, t),
		Reason: fmt.Sprintf("not a target: the document has no metadata.namespace, so it is read as namespace %q (--namespace), "+
			"but the target is in namespace %s; pass the release namespace with --namespace", t.Namespace, strings.Join(others, ", ")),
		Warning: true,
	})
}

// resolve follows aliases; aliased says whether n was one.
func resolve(n *yaml.Node) (_ *yaml.Node, aliased bool) {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && n.Alias != nil && i < 16; i++ {
		n, aliased = n.Alias, true
	}
	return n, aliased
}

// field returns the value of key in mapping m, or nil. how is "" for a key
// written once in m itself; "alias", "merge key" or "duplicate key" when
// the value's text cannot be taken as this object's own. Merge keys are
// followed one level deep, which bounds the work on hostile input.
func field(m *yaml.Node, key string) (_ *yaml.Node, how string) {
	m, aliased := resolve(m)
	found, merge, how := own(m, key)
	if found == nil && merge != nil {
		merge, _ = resolve(merge)
		sources := []*yaml.Node{merge}
		if merge.Kind == yaml.SequenceNode {
			sources = merge.Content
		}
		for _, src := range sources {
			src, _ = resolve(src)
			if v, _, _ := own(src, key); v != nil {
				return v, "merge key"
			}
		}
		return nil, ""
	}
	if found != nil && how == "" && (aliased || found.Kind == yaml.AliasNode) {
		how = "alias"
	}
	return found, how
}

// own looks key up in mapping m itself, and returns its merge key's value.
func own(m *yaml.Node, key string) (found, merge *yaml.Node, how string) {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil, nil, ""
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k := m.Content[i]
		switch {
		case k.Kind == yaml.ScalarNode && k.Value == key:
			if found != nil {
				how = "duplicate key"
			}
			found = m.Content[i+1]
		case k.Kind == yaml.ScalarNode && k.Value == "<<" && k.Tag == "!!merge":
			merge = m.Content[i+1]
		}
	}
	return found, merge, how
}

// scalar returns a scalar node's value, "" for anything else.
func scalar(n *yaml.Node) string {
	n, _ = resolve(n)
	if n == nil || n.Kind != yaml.ScalarNode {
		return ""
	}
	return n.Value
}
