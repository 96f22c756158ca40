package refresh

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// configNameChecks are the only k8s.io packages the engine may reach: the
// DNS-1123 and annotation-key checks of config validation (and what they
// import). Everything else of k8s.io (client-go, the API types) stays out.
var configNameChecks = []string{"k8s.io/apimachinery/pkg/util/validation", "k8s.io/apimachinery/pkg/api/validate/content"}

// The engine decides and talks to nothing (STYLE, "The shape we want"): it
// reaches no client of the cluster, not even through config, no registry
// client, and no signature crypto (issue 39: config only reads the trust
// material, internal/verify parses it).
func TestRefresh_ImportsNoKubernetesClientNoRegistryClientAndNoCrypto(t *testing.T) {
	goTool := goCommand(t)
	list := func(pkgs ...string) []string { return goListDeps(t, goTool, pkgs...) }
	allowed := map[string]bool{}
	for _, p := range list(configNameChecks...) {
		allowed[p] = true
	}
	deps := list(".")
	if len(deps) < 10 {
		t.Fatalf("go list -deps . listed %d packages: %q", len(deps), deps)
	}
	forbidden := []string{
		"github.com/google/go-containerregistry/pkg/v1/remote", "net/http",
		"github.com/sigstore/", "github.com/notaryproject/", "github.com/google/cel-go", "github.com/secure-systems-lab/",
		"crypto/x509", "crypto/ecdsa", "crypto/rsa", "crypto/ed25519", "crypto/tls",
	}
	for _, p := range deps {
		if (strings.HasPrefix(p, "k8s.io/") || strings.HasPrefix(p, "sigs.k8s.io/")) && !allowed[p] {
			t.Errorf("internal/refresh imports %s", p)
		}
		for _, f := range forbidden {
			if p == strings.TrimSuffix(f, "/") || strings.HasPrefix(p, f) {
				t.Errorf("internal/refresh imports %s (no %s in the engine)", p, f)
			}
		}
	}
}

// Only the registry client (which reads signatures) and the commands link
// the verification stack: the poller, the metrics, the admission webhook
// and render do not, so that the webhook's image and its fuzz build stay
// small (issue 39, layers).
func TestLayers_OnlyTheRegistryClientLinksVerification(t *testing.T) {
	goTool := goCommand(t)
	forbidden := []string{"github.com/sigstore/", "github.com/notaryproject/", "github.com/google/cel-go/", "github.com/image-refresh/image-refresh/internal/verify"}
	// The check itself: internal/registry does link it.
	if !linksAny(goListDeps(t, goTool, "../registry"), forbidden) {
		t.Fatalf("internal/registry links none of %q: the check below would prove nothing", forbidden)
	}
	for _, pkg := range []string{"../poller", "../metrics", "../pinwebhook", "../render"} {
		for _, p := range goListDeps(t, goTool, pkg) {
			if linksAny([]string{p}, forbidden) {
				t.Errorf("internal/%s links %s", strings.TrimPrefix(pkg, "../"), p)
			}
		}
	}
}

func linksAny(deps, prefixes []string) bool {
	for _, p := range deps {
		for _, f := range prefixes {
			if p == strings.TrimSuffix(f, "/") || strings.HasPrefix(p, f) {
				return true
			}
		}
	}
	return false
}

// goCommand is the go command of the toolchain running this test.
func goCommand(t *testing.T) string {
	t.Helper()
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		t.Fatalf("the go command that lists the imports: %v", err)
	}
	return goTool
}

func goListDeps(t *testing.T, goTool string, pkgs ...string) []string {
	t.Helper()
	out, err := exec.Command(goTool, append([]string{"list", "-deps"}, pkgs...)...).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", strings.Join(pkgs, " "), err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps %s listed %d packages: %q", strings.Join(pkgs, " "), len(deps), deps)
	}
	return deps
}
