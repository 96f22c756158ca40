package tick

import (
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/test/support/e2e"
)

func TestTick_R5_FirstObservationRecordsThenNextTickPins(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	before := e.Rollouts("jobs-manager")

	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("first tick exit %d, want 0", code)
	}
	if got := e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")]; got != digest {
		t.Fatalf("first observation recorded %q, want %q", got, digest)
	}
	if n := e.Rollouts("jobs-manager"); n != before {
		t.Fatalf("first observation rolled the workload (%d -> %d ReplicaSets)", before, n)
	}

	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("second tick exit %d, want 0", code)
	}
	want := e.Repo("api") + ":prod@" + digest
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := e.Image(w[0], w[1]); got != want {
			t.Errorf("%s/%s runs %s after the second tick, want %s", w[0], w[1], got, want)
		}
	}
	if a := e.Annotations("jobs-manager"); a[e.Key("refresh-attempt")] != "" {
		t.Errorf("attempt counter left at %q after a settled rollout", a[e.Key("refresh-attempt")])
	}
}

func TestTick_R7_RevertByHelmIsRepinnedInOneRollout(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.Tick(cfg)
	e.Tick(cfg) // pinned
	pinned := e.Repo("api") + ":prod@" + digest
	if got := e.Image("jobs-manager", "api"); got != pinned {
		t.Fatalf("setup: not pinned: %s", got)
	}

	// helm upgrade re-renders the tag.
	e.SetImageAs("helm", "Deployment", "jobs-manager", "api", e.Repo("api")+":prod")
	before := e.Rollouts("jobs-manager")

	code, logs := e.Tick(cfg)
	if code != 0 {
		t.Fatalf("tick exit %d, want 0", code)
	}
	if got := e.Image("jobs-manager", "api"); got != pinned {
		t.Fatalf("after the revert the tick left %s, want %s", got, pinned)
	}
	// The pinned template's ReplicaSet already exists (from the first pin),
	// so the re-pin adds none; count rollouts by the template instead.
	if n := e.Rollouts("jobs-manager"); n != before {
		t.Errorf("re-pin created %d new ReplicaSets, want 0 (it reuses the pinned template's)", n-before)
	}
	if a := e.Annotations("jobs-manager"); a[e.Key("refresh-attempt")] != "" {
		t.Errorf("attempt counter %q not cleared after the settled re-pin", a[e.Key("refresh-attempt")])
	}
	if !strings.Contains(logs, "fresh install, or a re-render reverted the pin") {
		t.Errorf("revert not logged neutrally:\n%s", logs)
	}
	if ev := e.Events("jobs-manager"); !e2e.HasEvent(ev, "Repinned", "helm") {
		t.Errorf("no Repinned event naming helm as the writer; events: %q", ev)
	}
}

func TestTick_R9_EveryTargetOnDigestWritesNothing(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.Tick(cfg)
	e.Tick(cfg)
	rvs := map[string]string{}
	for _, n := range []string{"jobs-manager", "requests-proxy"} {
		rvs[n] = e.Deployment(n).ResourceVersion
	}
	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("steady-state tick exit %d", code)
	}
	for n, rv := range rvs {
		if got := e.Deployment(n).ResourceVersion; got != rv {
			t.Errorf("%s was written in steady state (resourceVersion %s -> %s)", n, rv, got)
		}
	}
}

func TestTick_R8_OnlyTheTargetOffTheDigestIsRepinned(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.Tick(cfg)
	e.Tick(cfg)
	e.SetImageAs("helm", "Deployment", "requests-proxy", "proxy", e.Repo("api")+":prod")
	apiTemplate := e.Deployment("jobs-manager").Spec.Template.Spec.Containers[0].Image
	apiRollouts := e.Rollouts("jobs-manager")

	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("tick exit %d", code)
	}
	if got := e.Image("requests-proxy", "proxy"); got != e.Repo("api")+":prod@"+digest {
		t.Errorf("proxy not re-pinned: %s", got)
	}
	// The anchor carries bookkeeping writes (attempt set and cleared), but its
	// pod template must not change.
	if got := e.Image("jobs-manager", "api"); got != apiTemplate || e.Rollouts("jobs-manager") != apiRollouts {
		t.Errorf("api target touched although on the digest: %s -> %s", apiTemplate, got)
	}
}

func TestTick_R7_MirrorPrefixRewriteIsNotARevert(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.Tick(cfg)
	e.Tick(cfg)
	// A mirror webhook rewrote the registry prefix, keeping the digest.
	e.SetImageAs("mirror-webhook", "Deployment", "requests-proxy", "proxy", "mirror.local/acme/api@"+digest)
	rv := e.Deployment("requests-proxy").ResourceVersion
	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("tick exit %d", code)
	}
	if got := e.Deployment("requests-proxy").ResourceVersion; got != rv {
		t.Errorf("a prefix-only rewrite was treated as a revert (resourceVersion %s -> %s)", rv, got)
	}
}

func TestTick_R6_DigestChangeReimagesEveryTargetAndRecordsAfterSettle(t *testing.T) {
	e := newEnv(t)
	e.Seed()
	cfg := e.Config(e2e.SeedShape)
	e.Tick(cfg)
	e.Tick(cfg)
	next := e.Push("api", "prod")
	code, _ := e.Tick(cfg)
	if code != 0 {
		t.Fatalf("tick exit %d", code)
	}
	want := e.Repo("api") + ":prod@" + next
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := e.Image(w[0], w[1]); got != want {
			t.Errorf("%s/%s on %s after a digest change, want %s", w[0], w[1], got, want)
		}
	}
	if got := e.Annotations("jobs-manager")[e.Key("last-refreshed-api-digest")]; got != next {
		t.Errorf("record %q after a settled rollout, want %q", got, next)
	}
	if !e2e.HasEvent(e.Events("requests-proxy"), "DigestChanged", next) {
		t.Errorf("no DigestChanged event on the re-imaged workload: %q", e.Events("requests-proxy"))
	}
}
