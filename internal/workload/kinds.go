package workload

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// read and patch are the only places that switch on the kind: everything
// else works on Object. Callers have validated ref.

func (c *Client) read(ctx context.Context, ref Ref) (*Object, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	opts := metav1.GetOptions{}
	switch ref.Kind {
	case KindDeployment:
		d, err := c.kube.AppsV1().Deployments(ref.Namespace).Get(ctx, ref.Name, opts)
		if err != nil {
			return nil, err
		}
		return fromDeployment(d), nil
	case KindDaemonSet:
		ds, err := c.kube.AppsV1().DaemonSets(ref.Namespace).Get(ctx, ref.Name, opts)
		if err != nil {
			return nil, err
		}
		return fromDaemonSet(ds), nil
	default:
		st, err := c.kube.AppsV1().StatefulSets(ref.Namespace).Get(ctx, ref.Name, opts)
		if err != nil {
			return nil, err
		}
		return fromStatefulSet(st), nil
	}
}

// patch writes with FieldManager (R17) and returns the object as written.
func (c *Client) patch(ctx context.Context, ref Ref, pt types.PatchType, data []byte) (*Object, error) {
	out, err := c.patchKind(ctx, ref, pt, data)
	if err == nil {
		c.wrote(out)
	}
	return out, err
}

func (c *Client) patchKind(ctx context.Context, ref Ref, pt types.PatchType, data []byte) (*Object, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	opts := metav1.PatchOptions{FieldManager: FieldManager}
	switch ref.Kind {
	case KindDeployment:
		d, err := c.kube.AppsV1().Deployments(ref.Namespace).Patch(ctx, ref.Name, pt, data, opts)
		if err != nil {
			return nil, err
		}
		return fromDeployment(d), nil
	case KindDaemonSet:
		ds, err := c.kube.AppsV1().DaemonSets(ref.Namespace).Patch(ctx, ref.Name, pt, data, opts)
		if err != nil {
			return nil, err
		}
		return fromDaemonSet(ds), nil
	default:
		st, err := c.kube.AppsV1().StatefulSets(ref.Namespace).Patch(ctx, ref.Name, pt, data, opts)
		if err != nil {
			return nil, err
		}
		return fromStatefulSet(st), nil
	}
}

func fromDeployment(d *appsv1.Deployment) *Object {
	return newObject(KindDeployment, &d.ObjectMeta, &d.Spec.Template, DeploymentSettled(d))
}

func fromDaemonSet(ds *appsv1.DaemonSet) *Object {
	return newObject(KindDaemonSet, &ds.ObjectMeta, &ds.Spec.Template, DaemonSetSettled(ds))
}

func fromStatefulSet(st *appsv1.StatefulSet) *Object {
	return newObject(KindStatefulSet, &st.ObjectMeta, &st.Spec.Template, StatefulSetSettled(st))
}
