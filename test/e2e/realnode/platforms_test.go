package realnode

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/image-refresh/image-refresh/test/support/content"
	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/localcluster"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

var platformGroup = e2e.Groups(e2e.GroupOf("multi", "Deployment", "multi",
	e2e.ImageOf("app", "multi", "prod", e2e.Target("Deployment", "multi", "app"))))

// pushIndex pushes an OCI index to repo:tag of nodeapp for build as the
// linux/amd64 manifest (when amd64) and a random linux/arm64 image, and
// returns the index digest and its manifests' digests by platform.
func (w *world) pushIndex(repo, tag, build string, amd64 bool) (string, map[string]string) {
	w.t.Helper()
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	add := func(img v1.Image, p v1.Platform) {
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	if amd64 {
		img, err := localcluster.AppImage(w.c.BinDir, build)
		if err != nil {
			w.t.Fatal(err)
		}
		// A config of this run's own: containerd keeps one image per
		// config, with the first repository digest it was pulled by, and
		// reports that one as the imageID; a node that ran this build for
		// an earlier run (another registry, another index) would report
		// that run's index.
		cf, err := img.ConfigFile()
		if err != nil {
			w.t.Fatal(err)
		}
		cf = cf.DeepCopy()
		if cf.Config.Labels == nil {
			cf.Config.Labels = map[string]string{}
		}
		cf.Config.Labels["io.image-refresh.test.run"] = w.ns
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			w.t.Fatal(err)
		}
		add(img, v1.Platform{OS: "linux", Architecture: "amd64"})
	}
	arm, err := content.RandomOCIImageFor(v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"})
	if err != nil {
		w.t.Fatal(err)
	}
	add(arm, v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"})
	ref, err := name.NewTag(w.reg.Host()+"/"+repo+":"+tag, name.Insecure)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		w.t.Fatalf("push index of build %s to %s: %v", build, ref, err)
	}
	d, err := idx.Digest()
	if err != nil {
		w.t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		w.t.Fatal(err)
	}
	children := map[string]string{}
	for _, desc := range m.Manifests {
		children[desc.Platform.Architecture] = desc.Digest.String()
	}
	return d.String(), children
}

// TestRealNode_V3_AnIndexWithoutTheNodesPlatformIsHeldAndOneWithItIsPinnedAndRun:
// on a real kubelet and containerd (linux/amd64), an index that holds
// only linux/arm64 is never pinned (containerd would fail the pull with
// "no match for platform in manifest"); an index with linux/amd64 is
// pinned by its index digest, the node pulls and runs the amd64 manifest,
// and the pod counts as on the pin (N1).
func TestRealNode_V3_AnIndexWithoutTheNodesPlatformIsHeldAndOneWithItIsPinnedAndRun(t *testing.T) {
	w := newWorld(t)
	a := w.pushBuild("acme/multi", "prod", "A")
	tag := w.host + "/acme/multi:prod"
	testenv.Deployment(t, w.c.Client, w.ns, "multi", testenv.WithContainer("app", tag), testenv.WithReplicas(1), testenv.OnRealNode())
	w.readyPod("multi")
	cfg := w.config(platformGroup)
	for i := range 2 {
		if code, _, logs := w.run("tick", "--config", cfg, "--kubeconfig", w.c.Kubeconfig, "--discovery=false"); code != 0 {
			t.Fatalf("setup tick %d: exit %d:\n%s", i+1, code, logs)
		}
	}
	w.waitImage("multi", tag+"@"+a, time.Minute)
	pod := w.readyPod("multi")

	armOnly, _ := w.pushIndex("acme/multi", "prod", "B", false)
	code, _, logs := w.run("tick", "--config", cfg, "--kubeconfig", w.c.Kubeconfig, "--discovery=false")
	if code != 1 {
		t.Errorf("tick over an arm64-only index: exit %d, want 1:\n%s", code, logs)
	}
	if len(e2e.LogLines(logs, "ERROR", "at "+armOnly, "linux/amd64 (node ", "it serves linux/arm64/v8")) != 1 {
		t.Errorf("want one ERROR line naming %s, linux/amd64 and a node:\n%s", armOnly, logs)
	}
	if got := w.deployment("multi").Spec.Template.Spec.Containers[0].Image; got != tag+"@"+a {
		t.Errorf("the Deployment runs %s, want it held on build A %s", got, a)
	}
	if got := w.served(pod); !strings.Contains(got, "build A") {
		t.Errorf("the pod answers %q, want build A", got)
	}

	index, children := w.pushIndex("acme/multi", "prod", "C", true)
	if code, _, logs := w.run("tick", "--config", cfg, "--kubeconfig", w.c.Kubeconfig, "--discovery=false"); code != 0 {
		t.Fatalf("tick over an index with linux/amd64: exit %d, want 0:\n%s", code, logs)
	}
	w.waitImage("multi", tag+"@"+index, time.Minute)
	next := w.readyPod("multi", pod.Name)
	if got := w.served(next); !strings.Contains(got, "build C") {
		t.Errorf("the pod on the index answers %q, want build C", got)
	}
	// containerd reports the digest the pod asked for (the index's); a
	// runtime may report the platform manifest it pulled instead (the
	// local cluster's fake nodes test that one). Either is the pin (N1).
	if got := imageID(next, "app"); !strings.HasSuffix(got, "@"+index) && !strings.HasSuffix(got, "@"+children["amd64"]) {
		t.Errorf("the pod's imageID %q, want the index %s or its amd64 manifest %s", got, index, children["amd64"])
	}
	// N1: that pod runs the pin.
	code, out, logs := w.run("status", "--config", cfg, "--kubeconfig", w.c.Kubeconfig, "-o", "json")
	if code != 0 {
		t.Fatalf("status: exit %d:\n%s", code, logs)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("status -o json: %v\n%s", err, out)
	}
	if len(rows) != 1 || rows[0]["state"] != "pinned" || rows[0]["running"] != "1/1" {
		t.Errorf("status rows %v, want one pinned, running 1/1", rows)
	}
}
