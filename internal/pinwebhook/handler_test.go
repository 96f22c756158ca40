package pinwebhook

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/metrics"
	"github.com/image-refresh/image-refresh/internal/workload"
)

var (
	recorded = "sha256:" + strings.Repeat("a", 64)
	older    = "sha256:" + strings.Repeat("b", 64)
)

func testConfig() *config.Config {
	cfg := config.Defaults()
	cfg.Groups = []config.Group{{
		Name:   "cp",
		Anchor: config.Workload{Kind: workload.KindDeployment, Namespace: "tb", Name: "jobs"},
		Images: []config.Image{
			{Name: "api", Repository: "reg.local:5000/acme/api", Tag: "prod", Targets: []config.Target{
				{Kind: workload.KindDeployment, Namespace: "tb", Name: "jobs", Container: "api"},
				{Kind: workload.KindDaemonSet, Namespace: "tb", Name: "agent", Container: "agent"},
				{Kind: workload.KindCronJob, Namespace: "tb", Name: "nightly", Container: "api"},
				{Kind: workload.KindDeployment, Namespace: "tb", Name: "jobs", Container: "migrate"},
				{Kind: workload.KindDeployment, Namespace: "tb", Name: "jobs", Container: config.VolumeKey("models")},
			}},
			{Name: "tools", Repository: "docker.io/acme/tools", Tag: "prod", PinnedDigest: older, Targets: []config.Target{
				{Kind: workload.KindDeployment, Namespace: "tb", Name: "jobs", Container: "tools"},
			}},
		},
	}}
	return cfg
}

func TestPinFor_B1(t *testing.T) {
	api := testConfig().Groups[0].Images[0]
	pinned := testConfig().Groups[0].Images[1]
	cases := []struct {
		name, live, recorded string
		img                  config.Image
		format               imageref.PinFormat
		want                 string // "" = left alone
	}{
		{"the bare tag is pinned to the recorded digest", "reg.local:5000/acme/api:prod", recorded, api, imageref.PinTagAndDigest, "reg.local:5000/acme/api:prod@" + recorded},
		{"the pin format digest drops the tag", "reg.local:5000/acme/api:prod", recorded, api, imageref.PinDigest, "reg.local:5000/acme/api@" + recorded},
		{"another digest of the tag is pinned to the recorded one", "reg.local:5000/acme/api:prod@" + older, recorded, api, imageref.PinTagAndDigest, "reg.local:5000/acme/api:prod@" + recorded},
		{"a reference on the recorded digest is left alone", "reg.local:5000/acme/api:prod@" + recorded, recorded, api, imageref.PinTagAndDigest, ""},
		{"no record yet leaves the tag (R5)", "reg.local:5000/acme/api:prod", "", api, imageref.PinTagAndDigest, ""},
		{"a record that is not a digest is no record", "reg.local:5000/acme/api:prod", "latest", api, imageref.PinTagAndDigest, ""},
		{"another tag is left alone", "reg.local:5000/acme/api:staging", recorded, api, imageref.PinTagAndDigest, ""},
		{"a digest-only reference is left alone", "reg.local:5000/acme/api@" + older, recorded, api, imageref.PinTagAndDigest, ""},
		{"a mirror repository is left alone (R3)", "mirror.local/acme/api:prod", recorded, api, imageref.PinTagAndDigest, ""},
		{"an operator pin is left alone (R2)", "docker.io/acme/tools:prod", recorded, pinned, imageref.PinTagAndDigest, ""},
		{"an unparsable image is left alone", "UPPER/case:prod", recorded, api, imageref.PinTagAndDigest, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := pinFor(c.img, c.live, c.recorded, c.format)
			if ok != (c.want != "") || got != c.want {
				t.Errorf("pinFor(%q) = %q, %v; want %q", c.live, got, ok, c.want)
			}
		})
	}
}

func TestPinFor_R7_RepositoryAsWrittenIsKept(t *testing.T) {
	img := config.Image{Name: "api", Repository: "docker.io/acme/api", Tag: "prod"}
	got, ok := pinFor(img, "acme/api:prod", recorded, imageref.PinTagAndDigest)
	if !ok || got != "acme/api:prod@"+recorded {
		t.Errorf("got %q, %v; want the repository as written (acme/api)", got, ok)
	}
}

type request struct {
	op        admissionv1.Operation
	kind      string
	name      string
	manager   string
	images    map[string]string // container → image
	order     []string          // container order; default api, sidecar, tools, agent
	oldImages map[string]string
	dryRun    bool
}

// object encodes a workload of kind (from the kind table) whose pod
// template runs images, in order.
func object(kind string, images map[string]string, order []string) []byte {
	k, ok := workload.LookupKind(kind)
	if !ok {
		k, _ = workload.LookupKind(workload.KindDeployment) // the handler must ignore the kind anyway
	}
	o := k.New()
	spec := workload.PodSpec(o)
	for _, n := range order {
		if img, ok := images[n]; ok {
			spec.Containers = append(spec.Containers, corev1.Container{Name: n, Image: img})
		}
	}
	b, _ := json.Marshal(o)
	return b
}

// group is the API group of kind, "apps" for a kind outside the table.
func group(kind string) string {
	if k, ok := workload.LookupKind(kind); ok {
		return k.Group
	}
	return "apps"
}

func (r request) admission() admission.Request {
	order := r.order
	if order == nil {
		order = []string{"api", "sidecar", "tools", "agent"}
	}
	req := admissionv1.AdmissionRequest{
		Operation: r.op, Namespace: "tb", Name: r.name,
		Kind:   metav1.GroupVersionKind{Group: group(r.kind), Version: "v1", Kind: r.kind},
		Object: runtime.RawExtension{Raw: object(r.kind, r.images, order)},
		DryRun: &r.dryRun,
	}
	if r.oldImages != nil {
		req.OldObject = runtime.RawExtension{Raw: object(r.kind, r.oldImages, order)}
	}
	if r.manager != "" {
		req.Options = runtime.RawExtension{Raw: []byte(`{"kind":"UpdateOptions","apiVersion":"meta.k8s.io/v1","fieldManager":"` + r.manager + `"}`)}
	}
	return admission.Request{AdmissionRequest: req}
}

func newTestHandler(ann map[string]string, err error, ready bool) (*Handler, *metrics.Metrics) {
	m := metrics.New()
	anchors := func(_ context.Context, w config.Workload) (map[string]string, error) {
		if w.Name != "jobs" {
			return nil, errors.New("read a workload that is not the anchor")
		}
		return ann, err
	}
	return NewHandler(testConfig(), anchors, func() bool { return ready }, m, slog.New(slog.NewTextHandler(io.Discard, nil))), m
}

func TestHandle_B1(t *testing.T) {
	tag := "reg.local:5000/acme/api:prod"
	rec := map[string]string{"image-refresh.io/last-refreshed-api-digest": recorded, "image-refresh.io/last-refreshed-tools-digest": recorded}
	cases := []struct {
		name    string
		req     request
		want    []string // patch paths → values, "path=value"
		anchors map[string]string
	}{
		{"an update back to the tag is pinned", request{op: admissionv1.Update, kind: "Deployment", name: "jobs", manager: "helm",
			images: map[string]string{"api": tag}, oldImages: map[string]string{"api": tag + "@" + recorded}},
			[]string{"/spec/template/spec/containers/0/image=" + tag + "@" + recorded}, rec},
		{"a create is pinned, DaemonSets too", request{op: admissionv1.Create, kind: "DaemonSet", name: "agent", images: map[string]string{"agent": tag}},
			[]string{"/spec/template/spec/containers/0/image=" + tag + "@" + recorded}, rec},
		{"a CronJob is pinned under its jobTemplate", request{op: admissionv1.Create, kind: "CronJob", name: "nightly",
			images: map[string]string{"sidecar": tag, "api": tag}, order: []string{"sidecar", "api"}},
			[]string{"/spec/jobTemplate/spec/template/spec/containers/1/image=" + tag + "@" + recorded}, rec},
		{"a kind outside the table is left alone", request{op: admissionv1.Create, kind: "ReplicaSet", name: "jobs", images: map[string]string{"api": tag}}, nil, rec},
		{"only the managed container of a workload", request{op: admissionv1.Create, kind: "Deployment", name: "jobs",
			images: map[string]string{"api": tag, "sidecar": tag}},
			[]string{"/spec/template/spec/containers/0/image=" + tag + "@" + recorded}, rec},
		{"the container's index in the template is patched", request{op: admissionv1.Create, kind: "Deployment", name: "jobs",
			images: map[string]string{"sidecar": tag, "agent": "x/y:z", "api": tag}, order: []string{"sidecar", "api", "agent"}},
			[]string{"/spec/template/spec/containers/1/image=" + tag + "@" + recorded}, rec},
		{"an unmanaged workload is left alone", request{op: admissionv1.Create, kind: "Deployment", name: "other", images: map[string]string{"api": tag}}, nil, rec},
		{"the same name of another kind is left alone", request{op: admissionv1.Create, kind: "StatefulSet", name: "jobs", images: map[string]string{"api": tag}}, nil, rec},
		{"image-refresh's own write is left alone (R6 writes latest before the record)", request{op: admissionv1.Update, kind: "Deployment", name: "jobs",
			manager: "image-refresh", images: map[string]string{"api": tag + "@" + older}, oldImages: map[string]string{"api": tag + "@" + recorded}}, nil, rec},
		{"an update that does not change the image is left to fix A", request{op: admissionv1.Update, kind: "Deployment", name: "jobs", manager: "kubectl",
			images: map[string]string{"api": tag}, oldImages: map[string]string{"api": tag}}, nil, rec},
		{"an operator pin is left alone", request{op: admissionv1.Create, kind: "Deployment", name: "jobs", images: map[string]string{"tools": "docker.io/acme/tools:prod"}}, nil, rec},
		{"no record yet", request{op: admissionv1.Create, kind: "Deployment", name: "jobs", images: map[string]string{"api": tag}}, nil, map[string]string{}},
		{"no anchor yet", request{op: admissionv1.Create, kind: "Deployment", name: "jobs", images: map[string]string{"api": tag}}, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, m := newTestHandler(c.anchors, nil, true)
			resp := h.Handle(context.Background(), c.req.admission())
			wantPins(t, m, resp, c.want)
			if n := count(m.AdmissionErrors); n != 0 {
				t.Errorf("image_refresh_admission_errors_total = %v, want 0", n)
			}
		})
	}
}

// K1: an init container and an image volume that are targets are pinned
// at their own paths (a native sidecar is an init container too); an init
// container and a volume that are not targets, and a volume that is not an
// image, are left alone; an update pins only what it changed.
func TestHandle_K1_B1_InitContainersAndImageVolumesArePinned(t *testing.T) {
	tag := "reg.local:5000/acme/api:prod"
	pinned := tag + "@" + recorded
	always := corev1.ContainerRestartPolicyAlways
	deployment := func(migrate, models string) []byte {
		k, _ := workload.LookupKind(workload.KindDeployment)
		o := k.New()
		spec := workload.PodSpec(o)
		spec.Containers = []corev1.Container{{Name: "sidecar", Image: tag}}
		spec.InitContainers = []corev1.Container{
			{Name: "seed", Image: tag},
			{Name: "migrate", Image: migrate, RestartPolicy: &always},
		}
		spec.Volumes = []corev1.Volume{
			{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			{Name: "other", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: tag}}},
			{Name: "models", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: models}}},
		}
		b, _ := json.Marshal(o)
		return b
	}
	cases := []struct {
		name string
		obj  []byte
		old  []byte
		want []string
	}{
		{"a create pins the init container and the image volume", deployment(tag, tag), nil, []string{
			"/spec/template/spec/initContainers/1/image=" + pinned,
			"/spec/template/spec/volumes/2/image/reference=" + pinned,
		}},
		{"an update pins only what it changed", deployment(tag, tag), deployment(pinned, tag), []string{
			"/spec/template/spec/initContainers/1/image=" + pinned,
		}},
		{"both on the recorded digest: nothing", deployment(pinned, pinned), nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, m := newTestHandler(map[string]string{"image-refresh.io/last-refreshed-api-digest": recorded}, nil, true)
			op := admissionv1.Create
			if c.old != nil {
				op = admissionv1.Update
			}
			req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
				Operation: op, Namespace: "tb", Name: "jobs",
				Kind:   metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"},
				Object: runtime.RawExtension{Raw: c.obj}, OldObject: runtime.RawExtension{Raw: c.old},
			}}
			resp := h.Handle(context.Background(), req)
			wantPins(t, m, resp, c.want)
		})
	}
}

func TestHandle_B1_DryRunIsNotCounted(t *testing.T) {
	h, m := newTestHandler(map[string]string{"image-refresh.io/last-refreshed-api-digest": recorded}, nil, true)
	resp := h.Handle(context.Background(), request{op: admissionv1.Create, kind: "Deployment", name: "jobs", dryRun: true,
		images: map[string]string{"api": "reg.local:5000/acme/api:prod"}}.admission())
	if len(resp.Patches) != 1 {
		t.Fatalf("a dry run is not pinned: %+v", resp)
	}
	if n := count(m.AdmissionPins.WithLabelValues("cp", "api")); n != 0 {
		t.Errorf("a dry run counted %v pins", n)
	}
}

func TestHandle_B1_FailsOpen(t *testing.T) {
	managed := request{op: admissionv1.Create, kind: "Deployment", name: "jobs", images: map[string]string{"api": "reg.local:5000/acme/api:prod"}}
	garbled := managed.admission()
	garbled.Object.Raw = []byte(`{"spec":`)
	cases := []struct {
		name     string
		req      admission.Request
		anchors  func(context.Context, config.Workload) (map[string]string, error)
		ready    bool
		wantErrs float64
	}{
		{"cache not synced", managed.admission(), nil, false, 1},
		{"anchor read fails", managed.admission(), func(context.Context, config.Workload) (map[string]string, error) {
			return nil, errors.New("boom")
		}, true, 1},
		{"panic in a read", managed.admission(), func(context.Context, config.Workload) (map[string]string, error) { panic("bug") }, true, 1},
		{"an object that does not decode", garbled, nil, true, 1},
		{"an unmanaged object while not synced is no error", request{op: admissionv1.Create, kind: "Deployment", name: "x",
			images: map[string]string{"api": "a/b:c"}}.admission(), nil, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, m := newTestHandler(nil, nil, c.ready)
			if c.anchors != nil {
				h.annotations = c.anchors
			}
			resp := h.Handle(context.Background(), c.req)
			if !resp.Allowed || len(resp.Patches) != 0 {
				t.Errorf("want allowed unchanged, got %+v", resp)
			}
			if n := count(m.AdmissionErrors); n != c.wantErrs {
				t.Errorf("image_refresh_admission_errors_total = %v, want %v", n, c.wantErrs)
			}
		})
	}
}

// wantPins fails t unless resp allows the request with exactly the
// patches want ("path=value"), each counted by
// image_refresh_admission_pins_total of group cp, image api.
func wantPins(t *testing.T, m *metrics.Metrics, resp admission.Response, want []string) {
	t.Helper()
	if !resp.Allowed {
		t.Fatalf("denied: %+v", resp.Result)
	}
	var got []string
	for _, p := range resp.Patches {
		got = append(got, p.Path+"="+p.Value.(string))
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("patches %q, want %q", got, want)
	}
	if n := count(m.AdmissionPins.WithLabelValues("cp", "api")); n != float64(len(want)) {
		t.Errorf("image_refresh_admission_pins_total = %v, want %d", n, len(want))
	}
}

// count reads a counter.
func count(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}
