package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/internal/testregistry"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// withT returns a copy of the env whose failures go to t (a subtest), so
// that a table can share one namespace and registry.
func (e *env) withT(t *testing.T) *env {
	c := *e
	c.t = t
	return &c
}

// pinned seeds the namespace, runs the first observation and the pin, and
// returns the pinned digest and the config.
func (e *env) pinned() (digest, cfg string) {
	e.t.Helper()
	digest = e.seed()
	cfg = e.config(seedShape)
	for i := range 2 {
		if code, _ := e.tick(cfg); code != 0 {
			e.t.Fatalf("setup tick %d exit %d, want 0", i+1, code)
		}
	}
	if got, want := e.image("jobs-manager", "api"), e.repo("api")+":prod@"+digest; got != want {
		e.t.Fatalf("setup: jobs-manager not pinned: %s, want %s", got, want)
	}
	return digest, cfg
}

// resourceVersions returns the resourceVersion of every Deployment of the
// namespace, by name.
func (e *env) resourceVersions() map[string]string {
	e.t.Helper()
	list, err := e.c.Client.AppsV1().Deployments(e.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range list.Items {
		out[d.Name] = d.ResourceVersion
	}
	return out
}

// ownEvents returns the Events image-refresh recorded in the namespace, as
// name → count (a repeat bumps the count of the same Event).
func (e *env) ownEvents() map[string]int32 {
	e.t.Helper()
	list, err := e.c.Client.CoreV1().Events(e.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]int32{}
	for _, ev := range list.Items {
		if ev.Source.Component == workload.Component || ev.ReportingController == workload.Component {
			out[ev.Name] = ev.Count
		}
	}
	return out
}

// eventMessages returns every Event message of the namespace.
func (e *env) eventMessages() []string {
	e.t.Helper()
	return e.eventsWhere(func(corev1.Event) bool { return true })
}

// assertUnchanged fails when a Deployment's resourceVersion moved or
// image-refresh recorded or repeated an Event since before.
func (e *env) assertUnchanged(what string, rvs map[string]string, events map[string]int32) {
	e.t.Helper()
	for n, rv := range rvs {
		if got := e.deployment(n).ResourceVersion; got != rv {
			e.t.Errorf("%s wrote Deployment %s (resourceVersion %s -> %s)", what, n, rv, got)
		}
	}
	after := e.ownEvents()
	for n, c := range after {
		if events[n] != c {
			e.t.Errorf("%s recorded an Event %s (count %d -> %d)", what, n, events[n], c)
		}
	}
}

// status runs `status -o json` and decodes its rows.
func (e *env) status(cfg string) []map[string]any {
	e.t.Helper()
	code, out, errOut := e.run("status", "--config", cfg, "--kubeconfig", e.kubeconfig, "-o", "json")
	if code != 0 {
		e.t.Fatalf("status exit %d:\n%s", code, errOut)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		e.t.Fatalf("status -o json is not a JSON list: %v\n%s", err, out)
	}
	return rows
}

// row returns the status row of a target workload and container.
func row(rows []map[string]any, workloadName, container string) map[string]any {
	for _, r := range rows {
		target, _ := r["target"].(string)
		if strings.Contains(target, "/"+workloadName+" container "+container) {
			return r
		}
	}
	return nil
}

// logLines returns the log lines at level (e.g. "WARN") that hold every one
// of substrs.
func logLines(logs, level string, substrs ...string) []string {
	var out []string
	for _, l := range strings.Split(logs, "\n") {
		if !strings.Contains(l, "level="+level) {
			continue
		}
		all := true
		for _, s := range substrs {
			all = all && strings.Contains(l, s)
		}
		if all {
			out = append(out, l)
		}
	}
	return out
}

// copyContent copies repo@digest from one registry to another under tag,
// byte for byte, so the digest is the same there (a mirror).
func copyContent(t *testing.T, from, to *testregistry.Server, repo, tag, digest string) {
	t.Helper()
	src, err := name.NewDigest(from.Host()+"/"+repo+"@"+digest, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := name.NewTag(to.Host()+"/"+repo+":"+tag, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(src)
	if err != nil {
		t.Fatalf("get %s: %v", src, err)
	}
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			t.Fatal(err)
		}
		err = remote.WriteIndex(dst, idx)
		if err != nil {
			t.Fatalf("write %s: %v", dst, err)
		}
	} else {
		img, err := desc.Image()
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(dst, img); err != nil {
			t.Fatalf("write %s: %v", dst, err)
		}
	}
	got, err := remote.Head(dst)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest.String() != digest {
		t.Fatalf("mirror copy has digest %s, want %s", got.Digest, digest)
	}
}
