package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// WithT returns a copy of the env whose failures go to t (a subtest), so
// that a table can share one namespace and registry.
func (e *Env) WithT(t *testing.T) *Env {
	c := *e
	c.T = t
	return &c
}

// Pinned seeds the namespace, runs the first observation and the pin, and
// returns the pinned digest and the config.
func (e *Env) Pinned() (digest, cfg string) {
	e.T.Helper()
	digest = e.Seed()
	cfg = e.Config(SeedShape)
	for i := range 2 {
		if code, _ := e.Tick(cfg); code != 0 {
			e.T.Fatalf("setup tick %d exit %d, want 0", i+1, code)
		}
	}
	if got, want := e.Image("jobs-manager", "api"), e.Repo("api")+":prod@"+digest; got != want {
		e.T.Fatalf("setup: jobs-manager not pinned: %s, want %s", got, want)
	}
	return digest, cfg
}

// ResourceVersions returns the resourceVersion of every Deployment of the
// namespace, by name.
func (e *Env) ResourceVersions() map[string]string {
	e.T.Helper()
	list, err := e.C.Client.AppsV1().Deployments(e.NS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range list.Items {
		out[d.Name] = d.ResourceVersion
	}
	return out
}

// OwnEvents returns the Events image-refresh recorded in the namespace, as
// name → count (a repeat bumps the count of the same Event).
func (e *Env) OwnEvents() map[string]int32 {
	e.T.Helper()
	list, err := e.C.Client.CoreV1().Events(e.NS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	out := map[string]int32{}
	for _, ev := range list.Items {
		if ev.Source.Component == workload.Component || ev.ReportingController == workload.Component {
			out[ev.Name] = ev.Count
		}
	}
	return out
}

// EventMessages returns every Event message of the namespace.
func (e *Env) EventMessages() []string {
	e.T.Helper()
	return e.EventsWhere(func(corev1.Event) bool { return true })
}

// AssertUnchanged fails when a Deployment's resourceVersion moved or
// image-refresh recorded or repeated an Event since before.
func (e *Env) AssertUnchanged(what string, rvs map[string]string, events map[string]int32) {
	e.T.Helper()
	for n, rv := range rvs {
		if got := e.Deployment(n).ResourceVersion; got != rv {
			e.T.Errorf("%s wrote Deployment %s (resourceVersion %s -> %s)", what, n, rv, got)
		}
	}
	after := e.OwnEvents()
	for n, c := range after {
		if events[n] != c {
			e.T.Errorf("%s recorded an Event %s (count %d -> %d)", what, n, events[n], c)
		}
	}
}

// Status runs `status -o json` and decodes its rows.
func (e *Env) Status(cfg string) []map[string]any {
	e.T.Helper()
	code, out, errOut := e.Run("status", "--config", cfg, "--kubeconfig", e.Kubeconfig, "-o", "json")
	if code != 0 {
		e.T.Fatalf("status exit %d:\n%s", code, errOut)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		e.T.Fatalf("status -o json is not a JSON list: %v\n%s", err, out)
	}
	return rows
}

// Row returns the status row of a target workload and container (or init
// container, or image volume by its name).
func Row(rows []map[string]any, workloadName, container string) map[string]any {
	for _, r := range rows {
		target, _ := r["target"].(string)
		for _, what := range []string{" container ", " init container ", " image volume "} {
			if strings.Contains(target, "/"+workloadName+what+container) {
				return r
			}
		}
	}
	return nil
}

// LogLines returns the log lines at level (e.g. "WARN") that hold every one
// of substrs.
func LogLines(logs, level string, substrs ...string) []string {
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

// CopyContent copies repo@digest from one registry to another under tag,
// byte for byte, so the digest is the same there (a mirror).
func CopyContent(t *testing.T, from, to *testregistry.Server, repo, tag, digest string) {
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

// States is a status row's state, then the states beside it (its "also",
// O2): ["drifted", "running-stale"].
func States(row map[string]any) []string {
	if row == nil {
		return nil
	}
	s, _ := row["state"].(string)
	out := []string{s}
	also, _ := row["also"].([]any)
	for _, a := range also {
		if m, ok := a.(map[string]any); ok {
			st, _ := m["state"].(string)
			out = append(out, st)
		}
	}
	return out
}

// StatesAre reports whether a status row's state and the states beside it
// are exactly want.
func StatesAre(row map[string]any, want ...string) bool {
	got := States(row)
	return strings.Join(got, ",") == strings.Join(want, ",")
}

// IndexChildren lists the digests of the platform manifests of the image
// index ref ("repo@sha256:…"), in its order.
func IndexChildren(t *testing.T, ref string) []string {
	t.Helper()
	d, err := name.NewDigest(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(d)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, desc := range m.Manifests {
		out = append(out, desc.Digest.String())
	}
	return out
}
