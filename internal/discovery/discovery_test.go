package discovery

import (
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/image-refresh/image-refresh/internal/config"
)

const prefix = "image-refresh.io"

type objOption func(*metav1.ObjectMeta, *corev1.PodSpec)

func labelled(kv ...string) objOption {
	return func(m *metav1.ObjectMeta, _ *corev1.PodSpec) {
		if m.Labels == nil {
			m.Labels = map[string]string{}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m.Labels[kv[i]] = kv[i+1]
		}
	}
}

func annotated(kv ...string) objOption {
	return func(m *metav1.ObjectMeta, _ *corev1.PodSpec) {
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m.Annotations[kv[i]] = kv[i+1]
		}
	}
}

func container(name, image string) objOption {
	return func(_ *metav1.ObjectMeta, s *corev1.PodSpec) {
		s.Containers = append(s.Containers, corev1.Container{Name: name, Image: image})
	}
}

func initContainer(name, image string) objOption {
	return func(_ *metav1.ObjectMeta, s *corev1.PodSpec) {
		s.InitContainers = append(s.InitContainers, corev1.Container{Name: name, Image: image})
	}
}

func imageVolume(name, image string) objOption {
	return func(_ *metav1.ObjectMeta, s *corev1.PodSpec) {
		s.Volumes = append(s.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: image}}})
	}
}

func enabled() objOption { return labelled(prefix+"/enabled", "true") }

func deployment(ns, name string, opts ...objOption) client.Object {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for _, o := range opts {
		o(&d.ObjectMeta, &d.Spec.Template.Spec)
	}
	return d
}

func cronJob(ns, name string, opts ...objOption) client.Object {
	c := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	for _, o := range opts {
		o(&c.ObjectMeta, &c.Spec.JobTemplate.Spec.Template.Spec)
	}
	return c
}

func target(kind, ns, name, ctr string) config.Target {
	return config.Target{Kind: kind, Namespace: ns, Name: name, Container: ctr}
}

func wl(kind, ns, name string) config.Workload {
	return config.Workload{Kind: kind, Namespace: ns, Name: name}
}

func TestDiscover_D1(t *testing.T) {
	for _, tc := range []struct {
		name       string
		namespaces []string
		objs       []client.Object
		configured []config.Group
		want       []config.Group
		notes      []string
	}{
		{
			name: "a labelled Deployment is its own group and anchor, each container's repository:tag from its template",
			objs: []client.Object{deployment("shop", "api", enabled(), container("api", "reg.example/acme/api:prod"), container("side", "reg.example/acme/side:1.2"))},
			want: []config.Group{{Name: "shop/deployment/api", Anchor: wl("Deployment", "shop", "api"), Images: []config.Image{
				{Name: "api", Repository: "reg.example/acme/api", Tag: "prod", Targets: []config.Target{target("Deployment", "shop", "api", "api")}},
				{Name: "side", Repository: "reg.example/acme/side", Tag: "1.2", Targets: []config.Target{target("Deployment", "shop", "api", "side")}},
			}}},
		},
		{
			name: "an unlabelled workload outside a labelled namespace is not managed",
			objs: []client.Object{deployment("shop", "api", container("api", "reg.example/acme/api:prod"))},
		},
		{
			name:       "every workload of a labelled namespace is managed, one group each, and P/enabled=false opts one out",
			namespaces: []string{"shop"},
			objs: []client.Object{
				deployment("shop", "api", container("api", "reg.example/acme/api:prod")),
				cronJob("shop", "report", container("job", "reg.example/acme/job:prod")),
				deployment("shop", "legacy", labelled(prefix+"/enabled", "false"), container("x", "reg.example/acme/x:prod")),
				deployment("other", "web", container("web", "reg.example/acme/web:prod")),
			},
			want: []config.Group{
				{Name: "shop/cronjob/report", Anchor: wl("CronJob", "shop", "report"), Images: []config.Image{
					{Name: "job", Repository: "reg.example/acme/job", Tag: "prod", Targets: []config.Target{target("CronJob", "shop", "report", "job")}}}},
				{Name: "shop/deployment/api", Anchor: wl("Deployment", "shop", "api"), Images: []config.Image{
					{Name: "api", Repository: "reg.example/acme/api", Tag: "prod", Targets: []config.Target{target("Deployment", "shop", "api", "api")}}}},
			},
		},
		{
			name: "P/ignore-containers leaves the listed containers alone",
			objs: []client.Object{deployment("shop", "api", enabled(), annotated(prefix+"/ignore-containers", "side, proxy"),
				container("api", "reg.example/acme/api:prod"), container("side", "reg.example/acme/side:1"), container("proxy", "reg.example/acme/proxy:1"))},
			want: []config.Group{{Name: "shop/deployment/api", Anchor: wl("Deployment", "shop", "api"), Images: []config.Image{
				{Name: "api", Repository: "reg.example/acme/api", Tag: "prod", Targets: []config.Target{target("Deployment", "shop", "api", "api")}}}}},
		},
		{
			name: "P/group joins workloads of one namespace; the alphabetically first is the anchor; one image per repository:tag",
			objs: []client.Object{
				deployment("shop", "web", enabled(), labelled(prefix+"/group", "front"), container("app", "reg.example/acme/web:prod")),
				deployment("shop", "api", enabled(), labelled(prefix+"/group", "front"), container("app", "reg.example/acme/api:prod"), container("log", "reg.example/acme/log:1")),
				deployment("shop", "worker", enabled(), labelled(prefix+"/group", "front"), container("log", "reg.example/acme/log:1")),
				deployment("other", "web", enabled(), labelled(prefix+"/group", "front"), container("app", "reg.example/acme/web:prod")),
			},
			want: []config.Group{
				{Name: "other/front", Anchor: wl("Deployment", "other", "web"), Images: []config.Image{
					{Name: "app", Repository: "reg.example/acme/web", Tag: "prod", Targets: []config.Target{target("Deployment", "other", "web", "app")}}}},
				{Name: "shop/front", Anchor: wl("Deployment", "shop", "api"), Images: []config.Image{
					{Name: "app", Repository: "reg.example/acme/api", Tag: "prod", Targets: []config.Target{target("Deployment", "shop", "api", "app")}},
					{Name: "log", Repository: "reg.example/acme/log", Tag: "1", Targets: []config.Target{target("Deployment", "shop", "api", "log"), target("Deployment", "shop", "worker", "log")}},
					{Name: "web-app", Repository: "reg.example/acme/web", Tag: "prod", Targets: []config.Target{target("Deployment", "shop", "web", "app")}},
				}},
			},
		},
		{
			name: "the tag survives the pin: repo:tag@digest is discovered as repo:tag; a bare repository follows latest; repo@digest is an operator pin (R2)",
			objs: []client.Object{deployment("shop", "api", enabled(),
				container("pinned", "reg.example/acme/api:prod@sha256:"+strings.Repeat("a", 64)),
				container("bare", "reg.example/acme/bare"),
				container("op", "reg.example/acme/op@sha256:"+strings.Repeat("b", 64)))},
			want: []config.Group{{Name: "shop/deployment/api", Anchor: wl("Deployment", "shop", "api"), Images: []config.Image{
				{Name: "pinned", Repository: "reg.example/acme/api", Tag: "prod", Targets: []config.Target{target("Deployment", "shop", "api", "pinned")}},
				{Name: "bare", Repository: "reg.example/acme/bare", Tag: "latest", Targets: []config.Target{target("Deployment", "shop", "api", "bare")}},
			}}},
			notes: []string{"Deployment shop/api container op: not managed: pinned by digest with no tag (an operator pin, R2)"},
		},
		{
			name: "K1: init containers and image volumes are adopted like containers; one image for one repository:tag; ignore-containers names them too",
			objs: []client.Object{deployment("shop", "api", enabled(), annotated(prefix+"/ignore-containers", "seed, volume:scratch"),
				container("app", "reg.example/acme/api:prod"),
				initContainer("migrate", "reg.example/acme/api:prod"),
				initContainer("shipper", "reg.example/acme/log:1"),
				initContainer("seed", "reg.example/acme/seed:1"),
				imageVolume("models", "reg.example/acme/models:v2"),
				imageVolume("scratch", "reg.example/acme/scratch:1"))},
			want: []config.Group{{Name: "shop/deployment/api", Anchor: wl("Deployment", "shop", "api"), Images: []config.Image{
				{Name: "app", Repository: "reg.example/acme/api", Tag: "prod", Targets: []config.Target{target("Deployment", "shop", "api", "app"), target("Deployment", "shop", "api", "migrate")}},
				{Name: "shipper", Repository: "reg.example/acme/log", Tag: "1", Targets: []config.Target{target("Deployment", "shop", "api", "shipper")}},
				{Name: "models", Repository: "reg.example/acme/models", Tag: "v2", Targets: []config.Target{target("Deployment", "shop", "api", "volume:models")}},
			}}},
		},
		{
			name: "D2: a configured group wins for the workloads it names",
			objs: []client.Object{
				deployment("shop", "api", enabled(), container("api", "reg.example/acme/api:prod")),
				deployment("shop", "web", enabled(), container("web", "reg.example/acme/web:prod")),
			},
			configured: []config.Group{{Name: "explicit", Anchor: wl("Deployment", "shop", "api"), Images: []config.Image{
				{Name: "api", Repository: "reg.example/acme/api", Tag: "prod", Targets: []config.Target{target("Deployment", "shop", "api", "api")}}}}},
			want: []config.Group{{Name: "shop/deployment/web", Anchor: wl("Deployment", "shop", "web"), Images: []config.Image{
				{Name: "web", Repository: "reg.example/acme/web", Tag: "prod", Targets: []config.Target{target("Deployment", "shop", "web", "web")}}}}},
			notes: []string{"Deployment shop/api: named by the configured group explicit, which wins over the discovery label (docs/discovery.md)"},
		},
		{
			name: "an invalid group name falls back to the workload's own group, with a note",
			objs: []client.Object{deployment("shop", "api", enabled(), annotated(prefix+"/group", "Not_A_Label"), container("api", "reg.example/acme/api:prod"))},
			want: []config.Group{{Name: "shop/deployment/api", Anchor: wl("Deployment", "shop", "api"), Images: []config.Image{
				{Name: "api", Repository: "reg.example/acme/api", Tag: "prod", Targets: []config.Target{target("Deployment", "shop", "api", "api")}}}}},
			notes: []string{`Deployment shop/api: image-refresh.io/group "Not_A_Label" is not a valid group name`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nss := map[string]bool{}
			for _, n := range tc.namespaces {
				nss[n] = true
			}
			res := Discover(Input{Prefix: prefix, Namespaces: nss, Workloads: tc.objs, Configured: tc.configured})
			for i := range tc.want {
				tc.want[i].Discovered = true // every group Discover makes
			}
			if !reflect.DeepEqual(tc.want, res.Groups) {
				t.Errorf("groups:\n got %+v\nwant %+v", res.Groups, tc.want)
			}
			var notes []string
			for _, n := range res.Notes {
				notes = append(notes, n.String())
			}
			if len(notes) != len(tc.notes) {
				t.Fatalf("notes %q, want %d like %q", notes, len(tc.notes), tc.notes)
			}
			for i, want := range tc.notes {
				if !strings.Contains(notes[i], want) {
					t.Errorf("note %d = %q, want it to contain %q", i, notes[i], want)
				}
			}
		})
	}
}

// TestDiscover_D2_ADiscoveredGroupIsTheGroupItsConfigWouldBe runs both
// ways: a labelled workload yields exactly the group that the config file
// would declare for it, and that group passes the config's own validation
// (so every rule of the engine sees the same input either way).
func TestDiscover_D2_ADiscoveredGroupIsTheGroupItsConfigWouldBe(t *testing.T) {
	res := Discover(Input{Prefix: prefix, Workloads: []client.Object{
		deployment("shop", "api", enabled(), container("api", "reg.example/acme/api:prod"), container("side", "reg.example/acme/side:1")),
	}})
	cfg, err := config.Parse([]byte(`
groups:
  - name: api
    anchor: {kind: Deployment, namespace: shop, name: api}
    images:
      - name: api
        repository: reg.example/acme/api
        tag: prod
        targets: [{kind: Deployment, namespace: shop, name: api, container: api}]
      - name: side
        repository: reg.example/acme/side
        tag: "1"
        targets: [{kind: Deployment, namespace: shop, name: api, container: side}]
`), "config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Groups) != 1 {
		t.Fatalf("discovered %d groups, want 1", len(res.Groups))
	}
	got, want := res.Groups[0], cfg.Groups[0]
	got.Name = want.Name // discovered names carry the namespace and kind
	if !got.Discovered {
		t.Errorf("a discovered group is not marked Discovered")
	}
	got.Discovered = false // the only other difference
	if !reflect.DeepEqual(want, got) {
		t.Errorf("discovered group differs from the configured one:\nconfigured %+v\ndiscovered %+v", want, got)
	}
	c := config.Defaults()
	c.Groups = []config.Group{got}
	if err := c.Validate(); err != nil {
		t.Errorf("the discovered group does not pass the config's validation: %v", err)
	}
}

func TestDiscover_D1_ImageNamesStayValidAnnotationKeys(t *testing.T) {
	long := strings.Repeat("c", 63)
	res := Discover(Input{Prefix: prefix, Workloads: []client.Object{
		deployment("shop", "api", enabled(), container(long, "reg.example/acme/api:prod")),
	}})
	if len(res.Groups) != 1 || len(res.Groups[0].Images) != 1 {
		t.Fatalf("groups: %+v", res.Groups)
	}
	c := config.Defaults()
	g := res.Groups[0]
	g.Name = "api"
	c.Groups = []config.Group{g}
	if err := c.Validate(); err != nil {
		t.Errorf("image name %q of a 63-character container: %v", g.Images[0].Name, err)
	}
}

func TestDiscover_V2_TheAnchorsOnFailedRolloutIsTheGroups(t *testing.T) {
	key := prefix + "/on-failed-rollout"
	res := Discover(Input{Prefix: prefix, Workloads: []client.Object{
		deployment("shop", "api", enabled(), annotated(key, "rollback"), container("api", "reg.example/acme/api:prod")),
		deployment("shop", "web", enabled(), container("web", "reg.example/acme/web:prod")),
		deployment("shop", "odd", enabled(), annotated(key, "retry"), container("odd", "reg.example/acme/odd:prod")),
	}})
	got := map[string]config.OnFailedRollout{}
	for _, g := range res.Groups {
		got[g.Anchor.Name] = g.OnFailedRollout
	}
	if want := map[string]config.OnFailedRollout{"api": config.OnFailedRolloutRollback, "web": "", "odd": ""}; !reflect.DeepEqual(got, want) {
		t.Errorf("onFailedRollout by anchor %v, want %v", got, want)
	}
	noted := false
	for _, n := range res.Notes {
		noted = noted || (n.Workload.Name == "odd" && strings.Contains(n.Msg, `"retry" is not one of hold, rollback`))
	}
	if !noted {
		t.Errorf("no note names the invalid %s on odd: %v", key, res.Notes)
	}
}
