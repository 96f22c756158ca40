package tick

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/running"
	"github.com/image-refresh/image-refresh/test/support/testsign"
)

// V1 through tick and status on the local cluster, with signatures the
// test makes in cosign's formats and pushes to the in-process registry.

// signing is a verification policy over the env's registry, with its key.
type signing struct {
	e   *env
	key testsign.Signer
	// other is a key the policy does not list.
	other testsign.Signer
}

func newSigning(e *env) *signing {
	e.T.Helper()
	s := &signing{e: e, key: testsign.NewSigner(e.T, "release.pub"), other: testsign.NewSigner(e.T, "other.pub")}
	s.key.WritePublicKey(e.T, e.T.TempDir())
	return s
}

// config is e2e.SeedShape under a policy that needs s.key's signature.
func (s *signing) config() string {
	return s.e.Config(`verification:
  - name: release
    repositories: ["{{reg}}/acme/**"]
    cosign:
      publicKeys: [` + s.key.File + `]
` + e2e.SeedShape)
}

func (s *signing) ref(digest string) name.Digest {
	s.e.T.Helper()
	d, err := name.NewDigest(s.e.Repo("api")+"@"+digest, name.Insecure)
	if err != nil {
		s.e.T.Fatal(err)
	}
	return d
}

var plainHTTP []remote.Option

func TestTick_V1_OnlyASignedDigestIsRecordedAndPinned(t *testing.T) {
	e := newEnv(t)
	s := newSigning(e)
	cfg := s.config()
	d0 := e.Seed()
	onTag := e.Repo("api") + ":prod"

	// An unsigned first observation records nothing: exit 1, the digest
	// named with why, a status row, an Event.
	code, logs := e.Tick(cfg)
	if code != 1 {
		t.Errorf("tick over an unsigned digest: exit %d, want 1", code)
	}
	if v, ok := e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")]; ok {
		t.Fatalf("an unsigned digest was recorded: %s", v)
	}
	if len(e2e.LogLines(logs, "WARN", d0, "verification policy release", "no signature found")) == 0 {
		t.Errorf("no WARN line naming %s, the policy and why:\n%s", d0, logs)
	}
	if r := e2e.Row(e.Status(cfg), "jobs-manager", "api"); r == nil || r["state"] != "unverified" {
		t.Errorf("status row %v, want state unverified", r)
	}
	if ev := e.Events("jobs-manager"); !e2e.HasEvent(ev, "DigestUnverified", d0) {
		t.Errorf("no DigestUnverified Event naming %s: %v", d0, ev)
	}

	// Signed (a legacy .sig, cosign before v3): recorded, then pinned.
	s.key.AttachLegacy(t, s.ref(d0), plainHTTP, testsign.LegacyPayload(s.ref(d0)))
	for i := range 2 {
		if code, logs := e.Tick(cfg); code != 0 {
			t.Fatalf("tick %d over a signed digest: exit %d, want 0:\n%s", i+1, code, logs)
		}
	}
	if got, want := e.Image("jobs-manager", "api"), onTag+"@"+d0; got != want {
		t.Fatalf("after the signature: %s, want %s", got, want)
	}

	// A new digest that is not signed by the policy's key, each way it
	// can fail, holds every target on d0 and records nothing.
	d1 := e.Push("api", "prod")
	unverifiedBy := func(why string) {
		t.Helper()
		code, logs := e.Tick(cfg)
		if code != 1 {
			t.Errorf("%s: exit %d, want 1", why, code)
		}
		for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
			if got := e.Image(w[0], w[1]); got != onTag+"@"+d0 {
				t.Errorf("%s: %s/%s moved to %s, want it held on %s", why, w[0], w[1], got, d0)
			}
		}
		if got := e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")]; got != d0 {
			t.Errorf("%s: record %q, want %s", why, got, d0)
		}
		if len(e2e.LogLines(logs, "WARN", d1, why)) == 0 {
			t.Errorf("%s: no WARN line naming %s and why:\n%s", why, d1, logs)
		}
	}
	unverifiedBy("no signature found")
	s.other.SignBundle(t, s.ref(d1))
	unverifiedBy("wrong-key")
	testsign.AttachBundle(t, s.ref(d1), s.key.DSSEBundle(t, s.ref(d1), testsign.SPDXPredicate), testsign.SPDXPredicate)
	unverifiedBy("not-a-signature")
	// d0's signature copied onto d1 (a bundle: beside d1's bundles a
	// legacy .sig is not looked at, as cosign verify does not).
	testsign.AttachBundle(t, s.ref(d1), s.key.DSSEBundle(t, s.ref(d0), testsign.SignPredicate), testsign.SignPredicate)
	unverifiedBy("bound-to-another-digest")
	if r := e2e.Row(e.Status(cfg), "requests-proxy", "proxy"); r == nil || r["state"] != "unverified" || !strings.Contains(r["message"].(string), "held on the recorded digest "+d0) {
		t.Errorf("status row %v, want unverified, held on %s", r, d0)
	}

	// Fix B serves records only: render pins the bare tag to the verified
	// d0, never to the unverified d1 the tag points to.
	code, out, rlogs, _ := e.Render(e.SeedManifests(), "--config", cfg, "--kubeconfig", e.Kubeconfig, "--namespace", e.NS)
	if code != 0 || !strings.Contains(out, onTag+"@"+d0) || strings.Contains(out, d1) {
		t.Errorf("render (exit %d) did not pin to the verified %s only:\n%s\n%s", code, d0, out, rlogs)
	}

	// Signed with the policy's key (a bundle, cosign v3): rolled out.
	s.key.SignBundle(t, s.ref(d1))
	if code, logs := e.Tick(cfg); code != 0 {
		t.Fatalf("tick over the signed new digest: exit %d, want 0:\n%s", code, logs)
	}
	if got, want := e.Image("requests-proxy", "proxy"), onTag+"@"+d1; got != want {
		t.Errorf("after the signature: %s, want %s", got, want)
	}
	if got := e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")]; got != d1 {
		t.Errorf("record %q, want %s", got, d1)
	}

	// A revert re-pin restores the recorded digest even while the tag
	// serves an unsigned newer one.
	d2 := e.Push("api", "prod")
	e.SetImageAs("helm", "Deployment", "requests-proxy", "proxy", onTag)
	code, logs = e.Tick(cfg)
	if code != 1 {
		t.Errorf("tick with an unsigned %s: exit %d, want 1", d2, code)
	}
	if got, want := e.Image("requests-proxy", "proxy"), onTag+"@"+d1; got != want {
		t.Errorf("the reverted target: %s, want re-pinned to the recorded %s:\n%s", got, want, logs)
	}
}

// verifications reads image_refresh_verifications_total{policy="release",result}.
func verifications(t *testing.T, c *e2e.RunningController, result string) int {
	t.Helper()
	_, body := running.Get("http://" + c.Metrics + "/metrics")
	v, ok := running.MetricValue(body, "image_refresh_verifications_total", map[string]string{"policy": "release", "result": result})
	if !ok {
		return 0
	}
	n, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("image_refresh_verifications_total = %q", v)
	}
	return int(n)
}

// V1 through `run`: an unsigned push is held and looked up once, not per
// pass; once signed, it rolls when its recheck is due on the injected clock.
func TestRun_V1_AnUnsignedPushIsHeldAndLookedUpOnceUntilItsRecheck(t *testing.T) {
	e := newEnv(t)
	e.Clock = e2e.NewClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	s := newSigning(e)
	cfg := s.config()
	d0 := e.Seed()
	s.key.SignBundle(t, s.ref(d0))
	e.PinAll(cfg)
	onTag := e.Repo("api") + ":prod"

	ctl := e.StartRun(cfg, "--poll-interval", "300ms", "--poll-jitter", "0")
	ctl.WaitReady(t)
	ctl.WaitPasses(t, "control-plane", 0, 1)
	// The counters are the process's (other tests' runs count too): what
	// this run adds is the difference.
	unverified0, verified0 := verifications(t, ctl, "unverified"), verifications(t, ctl, "verified")
	d1 := e.Push("api", "prod")
	ctl.UntilLogged(t, "the unsigned push reported", func(logs string) bool {
		return len(e2e.LogLines(logs, "WARN", d1, "verification policy release", "no signature found")) > 0
	})
	ctl.KickedPasses(t, e.Env, "control-plane", "jobs-manager")
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := e.Image(w[0], w[1]); got != onTag+"@"+d0 {
			t.Errorf("%s/%s on %s, want it held on %s", w[0], w[1], got, d0)
		}
	}
	if n := verifications(t, ctl, "unverified") - unverified0; n != 1 {
		t.Errorf("the unsigned digest was looked up %d times over several passes, want once", n)
	}
	_, body := running.Get("http://" + ctl.Metrics + "/metrics")
	if v, _ := running.MetricValue(body, "image_refresh_group_needs_attention", map[string]string{"group": "control-plane", "reason": "DigestUnverified"}); v != "1" {
		t.Errorf("needs_attention{reason=DigestUnverified} = %q, want 1", v)
	}

	// Signed now; the recheck is a minute away on the clock: still held.
	s.key.SignBundle(t, s.ref(d1))
	ctl.KickedPasses(t, e.Env, "control-plane", "jobs-manager")
	if got := e.Image("requests-proxy", "proxy"); got != onTag+"@"+d0 {
		t.Errorf("before its recheck requests-proxy moved to %s", got)
	}
	e.Clock.Add(2 * time.Minute)
	e.UntilDeployments(60*time.Second, "the signed digest rolled after its recheck", func() bool {
		return e.Image("requests-proxy", "proxy") == onTag+"@"+d1 && e.Image("jobs-manager", "api") == onTag+"@"+d1
	})
	if n := verifications(t, ctl, "verified") - verified0; n != 1 {
		t.Errorf("verified lookups %d, want 1", n)
	}
}

func TestTick_V1_AKeylessSignatureCountsOnlyFromTheTrustedIdentity(t *testing.T) {
	e := newEnv(t)
	sig := testsign.NewSigstore(t)
	rootFile := sig.WriteTrustedRoot(t, t.TempDir())
	cfg := e.Config(`verification:
  - name: ci
    repositories: ["{{reg}}/acme/api"]
    cosign:
      keyless:
        - {issuer: "https://token.actions.example", subject: "release@acme.example"}
      trustedRoot: ` + rootFile + "\n" + e2e.SeedShape)
	d0 := e.Seed()
	ref, err := name.NewDigest(e.Repo("api")+"@"+d0, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}

	sig.SignKeyless(t, ref, "https://token.actions.example", "mallory@acme.example")
	code, logs := e.Tick(cfg)
	if code != 1 || len(e2e.LogLines(logs, "WARN", d0, "verification policy ci", "wrong-identity", "mallory@acme.example")) == 0 {
		t.Fatalf("signed by another identity: exit %d, want 1 with a WARN naming %s, the policy and the identity:\n%s", code, d0, logs)
	}
	if v, ok := e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")]; ok {
		t.Fatalf("a digest signed by another identity was recorded: %s", v)
	}

	sig.SignKeyless(t, ref, "https://token.actions.example", "release@acme.example")
	for i := range 2 {
		if code, logs := e.Tick(cfg); code != 0 {
			t.Fatalf("tick %d with the trusted identity's signature: exit %d:\n%s", i+1, code, logs)
		}
	}
	if got, want := e.Image("requests-proxy", "proxy"), e.Repo("api")+":prod@"+d0; got != want {
		t.Errorf("requests-proxy on %s, want %s", got, want)
	}
}

func TestTick_V1_ANotationSignatureCountsOnlyFromTheTrustStoresCA(t *testing.T) {
	e := newEnv(t)
	trusted := testsign.NewNotary()
	cfg := e.Config(`verification:
  - name: notary
    repositories: ["{{reg}}/acme/**"]
    notation:
      certificates: [` + trusted.WriteRoot(t, t.TempDir()) + `]
` + e2e.SeedShape)
	d0 := e.Seed()
	ref, err := name.NewDigest(e.Repo("api")+"@"+d0, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	testsign.NewOtherNotary().Sign(t, ref, ref)
	code, logs := e.Tick(cfg)
	if code != 1 || len(e2e.LogLines(logs, "WARN", d0, "verification policy notary", "notation signature", "untrusted")) == 0 {
		t.Fatalf("signed by another CA: exit %d, want 1 with a WARN naming %s, the policy and why:\n%s", code, d0, logs)
	}
	trusted.Sign(t, ref, ref)
	for i := range 2 {
		if code, logs := e.Tick(cfg); code != 0 {
			t.Fatalf("tick %d with a trusted Notation signature: exit %d:\n%s", i+1, code, logs)
		}
	}
	if got, want := e.Image("jobs-manager", "api"), e.Repo("api")+":prod@"+d0; got != want {
		t.Errorf("jobs-manager on %s, want %s", got, want)
	}
}

// V5 through tick and status: a policy that requires a vulnerability scan
// without criticals holds a signed push whose signed scan has criticals,
// naming the predicate type and the condition, and rolls it out once a
// passing scan is attested.
func TestTick_V5_ASignedPushWhoseScanFailsIsHeldUntilAPassingScanIsAttested(t *testing.T) {
	e := newEnv(t)
	s := newSigning(e)
	const condition = "predicate.scanner.result.summary.critical == 0"
	cfg := s.e.Config(`verification:
  - name: release
    repositories: ["{{reg}}/acme/**"]
    cosign:
      publicKeys: [` + s.key.File + `]
    attestations:
      - predicateType: ` + testsign.VulnPredicate + `
        conditions: ['` + condition + `']
` + e2e.SeedShape)
	scan := func(critical int) map[string]any {
		return map[string]any{"scanner": map[string]any{"uri": "pkg:github/aquasecurity/trivy", "result": map[string]any{"summary": map[string]any{"critical": critical}}}}
	}
	onTag := e.Repo("api") + ":prod"
	d0 := e.Seed()
	s.key.SignBundle(t, s.ref(d0))
	s.key.Attest(t, s.ref(d0), testsign.VulnPredicate, scan(0))
	for i := range 2 {
		if code, logs := e.Tick(cfg); code != 0 {
			t.Fatalf("tick %d over a signed, scanned digest: exit %d, want 0:\n%s", i+1, code, logs)
		}
	}
	if got, want := e.Image("jobs-manager", "api"), onTag+"@"+d0; got != want {
		t.Fatalf("the scanned first digest: %s, want %s", got, want)
	}

	d1 := e.Push("api", "prod")
	s.key.SignBundle(t, s.ref(d1))
	s.key.Attest(t, s.ref(d1), testsign.VulnPredicate, scan(2))
	code, logs := e.Tick(cfg)
	if code != 1 {
		t.Errorf("tick over a push whose scan fails: exit %d, want 1", code)
	}
	if len(e2e.LogLines(logs, "WARN", d1, "verification policy release", testsign.VulnPredicate, "condition-failed", condition)) == 0 {
		t.Errorf("no WARN line naming %s, the predicate type and the failed condition:\n%s", d1, logs)
	}
	if fix := "attest " + e.Repo("api") + "@" + d1 + " with " + testsign.VulnPredicate; !strings.Contains(logs, fix) {
		t.Errorf("the remediation does not say %q:\n%s", fix, logs)
	}
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := e.Image(w[0], w[1]); got != onTag+"@"+d0 {
			t.Errorf("%s/%s moved to %s, want it held on %s", w[0], w[1], got, d0)
		}
	}
	if r := e2e.Row(e.Status(cfg), "jobs-manager", "api"); r == nil || r["state"] != "unverified" || !strings.Contains(r["message"].(string), testsign.VulnPredicate) {
		t.Errorf("status row %v, want unverified naming %s", r, testsign.VulnPredicate)
	}
	if ev := e.Events("jobs-manager"); !e2e.HasEvent(ev, "DigestUnverified", d1) {
		t.Errorf("no DigestUnverified Event naming %s: %v", d1, ev)
	}

	// A passing scan attested (a rescan with a fixed database): rolled out.
	s.key.Attest(t, s.ref(d1), testsign.VulnPredicate, scan(0))
	if code, logs := e.Tick(cfg); code != 0 {
		t.Fatalf("tick after a passing scan: exit %d, want 0:\n%s", code, logs)
	}
	if got, want := e.Image("requests-proxy", "proxy"), onTag+"@"+d1; got != want {
		t.Errorf("after the passing scan: %s, want %s", got, want)
	}
}
