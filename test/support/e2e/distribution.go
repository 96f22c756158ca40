package e2e

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/test/support/distribution"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// DistEnv is an env whose image acme/api lives on a Distribution registry.
type DistEnv struct {
	*Env
	Dist *distribution.Registry
}

// NewDistEnv is an env with a Distribution registry of its own.
func NewDistEnv(t *testing.T) *DistEnv {
	return &DistEnv{Env: New(t), Dist: distribution.StartT(t)}
}

// Repo is the seed's repository in the Distribution registry.
func (d *DistEnv) Repo() string { return d.Dist.Host + "/acme/api" }

// SeedDist pushes acme/api:prod to the Distribution registry, creates the
// pull secret "regcred" with its credentials (pass) and the seed's two
// Deployments that use it, and returns the digest.
func (d *DistEnv) SeedDist(pass string) string {
	d.T.Helper()
	digest := d.Dist.MustPushRandomImage(d.T, "acme/api", "prod")
	d.DockerConfigSecret("regcred", d.Dist.Host, d.Dist.User, pass, false)
	tag := d.Repo() + ":prod"
	testenv.Deployment(d.T, d.C.Client, d.NS, "jobs-manager", testenv.WithContainer("api", tag), testenv.WithRecreate(), testenv.WithPullSecrets("regcred"))
	testenv.Deployment(d.T, d.C.Client, d.NS, "requests-proxy", testenv.WithContainer("proxy", tag), testenv.WithPullSecrets("regcred"))
	d.Settle("Deployment", "jobs-manager")
	d.Settle("Deployment", "requests-proxy")
	return digest
}

// DistConfig writes the seed's shape on the Distribution registry; with
// caFile the registry's host is configured to trust its certificate,
// without it the host has no entry (system roots only).
func (d *DistEnv) DistConfig(caFile bool) string {
	d.T.Helper()
	body := strings.ReplaceAll(SeedShape, "{{reg}}", d.Dist.Host)
	if caFile {
		return d.Config("  - host: " + d.Dist.Host + "\n    caFile: " + d.Dist.CAFile + "\n" + body)
	}
	return d.Config(body)
}

// PinDist runs the first observation and the pin, and checks both.
func (d *DistEnv) PinDist(cfg, digest string) string {
	d.T.Helper()
	for i := range 2 {
		if code, logs := d.Tick(cfg); code != 0 {
			d.T.Fatalf("setup tick %d on the Distribution registry: exit %d, want 0\n%s", i+1, code, logs)
		}
	}
	pinned := d.Repo() + ":prod@" + digest
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := d.Image(w[0], w[1]); got != pinned {
			d.T.Fatalf("setup: %s/%s runs %s, want %s", w[0], w[1], got, pinned)
		}
	}
	return pinned
}

// Secrets are the strings that must never leave the pull secret (R20): the
// password, a wrong one tests use, and the base64 "user:pass" of both.
func (d *DistEnv) Secrets() []string {
	out := []string{distribution.Password, WrongDistPassword}
	for _, p := range []string{distribution.Password, WrongDistPassword} {
		out = append(out, base64.StdEncoding.EncodeToString([]byte(d.Dist.User+":"+p)))
	}
	return out
}

// WrongDistPassword is a password Distribution refuses.
const WrongDistPassword = "wr0ng-Dstrb-7e1d0c"

// AssertNoLeakAnywhere greps logs, every Event (message and annotations),
// and the annotations of every Deployment, ReplicaSet and Pod of the
// namespace for each secret (R20).
func (d *DistEnv) AssertNoLeakAnywhere(logs string) {
	d.T.Helper()
	d.AssertNoLeak(logs, d.Secrets()...) // logs, Event messages, Deployment annotations
	ctx := context.Background()
	var annotations []map[string]string
	rss, err := d.C.Client.AppsV1().ReplicaSets(d.NS).List(ctx, metav1.ListOptions{})
	if err != nil {
		d.T.Fatal(err)
	}
	for _, rs := range rss.Items {
		annotations = append(annotations, rs.Annotations, rs.Spec.Template.Annotations)
	}
	pods, err := d.C.Client.CoreV1().Pods(d.NS).List(ctx, metav1.ListOptions{})
	if err != nil {
		d.T.Fatal(err)
	}
	for _, p := range pods.Items {
		annotations = append(annotations, p.Annotations)
	}
	events, err := d.C.Client.CoreV1().Events(d.NS).List(ctx, metav1.ListOptions{})
	if err != nil {
		d.T.Fatal(err)
	}
	for _, ev := range events.Items {
		annotations = append(annotations, ev.Annotations)
	}
	for _, s := range d.Secrets() {
		for _, a := range annotations {
			for k, v := range a {
				if strings.Contains(k, s) || strings.Contains(v, s) {
					d.T.Errorf("R20: %q appears in annotation %s=%s", s, k, v)
				}
			}
		}
	}
}

// RegistryHeads counts the manifest HEADs of acme/api:prod that
// image-refresh sent (its User-Agent) and that Distribution answered with
// status, from the registry's access log.
func (d *DistEnv) RegistryHeads(status string) int {
	n := 0
	for _, l := range strings.Split(d.Dist.Log(), "\n") {
		if strings.Contains(l, `"HEAD /v2/acme/api/manifests/prod HTTP/`) && strings.Contains(l, `" `+status+` `) && strings.Contains(l, `"image-refresh/`) {
			n++
		}
	}
	return n
}

// AssertHeld checks what a tick whose resolve failed (why: "with wrong
// credentials", …) leaves: the seed's two targets on pinned, the record on
// old and the resolve-failure streak at 1.
func (d *DistEnv) AssertHeld(why, pinned, old string) {
	d.T.Helper()
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := d.Image(w[0], w[1]); got != pinned {
			d.T.Errorf("%s/%s re-imaged to %s %s, want it left on %s", w[0], w[1], got, why, pinned)
		}
	}
	a := d.Annotations("jobs-manager")
	if got := a[d.Key("last-refreshed-api-digest")]; got != old {
		d.T.Errorf("record moved to %q %s, want %q", got, why, old)
	}
	if got := a[d.Key("resolve-failure-streak-api")]; got != "1" {
		d.T.Errorf("resolve-failure streak %q %s, want \"1\"", got, why)
	}
}
