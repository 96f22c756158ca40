package tick

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
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
	clearFault := func(e *env, _ string) { e.Reg.ClearFault() }
	fault := func(f testregistry.Fault) func(e *env, _ string) {
		return func(e *env, _ string) { e.Reg.SetFault(f) }
	}
	for name, tc := range map[string]breakage{
		"a malformed Docker-Content-Digest is an error, not a digest": {
			brk: fault(testregistry.Fault{DigestHeader: e2e.Ptr("sha256:XYZ")}), heal: clearFault, logged: "invalid-digest",
		},
		"an answer without Docker-Content-Digest is an error": {
			brk: fault(testregistry.Fault{DigestHeader: e2e.Ptr("")}), heal: clearFault, logged: "invalid-digest",
		},
		"a deleted tag (404) is skipped": {
			brk:    func(e *env, _ string) { e.Reg.MustDeleteTag(e.T, "acme/api", "prod") },
			heal:   func(e *env, next string) { e.Reg.MustTag(e.T, "acme/api", "prod", next) },
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
			brk:  fault(testregistry.Fault{Method: "HEAD", DigestHeader: e2e.Ptr("sha512:" + strings.Repeat("0123456789abcdef", 8))}),
			heal: clearFault, logged: "inconsistent-digest",
		},
		"a HEAD naming another well-formed digest than the GET serves is inconsistent, not pinned": {
			brk:  fault(testregistry.Fault{Method: "HEAD", DigestHeader: e2e.Ptr("sha256:" + strings.Repeat("0", 64))}),
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
			t.Parallel() // each case has its own namespace and registry; a tick keeps no process-wide state
			e := newEnv(t)
			old, cfg := e.Pinned()
			oldRef := e.Repo("api") + ":prod@" + old
			next := e.Push("api", "prod")
			tc.brk(e, next)

			start := time.Now()
			code, logs := e.Tick(cfg)
			took := time.Since(start)
			if code != 0 {
				t.Errorf("tick exit %d below the failure ceiling, want 0", code)
			}
			if took > 10*time.Second {
				t.Errorf("tick took %s with registryTimeout 2s (R14: bounded)", took)
			}
			for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
				if got := e.Image(w[0], w[1]); got != oldRef {
					t.Errorf("%s/%s re-imaged to %s on a bad registry answer, want it left on %s", w[0], w[1], got, oldRef)
				}
			}
			a := e.Annotations("jobs-manager")
			if got := a[e.Key("last-refreshed-api-digest")]; got != old {
				t.Errorf("record changed to %q on a bad registry answer, want %q", got, old)
			}
			if got := a[e.Key("resolve-failure-streak-api")]; got != "1" {
				t.Errorf("resolve-failure streak %q, want \"1\"", got)
			}
			if lines := e2e.LogLines(logs, "WARN", e.Repo("api"), tc.logged); len(lines) == 0 {
				t.Errorf("no WARN line naming %s and %q:\n%s", e.Repo("api"), tc.logged, logs)
			}
			if strings.Contains(logs, "sha256:XYZ@") || strings.Contains(logs, "@sha256:XYZ") {
				t.Errorf("the malformed digest made it into a reference:\n%s", logs)
			}

			tc.heal(e, next)
			if code, _ := e.Tick(cfg); code != 0 {
				t.Fatalf("tick after the registry healed: exit %d, want 0", code)
			}
			want := e.Repo("api") + ":prod@" + next
			for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
				if got := e.Image(w[0], w[1]); got != want {
					t.Errorf("after the registry healed %s/%s runs %s, want %s", w[0], w[1], got, want)
				}
			}
			a = e.Annotations("jobs-manager")
			if got := a[e.Key("last-refreshed-api-digest")]; got != next {
				t.Errorf("after the registry healed the record is %q, want %q", got, next)
			}
			if v, ok := a[e.Key("resolve-failure-streak-api")]; ok {
				t.Errorf("resolve-failure streak %q not cleared after a good answer", v)
			}
		})
	}
}

func TestTick_R1_ResolveFailureCeilingExits1(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	cfg := e.Config("maxReadFailures: 2\n" + e2e.SeedShape)
	e.Reg.SetFault(testregistry.Fault{Status: 500})

	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("first failing tick exit %d, want 0 (below the ceiling)", code)
	}
	if ev := e.Events("jobs-manager"); e2e.HasEvent(ev, "RefreshError", "") {
		t.Errorf("RefreshError event below the ceiling: %q", ev)
	}
	code, logs := e.Tick(cfg)
	if code != 1 {
		t.Fatalf("second failing tick exit %d, want 1 (ceiling maxReadFailures 2 reached)", code)
	}
	if got := e.Annotations("jobs-manager")[e.Key("resolve-failure-streak-api")]; got != "2" {
		t.Errorf("resolve-failure streak %q, want \"2\"", got)
	}
	ev := e.Events("jobs-manager")
	if !e2e.HasEvent(ev, "RefreshError", e.Repo("api")+":prod") || !e2e.HasEvent(ev, "RefreshError", "HTTP 500") {
		t.Errorf("no RefreshError event on the anchor naming %s:prod and HTTP 500; events: %q", e.Repo("api"), ev)
	}
	if lines := e2e.LogLines(logs, "ERROR", e.Repo("api"), "remediation="); len(lines) == 0 {
		t.Errorf("no ERROR line with a remediation at the ceiling:\n%s", logs)
	}
}

func TestTick_R1_MultiArchTagPinsTheIndexDigest(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	index := e.Reg.MustPushRandomIndex(t, "acme/api", "prod", 3)
	cfg := e.Config(e2e.SeedShape)
	e.Tick(cfg)
	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("tick exit %d", code)
	}
	want := e.Repo("api") + ":prod@" + index
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := e.Image(w[0], w[1]); got != want {
			t.Errorf("%s/%s runs %s, want the index digest %s", w[0], w[1], got, want)
		}
	}
	if got := e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")]; got != index {
		t.Errorf("recorded %q, want the index digest %q", got, index)
	}
}

func TestTick_C2_OneHeadPerRepoTagPerTick(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	tag := e.Repo("api") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "worker-a", testenv.WithContainer("app", tag), testenv.WithReplicas(1))
	testenv.Deployment(t, e.C.Client, e.NS, "worker-b", testenv.WithContainer("app", tag), testenv.WithReplicas(1))
	e.Settle("Deployment", "worker-a")
	e.Settle("Deployment", "worker-b")
	cfg := e.Config(e2e.SeedShape + e2e.GroupOf("workers", "Deployment", "worker-a", e2e.ImageOf("api", "api", "prod", e2e.Target("Deployment", "worker-a", "app"), e2e.Target("Deployment", "worker-b", "app"))))
	// A digest is verified with one GET before it is first recorded (R1),
	// and what it serves is read once (V3: its manifest by digest, and the
	// config blob of a single image); after that a HEAD is enough.
	for i, tc := range []struct {
		what        string
		gets, blobs int
	}{{"first observation", 2, 1}, {"pin", 0, 0}, {"steady state", 0, 0}} {
		e.Reg.ResetRequests()
		if code, _ := e.Tick(cfg); code != 0 {
			t.Fatalf("tick %d (%s) exit %d", i+1, tc.what, code)
		}
		if n := e.Reg.Count("HEAD", "/manifests/prod"); n != 1 {
			t.Errorf("tick %d (%s): %d manifest HEADs of acme/api:prod, want 1 for 2 groups and 4 targets", i+1, tc.what, n)
		}
		if n := e.Reg.Count("GET", "/manifests/"); n != tc.gets {
			t.Errorf("tick %d (%s): %d manifest GETs, want %d (one GET verifies a new digest and one reads its platforms, once for every group, then a HEAD is enough)", i+1, tc.what, n, tc.gets)
		}
		if n := e.Reg.Count("GET", "/blobs/"); n != tc.blobs {
			t.Errorf("tick %d (%s): %d blob GETs, want %d (the config of a new single-platform digest, once for every group)", i+1, tc.what, n, tc.blobs)
		}
	}
	want := tag + "@" + digest
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}, {"worker-a", "app"}, {"worker-b", "app"}} {
		if got := e.Image(w[0], w[1]); got != want {
			t.Errorf("%s/%s runs %s, want %s (the shared answer must serve every group)", w[0], w[1], got, want)
		}
	}
}

// mirrorShape has jobs-manager on the configured registry and
// requests-proxy on a mirror ({{mirror}}) that a webhook or an operator
// pointed it at.
var mirrorShape = `  - host: {{mirror}}
    insecure: true
` + e2e.SeedShape

// mirrorEnv seeds jobs-manager on the primary registry and requests-proxy on
// a second registry (the mirror), and returns the mirror, the digest and
// the config.
func mirrorEnv(t *testing.T) (e *env, mirror *testregistry.Server, digest, cfg string) {
	e = newEnv(t)
	mirror = testregistry.Start(t)
	digest = e.Push("api", "prod")
	testenv.Deployment(t, e.C.Client, e.NS, "jobs-manager", testenv.WithContainer("api", e.Repo("api")+":prod"), testenv.WithRecreate())
	testenv.Deployment(t, e.C.Client, e.NS, "requests-proxy", testenv.WithContainer("proxy", mirror.Host()+"/acme/api:prod"))
	e.Settle("Deployment", "jobs-manager")
	e.Settle("Deployment", "requests-proxy")
	cfg = e.Config(strings.ReplaceAll(mirrorShape, "{{mirror}}", mirror.Host()))
	return e, mirror, digest, cfg
}

// assertInert checks that requests-proxy, on the mirror without the digest,
// was not touched and says so as a NOTE.
func (e *env) assertInert(mirror *testregistry.Server, rv, logs string) {
	e.T.Helper()
	if got := e.Image("requests-proxy", "proxy"); got != mirror.Host()+"/acme/api:prod" {
		e.T.Errorf("requests-proxy re-imaged to %s although the mirror does not hold the digest (R3)", got)
	}
	if got := e.Deployment("requests-proxy").ResourceVersion; got != rv {
		e.T.Errorf("requests-proxy written (resourceVersion %s -> %s) although inert", rv, got)
	}
	if lines := e2e.LogLines(logs, "INFO", "NOTE:", mirror.Host()+"/acme/api"); len(lines) == 0 {
		e.T.Errorf("no NOTE naming the mirror %s:\n%s", mirror.Host(), logs)
	}
	if strings.Contains(logs, "level=ERROR") || strings.Contains(logs, "level=WARN") {
		e.T.Errorf("an inert target is a NOTE, not a WARN or an error:\n%s", logs)
	}
}

func TestTick_R3_MirrorTargetWithoutProofIsInert(t *testing.T) {
	e, mirror, digest, cfg := mirrorEnv(t)
	rv := e.Deployment("requests-proxy").ResourceVersion
	e.Tick(cfg) // first observation
	mirror.ResetRequests()
	code, logs := e.Tick(cfg)
	if code != 0 {
		t.Fatalf("tick exit %d, want 0 (an inert target is not an error)", code)
	}
	if got, want := e.Image("jobs-manager", "api"), e.Repo("api")+":prod@"+digest; got != want {
		t.Errorf("jobs-manager (on the configured registry) runs %s, want %s", got, want)
	}
	e.assertInert(mirror, rv, logs)
	if n := mirror.Count("HEAD", "/manifests/"+digest); n == 0 {
		t.Errorf("the mirror was never asked for %s (R3 proof)", digest)
	}
	r := e2e.Row(e.Status(cfg), "requests-proxy", "proxy")
	if r == nil || r["state"] != "inert" {
		t.Errorf("status row of requests-proxy: %v, want state inert", r)
	}
}

func TestTick_R3_MirrorTargetWithProofIsPinnedOnTheMirror(t *testing.T) {
	e, mirror, digest, cfg := mirrorEnv(t)
	rv := e.Deployment("requests-proxy").ResourceVersion
	e.Tick(cfg)
	_, logs := e.Tick(cfg)
	e.assertInert(mirror, rv, logs)

	e2e.CopyContent(t, e.Reg, mirror, "acme/api", "prod", digest)
	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("tick exit %d", code)
	}
	if got, want := e.Image("requests-proxy", "proxy"), mirror.Host()+"/acme/api:prod@"+digest; got != want {
		t.Errorf("requests-proxy runs %s, want %s (pinned on the mirror that holds the digest)", got, want)
	}
	if got, want := e.Image("jobs-manager", "api"), e.Repo("api")+":prod@"+digest; got != want {
		t.Errorf("jobs-manager runs %s, want %s", got, want)
	}
	if r := e2e.Row(e.Status(cfg), "requests-proxy", "proxy"); r == nil || r["state"] != "pinned" {
		t.Errorf("status row of requests-proxy: %v, want state pinned", r)
	}
}

func TestTick_R20_PullSecretCredentialsNeverLeak(t *testing.T) {
	const user, pass, wrong = "robot", "s3cr3t-pass", "wr0ng-s3cr3t"
	e := newEnv(t)
	e.Reg = testregistry.Start(t, testregistry.WithBasicAuth(user, pass))
	digest := e.Push("api", "prod")
	e.DockerConfigSecret("regcred", e.Reg.Host(), user, pass, false)
	tag := e.Repo("api") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "jobs-manager", testenv.WithContainer("api", tag), testenv.WithRecreate(), testenv.WithPullSecrets("regcred"))
	testenv.Deployment(t, e.C.Client, e.NS, "requests-proxy", testenv.WithContainer("proxy", tag), testenv.WithPullSecrets("regcred"))
	e.Settle("Deployment", "jobs-manager")
	e.Settle("Deployment", "requests-proxy")
	cfg := e.Config(e2e.SeedShape)
	leaks := []string{pass, wrong,
		base64.StdEncoding.EncodeToString([]byte(user + ":" + pass)),
		base64.StdEncoding.EncodeToString([]byte(user + ":" + wrong))}

	var all strings.Builder
	for i := range 2 {
		code, logs := e.Tick(cfg)
		all.WriteString(logs)
		if code != 0 {
			t.Fatalf("tick %d with the pull secret: exit %d, want 0", i+1, code)
		}
	}
	if got := e.Image("jobs-manager", "api"); got != tag+"@"+digest {
		t.Fatalf("not pinned with the pull secret's credentials: %s", got)
	}
	if n := e.Reg.Count("HEAD", "/manifests/prod"); n == 0 {
		t.Fatal("the registry was never asked")
	}
	e.AssertNoLeak(all.String(), leaks...)

	// The secret now holds a wrong password: resolving fails as unauthorized.
	e.DockerConfigSecret("regcred", e.Reg.Host(), user, wrong, true)
	next := e.Push("api", "prod")
	code, logs := e.Tick(cfg)
	if code != 0 {
		t.Errorf("tick with a wrong password: exit %d, want 0 below the ceiling", code)
	}
	if lines := e2e.LogLines(logs, "WARN", e.Repo("api"), "unauthorized"); len(lines) == 0 {
		t.Errorf("no WARN line saying unauthorized:\n%s", logs)
	}
	if got := e.Image("jobs-manager", "api"); got == tag+"@"+next {
		t.Errorf("re-imaged to %s although the credentials are wrong", got)
	}
	if got := e.Annotations("jobs-manager")[e.Key("resolve-failure-streak-api")]; got != "1" {
		t.Errorf("resolve-failure streak %q, want \"1\"", got)
	}
	e.AssertNoLeak(logs, leaks...)
}
