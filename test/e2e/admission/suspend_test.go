package admission

import (
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

// O1 at admission and in render: a suspended group's targets are left
// as sent (suspend and resume, test/e2e/tick).

// O1 at admission: while the group is suspended the webhook stores a
// re-render as sent (and says so); resumed, the same write is pinned.
func TestWebhook_O1_ASuspendedGroupIsNotPinnedAtAdmission(t *testing.T) {
	e := newEnv(t)
	digest, cfg := e.Pinned()
	tag, pinned := e.Repo("api")+":prod", e.Repo("api")+":prod@"+digest
	e.WhLabel("jobs-manager", "requests-proxy")
	ctl := e.whStart(cfg, "--poll-interval", "1h")
	if code, _, stderr := e.SuspendCmd(cfg, "suspend", "--group", "control-plane", "--reason", "hotfix by hand"); code != 0 {
		t.Fatalf("suspend: exit %d\n%s", code, stderr)
	}
	// The webhook reads the anchor from the manager's cache: wait for the
	// cache to hold the suspension (a dry-run write comes back unpinned,
	// and the webhook says why).
	testwait.Eventually(t, 30*time.Second, "the webhook sees the suspension", func() bool {
		d, err := e.WhTry("helm", "requests-proxy", map[string]string{"proxy": tag}, true)
		return err == nil && e2e.WhImages(d)["proxy"] == tag
	})
	stored := e.WhWrite("helm", "requests-proxy", map[string]string{"proxy": tag})
	if got := e2e.WhImages(stored)["proxy"]; got != tag {
		t.Errorf("helm's write while suspended was stored as %s, want it as sent: %s", got, tag)
	}
	// At least two writes were admitted while suspended (the dry run that
	// came back unpinned and helm's): one INFO line for the suspension,
	// not one per write.
	if n := len(e2e.LogLines(ctl.Logs(), "INFO", "admission: group suspended, left as sent (docs/states/suspended.md)", "hotfix by hand")); n != 1 {
		t.Errorf("%d INFO lines saying the webhook left a write as sent because the group is suspended, want 1:\n%s", n, ctl.Logs())
	}
	if code, _, stderr := e.SuspendCmd(cfg, "resume", "--group", "control-plane"); code != 0 {
		t.Fatalf("resume: exit %d\n%s", code, stderr)
	}
	testwait.Eventually(t, 30*time.Second, "the webhook pins again once resumed", func() bool {
		d, err := e.WhTry("helm", "requests-proxy", map[string]string{"proxy": tag}, true)
		return err == nil && e2e.WhImages(d)["proxy"] == pinned
	})
}

// O1 in render: a suspended group's images are left as rendered, with a
// note saying who suspended it and why; resumed, they are pinned.
func TestRender_O1_ASuspendedGroupIsLeftAsRendered(t *testing.T) {
	e := newEnv(t)
	digest := e.Seed()
	cfg := e.Config(renderConfig)
	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("tick exit %d", code)
	}
	if code, _, stderr := e.SuspendCmd(cfg, "suspend", "--group", "control-plane", "--reason", "INC-9"); code != 0 {
		t.Fatalf("suspend: exit %d\n%s", code, stderr)
	}
	in := e.SeedManifests()
	code, out, logs, _ := e.Render(in, "--config", cfg, "--kubeconfig", e.Kubeconfig, "--namespace", e.NS)
	if code != 0 || out != in {
		t.Errorf("render of a suspended group: exit %d, output changed=%v, want 0 and the stream as rendered:\n%s", code, out != in, logs)
	}
	if n := len(e2e.LogLines(logs, "INFO", "left as rendered: group control-plane is suspended by image-refresh-suspend until resumed: INC-9 (docs/states/suspended.md)")); n != 2 {
		t.Errorf("%d notes naming the suspension, want 2 (one per target):\n%s", n, logs)
	}
	if code, _, stderr := e.SuspendCmd(cfg, "resume", "--group", "control-plane"); code != 0 {
		t.Fatalf("resume: exit %d\n%s", code, stderr)
	}
	code, out, logs, _ = e.Render(in, "--config", cfg, "--kubeconfig", e.Kubeconfig, "--namespace", e.NS)
	if want := e.pinnedSeedManifests(digest); code != 0 || out != want {
		t.Errorf("render after resume: exit %d, not pinned:\n%s", code, logs)
	}
}
