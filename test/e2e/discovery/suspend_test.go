package discovery

import (
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// O1 for a discovered workload: it is its own anchor, so P/suspend on the
// workload itself suspends it; `suspend --group` takes its discovered
// group's name too.
func TestTick_O1_ADiscoveredWorkloadIsSuspendedOnItself(t *testing.T) {
	e := &env{e2e.DiscoveryEnv(t)}
	a := e.Push("api", "prod")
	tag := e.Repo("api") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "api", testenv.WithContainer("api", tag))
	e.Settle("Deployment", "api")
	cfg := e.Config("pinFormat: digest\n")
	e.Enable("Deployment", "api")
	for range 2 {
		if code, _ := e.DiscoveryTick(cfg); code != 0 {
			t.Fatalf("setup tick exit %d", code)
		}
	}
	if got := e.Image("api", "api"); got != tag+"@"+a {
		t.Fatalf("setup: api on %s, want %s", got, tag+"@"+a)
	}
	e.AnnotateAs("argocd-controller", "api", map[string]*string{e.Key("suspend"): e2e.Ptr("true")})
	b := e.Push("api", "prod")
	if code, logs := e.DiscoveryTick(cfg); code != 0 || !strings.Contains(logs, "held back") {
		t.Fatalf("tick of the suspended workload: exit %d, want 0 holding the new digest back:\n%s", code, logs)
	}
	if got := e.Image("api", "api"); got != tag+"@"+a {
		t.Errorf("a suspended discovered workload moved to %s", got)
	}
	code, out, stderr := e.Run("status", "--config", cfg, "--kubeconfig", e.Kubeconfig, "--watch-namespaces", e.NS, "-o", "json")
	if code != 0 || !strings.Contains(out, `"state": "suspended"`) || !strings.Contains(out, "suspended by argocd-controller until resumed") {
		t.Errorf("status: exit %d, want the discovered row suspended by argocd-controller:\n%s\n%s", code, out, stderr)
	}
	group := e.NS + "/deployment/api"
	if code, _, stderr := e.Run("resume", "--config", cfg, "--kubeconfig", e.Kubeconfig, "--watch-namespaces", e.NS, "--group", group); code != 0 {
		t.Fatalf("resume --group %s: exit %d\n%s", group, code, stderr)
	}
	if code, _ := e.DiscoveryTick(cfg); code != 0 {
		t.Fatalf("tick after resume exit %d", code)
	}
	if got := e.Image("api", "api"); got != tag+"@"+b {
		t.Errorf("after resume api on %s, want %s", got, tag+"@"+b)
	}
}
