package discovery

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/image-refresh/image-refresh/internal/config"
)

// metaOf is the metadata of a Deployment as LetGoUnlabelled lists it.
func metaOf(name string, annotations ...string) client.Object {
	m := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Annotations: map[string]string{}}}
	m.Kind = "Deployment"
	for i := 0; i+1 < len(annotations); i += 2 {
		m.Annotations[annotations[i]] = annotations[i+1]
	}
	return m
}

func deployRef(name string) config.Workload {
	return config.Workload{Kind: "Deployment", Namespace: "shop", Name: name}
}

func TestReleased_D1_D2(t *testing.T) {
	const mark = prefix + "/discovered-group"
	configured := config.Group{Name: "explicit", Anchor: deployRef("claimed")}
	for _, tc := range []struct {
		name    string
		obj     client.Object
		managed bool
		want    bool
	}{
		{"a marked workload no longer labelled and named by no group is let go", metaOf("api", mark, "shop/deployment/api"), false, true},
		{"a marked workload still labelled in is kept", metaOf("api", mark, "shop/deployment/api"), true, false},
		{"a marked workload a configured group names is kept: configured groups win", metaOf("claimed", mark, "shop/deployment/claimed"), false, false},
		{"an unmarked workload with state (a configured anchor of another config) is kept", metaOf("other", prefix+"/last-refreshed-api-digest", "sha256:aa"), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, _ := kindOfMeta(tc.obj)
			w := config.Workload{Kind: k.Name, Namespace: tc.obj.GetNamespace(), Name: tc.obj.GetName()}
			got := Released(prefix, []client.Object{tc.obj}, map[config.Workload]bool{w: tc.managed}, []config.Group{configured})
			if released := reflect.DeepEqual(got, []config.Workload{w}); released != tc.want {
				t.Errorf("Released = %v; want let go: %v", got, tc.want)
			}
		})
	}
}
