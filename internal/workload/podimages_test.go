package workload_test

import (
	"context"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// K1, R9, R16, R17 on the API server: the images of a Deployment's init
// container, native sidecar and image volume are read with their writers,
// and re-imaged with its container in one write that changes nothing but
// those image fields.
func TestSetImages_K1_R9_R16_InitContainersAndImageVolumesInOneWrite(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	const models = "registry.test/acme/models:v2"
	testenv.Deployment(t, c.Client, ns, "api",
		testenv.WithContainer("app", appTag),
		testenv.WithInitContainer("migrate", appTag),
		testenv.WithSidecar("shipper", proxyTag),
		testenv.WithImageVolume("models", models))
	ref := config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"}
	before := getDeployment(t, c.Client, ns, "api")
	if len(before.Spec.Template.Spec.Volumes) != 1 || before.Spec.Template.Spec.Volumes[0].Image == nil {
		t.Fatalf("the API server did not keep the image volume: %s", toJSON(t, before.Spec.Template.Spec.Volumes))
	}

	obj := mustGet(t, wc, ref)
	var got []string
	for _, ctr := range obj.Containers {
		got = append(got, ctr.PodImage().String()+"="+ctr.Image)
		if ctr.ImageManager == "" {
			t.Errorf("%s: no field manager read for its image", ctr.PodImage())
		}
	}
	want := []string{"container app=" + appTag, "init container migrate=" + appTag, "init container shipper=" + proxyTag, "image volume models=" + models}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("images read %q, want %q", got, want)
	}

	// A helm upgrade re-renders the init container: its manager is helm's.
	patch := `{"spec":{"template":{"spec":{"initContainers":[{"name":"migrate","image":"registry.test/acme/app:v2"}]}}}}`
	if _, err := c.Client.AppsV1().Deployments(ns).Patch(context.Background(), "api", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "helm"}); err != nil {
		t.Fatal(err)
	}
	obj = mustGet(t, wc, ref)
	if m, _ := obj.Container("migrate"); m.ImageManager != "helm" {
		t.Errorf("init container migrate's image manager %q, want helm", m.ImageManager)
	}
	if m, _ := obj.Container("app"); m.ImageManager == "helm" {
		t.Errorf("container app's image manager is helm, which did not write it")
	}

	const d = "@sha256:1111111111111111111111111111111111111111111111111111111111111111"
	rv := obj.ResourceVersion
	wrote, err := wc.SetImages(context.Background(), obj, []workload.ImageChange{
		{Container: "app", From: appTag, To: appTag + d},
		{Container: "migrate", From: "registry.test/acme/app:v2", To: appTag + d},
		{Container: config.VolumeKey("models"), From: models, To: models + d},
	})
	if err != nil || !wrote {
		t.Fatalf("SetImages: wrote %v, %v", wrote, err)
	}
	after := getDeployment(t, c.Client, ns, "api")
	if after.Generation != before.Generation+2 {
		// one for helm's patch, one for SetImages': one write (R9)
		t.Errorf("generation %d → %d, want two writes (helm's and one of SetImages)", before.Generation, after.Generation)
	}
	spec := after.Spec.Template.Spec
	if spec.Containers[0].Image != appTag+d || spec.InitContainers[0].Image != appTag+d || spec.Volumes[0].Image.Reference != models+d {
		t.Errorf("images after SetImages: %s", toJSON(t, spec))
	}
	if spec.InitContainers[1].Image != proxyTag {
		t.Errorf("the sidecar, not in the change, was rewritten to %s (R16)", spec.InitContainers[1].Image)
	}
	// R16: nothing but the image fields changed.
	wantSpec := before.Spec.Template.Spec.DeepCopy()
	wantSpec.Containers[0].Image, wantSpec.InitContainers[0].Image, wantSpec.Volumes[0].Image.Reference = appTag+d, appTag+d, models+d
	if !reflect.DeepEqual(&spec, wantSpec) {
		t.Errorf("the pod spec changed beyond the image fields:\n got %s\nwant %s", toJSON(t, spec), toJSON(t, wantSpec))
	}
	obj = mustGet(t, wc, ref)
	if obj.ResourceVersion == rv {
		t.Fatal("no write landed")
	}
	for _, key := range []string{"app", "migrate", config.VolumeKey("models")} {
		if m, _ := obj.Container(key); m.ImageManager != workload.FieldManager {
			t.Errorf("%s: image manager %q after SetImages, want %s", key, m.ImageManager, workload.FieldManager)
		}
	}
	// R9: already on the wanted images, no write at all.
	wrote, err = wc.SetImages(context.Background(), obj, []workload.ImageChange{{Container: "migrate", From: appTag, To: appTag + d}})
	if err != nil || wrote {
		t.Errorf("a second SetImages to the same images wrote %v, %v", wrote, err)
	}
}

// K1: Pods' "current" compares every image of the template, and reads the
// image IDs of init containers (also finished ones) and of image volumes
// where the pod reports them; StripPod keeps all of it.
func TestPods_K1_N1_InitContainersAndImageVolumesAreRead(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: map[string]string{"a": "b"}},
		Spec: corev1.PodSpec{NodeName: "n1",
			Containers:     []corev1.Container{{Name: "app", Image: "r/app:1", Env: []corev1.EnvVar{{Name: "X", Value: "y"}}}},
			InitContainers: []corev1.Container{{Name: "migrate", Image: "r/app:1"}, {Name: "shipper", Image: "r/log:1", RestartPolicy: &always}},
			Volumes: []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "models", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "r/models:2"}}}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", ImageID: "r/app@sha256:aa",
				VolumeMounts: []corev1.VolumeMountStatus{{Name: "models", VolumeStatus: &corev1.VolumeStatus{Image: &corev1.ImageVolumeStatus{ImageRef: "r/models@sha256:mm"}}}}}},
			InitContainerStatuses: []corev1.ContainerStatus{
				{Name: "migrate", ImageID: "r/app@sha256:old", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}},
				{Name: "shipper", ImageID: "r/log@sha256:ll", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}},
			},
		},
	}
	stripped, err := workload.StripPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]*corev1.Pod{"pod": pod, "stripped pod": stripped.(*corev1.Pod)} {
		got := workload.PodOf(p)
		want := map[string]string{"app": "r/app@sha256:aa", "migrate": "r/app@sha256:old", "shipper": "r/log@sha256:ll", config.VolumeKey("models"): "r/models@sha256:mm"}
		if !reflect.DeepEqual(got.ImageIDs, want) {
			t.Errorf("%s: image IDs %v, want %v", name, got.ImageIDs, want)
		}
		if got.Failing["shipper"] == "" {
			t.Errorf("%s: the crashing sidecar is not failing: %v", name, got.Failing)
		}
		images := workload.PodImages(&p.Spec)
		if len(images) != 4 || images[3].Key != config.VolumeKey("models") || images[3].Pointer("/spec") != "/spec/volumes/1/image/reference" ||
			images[1].Pointer("/spec") != "/spec/initContainers/0/image" {
			t.Errorf("%s: pod images %+v", name, images)
		}
	}
}
