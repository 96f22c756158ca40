package tick

import (
	"net/http"
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// R1: a registry whose HEAD of the tag names another digest than the
// content its GET serves is reported, never recorded nor pinned; once the
// registry agrees with itself, the next tick converges.
func TestTick_R1_AHeadThatDisagreesWithTheGetIsNeverPinned(t *testing.T) {
	e := newEnv(t)
	a, cfg := e.Pinned()
	b := e.Push("api", "prod")
	bogus := "sha256:" + strings.Repeat("0", 64)
	e.Reg.SetFault(testregistry.Fault{Method: http.MethodHead, DigestHeader: &bogus})
	rvs := e.ResourceVersions()

	code, logs := e.Tick(cfg)
	if code != 0 {
		t.Fatalf("tick exit %d, want 0 below the resolve-failure ceiling", code)
	}
	if len(e2e.LogLines(logs, "WARN", "inconsistent-digest", bogus, b, "not pinned")) == 0 {
		t.Errorf("no WARN naming the HEAD's and the GET's digests:\n%s", logs)
	}
	if strings.Contains(e.Image("jobs-manager", "api")+e.Image("requests-proxy", "proxy"), bogus) {
		t.Fatalf("the HEAD's unverified digest was pinned")
	}
	ann := e.Annotations("jobs-manager")
	if ann[e.Key("last-refreshed-api-digest")] != a || ann[e.Key("resolve-failure-streak-api")] != "1" {
		t.Errorf("record %q, streak %q; want the old record %s and streak 1", ann[e.Key("last-refreshed-api-digest")], ann[e.Key("resolve-failure-streak-api")], a)
	}
	for name, rv := range e.ResourceVersions() {
		if name != "jobs-manager" && rv != rvs[name] {
			t.Errorf("%s was written while the registry disagreed with itself", name)
		}
	}

	e.Reg.ClearFault()
	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("tick after the fix exit %d", code)
	}
	if got, want := e.Image("requests-proxy", "proxy"), e.Repo("api")+":prod@"+b; got != want {
		t.Errorf("after the fix requests-proxy on %s, want %s", got, want)
	}
	if _, ok := e.Annotations("jobs-manager")[e.Key("resolve-failure-streak-api")]; ok {
		t.Errorf("resolve-failure streak not cleared after the fix")
	}
}

// R1, R5: the first observation records only a verified digest.
func TestTick_R1_R5_FirstObservationRecordsOnlyAVerifiedDigest(t *testing.T) {
	e := newEnv(t)
	served := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	bogus := "sha256:" + strings.Repeat("1", 64)
	e.Reg.SetFault(testregistry.Fault{Method: http.MethodHead, DigestHeader: &bogus})
	if code, logs := e.Tick(cfg); code != 0 || len(e2e.LogLines(logs, "WARN", "inconsistent-digest")) == 0 {
		t.Fatalf("tick exit %d, want 0 with an inconsistent-digest WARN:\n%s", code, logs)
	}
	if rec, ok := e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")]; ok {
		t.Fatalf("recorded %q from a HEAD the GET contradicts", rec)
	}
	e.Reg.ClearFault()
	e.Tick(cfg)
	if rec := e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")]; rec != served {
		t.Errorf("record %q after the fix, want %s", rec, served)
	}
}
