package operator

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// countingMapper counts the RESTMapping questions that reach it.
type countingMapper struct {
	meta.RESTMapper
	asked int
}

func (c *countingMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	c.asked++
	return c.RESTMapper.RESTMapping(gk, versions...)
}

// The cache asks whether an object is namespaced on every read (C6: a
// resync over 10,000 workloads); the answer for a kind is built once.
func TestRememberingMapper_C6_AKindIsMappedOnceAndAnUnknownKindIsAskedAgain(t *testing.T) {
	inner := meta.NewDefaultRESTMapper(nil)
	deploy := schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}
	inner.Add(deploy, meta.RESTScopeNamespace)
	counting := &countingMapper{RESTMapper: inner}
	m := newRememberingMapper(counting)

	for i := range 3 {
		got, err := m.RESTMapping(deploy.GroupKind(), "v1")
		if err != nil {
			t.Fatal(err)
		}
		if got.Scope.Name() != meta.RESTScopeNameNamespace || got.Resource.Resource != "deployments" {
			t.Fatalf("read %d: mapping %+v, want namespaced deployments", i, got)
		}
		got.Resource.Resource = "changed" // a caller's change stays its own
	}
	if counting.asked != 1 {
		t.Errorf("the wrapped mapper was asked %d times for one kind, want 1", counting.asked)
	}
	if _, err := m.RESTMapping(deploy.GroupKind(), "v1beta1", "v1"); err != nil || counting.asked != 2 {
		t.Errorf("another version list: err %v, asked %d times, want a new question (2)", err, counting.asked)
	}

	unknown := schema.GroupKind{Group: "example.com", Kind: "Widget"}
	for range 2 {
		if _, err := m.RESTMapping(unknown, "v1"); err == nil {
			t.Fatal("an unknown kind was mapped")
		}
	}
	if counting.asked != 4 {
		t.Errorf("an unknown kind reached the wrapped mapper %d times in 2 questions, want 2 (errors are not kept)", counting.asked-2)
	}
}
