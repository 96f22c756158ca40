package cli

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/internal/testenv"
	"github.com/image-refresh/image-refresh/internal/testregistry"
)

func TestTick_R1_BadRegistryAnswerIsNeverPinned(t *testing.T) {
	// Each case breaks the registry's answer for acme/api:prod after the tag
	// moved to a new digest (break), and repairs it (heal).
	type breakage struct {
		brk  func(e *env, next string)
		heal func(e *env, next string)
		// logged is a word of the WARN line that names the problem.
		logged string
	}
	clearFault := func(e *env, _ string) { e.reg.ClearFault() }
	fault := func(f testregistry.Fault) func(e *env, _ string) {
		return func(e *env, _ string) { e.reg.SetFault(f) }
	}
	for name, tc := range map[string]breakage{
		"a malformed Docker-Content-Digest is an error, not a digest": {
			brk: fault(testregistry.Fault{DigestHeader: ptr("sha256:XYZ")}), heal: clearFault, logged: "invalid-digest",
		},
		"an answer without Docker-Content-Digest is an error": {
			brk: fault(testregistry.Fault{DigestHeader: ptr("")}), heal: clearFault, logged: "invalid-digest",
		},
		"a deleted tag (404) is skipped": {
			brk:    func(e *env, _ string) { e.reg.MustDeleteTag(e.t, "acme/api", "prod") },
			heal:   func(e *env, next string) { e.reg.MustTag(e.t, "acme/api", "prod", next) },
			logged: "not-found",
		},
		"a 404 answer is skipped": {
			brk: fault(testregistry.Fault{Status: 404}), heal: clearFault, logged: "not-found",
		},
		"a 429 with Retry-After is skipped": {
			brk: fault(testregistry.Fault{Status: 429, RetryAfter: "120"}), heal: clearFault, logged: "rate-limited (HTTP 429, retry after 2m0s)",
		},
		"a 429 without Retry-After is skipped": {
			brk: fault(testregistry.Fault{Status: 429}), heal: clearFault, logged: "rate-limited (HTTP 429)",
		},
		"a 502 is skipped": {
			brk: fault(testregistry.Fault{Status: 502}), heal: clearFault, logged: "server-error (HTTP 502)",
		},
		"a 401 is skipped": {
			brk: fault(testregistry.Fault{Status: 401}), heal: clearFault, logged: "unauthorized (HTTP 401)",
		},
		"a sha512 digest the content does not hash to is inconsistent, not pinned": {
			brk:  fault(testregistry.Fault{Method: "HEAD", DigestHeader: ptr("sha512:" + strings.Repeat("0123456789abcdef", 8))}),
			heal: clearFault, logged: "inconsistent-digest",
		},
		"a HEAD naming another well-formed digest than the GET serves is inconsistent, not pinned": {
			brk:  fault(testregistry.Fault{Method: "HEAD", DigestHeader: ptr("sha256:" + strings.Repeat("0", 64))}),
			heal: clearFault, logged: "inconsistent-digest",
		},
		"a 500 is skipped": {
			brk: fault(testregistry.Fault{Status: 500}), heal: clearFault, logged: "server-error",
		},
		"a 503 is skipped": {
			brk: fault(testregistry.Fault{Status: 503, RetryAfter: "30"}), heal: clearFault, logged: "server-error",
		},
		"a registry that never answers times out within registryTimeout": {
			brk: fault(testregistry.Fault{Hang: true}), heal: clearFault, logged: "timeout",
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			old, cfg := e.pinned()
			oldRef := e.repo("api") + ":prod@" + old
			next := e.push("api", "prod")
			tc.brk(e, next)

			start := time.Now()
			code, logs := e.tick(cfg)
			took := time.Since(start)
			if code != 0 {
				t.Errorf("tick exit %d below the failure ceiling, want 0", code)
			}
			if took > 10*time.Second {
				t.Errorf("tick took %s with registryTimeout 2s (R14: bounded)", took)
			}
			for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
				if got := e.image(w[0], w[1]); got != oldRef {
					t.Errorf("%s/%s re-imaged to %s on a bad registry answer, want it left on %s", w[0], w[1], got, oldRef)
				}
			}
			a := e.annotations("jobs-manager")
			if got := a[e.key("last-refreshed-api-digest")]; got != old {
				t.Errorf("record changed to %q on a bad registry answer, want %q", got, old)
			}
			if got := a[e.key("resolve-failure-streak-api")]; got != "1" {
				t.Errorf("resolve-failure streak %q, want \"1\"", got)
			}
			if lines := logLines(logs, "WARN", e.repo("api"), tc.logged); len(lines) == 0 {
				t.Errorf("no WARN line naming %s and %q:\n%s", e.repo("api"), tc.logged, logs)
			}
			if strings.Contains(logs, "sha256:XYZ@") || strings.Contains(logs, "@sha256:XYZ") {
				t.Errorf("the malformed digest made it into a reference:\n%s", logs)
			}

			tc.heal(e, next)
			if code, _ := e.tick(cfg); code != 0 {
				t.Fatalf("tick after the registry healed: exit %d, want 0", code)
			}
			want := e.repo("api") + ":prod@" + next
			for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
				if got := e.image(w[0], w[1]); got != want {
					t.Errorf("after the registry healed %s/%s runs %s, want %s", w[0], w[1], got, want)
				}
			}
			a = e.annotations("jobs-manager")
			if got := a[e.key("last-refreshed-api-digest")]; got != next {
				t.Errorf("after the registry healed the record is %q, want %q", got, next)
			}
			if v, ok := a[e.key("resolve-failure-streak-api")]; ok {
				t.Errorf("resolve-failure streak %q not cleared after a good answer", v)
			}
		})
	}
}

func TestTick_R1_ResolveFailureCeilingExits1(t *testing.T) {
	e := newEnv(t)
	e.seed()
	cfg := e.config("maxReadFailures: 2\n" + seedShape)
	e.reg.SetFault(testregistry.Fault{Status: 500})

	if code, _ := e.tick(cfg); code != 0 {
		t.Fatalf("first failing tick exit %d, want 0 (below the ceiling)", code)
	}
	if ev := e.events("jobs-manager"); hasEvent(ev, "RefreshError", "") {
		t.Errorf("RefreshError event below the ceiling: %q", ev)
	}
	code, logs := e.tick(cfg)
	if code != 1 {
		t.Fatalf("second failing tick exit %d, want 1 (ceiling maxReadFailures 2 reached)", code)
	}
	if got := e.annotations("jobs-manager")[e.key("resolve-failure-streak-api")]; got != "2" {
		t.Errorf("resolve-failure streak %q, want \"2\"", got)
	}
	ev := e.events("jobs-manager")
	if !hasEvent(ev, "RefreshError", e.repo("api")+":prod") || !hasEvent(ev, "RefreshError", "HTTP 500") {
		t.Errorf("no RefreshError event on the anchor naming %s:prod and HTTP 500; events: %q", e.repo("api"), ev)
	}
	if lines := logLines(logs, "ERROR", e.repo("api"), "remediation="); len(lines) == 0 {
		t.Errorf("no ERROR line with a remediation at the ceiling:\n%s", logs)
	}
}

func TestTick_R1_MultiArchTagPinsTheIndexDigest(t *testing.T) {
	e := newEnv(t)
	e.seed()
	index := e.reg.MustPushRandomIndex(t, "acme/api", "prod", 3)
	cfg := e.config(seedShape)
	e.tick(cfg)
	if code, _ := e.tick(cfg); code != 0 {
		t.Fatalf("tick exit %d", code)
	}
	want := e.repo("api") + ":prod@" + index
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := e.image(w[0], w[1]); got != want {
			t.Errorf("%s/%s runs %s, want the index digest %s", w[0], w[1], got, want)
		}
	}
	if got := e.annotations("jobs-manager")[e.key("last-refreshed-api-digest")]; got != index {
		t.Errorf("recorded %q, want the index digest %q", got, index)
	}
}

func TestTick_C2_OneHeadPerRepoTagPerTick(t *testing.T) {
	e := newEnv(t)
	digest := e.seed()
	tag := e.repo("api") + ":prod"
	testenv.Deployment(t, e.c.Client, e.ns, "worker-a", testenv.WithContainer("app", tag), testenv.WithReplicas(1))
	testenv.Deployment(t, e.c.Client, e.ns, "worker-b", testenv.WithContainer("app", tag), testenv.WithReplicas(1))
	e.settle("Deployment", "worker-a")
	e.settle("Deployment", "worker-b")
	cfg := e.config(seedShape + `  - name: workers
    anchor: {kind: Deployment, namespace: {{ns}}, name: worker-a}
    images:
      - name: api
        repository: {{reg}}/acme/api
        tag: prod
        targets:
          - {kind: Deployment, namespace: {{ns}}, name: worker-a, container: app}
          - {kind: Deployment, namespace: {{ns}}, name: worker-b, container: app}
`)
	// A digest is verified with one GET before it is first recorded (R1);
	// after that a HEAD is enough.
	for i, tc := range []struct {
		what string
		gets int
	}{{"first observation", 1}, {"pin", 0}, {"steady state", 0}} {
		e.reg.ResetRequests()
		if code, _ := e.tick(cfg); code != 0 {
			t.Fatalf("tick %d (%s) exit %d", i+1, tc.what, code)
		}
		if n := e.reg.Count("HEAD", "/manifests/prod"); n != 1 {
			t.Errorf("tick %d (%s): %d manifest HEADs of acme/api:prod, want 1 for 2 groups and 4 targets", i+1, tc.what, n)
		}
		if n := e.reg.Count("GET", "/manifests/"); n != tc.gets {
			t.Errorf("tick %d (%s): %d manifest GETs, want %d (one GET verifies a new digest once for every group, then a HEAD is enough)", i+1, tc.what, n, tc.gets)
		}
	}
	want := tag + "@" + digest
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}, {"worker-a", "app"}, {"worker-b", "app"}} {
		if got := e.image(w[0], w[1]); got != want {
			t.Errorf("%s/%s runs %s, want %s (the shared answer must serve every group)", w[0], w[1], got, want)
		}
	}
}

// mirrorShape has jobs-manager on the configured registry and
// requests-proxy on a mirror ({{mirror}}) that a webhook or an operator
// pointed it at.
const mirrorShape = `  - host: {{mirror}}
    insecure: true
` + seedShape

// mirrorEnv seeds jobs-manager on the primary registry and requests-proxy on
// a second registry (the mirror), and returns the mirror, the digest and
// the config.
func mirrorEnv(t *testing.T) (e *env, mirror *testregistry.Server, digest, cfg string) {
	e = newEnv(t)
	mirror = testregistry.Start(t)
	digest = e.push("api", "prod")
	testenv.Deployment(t, e.c.Client, e.ns, "jobs-manager", testenv.WithContainer("api", e.repo("api")+":prod"), testenv.WithRecreate())
	testenv.Deployment(t, e.c.Client, e.ns, "requests-proxy", testenv.WithContainer("proxy", mirror.Host()+"/acme/api:prod"))
	e.settle("Deployment", "jobs-manager")
	e.settle("Deployment", "requests-proxy")
	cfg = e.config(strings.ReplaceAll(mirrorShape, "{{mirror}}", mirror.Host()))
	return e, mirror, digest, cfg
}

// assertInert checks that requests-proxy, on the mirror without the digest,
// was not touched and says so as a NOTE.
func (e *env) assertInert(mirror *testregistry.Server, rv, logs string) {
	e.t.Helper()
	if got := e.image("requests-proxy", "proxy"); got != mirror.Host()+"/acme/api:prod" {
		e.t.Errorf("requests-proxy re-imaged to %s although the mirror does not hold the digest (R3)", got)
	}
	if got := e.deployment("requests-proxy").ResourceVersion; got != rv {
		e.t.Errorf("requests-proxy written (resourceVersion %s -> %s) although inert", rv, got)
	}
	if lines := logLines(logs, "INFO", "NOTE:", mirror.Host()+"/acme/api"); len(lines) == 0 {
		e.t.Errorf("no NOTE naming the mirror %s:\n%s", mirror.Host(), logs)
	}
	if strings.Contains(logs, "level=ERROR") || strings.Contains(logs, "level=WARN") {
		e.t.Errorf("an inert target is a NOTE, not a WARN or an error:\n%s", logs)
	}
}

func TestTick_R3_MirrorTargetWithoutProofIsInert(t *testing.T) {
	e, mirror, digest, cfg := mirrorEnv(t)
	rv := e.deployment("requests-proxy").ResourceVersion
	e.tick(cfg) // first observation
	mirror.ResetRequests()
	code, logs := e.tick(cfg)
	if code != 0 {
		t.Fatalf("tick exit %d, want 0 (an inert target is not an error)", code)
	}
	if got, want := e.image("jobs-manager", "api"), e.repo("api")+":prod@"+digest; got != want {
		t.Errorf("jobs-manager (on the configured registry) runs %s, want %s", got, want)
	}
	e.assertInert(mirror, rv, logs)
	if n := mirror.Count("HEAD", "/manifests/"+digest); n == 0 {
		t.Errorf("the mirror was never asked for %s (R3 proof)", digest)
	}
	r := row(e.status(cfg), "requests-proxy", "proxy")
	if r == nil || r["state"] != "inert" {
		t.Errorf("status row of requests-proxy: %v, want state inert", r)
	}
}

func TestTick_R3_MirrorTargetWithProofIsPinnedOnTheMirror(t *testing.T) {
	e, mirror, digest, cfg := mirrorEnv(t)
	rv := e.deployment("requests-proxy").ResourceVersion
	e.tick(cfg)
	_, logs := e.tick(cfg)
	e.assertInert(mirror, rv, logs)

	copyContent(t, e.reg, mirror, "acme/api", "prod", digest)
	if code, _ := e.tick(cfg); code != 0 {
		t.Fatalf("tick exit %d", code)
	}
	if got, want := e.image("requests-proxy", "proxy"), mirror.Host()+"/acme/api:prod@"+digest; got != want {
		t.Errorf("requests-proxy runs %s, want %s (pinned on the mirror that holds the digest)", got, want)
	}
	if got, want := e.image("jobs-manager", "api"), e.repo("api")+":prod@"+digest; got != want {
		t.Errorf("jobs-manager runs %s, want %s", got, want)
	}
	if r := row(e.status(cfg), "requests-proxy", "proxy"); r == nil || r["state"] != "pinned" {
		t.Errorf("status row of requests-proxy: %v, want state pinned", r)
	}
}

// dockerConfigSecret creates a kubernetes.io/dockerconfigjson Secret with
// credentials for host.
func (e *env) dockerConfigSecret(name, host, user, pass string, update bool) {
	e.t.Helper()
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	cfg := fmt.Sprintf(`{"auths":{%q:{"username":%q,"password":%q,"auth":%q}}}`, host, user, pass, auth)
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: []byte(cfg)},
	}
	var err error
	if update {
		_, err = e.c.Client.CoreV1().Secrets(e.ns).Update(context.Background(), s, metav1.UpdateOptions{})
	} else {
		_, err = e.c.Client.CoreV1().Secrets(e.ns).Create(context.Background(), s, metav1.CreateOptions{})
	}
	if err != nil {
		e.t.Fatal(err)
	}
}

// assertNoLeak fails when any of secrets appears in the logs, an Event
// message or an annotation value of the namespace's Deployments.
func (e *env) assertNoLeak(logs string, secrets ...string) {
	e.t.Helper()
	list, err := e.c.Client.AppsV1().Deployments(e.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, s := range secrets {
		if strings.Contains(logs, s) {
			e.t.Errorf("R20: %q appears in the logs:\n%s", s, logs)
		}
		for _, m := range e.eventMessages() {
			if strings.Contains(m, s) {
				e.t.Errorf("R20: %q appears in an Event: %s", s, m)
			}
		}
		for _, d := range list.Items {
			for k, v := range d.Annotations {
				if strings.Contains(v, s) || strings.Contains(k, s) {
					e.t.Errorf("R20: %q appears in annotation %s=%s of %s", s, k, v, d.Name)
				}
			}
		}
	}
}

func TestTick_R20_PullSecretCredentialsNeverLeak(t *testing.T) {
	const user, pass, wrong = "robot", "s3cr3t-pass", "wr0ng-s3cr3t"
	e := newEnv(t)
	e.reg = testregistry.Start(t, testregistry.WithBasicAuth(user, pass))
	digest := e.push("api", "prod")
	e.dockerConfigSecret("regcred", e.reg.Host(), user, pass, false)
	tag := e.repo("api") + ":prod"
	testenv.Deployment(t, e.c.Client, e.ns, "jobs-manager", testenv.WithContainer("api", tag), testenv.WithRecreate(), testenv.WithPullSecrets("regcred"))
	testenv.Deployment(t, e.c.Client, e.ns, "requests-proxy", testenv.WithContainer("proxy", tag), testenv.WithPullSecrets("regcred"))
	e.settle("Deployment", "jobs-manager")
	e.settle("Deployment", "requests-proxy")
	cfg := e.config(seedShape)
	leaks := []string{pass, wrong,
		base64.StdEncoding.EncodeToString([]byte(user + ":" + pass)),
		base64.StdEncoding.EncodeToString([]byte(user + ":" + wrong))}

	var all strings.Builder
	for i := range 2 {
		code, logs := e.tick(cfg)
		all.WriteString(logs)
		if code != 0 {
			t.Fatalf("tick %d with the pull secret: exit %d, want 0", i+1, code)
		}
	}
	if got := e.image("jobs-manager", "api"); got != tag+"@"+digest {
		t.Fatalf("not pinned with the pull secret's credentials: %s", got)
	}
	if n := e.reg.Count("HEAD", "/manifests/prod"); n == 0 {
		t.Fatal("the registry was never asked")
	}
	e.assertNoLeak(all.String(), leaks...)

	// The secret now holds a wrong password: resolving fails as unauthorized.
	e.dockerConfigSecret("regcred", e.reg.Host(), user, wrong, true)
	next := e.push("api", "prod")
	code, logs := e.tick(cfg)
	if code != 0 {
		t.Errorf("tick with a wrong password: exit %d, want 0 below the ceiling", code)
	}
	if lines := logLines(logs, "WARN", e.repo("api"), "unauthorized"); len(lines) == 0 {
		t.Errorf("no WARN line saying unauthorized:\n%s", logs)
	}
	if got := e.image("jobs-manager", "api"); got == tag+"@"+next {
		t.Errorf("re-imaged to %s although the credentials are wrong", got)
	}
	if got := e.annotations("jobs-manager")[e.key("resolve-failure-streak-api")]; got != "1" {
		t.Errorf("resolve-failure streak %q, want \"1\"", got)
	}
	e.assertNoLeak(logs, leaks...)
}
