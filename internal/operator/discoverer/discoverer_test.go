package discoverer

import (
	"reflect"
	"testing"

	"github.com/image-refresh/image-refresh/internal/config"
)

// TestDropped_D1_D2: after its first sweep, the leader lets go of the
// workloads of the groups it drops: those no longer labelled in and named
// by no group (a configured group wins), and nothing else, so that a
// steady state costs no list (C6).
func TestDropped_D1_D2(t *testing.T) {
	w := func(name string) config.Workload {
		return config.Workload{Kind: "Deployment", Namespace: "shop", Name: name}
	}
	group := func(name string, ws ...config.Workload) config.Group {
		g := config.Group{Name: name, Anchor: ws[0]}
		for _, x := range ws {
			g.Images = append(g.Images, config.Image{Name: x.Name, Repository: "r/" + x.Name, Tag: "prod",
				Targets: []config.Target{{Kind: x.Kind, Namespace: x.Namespace, Name: x.Name, Container: "app"}}})
		}
		return g
	}
	old := map[string]config.Group{
		"shop/deployment/api":  group("shop/deployment/api", w("api"), w("worker")), // api unlabelled, worker still labelled
		"shop/deployment/web":  group("shop/deployment/web", w("web")),              // unlabelled, but a configured group names it
		"shop/deployment/kept": group("shop/deployment/kept", w("kept")),
	}
	managed := map[config.Workload]bool{w("worker"): true, w("kept"): true}
	all := []config.Group{group("shop/deployment/kept", w("kept")), group("explicit", w("web"))}
	if got, want := dropped(old, managed, all), []config.Workload{w("api")}; !reflect.DeepEqual(got, want) {
		t.Errorf("dropped = %v, want %v", got, want)
	}
}
