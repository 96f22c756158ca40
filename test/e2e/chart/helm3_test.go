package chart

import (
	"encoding/json"
	"fmt"
	"testing"
)

// TestChart_Helm3LintsAndRendersLikeHelm4 runs Helm 3, what most clusters
// run, over the chart in every mode: `helm lint --strict` passes and `helm
// template` renders the same objects as Helm 4. It also proves that the
// helm3 of hack/build-cluster.sh carries its Kubernetes version: built
// without it, Helm 3 assumes v1.20 when no cluster is asked and refuses the
// chart's kubeVersion.
func TestChart_Helm3LintsAndRendersLikeHelm4(t *testing.T) {
	h3, h4 := newHelmMajor(t, 3), newHelm(t)
	for name, md := range modes {
		t.Run(name, func(t *testing.T) {
			h3 := &helm{t: t, bin: h3.bin, home: h3.home, kubeconfig: h3.kubeconfig}
			h4 := &helm{t: t, bin: h4.bin, home: h4.home, kubeconfig: h4.kubeconfig}
			if out, err := h3.run("lint", "--strict", chartDir(t), "-f", ciValues(t, md.values)); err != nil {
				t.Fatalf("helm3 lint: %v\n%s", err, out)
			}
			got, want := objectsByName(t, h3.template(ciValues(t, md.values))), objectsByName(t, h4.template(ciValues(t, md.values)))
			for key, w := range want {
				if g, ok := got[key]; !ok {
					t.Errorf("Helm 3 did not render %s", key)
				} else if g != w {
					t.Errorf("Helm 3 renders %s differently:\nhelm3: %s\nhelm4: %s", key, g, w)
				}
			}
			for key := range got {
				if _, ok := want[key]; !ok {
					t.Errorf("Helm 3 renders %s, Helm 4 does not", key)
				}
			}
			if len(want) == 0 {
				t.Fatalf("Helm 4 rendered nothing to compare")
			}
		})
	}
}

// objectsByName returns the JSON of each rendered object by kind,
// namespace and name.
func objectsByName(t *testing.T, m *manifest) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, o := range m.objects {
		b, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		out[fmt.Sprintf("%T %s/%s", o, o.GetNamespace(), o.GetName())] = string(b)
	}
	return out
}
