package run

// The registry paths run once more against a second registry implementation:
// the CNCF Distribution registry (Debian's docker-registry package, installed
// by hack/install-distribution.sh), started per test on loopback over TLS
// with htpasswd basic auth (test/support/distribution). The credentials reach
// image-refresh only through a kubernetes.io/dockerconfigjson pull secret on
// the target pods, and the registry's certificate only through the config's
// registries[].caFile: exactly what an operator with a private registry sets
// up (R1, R20).

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/test/support/content"
	"github.com/image-refresh/image-refresh/test/support/distribution"
	"github.com/image-refresh/image-refresh/test/support/e2e"
)

func TestDistribution_R1_R20_TLSAndBasicAuthFromAPullSecretPin(t *testing.T) {
	d := e2e.NewDistEnv(t)
	digest := d.SeedDist(distribution.Password)
	cfg := d.DistConfig(true)
	before := map[string]int{"jobs-manager": d.Rollouts("jobs-manager"), "requests-proxy": d.Rollouts("requests-proxy")}

	var all strings.Builder
	code, logs := d.Tick(cfg)
	all.WriteString(logs)
	if code != 0 {
		t.Fatalf("first observation on Distribution: exit %d, want 0", code)
	}
	if got := d.Annotations("jobs-manager")[d.Key("last-refreshed-api-digest")]; got != digest {
		t.Fatalf("first observation recorded %q, want the digest Distribution serves %q", got, digest)
	}
	code, logs = d.Tick(cfg)
	all.WriteString(logs)
	if code != 0 {
		t.Fatalf("pinning tick on Distribution: exit %d, want 0", code)
	}
	pinned := d.Repo() + ":prod@" + digest
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := d.Image(w[0], w[1]); got != pinned {
			t.Errorf("%s/%s runs %s, want %s", w[0], w[1], got, pinned)
		}
	}
	// Distribution answers 200 only to an authenticated request: the
	// credentials came from the pull secret, the trust from caFile.
	if n := d.RegistryHeads("200"); n < 2 {
		t.Errorf("Distribution logged %d authenticated HEADs of acme/api:prod by image-refresh, want one per tick (2); its log:\n%s", n, d.Dist.Log())
	}

	// R6: the registry moves the tag; one rollout per workload re-images it.
	next := d.Dist.MustPushRandomImage(t, "acme/api", "prod")
	code, logs = d.Tick(cfg)
	all.WriteString(logs)
	if code != 0 {
		t.Fatalf("digest-change tick on Distribution: exit %d, want 0", code)
	}
	want := d.Repo() + ":prod@" + next
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := d.Image(w[0], w[1]); got != want {
			t.Errorf("R6: %s/%s runs %s after the tag moved, want %s", w[0], w[1], got, want)
		}
		// Pin (1) and digest change (1): two templates more than the seed.
		if n := d.Rollouts(w[0]); n != before[w[0]]+2 {
			t.Errorf("%s has %d ReplicaSets, want %d (one per pin, no extra rollout)", w[0], n, before[w[0]]+2)
		}
	}
	if got := d.Annotations("jobs-manager")[d.Key("last-refreshed-api-digest")]; got != next {
		t.Errorf("R6: record %q after the settled rollout, want %q", got, next)
	}
	if !e2e.HasEvent(d.Events("requests-proxy"), "DigestChanged", next) {
		t.Errorf("no DigestChanged event naming %s: %q", next, d.Events("requests-proxy"))
	}
	// R20: status reads the registry the same way; its output counts too.
	_, out, errOut := d.Run("status", "--config", cfg, "--kubeconfig", d.Kubeconfig, "-o", "json")
	all.WriteString(out + errOut)
	d.AssertNoLeakAnywhere(all.String())
}

func TestDistribution_R1_MultiArchIndexPinsTheIndexDigest(t *testing.T) {
	d := e2e.NewDistEnv(t)
	d.SeedDist(distribution.Password)
	index := d.Dist.MustPushRandomIndex(t, "acme/api", "prod", 3)
	cfg := d.DistConfig(true)
	d.PinDist(cfg, index)
	if got := d.Annotations("jobs-manager")[d.Key("last-refreshed-api-digest")]; got != index {
		t.Errorf("recorded %q, want the OCI index digest %q", got, index)
	}
}

func TestDistribution_R1_R20_WrongPasswordIsUnauthorizedAndNeverPinned(t *testing.T) {
	d := e2e.NewDistEnv(t)
	old := d.SeedDist(distribution.Password)
	cfg := d.DistConfig(true)
	pinned := d.PinDist(cfg, old)

	d.DockerConfigSecret("regcred", d.Dist.Host, d.Dist.User, e2e.WrongDistPassword, true)
	next := d.Dist.MustPushRandomImage(t, "acme/api", "prod")
	var all strings.Builder
	code, logs := d.Tick(cfg)
	all.WriteString(logs)
	if code != 0 {
		t.Errorf("tick with a wrong password: exit %d, want 0 below the failure ceiling", code)
	}
	if lines := e2e.LogLines(logs, "WARN", d.Repo(), "unauthorized", "HTTP 401"); len(lines) == 0 {
		t.Errorf("no WARN line naming %s, unauthorized and HTTP 401:\n%s", d.Repo(), logs)
	}
	if n := d.RegistryHeads("401"); n == 0 {
		t.Errorf("Distribution did not refuse image-refresh's HEAD with 401; its log:\n%s", d.Dist.Log())
	}
	d.AssertHeld("with wrong credentials", pinned, old)

	// The secret is fixed: the next tick converges.
	d.DockerConfigSecret("regcred", d.Dist.Host, d.Dist.User, distribution.Password, true)
	code, logs = d.Tick(cfg)
	all.WriteString(logs)
	if code != 0 {
		t.Fatalf("tick after the secret was fixed: exit %d, want 0", code)
	}
	if got, want := d.Image("requests-proxy", "proxy"), d.Repo()+":prod@"+next; got != want {
		t.Errorf("after the fix requests-proxy runs %s, want %s", got, want)
	}
	if v, ok := d.Annotations("jobs-manager")[d.Key("resolve-failure-streak-api")]; ok {
		t.Errorf("resolve-failure streak %q not cleared after a good answer", v)
	}
	d.AssertNoLeakAnywhere(all.String())
}

func TestDistribution_R1_WithoutCAFileTheTLSFailureIsNeverPinned(t *testing.T) {
	d := e2e.NewDistEnv(t)
	old := d.SeedDist(distribution.Password)
	withCA := d.DistConfig(true)
	pinned := d.PinDist(withCA, old)

	next := d.Dist.MustPushRandomImage(t, "acme/api", "prod")
	before := strings.Count(d.Dist.Log(), "/v2/acme/api/manifests/prod")
	noCA := d.DistConfig(false)
	code, logs := d.Tick(noCA)
	if code != 0 {
		t.Errorf("tick without caFile: exit %d, want 0 below the failure ceiling", code)
	}
	if lines := e2e.LogLines(logs, "WARN", d.Repo(), "tls"); len(lines) == 0 {
		t.Errorf("no WARN line naming %s and tls:\n%s", d.Repo(), logs)
	}
	if after := strings.Count(d.Dist.Log(), "/v2/acme/api/manifests/prod"); after != before {
		t.Errorf("a manifest request reached the registry over an untrusted connection (%d -> %d log lines)", before, after)
	}
	d.AssertHeld("over an untrusted connection", pinned, old)

	// caFile back: converges in one tick.
	if code, _ := d.Tick(withCA); code != 0 {
		t.Fatalf("tick with caFile again: exit %d, want 0", code)
	}
	if got, want := d.Image("jobs-manager", "api"), d.Repo()+":prod@"+next; got != want {
		t.Errorf("with caFile again jobs-manager runs %s, want %s", got, want)
	}
}

func TestDistribution_R1_DeletedTagIsNotFoundAndNeverPinned(t *testing.T) {
	d := e2e.NewDistEnv(t)
	old := d.SeedDist(distribution.Password)
	cfg := d.DistConfig(true)
	pinned := d.PinDist(cfg, old)

	img, err := content.RandomImage()
	if err != nil {
		t.Fatal(err)
	}
	next := d.Dist.MustPush(t, "acme/api", "prod", img)
	// Distribution deletes a tag only with its manifest (DELETE by digest,
	// storage.delete.enabled): acme/api:prod is gone, a HEAD of it is 404.
	d.Dist.MustDeleteManifest(t, "acme/api", next)
	if _, err := d.Dist.Head("acme/api", "prod"); err == nil {
		t.Fatal("setup: acme/api:prod still resolves after its manifest was deleted")
	}
	code, logs := d.Tick(cfg)
	if code != 0 {
		t.Errorf("tick on a deleted tag: exit %d, want 0 below the failure ceiling", code)
	}
	if lines := e2e.LogLines(logs, "WARN", d.Repo(), "not-found", "HTTP 404"); len(lines) == 0 {
		t.Errorf("no WARN line naming %s, not-found and HTTP 404:\n%s", d.Repo(), logs)
	}
	d.AssertHeld("on a deleted tag", pinned, old)

	// The tag is published again: the next tick converges.
	d.Dist.MustPush(t, "acme/api", "prod", img)
	if code, _ := d.Tick(cfg); code != 0 {
		t.Fatalf("tick after the tag came back: exit %d, want 0", code)
	}
	if got, want := d.Image("requests-proxy", "proxy"), d.Repo()+":prod@"+next; got != want {
		t.Errorf("after the tag came back requests-proxy runs %s, want %s", got, want)
	}
}

// R1: with the pull secret gone, image-refresh asks anonymously; Distribution
// refuses with 401, which is a WARN and a counted failure, never a pin.
// The secret back: converged in one tick.
func TestDistribution_R1_WithoutCredentialsIsUnauthorizedAndNeverPinned(t *testing.T) {
	d := e2e.NewDistEnv(t)
	old := d.SeedDist(distribution.Password)
	cfg := d.DistConfig(true)
	pinned := d.PinDist(cfg, old)
	if err := d.C.Client.CoreV1().Secrets(d.NS).Delete(context.Background(), "regcred", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	next := d.Dist.MustPushRandomImage(t, "acme/api", "prod")
	code, logs := d.Tick(cfg)
	if code != 0 {
		t.Errorf("tick without credentials: exit %d, want 0 below the failure ceiling", code)
	}
	if len(e2e.LogLines(logs, "WARN", "imagePullSecrets not found", "regcred")) == 0 {
		t.Errorf("no WARN naming the missing pull secret regcred:\n%s", logs)
	}
	if len(e2e.LogLines(logs, "WARN", d.Repo(), "unauthorized", "HTTP 401")) == 0 {
		t.Errorf("no WARN naming %s, unauthorized and HTTP 401:\n%s", d.Repo(), logs)
	}
	if got := d.Image("requests-proxy", "proxy"); got != pinned {
		t.Errorf("requests-proxy re-imaged to %s without credentials, want %s", got, pinned)
	}
	if got := d.Annotations("jobs-manager")[d.Key("last-refreshed-api-digest")]; got != old {
		t.Errorf("record moved to %q without credentials, want %q", got, old)
	}
	d.DockerConfigSecret("regcred", d.Dist.Host, d.Dist.User, distribution.Password, false)
	if code, _ := d.Tick(cfg); code != 0 {
		t.Fatalf("tick with the secret back: exit %d, want 0", code)
	}
	if got, want := d.Image("requests-proxy", "proxy"), d.Repo()+":prod@"+next; got != want {
		t.Errorf("with the secret back requests-proxy runs %s, want %s", got, want)
	}
}
