// Package crosscluster tests P2 end to end: two local clusters (the test
// binary's, and one the test starts) that share one registry on loopback
// and nothing else. Staging runs in the first, prod in the second; the
// only evidence that crosses is the promotion attestation in the
// registry.
package crosscluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/verify"
	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/localcluster"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
	"github.com/image-refresh/image-refresh/test/support/testsign"
)

func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }

const gate = "lb.acme.example/target-healthy"

// secondCluster starts a local cluster of the test's own, stopped when
// the test ends.
func secondCluster(t *testing.T) *localcluster.Cluster {
	t.Helper()
	bin, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	runDir, err := os.MkdirTemp("", "image-refresh-second-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := localcluster.Start(ctx, localcluster.Options{BinDir: bin, RunDir: runDir, Log: os.Stderr})
	if err != nil {
		t.Fatalf("start the second cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop the second cluster: %v", err)
		}
		if !t.Failed() {
			_ = os.RemoveAll(runDir)
		}
	})
	return c
}

// gated is a Deployment of one pod whose readiness a gate owner sets, as
// a load balancer would: the pods of a crashing build never become Ready.
func gated(e *e2e.Env, name, tag string) *e2e.GateOwner {
	e.T.Helper()
	testenv.Deployment(e.T, e.C.Client, e.NS, name, testenv.WithContainer("web", tag), testenv.WithReplicas(1),
		testenv.WithReadinessGate(gate), testenv.WithMinReadySeconds(1))
	g := e.StartGateOwner(name, gate)
	e.Settle("Deployment", name)
	return g
}

// keyPair writes an ECDSA P-256 key pair (PKCS#8 PEM, as `openssl
// genpkey` writes it) into dir.
func keyPair(t *testing.T, dir, prefix string) (keyFile, pubFile string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKCS8PrivateKey(k)
	pub, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
	keyFile, pubFile = filepath.Join(dir, prefix+".key"), filepath.Join(dir, prefix+".pub")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
		t.Fatal(err)
	}
	return keyFile, pubFile
}

// row is the status row of deploy's container web in env e, whatever the
// exit code (a held digest that needs a human exits 1).
func row(t *testing.T, e *e2e.Env, cfg, deploy string) map[string]any {
	t.Helper()
	_, out, errOut := e.Run("status", "--config", cfg, "--kubeconfig", e.Kubeconfig, "-o", "json")
	var rows []map[string]any
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("status -o json: %v\n%s\n%s", err, out, errOut)
	}
	r := e2e.Row(rows, deploy, "web")
	if r == nil {
		t.Fatalf("no status row of %s in %s", deploy, out)
	}
	return r
}

func TestTick_P2_AcrossTwoClustersOnlyABuildStagingSoakedAndAttestedReachesProd(t *testing.T) {
	a := e2e.New(t) // staging's cluster, the binary's
	clock := e2e.NewClock(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	a.Clock = clock
	second := secondCluster(t)
	b := &e2e.Env{T: t, C: second, Reg: a.Reg, NS: testenv.Namespace(t, second.Client), Kubeconfig: second.Kubeconfig, Prefix: a.Prefix, Clock: clock}

	dir := t.TempDir()
	key, pub := keyPair(t, dir, "staging")
	first := a.Push("web", "prod")
	tag := a.Repo("web") + ":prod"
	staging := gated(a, "staging", tag)
	gated(b, "prod", tag)

	stagingGroup := strings.Replace(e2e.OneGroup("staging", "web", "staging", "web"),
		"    anchor:", "    onFailedRollout: rollback\n    promotion: {publish: {soak: 30m}}\n    anchor:", 1)
	cfgA := a.Config("rolloutTimeout: 3m\ninstallation: staging\npromotionSigning: {keyFile: " + key + "}\ngroups:\n" + stagingGroup)
	cfgB := b.Config("groups:\n" + e2e.OneGroup("prod", "web", "prod", "web") +
		"    promotion: {attestedBy: {name: staging, cosign: {publicKeys: [" + pub + "]}}, soak: 10m}\n")
	a.PinAll(cfgA)
	b.PinAll(cfgB)
	for _, x := range []struct {
		e      *e2e.Env
		deploy string
	}{{a, "staging"}, {b, "prod"}} {
		if got := x.e.Image(x.deploy, "web"); got != tag+"@"+first {
			t.Fatalf("setup: %s on %s, want %s", x.deploy, got, first)
		}
	}

	// A good build: staging moves; prod, in the other cluster, waits for
	// staging's attestation.
	good := a.Push("web", "prod")
	if code, logs := a.Tick(cfgA); code != 0 || a.Image("staging", "web") != tag+"@"+good {
		t.Fatalf("staging's tick: exit %d, staging on %s, want %s:\n%s", code, a.Image("staging", "web"), good, logs)
	}
	if code, logs := b.Tick(cfgB); code != 0 || b.Image("prod", "web") != tag+"@"+first {
		t.Fatalf("prod's tick: exit %d, prod on %s, want it held on %s:\n%s", code, b.Image("prod", "web"), first, logs)
	}
	if r := row(t, b, cfgB, "prod"); r["state"] != "waiting" || !strings.Contains(r["message"].(string), "carries no promotion attestation from staging yet") {
		t.Errorf("prod's row %v, want waiting for staging's attestation", r)
	}
	// Staging soaks it: the clock starts, and nothing is published
	// before the soak's end.
	a.Tick(cfgA)
	if got, want := a.Annotations("staging")[a.Key("soak-web")], good+" 2026-12-07T12:00:00Z 0"; got != want {
		t.Fatalf("staging's soak clock %q, want %q", got, want)
	}
	clock.Add(30*time.Minute - time.Second)
	a.Tick(cfgA)
	if v := a.Annotations("staging")[a.Key("published-web")]; v != "" {
		t.Fatalf("published %q a second before the soak's end", v)
	}
	clock.Add(time.Second)
	code, logs := a.Tick(cfgA)
	if got, want := a.Annotations("staging")[a.Key("published-web")], good+" 2026-12-07T12:30:00Z"; code != 0 || got != want {
		t.Fatalf("at the soak's end: exit %d, published %q, want %q:\n%s", code, got, want, logs)
	}
	if !e2e.HasEvent(a.Events("staging"), "PromotionPublished", good) {
		t.Errorf("no PromotionPublished Event on staging's anchor: %v", a.Events("staging"))
	}
	// Published once: a later pass publishes nothing more.
	subject, err := name.NewDigest(tag[:strings.LastIndex(tag, ":")]+"@"+good, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Minute)
	a.Tick(cfgA)
	if n := referrers(t, subject); n != 1 {
		t.Errorf("%d referrers of %s after another pass, want the one attestation", n, good)
	}

	// Prod sees it, waits its own 10 minutes after the attestation's
	// time, then moves.
	b.Tick(cfgB)
	if r := row(t, b, cfgB, "prod"); r["state"] != "waiting" || !strings.Contains(r["message"].(string), "staging attested") || !strings.Contains(r["message"].(string), "in 9m0s") {
		t.Errorf("prod's row %v, want waiting 9m more after staging's attestation", r)
	}
	if got := b.Image("prod", "web"); got != tag+"@"+first {
		t.Fatalf("prod on %s before its soak, want %s", got, first)
	}
	clock.Add(9 * time.Minute)
	if code, logs := b.Tick(cfgB); code != 0 || b.Image("prod", "web") != tag+"@"+good {
		t.Fatalf("prod after its soak: exit %d, on %s, want %s:\n%s", code, b.Image("prod", "web"), good, logs)
	}

	// A build that crashes in staging is rolled back there (V2) and
	// never attested: prod stays on the good one.
	bad := a.Push("web", "prod")
	staging.Fail(bad)
	a.StartCrashLoop("staging", bad, 1)
	a.Tick(cfgA)
	if got := a.Image("staging", "web"); got != tag+"@"+good {
		t.Fatalf("staging runs %s after the crash, want it rolled back to %s", got, good)
	}
	if rb := a.Annotations("staging")[a.Key("rolled-back-web")]; !strings.HasPrefix(rb, bad+" ") {
		t.Fatalf("staging's rolled-back note %q, want %s", rb, bad)
	}
	for range 2 {
		clock.Add(time.Hour)
		a.Tick(cfgA)
		b.Tick(cfgB)
		if got := b.Image("prod", "web"); got != tag+"@"+good {
			t.Fatalf("prod moved to %s, want it held on %s: staging rolled %s back", got, good, bad)
		}
	}
	if r := row(t, b, cfgB, "prod"); r["state"] != "waiting" || !strings.Contains(r["message"].(string), bad) || !strings.Contains(r["message"].(string), "no promotion attestation from staging") {
		t.Errorf("prod's row %v, want waiting on %s for staging's attestation", r, bad)
	}

	// Evidence that is not staging's never counts: a build attested with
	// another key, and one carrying the good build's attestation copied
	// from it, are held as unverified, the reason naming why.
	otherKey, _ := keyPair(t, dir, "mallory")
	for _, tc := range []struct {
		name, reason string
		attach       func(d name.Digest)
	}{
		{"another key", "wrong-key", func(d name.Digest) {
			publishAs(t, otherKey, d, "staging")
		}},
		{"another digest's attestation", "bound-to-another-digest", func(d name.Digest) {
			b := promoter(t, key).Bundle
			data, err := b(subject, verify.PromotionPredicate{Installation: "staging", Group: "staging", Image: "web", Soak: "30m0s", Time: clock.Now()})
			if err != nil {
				t.Fatal(err)
			}
			testsign.AttachBundle(t, d, data, config.PromotionPredicateType)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			digest := a.Push("web", "prod")
			d, err := name.NewDigest(tag[:strings.LastIndex(tag, ":")]+"@"+digest, name.Insecure)
			if err != nil {
				t.Fatal(err)
			}
			tc.attach(d)
			clock.Add(time.Hour)
			b.Tick(cfgB)
			if got := b.Image("prod", "web"); got != tag+"@"+good {
				t.Fatalf("prod moved to %s (%s), want it held on %s", got, tc.name, good)
			}
			r := row(t, b, cfgB, "prod")
			if msg, _ := r["message"].(string); r["state"] != "unverified" || !strings.Contains(msg, digest) || !strings.Contains(msg, tc.reason) {
				t.Errorf("prod's row %v, want unverified naming %s and %s", r, digest, tc.reason)
			}
		})
	}
}

func promoter(t *testing.T, keyFile string) *verify.Promoter {
	t.Helper()
	data, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	p, err := verify.NewPromoter(&config.PromotionSigning{KeyFile: keyFile, Key: data})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// publishAs publishes a promotion attestation of d signed with keyFile,
// naming installation.
func publishAs(t *testing.T, keyFile string, d name.Digest, installation string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pred := verify.PromotionPredicate{Installation: installation, Group: "staging", Image: "web", Soak: "30m0s", Time: time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)}
	if _, err := promoter(t, keyFile).Publish(ctx, d, pred); err != nil {
		t.Fatal(err)
	}
}

// referrers counts d's referrers.
func referrers(t *testing.T, d name.Digest) int {
	t.Helper()
	idx, err := remote.Referrers(d)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	return len(m.Manifests)
}

// A publication the registry refuses (no push rights) is a WARN, an Event
// and a metric, holds nothing (staging keeps its build, the tick exits
// 0), records nothing, and is tried again: the next pass after the
// registry accepts it publishes it, once.
func TestTick_P2_APublicationTheRegistryRefusesIsReportedAndTriedAgain(t *testing.T) {
	a := e2e.New(t)
	a.Clock = e2e.NewClock(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	key, _ := keyPair(t, t.TempDir(), "staging")
	a.Push("web", "prod")
	tag := a.Repo("web") + ":prod"
	gated(a, "staging", tag)
	cfg := a.Config("installation: staging\npromotionSigning: {keyFile: " + key + "}\ngroups:\n" +
		strings.Replace(e2e.OneGroup("staging", "web", "staging", "web"), "    anchor:", "    promotion: {publish: {soak: 0s}}\n    anchor:", 1))
	a.PinAll(cfg)
	good := a.Push("web", "prod")
	a.Tick(cfg) // moves staging to good
	if got := a.Image("staging", "web"); got != tag+"@"+good {
		t.Fatalf("staging on %s, want %s", got, good)
	}

	// The next pass soaks it (0s) and publishes: the registry refuses the
	// attestation's manifest.
	a.Reg.SetFault(testregistry.Fault{Method: "PUT", Status: 403})
	metrics := filepath.Join(t.TempDir(), "metrics.prom")
	code, logs := a.Tick(cfg, "--metrics-file", metrics)
	if code != 0 || a.Image("staging", "web") != tag+"@"+good {
		t.Fatalf("tick with the push refused: exit %d, staging on %s; want 0 and %s (a publication never holds the group):\n%s", code, a.Image("staging", "web"), good, logs)
	}
	if a.Reg.Count("PUT", "/manifests/sha256:") == 0 {
		t.Fatalf("no attestation was pushed: the publication did not run:\n%s", logs)
	}
	if len(e2e.LogLines(logs, "WARN", "its promotion attestation could not be published", good, "tried again in 1m0s")) != 1 {
		t.Errorf("want one WARN saying the publication of %s failed and is tried again:\n%s", good, logs)
	}
	if !e2e.HasEvent(a.Events("staging"), "PromotionPublishFailed", "push rights") {
		t.Errorf("no PromotionPublishFailed Event naming the fix: %v", a.Events("staging"))
	}
	prom, err := os.ReadFile(metrics)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`image_refresh_group_needs_attention{group="staging",reason="PromotionPublishFailed"} 1`,
		`image_refresh_promotion_publishes_total{group="staging",image="web",result="failed"} 1`} {
		if !strings.Contains(string(prom), want) {
			t.Errorf("the metrics file lacks %s", want)
		}
	}
	if v := a.Annotations("staging")[a.Key("published-web")]; v != "" {
		t.Fatalf("a refused publication was recorded: %q", v)
	}

	// The registry accepts it again: the next tick publishes, once.
	a.Reg.ClearFault()
	a.Clock.Add(time.Minute)
	code, logs = a.Tick(cfg)
	if got, want := a.Annotations("staging")[a.Key("published-web")], good+" 2026-12-07T12:01:00Z"; code != 0 || got != want {
		t.Fatalf("after the fault: exit %d, published %q, want %q:\n%s", code, got, want, logs)
	}
	a.Tick(cfg)
	d, err := name.NewDigest(a.Repo("web")+"@"+good, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if n := referrers(t, d); n != 1 {
		t.Errorf("%d referrers of %s, want the one attestation", n, good)
	}
}

// In `run`, the leader publishes when its soak ends, on a timer of its
// own (no event, no poll, no resync starts that pass); a follower whose
// new digest carries the signer's attestation (soak 0s) moves on its
// next pass.
func TestRun_P2_TheLeaderPublishesWhenItsSoakEndsAndTheFollowerMovesOnIt(t *testing.T) {
	a := e2e.New(t)
	a.Clock = e2e.NewClock(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	key, pub := keyPair(t, t.TempDir(), "staging")
	first := a.Push("web", "prod")
	tag := a.Repo("web") + ":prod"
	gated(a, "staging", tag)
	cfg := a.Config("installation: staging\npromotionSigning: {keyFile: " + key + "}\ngroups:\n" +
		strings.Replace(e2e.OneGroup("staging", "web", "staging", "web"), "    anchor:", "    promotion: {publish: {soak: 2s}}\n    anchor:", 1))
	a.PinAll(cfg)
	good := a.Push("web", "prod")

	ctl := a.StartRun(cfg, "--poll-interval", "1h")
	ctl.WaitReady(t)
	a.UntilDeployments(60*time.Second, "staging soaks the new build", func() bool {
		return strings.HasPrefix(a.Annotations("staging")[a.Key("soak-web")], good+" 2026-12-07T12:00:00Z")
	})
	if v := a.Annotations("staging")[a.Key("published-web")]; v != "" {
		t.Fatalf("published %q before the soak's end", v)
	}
	a.Clock.Add(3 * time.Second)
	a.UntilDeployments(60*time.Second, "staging publishes at the soak's end", func() bool {
		return strings.HasPrefix(a.Annotations("staging")[a.Key("published-web")], good+" ")
	})

	// A follower (here on the same cluster, as another installation
	// would be) whose new digest carries staging's attestation moves on
	// its first pass.
	testenv.Deployment(t, a.C.Client, a.NS, "prod", testenv.WithContainer("web", tag+"@"+first), testenv.WithReplicas(1))
	a.Settle("Deployment", "prod")
	follower := a.Config("groups:\n" + e2e.OneGroup("prod", "web", "prod", "web") +
		"    promotion: {attestedBy: {name: staging, cosign: {publicKeys: [" + pub + "]}}}\n")
	prodAnchor := map[string]*string{a.Key("last-refreshed-web-digest"): e2e.Ptr(first)}
	a.Annotate("prod", prodAnchor)
	if code, logs := a.Tick(follower); code != 0 || a.Image("prod", "web") != tag+"@"+good {
		t.Fatalf("the follower's tick: exit %d, prod on %s, want %s:\n%s", code, a.Image("prod", "web"), good, logs)
	}
}

// P2 in `run`: a follower whose new digest carries no attestation yet
// waits, looks again every --promotion-recheck, and moves on the pass
// after the signer published one; no watch event or poll answer changes
// in between (the tag stays on the same digest), so only the recheck can
// move it.
func TestRun_P2_AFollowerLooksAgainForTheAttestationAndMovesOnceItIsPublished(t *testing.T) {
	e := e2e.New(t)
	key, pub := keyPair(t, t.TempDir(), "staging")
	first := e.Push("web", "prod")
	tag := e.Repo("web") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "prod", testenv.WithContainer("web", tag+"@"+first), testenv.WithReplicas(1))
	e.Settle("Deployment", "prod")
	e.Annotate("prod", map[string]*string{e.Key("last-refreshed-web-digest"): e2e.Ptr(first)})
	good := e.Push("web", "prod")
	cfg := e.Config("groups:\n" + e2e.OneGroup("prod", "web", "prod", "web") +
		"    promotion: {attestedBy: {name: staging, cosign: {publicKeys: [" + pub + "]}}}\n")

	ctl := e.StartRun(cfg, "--poll-interval", "1h", "--promotion-recheck", "1s")
	ctl.WaitReady(t)
	waiting := "carries no promotion attestation from staging yet"
	ctl.UntilLogged(t, "the follower waits for staging's attestation", func(logs string) bool { return strings.Contains(logs, waiting) })
	if got := e.Image("prod", "web"); got != tag+"@"+first {
		t.Fatalf("before any attestation prod runs %s, want %s", got, tag+"@"+first)
	}
	// It looks again: a second lookup (a second waiting line) proves the
	// recheck runs without any event.
	ctl.UntilLogged(t, "the follower looks again", func(logs string) bool { return strings.Count(logs, waiting) >= 2 })

	d, err := name.NewDigest(tag+"@"+good, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	publishAs(t, key, d, "staging")
	ctl.Eventually(t, 60*time.Second, "prod moves to the attested build", func() bool { return e.Image("prod", "web") == tag+"@"+good })
	if !strings.Contains(ctl.Logs(), "promotion attestation verified") {
		t.Fatalf("prod moved, but no log line says the attestation verified:\n%s", ctl.Logs())
	}
}
