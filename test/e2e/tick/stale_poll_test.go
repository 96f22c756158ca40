package tick

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/image-refresh/image-refresh/internal/cli"
	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/pass"
	"github.com/image-refresh/image-refresh/internal/poller"
	"github.com/image-refresh/image-refresh/internal/refresh"
	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// R1, C3: the controller's poller asks once per interval, so once a tick
// (or another instance) has rolled and recorded a newer digest, the
// poller's answer is older than the tag, and the GET that verifies a digest
// before it is recorded serves the newer manifest. That is a stale HEAD,
// not a registry that disagrees with itself: the pass asks again, and
// neither reports an inconsistent digest nor rolls the group back. The pass
// is `run`'s own (its Runner and its poller, wired as run.go wires them),
// driven once so that nothing else decides which path it takes.
func TestRun_R1_C3_AStalePollAnswerIsAskedAgainBeforeItIsCalledInconsistent(t *testing.T) {
	e := newEnv(t)
	first := e.Push("web", "prod")
	tag := e.Repo("web") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "web", testenv.WithContainer("web", tag), testenv.WithReplicas(1))
	e.Settle("Deployment", "web")
	cfgPath := e.Config(e2e.CfWebGroup)
	e.PinAll(cfgPath)
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	r, err := cli.NewRunner(cfgPath, e.Kubeconfig, cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	p := &poller.Poller{Interval: time.Hour, Resolve: func(ctx context.Context, img config.Image) (string, error) {
		return r.Resolver.Latest(ctx, img.Repository, img.Tag, r.KeychainFor(ctx, img))
	}}
	ctx := context.Background()
	g, img := cfg.Groups[0], cfg.Groups[0].Images[0]
	p.Add(img) // as the controller adds a group's images
	if res := p.Refresh(ctx, img); res.Err != nil || res.Digest != first {
		t.Fatalf("the poller's first answer %+v, want %s", res, first)
	}

	next := e.Push("web", "prod") // the poller, asking hourly, has not seen it
	if code, out := e.Tick(cfgPath); code != 0 || e.Image("web", "web") != tag+"@"+next {
		t.Fatalf("the tick did not roll the new digest: exit %d, web %s\n%s", code, e.Image("web", "web"), out)
	}
	if stale := p.Latest(ctx, img, func() authn.Keychain { return nil }); stale.Digest != first {
		t.Fatalf("precondition: the poller's answer is %s, want the stale %s", stale.Digest, first)
	}

	plan := r.Group(ctx, g, p, pass.GroupOptions{})
	t.Logf("the pass:\n%s", logs.String())
	for _, f := range plan.Findings {
		if f.Severity == refresh.SeverityWarn || f.Severity == refresh.SeverityError || strings.Contains(f.Message, "inconsistent") {
			t.Errorf("finding %s: %s", f.Severity, f.Message)
		}
	}
	if got := e.Image("web", "web"); got != tag+"@"+next {
		t.Errorf("web runs %s after the pass, want %s: rolled back to the stale answer", got, tag+"@"+next)
	}
	if got := e.StateOf("web")[e.Key("last-refreshed-web-digest")]; got != next {
		t.Errorf("record %q, want %s", got, next)
	}
	if !strings.Contains(logs.String(), "the registry's answer changed since the last poll; verifying the new one") {
		t.Errorf("the pass did not ask the registry again:\n%s", logs.String())
	}
	if now := p.Latest(ctx, img, func() authn.Keychain { return nil }); now.Digest != next {
		t.Errorf("the poller keeps %s, want the fresh answer %s", now.Digest, next)
	}
}

// R1: in `run`, a pass runs on every watch event and reads the poller's
// last answer, which stays the same failure until the poller asks again
// (its backoff). The read-failure streak counts failed asks of the
// registry, as a tick's would: passes that re-read one failed answer do
// not count it again, and do not write the anchor. The next failed ask
// counts. The passes are `run`'s own Runner and poller, wired as run.go
// wires them, against the registry answering 503.
func TestRun_R1_TheResolveFailureStreakCountsFailedAsksNotPasses(t *testing.T) {
	e := newEnv(t)
	e.Push("web", "prod")
	tag := e.Repo("web") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "web", testenv.WithContainer("web", tag), testenv.WithReplicas(1))
	e.Settle("Deployment", "web")
	cfgPath := e.Config(e2e.CfWebGroup)
	e.PinAll(cfgPath)
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	r, err := cli.NewRunner(cfgPath, e.Kubeconfig, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	p := &poller.Poller{Interval: time.Hour, Resolve: func(ctx context.Context, img config.Image) (string, error) {
		return r.Resolver.Latest(ctx, img.Repository, img.Tag, r.KeychainFor(ctx, img))
	}}
	ctx := context.Background()
	g, img := cfg.Groups[0], cfg.Groups[0].Images[0]
	p.Add(img) // as the controller adds a group's images
	streak := e.Key("resolve-failure-streak-web")
	e.Reg.SetFault(testregistry.Fault{Status: http.StatusServiceUnavailable})
	defer e.Reg.ClearFault()

	if res := p.Refresh(ctx, img); res.Err == nil {
		t.Fatalf("precondition: the poller's ask succeeded under a 503 fault: %+v", res)
	}
	groupPass := func(want string, counts bool) {
		t.Helper()
		plan := r.Group(ctx, g, p, pass.GroupOptions{NoWait: true})
		ran := false
		for _, f := range plan.Findings {
			ran = ran || strings.Contains(f.Message, "failure "+want+" of")
		}
		if !ran {
			t.Fatalf("the pass did not report failure %s: %+v", want, plan.Findings)
		}
		if got := e.StateOf("web")[streak]; got != want {
			t.Fatalf("streak %q after the pass, want %q", got, want)
		}
		if _, wrote := plan.Bookkeeping.Set[streak]; wrote != counts {
			t.Fatalf("the pass wrote the streak: %v, want %v", wrote, counts)
		}
	}
	groupPass("1", true)
	for range 3 {
		groupPass("1", false) // the same failed ask, read again
	}
	if res := p.Refresh(ctx, img); res.Err == nil {
		t.Fatalf("the second ask succeeded under a 503 fault: %+v", res)
	}
	groupPass("2", true)
	groupPass("2", false)
}
