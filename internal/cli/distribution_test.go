package cli

// The registry paths run once more against a second registry implementation:
// the CNCF Distribution registry (Debian's docker-registry package, installed
// by hack/install-distribution.sh), started per test on loopback over TLS
// with htpasswd basic auth (internal/distribution). The credentials reach
// image-refresh only through a kubernetes.io/dockerconfigjson pull secret on
// the target pods, and the registry's certificate only through the config's
// registries[].caFile: exactly what an operator with a private registry sets
// up (R1, R20).

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/internal/distribution"
	"github.com/image-refresh/image-refresh/internal/testenv"
)

// distEnv is an env whose image acme/api lives on a Distribution registry.
type distEnv struct {
	*env
	dist *distribution.Registry
}

func newDistEnv(t *testing.T) *distEnv {
	return &distEnv{env: newEnv(t), dist: distribution.StartT(t)}
}

func (d *distEnv) repo() string { return d.dist.Host + "/acme/api" }

// seedDist pushes acme/api:prod to the Distribution registry, creates the
// pull secret "regcred" with its credentials (pass) and the seed's two
// Deployments that use it, and returns the digest.
func (d *distEnv) seedDist(pass string) string {
	d.t.Helper()
	digest := d.dist.MustPushRandomImage(d.t, "acme/api", "prod")
	d.dockerConfigSecret("regcred", d.dist.Host, d.dist.User, pass, false)
	tag := d.repo() + ":prod"
	testenv.Deployment(d.t, d.c.Client, d.ns, "jobs-manager", testenv.WithContainer("api", tag), testenv.WithRecreate(), testenv.WithPullSecrets("regcred"))
	testenv.Deployment(d.t, d.c.Client, d.ns, "requests-proxy", testenv.WithContainer("proxy", tag), testenv.WithPullSecrets("regcred"))
	d.settle("Deployment", "jobs-manager")
	d.settle("Deployment", "requests-proxy")
	return digest
}

// distConfig writes the seed's shape on the Distribution registry; with
// caFile the registry's host is configured to trust its certificate,
// without it the host has no entry (system roots only).
func (d *distEnv) distConfig(caFile bool) string {
	d.t.Helper()
	body := strings.ReplaceAll(seedShape, "{{reg}}", d.dist.Host)
	if caFile {
		return d.config("  - host: " + d.dist.Host + "\n    caFile: " + d.dist.CAFile + "\n" + body)
	}
	return d.config(body)
}

// pinDist runs the first observation and the pin, and checks both.
func (d *distEnv) pinDist(cfg, digest string) string {
	d.t.Helper()
	for i := range 2 {
		if code, logs := d.tick(cfg); code != 0 {
			d.t.Fatalf("setup tick %d on the Distribution registry: exit %d, want 0\n%s", i+1, code, logs)
		}
	}
	pinned := d.repo() + ":prod@" + digest
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := d.image(w[0], w[1]); got != pinned {
			d.t.Fatalf("setup: %s/%s runs %s, want %s", w[0], w[1], got, pinned)
		}
	}
	return pinned
}

// secrets are the strings that must never leave the pull secret (R20): the
// password, a wrong one tests use, and the base64 "user:pass" of both.
func (d *distEnv) secrets() []string {
	out := []string{distribution.Password, wrongDistPassword}
	for _, p := range []string{distribution.Password, wrongDistPassword} {
		out = append(out, base64.StdEncoding.EncodeToString([]byte(d.dist.User+":"+p)))
	}
	return out
}

const wrongDistPassword = "wr0ng-Dstrb-7e1d0c"

// assertNoLeakAnywhere greps logs, every Event (message and annotations),
// and the annotations of every Deployment, ReplicaSet and Pod of the
// namespace for each secret (R20).
func (d *distEnv) assertNoLeakAnywhere(logs string) {
	d.t.Helper()
	d.assertNoLeak(logs, d.secrets()...) // logs, Event messages, Deployment annotations
	ctx := context.Background()
	var annotations []map[string]string
	rss, err := d.c.Client.AppsV1().ReplicaSets(d.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		d.t.Fatal(err)
	}
	for _, rs := range rss.Items {
		annotations = append(annotations, rs.Annotations, rs.Spec.Template.Annotations)
	}
	pods, err := d.c.Client.CoreV1().Pods(d.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		d.t.Fatal(err)
	}
	for _, p := range pods.Items {
		annotations = append(annotations, p.Annotations)
	}
	events, err := d.c.Client.CoreV1().Events(d.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		d.t.Fatal(err)
	}
	for _, ev := range events.Items {
		annotations = append(annotations, ev.Annotations)
	}
	for _, s := range d.secrets() {
		for _, a := range annotations {
			for k, v := range a {
				if strings.Contains(k, s) || strings.Contains(v, s) {
					d.t.Errorf("R20: %q appears in annotation %s=%s", s, k, v)
				}
			}
		}
	}
}

// registryHeads counts the manifest HEADs of acme/api:prod that
// image-refresh sent (its User-Agent) and that Distribution answered with
// status, from the registry's access log.
func (d *distEnv) registryHeads(status string) int {
	n := 0
	for _, l := range strings.Split(d.dist.Log(), "\n") {
		if strings.Contains(l, `"HEAD /v2/acme/api/manifests/prod HTTP/`) && strings.Contains(l, `" `+status+` `) && strings.Contains(l, `"image-refresh/`) {
			n++
		}
	}
	return n
}

func TestDistribution_R1_R20_TLSAndBasicAuthFromAPullSecretPin(t *testing.T) {
	d := newDistEnv(t)
	digest := d.seedDist(distribution.Password)
	cfg := d.distConfig(true)
	before := map[string]int{"jobs-manager": d.rollouts("jobs-manager"), "requests-proxy": d.rollouts("requests-proxy")}

	var all strings.Builder
	code, logs := d.tick(cfg)
	all.WriteString(logs)
	if code != 0 {
		t.Fatalf("first observation on Distribution: exit %d, want 0", code)
	}
	if got := d.annotations("jobs-manager")[d.key("last-refreshed-api-digest")]; got != digest {
		t.Fatalf("first observation recorded %q, want the digest Distribution serves %q", got, digest)
	}
	code, logs = d.tick(cfg)
	all.WriteString(logs)
	if code != 0 {
		t.Fatalf("pinning tick on Distribution: exit %d, want 0", code)
	}
	pinned := d.repo() + ":prod@" + digest
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := d.image(w[0], w[1]); got != pinned {
			t.Errorf("%s/%s runs %s, want %s", w[0], w[1], got, pinned)
		}
	}
	// Distribution answers 200 only to an authenticated request: the
	// credentials came from the pull secret, the trust from caFile.
	if n := d.registryHeads("200"); n < 2 {
		t.Errorf("Distribution logged %d authenticated HEADs of acme/api:prod by image-refresh, want one per tick (2); its log:\n%s", n, d.dist.Log())
	}

	// R6: the registry moves the tag; one rollout per workload re-images it.
	next := d.dist.MustPushRandomImage(t, "acme/api", "prod")
	code, logs = d.tick(cfg)
	all.WriteString(logs)
	if code != 0 {
		t.Fatalf("digest-change tick on Distribution: exit %d, want 0", code)
	}
	want := d.repo() + ":prod@" + next
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := d.image(w[0], w[1]); got != want {
			t.Errorf("R6: %s/%s runs %s after the tag moved, want %s", w[0], w[1], got, want)
		}
		// Pin (1) and digest change (1): two templates more than the seed.
		if n := d.rollouts(w[0]); n != before[w[0]]+2 {
			t.Errorf("%s has %d ReplicaSets, want %d (one per pin, no extra rollout)", w[0], n, before[w[0]]+2)
		}
	}
	if got := d.annotations("jobs-manager")[d.key("last-refreshed-api-digest")]; got != next {
		t.Errorf("R6: record %q after the settled rollout, want %q", got, next)
	}
	if !hasEvent(d.events("requests-proxy"), "DigestChanged", next) {
		t.Errorf("no DigestChanged event naming %s: %q", next, d.events("requests-proxy"))
	}
	// R20: status reads the registry the same way; its output counts too.
	_, out, errOut := d.run("status", "--config", cfg, "--kubeconfig", d.kubeconfig, "-o", "json")
	all.WriteString(out + errOut)
	d.assertNoLeakAnywhere(all.String())
}

func TestDistribution_R1_MultiArchIndexPinsTheIndexDigest(t *testing.T) {
	d := newDistEnv(t)
	d.seedDist(distribution.Password)
	index := d.dist.MustPushRandomIndex(t, "acme/api", "prod", 3)
	cfg := d.distConfig(true)
	d.pinDist(cfg, index)
	if got := d.annotations("jobs-manager")[d.key("last-refreshed-api-digest")]; got != index {
		t.Errorf("recorded %q, want the OCI index digest %q", got, index)
	}
}

func TestDistribution_R1_R20_WrongPasswordIsUnauthorizedAndNeverPinned(t *testing.T) {
	d := newDistEnv(t)
	old := d.seedDist(distribution.Password)
	cfg := d.distConfig(true)
	pinned := d.pinDist(cfg, old)

	d.dockerConfigSecret("regcred", d.dist.Host, d.dist.User, wrongDistPassword, true)
	next := d.dist.MustPushRandomImage(t, "acme/api", "prod")
	var all strings.Builder
	code, logs := d.tick(cfg)
	all.WriteString(logs)
	if code != 0 {
		t.Errorf("tick with a wrong password: exit %d, want 0 below the failure ceiling", code)
	}
	if lines := logLines(logs, "WARN", d.repo(), "unauthorized", "HTTP 401"); len(lines) == 0 {
		t.Errorf("no WARN line naming %s, unauthorized and HTTP 401:\n%s", d.repo(), logs)
	}
	if n := d.registryHeads("401"); n == 0 {
		t.Errorf("Distribution did not refuse image-refresh's HEAD with 401; its log:\n%s", d.dist.Log())
	}
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := d.image(w[0], w[1]); got != pinned {
			t.Errorf("%s/%s re-imaged to %s with wrong credentials, want it left on %s", w[0], w[1], got, pinned)
		}
	}
	a := d.annotations("jobs-manager")
	if got := a[d.key("last-refreshed-api-digest")]; got != old {
		t.Errorf("record moved to %q with wrong credentials, want %q", got, old)
	}
	if got := a[d.key("resolve-failure-streak-api")]; got != "1" {
		t.Errorf("resolve-failure streak %q, want \"1\"", got)
	}

	// The secret is fixed: the next tick converges.
	d.dockerConfigSecret("regcred", d.dist.Host, d.dist.User, distribution.Password, true)
	code, logs = d.tick(cfg)
	all.WriteString(logs)
	if code != 0 {
		t.Fatalf("tick after the secret was fixed: exit %d, want 0", code)
	}
	if got, want := d.image("requests-proxy", "proxy"), d.repo()+":prod@"+next; got != want {
		t.Errorf("after the fix requests-proxy runs %s, want %s", got, want)
	}
	if v, ok := d.annotations("jobs-manager")[d.key("resolve-failure-streak-api")]; ok {
		t.Errorf("resolve-failure streak %q not cleared after a good answer", v)
	}
	d.assertNoLeakAnywhere(all.String())
}

func TestDistribution_R1_WithoutCAFileTheTLSFailureIsNeverPinned(t *testing.T) {
	d := newDistEnv(t)
	old := d.seedDist(distribution.Password)
	withCA := d.distConfig(true)
	pinned := d.pinDist(withCA, old)

	next := d.dist.MustPushRandomImage(t, "acme/api", "prod")
	before := strings.Count(d.dist.Log(), "/v2/acme/api/manifests/prod")
	noCA := d.distConfig(false)
	code, logs := d.tick(noCA)
	if code != 0 {
		t.Errorf("tick without caFile: exit %d, want 0 below the failure ceiling", code)
	}
	if lines := logLines(logs, "WARN", d.repo(), "tls"); len(lines) == 0 {
		t.Errorf("no WARN line naming %s and tls:\n%s", d.repo(), logs)
	}
	if after := strings.Count(d.dist.Log(), "/v2/acme/api/manifests/prod"); after != before {
		t.Errorf("a manifest request reached the registry over an untrusted connection (%d -> %d log lines)", before, after)
	}
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := d.image(w[0], w[1]); got != pinned {
			t.Errorf("%s/%s re-imaged to %s over an untrusted connection, want %s", w[0], w[1], got, pinned)
		}
	}
	a := d.annotations("jobs-manager")
	if got := a[d.key("last-refreshed-api-digest")]; got != old {
		t.Errorf("record moved to %q without a trusted answer, want %q", got, old)
	}
	if got := a[d.key("resolve-failure-streak-api")]; got != "1" {
		t.Errorf("resolve-failure streak %q, want \"1\"", got)
	}

	// caFile back: converges in one tick.
	if code, _ := d.tick(withCA); code != 0 {
		t.Fatalf("tick with caFile again: exit %d, want 0", code)
	}
	if got, want := d.image("jobs-manager", "api"), d.repo()+":prod@"+next; got != want {
		t.Errorf("with caFile again jobs-manager runs %s, want %s", got, want)
	}
}

func TestDistribution_R1_DeletedTagIsNotFoundAndNeverPinned(t *testing.T) {
	d := newDistEnv(t)
	old := d.seedDist(distribution.Password)
	cfg := d.distConfig(true)
	pinned := d.pinDist(cfg, old)

	img, err := distribution.RandomImage()
	if err != nil {
		t.Fatal(err)
	}
	next := d.dist.MustPush(t, "acme/api", "prod", img)
	// Distribution deletes a tag only with its manifest (DELETE by digest,
	// storage.delete.enabled): acme/api:prod is gone, a HEAD of it is 404.
	d.dist.MustDeleteManifest(t, "acme/api", next)
	if _, err := d.dist.Head("acme/api", "prod"); err == nil {
		t.Fatal("setup: acme/api:prod still resolves after its manifest was deleted")
	}
	code, logs := d.tick(cfg)
	if code != 0 {
		t.Errorf("tick on a deleted tag: exit %d, want 0 below the failure ceiling", code)
	}
	if lines := logLines(logs, "WARN", d.repo(), "not-found", "HTTP 404"); len(lines) == 0 {
		t.Errorf("no WARN line naming %s, not-found and HTTP 404:\n%s", d.repo(), logs)
	}
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := d.image(w[0], w[1]); got != pinned {
			t.Errorf("%s/%s re-imaged to %s on a deleted tag, want it left on %s", w[0], w[1], got, pinned)
		}
	}
	a := d.annotations("jobs-manager")
	if got := a[d.key("last-refreshed-api-digest")]; got != old {
		t.Errorf("record %q on a deleted tag, want %q", got, old)
	}
	if got := a[d.key("resolve-failure-streak-api")]; got != "1" {
		t.Errorf("resolve-failure streak %q, want \"1\"", got)
	}

	// The tag is published again: the next tick converges.
	d.dist.MustPush(t, "acme/api", "prod", img)
	if code, _ := d.tick(cfg); code != 0 {
		t.Fatalf("tick after the tag came back: exit %d, want 0", code)
	}
	if got, want := d.image("requests-proxy", "proxy"), d.repo()+":prod@"+next; got != want {
		t.Errorf("after the tag came back requests-proxy runs %s, want %s", got, want)
	}
}

// R1: with the pull secret gone, image-refresh asks anonymously; Distribution
// refuses with 401, which is a WARN and a counted failure, never a pin.
// The secret back: converged in one tick.
func TestDistribution_R1_WithoutCredentialsIsUnauthorizedAndNeverPinned(t *testing.T) {
	d := newDistEnv(t)
	old := d.seedDist(distribution.Password)
	cfg := d.distConfig(true)
	pinned := d.pinDist(cfg, old)
	if err := d.c.Client.CoreV1().Secrets(d.ns).Delete(context.Background(), "regcred", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	next := d.dist.MustPushRandomImage(t, "acme/api", "prod")
	code, logs := d.tick(cfg)
	if code != 0 {
		t.Errorf("tick without credentials: exit %d, want 0 below the failure ceiling", code)
	}
	if len(logLines(logs, "WARN", "imagePullSecrets not found", "regcred")) == 0 {
		t.Errorf("no WARN naming the missing pull secret regcred:\n%s", logs)
	}
	if len(logLines(logs, "WARN", d.repo(), "unauthorized", "HTTP 401")) == 0 {
		t.Errorf("no WARN naming %s, unauthorized and HTTP 401:\n%s", d.repo(), logs)
	}
	if got := d.image("requests-proxy", "proxy"); got != pinned {
		t.Errorf("requests-proxy re-imaged to %s without credentials, want %s", got, pinned)
	}
	if got := d.annotations("jobs-manager")[d.key("last-refreshed-api-digest")]; got != old {
		t.Errorf("record moved to %q without credentials, want %q", got, old)
	}
	d.dockerConfigSecret("regcred", d.dist.Host, d.dist.User, distribution.Password, false)
	if code, _ := d.tick(cfg); code != 0 {
		t.Fatalf("tick with the secret back: exit %d, want 0", code)
	}
	if got, want := d.image("requests-proxy", "proxy"), d.repo()+":prod@"+next; got != want {
		t.Errorf("with the secret back requests-proxy runs %s, want %s", got, want)
	}
}
