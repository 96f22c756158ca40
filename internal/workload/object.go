package workload

import (
	"context"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/internal/config"
)

// Object is a snapshot of one workload as read. SetImages and the
// annotation compare-and-swap are checked against it.
type Object struct {
	Ref             config.Workload
	UID             types.UID
	ResourceVersion string
	Generation      int64
	Annotations     map[string]string
	// Labels are the workload's own (not its pod template's): GitOps
	// controllers' tracking labels name the application that applied it (O2).
	Labels map[string]string
	// Containers are the pod template's images in PodImages' order:
	// containers, init containers, image volumes (K1).
	Containers     []Container
	PullSecrets    []string // spec.template.spec.imagePullSecrets names
	ServiceAccount string   // spec.template.spec.serviceAccountName
	Settled        Settledness
	// Selector selects the workload's pods; nil for a kind without
	// long-running pods (CronJob).
	Selector *metav1.LabelSelector
	// NodeSelector and RequiredNodeAffinity are the pod template's: the
	// nodes its pods can run on (V3, RunsOn).
	NodeSelector         map[string]string
	RequiredNodeAffinity *corev1.NodeSelector

	managedFields []metav1.ManagedFieldsEntry // AnnotationManager
}

// Container is one image of the pod template: a container's, an init
// container's or an image volume's.
type Container struct {
	// Name is its key (PodImage.Key): the container's name, or an image
	// volume's config.VolumeKey.
	Name, Image string
	// Slot and Index say where it is in the pod spec.
	Slot  Slot
	Index int
	// ImageManager is the field manager that owns this container's image
	// per metadata.managedFields ("helm", "image-refresh", …), "" if none:
	// it tells who last rendered the reference (R7, R17).
	ImageManager string
}

// PodImage is where c sits in the pod spec.
func (c Container) PodImage() PodImage {
	return PodImage{Key: c.Name, Image: c.Image, Slot: c.Slot, Index: c.Index}
}

// Container returns the image of that key (a container's name, an image
// volume's config.VolumeKey).
func (o *Object) Container(name string) (Container, bool) {
	if i := o.containerIndex(name); i >= 0 {
		return o.Containers[i], true
	}
	return Container{}, false
}

func (o *Object) containerIndex(name string) int {
	for i, c := range o.Containers {
		if c.Name == name {
			return i
		}
	}
	return -1
}

// Get reads a workload. Errors name the ref and wrap the API error, so
// apierrors.IsNotFound and IsForbidden still work on them (R4: the caller
// must tell a missing workload or an RBAC denial from a transient).
func (c *Client) Get(ctx context.Context, ref config.Workload) (*Object, error) {
	if err := validate(ref); err != nil {
		return nil, err
	}
	obj, err := c.read(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", ref, err)
	}
	return obj, nil
}

// observeWithin bounds how long GetObserved waits for the controller.
const observeWithin = 2 * time.Second

// GetObserved reads a workload for a pass's observation: from the cache
// when one is set (SetCache), else as Get does. image-refresh's own
// annotation writes bump a Deployment's generation; a generation that only
// this client's own annotation writes moved is not unsettledness (the
// status decides), and a pass that reads the anchor right after one would
// otherwise take the group for unsettled and count a skip streak it then
// has to clear: two writes for nothing (R4, R9). Without a cache, while
// the controller has not observed another writer's generation, it reads
// again for up to 2 s; with a cache it does not wait, as the controller's
// status update arrives as a watch event and starts the next pass.
func (c *Client) GetObserved(ctx context.Context, ref config.Workload) (*Object, error) {
	obj, err := c.Cached(ctx, ref)
	if err != nil {
		return nil, err
	}
	c.excuseOwnBumps(obj)
	if c.cache != nil {
		return obj, nil
	}
	for deadline := time.Now().Add(observeWithin); obj.Settled.Unobserved && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return obj, nil
		case <-time.After(50 * time.Millisecond):
		}
		again, rerr := c.Get(ctx, ref)
		if rerr != nil {
			break // the first read stands; the next pass reads again
		}
		obj = again
		c.excuseOwnBumps(obj)
	}
	return obj, nil
}

func newObject(k *Kind, meta *metav1.ObjectMeta, tmpl *corev1.PodTemplateSpec, settled Settledness) *Object {
	o := &Object{
		Ref:             config.Workload{Kind: k.Name, Namespace: meta.Namespace, Name: meta.Name},
		UID:             meta.UID,
		ResourceVersion: meta.ResourceVersion,
		Generation:      meta.Generation,
		Annotations:     map[string]string{},
		Labels:          meta.Labels,
		ServiceAccount:  tmpl.Spec.ServiceAccountName,
		Settled:         settled,
		managedFields:   meta.ManagedFields,
	}
	for k, v := range meta.Annotations {
		o.Annotations[k] = v
	}
	managers := imageManagers(k, meta.ManagedFields)
	for _, pi := range PodImages(&tmpl.Spec) {
		o.Containers = append(o.Containers, Container{Name: pi.Key, Image: pi.Image, Slot: pi.Slot, Index: pi.Index, ImageManager: managers[pi.Key]})
	}
	for _, s := range tmpl.Spec.ImagePullSecrets {
		o.PullSecrets = append(o.PullSecrets, s.Name)
	}
	// Copies: the object may be the cache's own (readCache).
	o.NodeSelector = maps.Clone(tmpl.Spec.NodeSelector)
	if a := tmpl.Spec.Affinity; a != nil && a.NodeAffinity != nil {
		o.RequiredNodeAffinity = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.DeepCopy()
	}
	return o
}
