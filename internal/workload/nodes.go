package workload

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The node labels the kubelet sets that say which platform a node runs
// (V3). No label gives a variant: a node's variant is containerd's default
// for its architecture.
const (
	LabelOS   = corev1.LabelOSStable   // kubernetes.io/os
	LabelArch = corev1.LabelArchStable // kubernetes.io/arch
)

// Node is what V3 reads of a node: its name and labels (metadata only).
type Node struct {
	Name   string
	Labels map[string]string
}

// Platform returns the node's operating system and architecture from
// its labels; ok is false when either label is missing (the node is not
// counted: nothing says what it runs).
func (n Node) Platform() (os, arch string, ok bool) {
	os, arch = n.Labels[LabelOS], n.Labels[LabelArch]
	return os, arch, os != "" && arch != ""
}

// Nodes lists the cluster's nodes, metadata only (V3): `run` from its
// informer cache, tick and status with one LIST when a new digest is
// checked.
type Nodes interface {
	Nodes(ctx context.Context) ([]Node, error)
}

var nodeGVK = corev1.SchemeGroupVersion.WithKind("Node")

// NodesFromAPI lists the nodes' metadata with one LIST per call, bounded
// by timeout.
func NodesFromAPI(md metadata.Interface, timeout time.Duration) Nodes {
	return apiNodes{md: md, timeout: timeout}
}

type apiNodes struct {
	md      metadata.Interface
	timeout time.Duration
}

func (a apiNodes) Nodes(ctx context.Context) ([]Node, error) {
	if a.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, a.timeout)
		defer cancel()
	}
	list, err := a.md.Resource(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the nodes: %w", err)
	}
	return nodesOf(list.Items), nil
}

// NodesFromCache reads the nodes' metadata from r, the controller
// manager's cache: its metadata-only informer of nodes starts with the
// first read, which timeout bounds (a denied watch never syncs).
func NodesFromCache(r client.Reader, timeout time.Duration) Nodes {
	return cacheNodes{r: r, timeout: timeout}
}

type cacheNodes struct {
	r       client.Reader
	timeout time.Duration
}

// NodeMetadata is the object the cache keeps for a node (metadata only).
func NodeMetadata() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(nodeGVK)
	return m
}

func (c cacheNodes) Nodes(ctx context.Context) ([]Node, error) {
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	if err := c.r.List(ctx, list); err != nil {
		return nil, fmt.Errorf("list the nodes from the cache: %w", err)
	}
	return nodesOf(list.Items), nil
}

func nodesOf(items []metav1.PartialObjectMetadata) []Node {
	out := make([]Node, 0, len(items))
	for _, m := range items {
		out = append(out, Node{Name: m.Name, Labels: m.Labels})
	}
	slices.SortFunc(out, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// RunsOn reports whether the pods of obj's template can be scheduled on n
// as far as its labels tell: the template's nodeSelector and required node
// affinity (V3). Taints and tolerations are not read (metadata only).
func (o *Object) RunsOn(n Node) bool {
	pod := &corev1.Pod{Spec: corev1.PodSpec{NodeSelector: o.NodeSelector}}
	if o.RequiredNodeAffinity != nil {
		pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: o.RequiredNodeAffinity}}
	}
	ok, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels}})
	// A term that does not parse matches no node, as the scheduler's.
	return ok && err == nil
}
