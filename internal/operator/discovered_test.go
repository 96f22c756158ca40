package operator

import (
	"reflect"
	"testing"

	"github.com/image-refresh/image-refresh/internal/config"
)

// TestUnused_C2_D1: the images of a group let go stop being polled only
// when no group still uses their repository:tag.
func TestUnused_C2_D1(t *testing.T) {
	img := func(repo string) config.Image { return config.Image{Name: "x", Repository: repo, Tag: "prod"} }
	old := map[string]config.Group{
		"shop/deployment/gone": {Name: "shop/deployment/gone", Images: []config.Image{img("r/only-gone"), img("r/shared")}},
		"shop/deployment/kept": {Name: "shop/deployment/kept", Images: []config.Image{img("r/kept")}},
	}
	all := []config.Group{
		{Name: "shop/deployment/kept", Images: []config.Image{img("r/kept")}},
		{Name: "explicit", Images: []config.Image{img("r/shared")}}, // a configured group
	}
	if got, want := unused(old, all), []config.Image{img("r/only-gone")}; !reflect.DeepEqual(got, want) {
		t.Errorf("unused = %v, want %v", got, want)
	}
}
