package pass

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/crane"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/registry"
	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// TestObserve_R3_AMirrorsProofIsAskedOncePerDigest: a target that runs
// from a mirror needs the proof that the mirror holds the digest (R3). A
// pass that finds it missing asks again on the next pass (the mirror may
// sync it); once proven, later passes do not ask the mirror again: a
// digest is immutable, and a steady state on a mirror makes no registry
// request for the proof.
func TestObserve_R3_AMirrorsProofIsAskedOncePerDigest(t *testing.T) {
	reg := testregistry.Start(t)
	digest := reg.MustPushRandomImage(t, "acme/api", "prod")
	upstream, mirror := reg.Host()+"/acme/api", reg.Host()+"/mirror/api"

	kube := fake.NewClientset(&appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "api", Generation: 1},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "api"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "api", Image: mirror + ":prod"}}},
			},
		},
		Status: appsv1.DeploymentStatus{ObservedGeneration: 1},
	})
	cfg := config.Defaults()
	cfg.Registries = []config.Registry{{Host: reg.Host(), Insecure: true}}
	g := config.Group{
		Name:   "api",
		Anchor: config.Workload{Kind: "Deployment", Namespace: "shop", Name: "api"},
		Images: []config.Image{{Name: "api", Repository: upstream, Tag: "prod",
			Targets: []config.Target{{Kind: "Deployment", Namespace: "shop", Name: "api", Container: "api"}}}},
	}
	cfg.Groups = []config.Group{g}
	res, err := registry.NewResolver(registry.Options{
		Hosts:   []registry.HostConfig{{Host: reg.Host(), Insecure: true}},
		Timeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &Runner{
		Config: cfg, Kube: kube, Workloads: workload.New(kube, 5*time.Second), Resolver: res,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	target := g.Images[0].Targets[0]
	proofAsks := func() int { return reg.Count("HEAD", "/v2/mirror/api/manifests/"+digest) }
	pass := func(wantHas bool, wantAsks int) {
		t.Helper()
		reg.ResetRequests()
		obs := r.Observe(context.Background(), g, &PassSource{Resolver: res}).Observation
		if got := obs.Latest["api"]; got.Err != nil || got.Digest != digest {
			t.Fatalf("latest = %+v, want %s", got, digest)
		}
		p, ok := obs.MirrorProof[target]
		if !ok || p.Err != nil || p.Has != wantHas {
			t.Fatalf("mirror proof = %+v (present %v), want Has=%v", p, ok, wantHas)
		}
		if got := proofAsks(); got != wantAsks {
			t.Fatalf("the pass asked the mirror for %s %d times, want %d", digest, got, wantAsks)
		}
	}

	pass(false, 1) // not on the mirror yet
	pass(false, 1) // a "not there" is not kept: asked again
	if err := crane.Copy(upstream+"@"+digest, mirror+":prod", crane.Insecure); err != nil {
		t.Fatal(err)
	}
	pass(true, 1) // proven
	pass(true, 0) // kept: not asked again
	pass(true, 0)
}
