package cli

import (
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/internal/testenv"
)

// seedShape is the seed's control plane: jobs-manager (anchor, container
// api) and requests-proxy (container proxy) on one image.
const seedShape = `groups:
  - name: control-plane
    anchor: {kind: Deployment, namespace: {{ns}}, name: jobs-manager}
    images:
      - name: api
        repository: {{reg}}/acme/api
        tag: prod
        targets:
          - {kind: Deployment, namespace: {{ns}}, name: jobs-manager, container: api}
          - {kind: Deployment, namespace: {{ns}}, name: requests-proxy, container: proxy}
`

// seed creates the seed's two Deployments on repo:prod and returns the
// registry's digest for it.
func (e *env) seed() string {
	e.t.Helper()
	digest := e.push("api", "prod")
	tag := e.repo("api") + ":prod"
	testenv.Deployment(e.t, e.c.Client, e.ns, "jobs-manager", testenv.WithContainer("api", tag), testenv.WithRecreate())
	testenv.Deployment(e.t, e.c.Client, e.ns, "requests-proxy", testenv.WithContainer("proxy", tag))
	e.settle("Deployment", "jobs-manager")
	e.settle("Deployment", "requests-proxy")
	return digest
}

func TestTick_R5_FirstObservationRecordsThenNextTickPins(t *testing.T) {
	e := newEnv(t)
	digest := e.seed()
	cfg := e.config(seedShape)
	before := e.rollouts("jobs-manager")

	if code, _ := e.tick(cfg); code != 0 {
		t.Fatalf("first tick exit %d, want 0", code)
	}
	if got := e.annotations("jobs-manager")[e.key("last-refreshed-api-digest")]; got != digest {
		t.Fatalf("first observation recorded %q, want %q", got, digest)
	}
	if n := e.rollouts("jobs-manager"); n != before {
		t.Fatalf("first observation rolled the workload (%d -> %d ReplicaSets)", before, n)
	}

	if code, _ := e.tick(cfg); code != 0 {
		t.Fatalf("second tick exit %d, want 0", code)
	}
	want := e.repo("api") + ":prod@" + digest
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := e.image(w[0], w[1]); got != want {
			t.Errorf("%s/%s runs %s after the second tick, want %s", w[0], w[1], got, want)
		}
	}
	if a := e.annotations("jobs-manager"); a[e.key("refresh-attempt")] != "" {
		t.Errorf("attempt counter left at %q after a settled rollout", a[e.key("refresh-attempt")])
	}
}

func TestTick_R7_RevertByHelmIsRepinnedInOneRollout(t *testing.T) {
	e := newEnv(t)
	digest := e.seed()
	cfg := e.config(seedShape)
	e.tick(cfg)
	e.tick(cfg) // pinned
	pinned := e.repo("api") + ":prod@" + digest
	if got := e.image("jobs-manager", "api"); got != pinned {
		t.Fatalf("setup: not pinned: %s", got)
	}

	// helm upgrade re-renders the tag.
	e.setImageAs("helm", "Deployment", "jobs-manager", "api", e.repo("api")+":prod")
	before := e.rollouts("jobs-manager")

	code, logs := e.tick(cfg)
	if code != 0 {
		t.Fatalf("tick exit %d, want 0", code)
	}
	if got := e.image("jobs-manager", "api"); got != pinned {
		t.Fatalf("after the revert the tick left %s, want %s", got, pinned)
	}
	// The pinned template's ReplicaSet already exists (from the first pin),
	// so the re-pin adds none; count rollouts by the template instead.
	if n := e.rollouts("jobs-manager"); n != before {
		t.Errorf("re-pin created %d new ReplicaSets, want 0 (it reuses the pinned template's)", n-before)
	}
	if a := e.annotations("jobs-manager"); a[e.key("refresh-attempt")] != "" {
		t.Errorf("attempt counter %q not cleared after the settled re-pin", a[e.key("refresh-attempt")])
	}
	if !strings.Contains(logs, "fresh install, or a re-render reverted the pin") {
		t.Errorf("revert not logged neutrally:\n%s", logs)
	}
	if ev := e.events("jobs-manager"); !hasEvent(ev, "Repinned", "helm") {
		t.Errorf("no Repinned event naming helm as the writer; events: %q", ev)
	}
}

func TestTick_R9_EveryTargetOnDigestWritesNothing(t *testing.T) {
	e := newEnv(t)
	e.seed()
	cfg := e.config(seedShape)
	e.tick(cfg)
	e.tick(cfg)
	rvs := map[string]string{}
	for _, n := range []string{"jobs-manager", "requests-proxy"} {
		rvs[n] = e.deployment(n).ResourceVersion
	}
	if code, _ := e.tick(cfg); code != 0 {
		t.Fatalf("steady-state tick exit %d", code)
	}
	for n, rv := range rvs {
		if got := e.deployment(n).ResourceVersion; got != rv {
			t.Errorf("%s was written in steady state (resourceVersion %s -> %s)", n, rv, got)
		}
	}
}

func TestTick_R8_OnlyTheTargetOffTheDigestIsRepinned(t *testing.T) {
	e := newEnv(t)
	digest := e.seed()
	cfg := e.config(seedShape)
	e.tick(cfg)
	e.tick(cfg)
	e.setImageAs("helm", "Deployment", "requests-proxy", "proxy", e.repo("api")+":prod")
	apiTemplate := e.deployment("jobs-manager").Spec.Template.Spec.Containers[0].Image
	apiRollouts := e.rollouts("jobs-manager")

	if code, _ := e.tick(cfg); code != 0 {
		t.Fatalf("tick exit %d", code)
	}
	if got := e.image("requests-proxy", "proxy"); got != e.repo("api")+":prod@"+digest {
		t.Errorf("proxy not re-pinned: %s", got)
	}
	// The anchor carries bookkeeping writes (attempt set and cleared), but its
	// pod template must not change.
	if got := e.image("jobs-manager", "api"); got != apiTemplate || e.rollouts("jobs-manager") != apiRollouts {
		t.Errorf("api target touched although on the digest: %s -> %s", apiTemplate, got)
	}
}

func TestTick_R7_MirrorPrefixRewriteIsNotARevert(t *testing.T) {
	e := newEnv(t)
	digest := e.seed()
	cfg := e.config(seedShape)
	e.tick(cfg)
	e.tick(cfg)
	// A mirror webhook rewrote the registry prefix, keeping the digest.
	e.setImageAs("mirror-webhook", "Deployment", "requests-proxy", "proxy", "mirror.local/acme/api@"+digest)
	rv := e.deployment("requests-proxy").ResourceVersion
	if code, _ := e.tick(cfg); code != 0 {
		t.Fatalf("tick exit %d", code)
	}
	if got := e.deployment("requests-proxy").ResourceVersion; got != rv {
		t.Errorf("a prefix-only rewrite was treated as a revert (resourceVersion %s -> %s)", rv, got)
	}
}

func TestTick_R6_DigestChangeReimagesEveryTargetAndRecordsAfterSettle(t *testing.T) {
	e := newEnv(t)
	e.seed()
	cfg := e.config(seedShape)
	e.tick(cfg)
	e.tick(cfg)
	next := e.push("api", "prod")
	code, _ := e.tick(cfg)
	if code != 0 {
		t.Fatalf("tick exit %d", code)
	}
	want := e.repo("api") + ":prod@" + next
	for _, w := range [][2]string{{"jobs-manager", "api"}, {"requests-proxy", "proxy"}} {
		if got := e.image(w[0], w[1]); got != want {
			t.Errorf("%s/%s on %s after a digest change, want %s", w[0], w[1], got, want)
		}
	}
	if got := e.annotations("jobs-manager")[e.key("last-refreshed-api-digest")]; got != next {
		t.Errorf("record %q after a settled rollout, want %q", got, next)
	}
	if !hasEvent(e.events("requests-proxy"), "DigestChanged", next) {
		t.Errorf("no DigestChanged event on the re-imaged workload: %q", e.events("requests-proxy"))
	}
}
