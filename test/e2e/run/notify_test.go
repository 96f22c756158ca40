package run

// Push notifications end to end (issue 18, docs/notifications.md): the
// CNCF Distribution registry of the suite, configured with a
// notifications endpoint that points at `run --notify-port`, tells the
// controller about a push, and the controller re-pins the targets at once
// although its poll interval is an hour.

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/image-refresh/image-refresh/internal/cli"
	"github.com/image-refresh/image-refresh/test/support/distribution"
	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/freeport"
	"github.com/image-refresh/image-refresh/test/support/running"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

const notifyToken = "e2e-n0tify-s3cret-7c1d9b42"

// notifyHints reads image_refresh_notify_hints_total{sender,result} from
// the process-wide registry every `run` of this process serves.
func notifyHints(t *testing.T, sender, result string) int {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "image_refresh_notify_hints_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["sender"] == sender && l["result"] == result {
				return int(m.GetCounter().GetValue())
			}
		}
	}
	return 0
}

// waitImages watches the namespace's Deployments until every one named in
// want has a pod template whose container runs the wanted image, and
// returns how long that took.
func (e *env) waitImages(timeout time.Duration, want map[[2]string]string) time.Duration {
	e.T.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	list, err := e.C.Client.AppsV1().Deployments(e.NS).List(ctx, metav1.ListOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	done := map[string]bool{}
	check := func(d *appsv1.Deployment) {
		ok := true
		for k, img := range want {
			if k[0] != d.Name {
				continue
			}
			found := false
			for _, c := range d.Spec.Template.Spec.Containers {
				found = found || (c.Name == k[1] && c.Image == img)
			}
			ok = ok && found
		}
		done[d.Name] = ok
	}
	all := func() bool {
		for k := range want {
			if !done[k[0]] {
				return false
			}
		}
		return true
	}
	for i := range list.Items {
		check(&list.Items[i])
	}
	if all() {
		return 0
	}
	w, err := e.C.Client.AppsV1().Deployments(e.NS).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		e.T.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if d, ok := ev.Object.(*appsv1.Deployment); ok {
			check(d)
			if all() {
				return time.Since(start)
			}
		}
	}
	e.T.Fatalf("the Deployments did not reach %v within %s", want, timeout)
	return 0
}

func TestRun_Notify_R1_ADistributionPushRepinsTheTargetsAtOnceWithAnHourPollInterval(t *testing.T) {
	addr := freeport.MustAddr(t)
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	d := &e2e.DistEnv{Env: e.Env, Dist: distribution.StartT(t, &distribution.Endpoint{
		URL: "http://" + addr + "/distribution", Authorization: "Bearer " + notifyToken,
	})}
	first := d.SeedDist(distribution.Password)
	cfg := d.DistConfig(true)
	d.PinDist(cfg, first)
	tokenFile := filepath.Join(t.TempDir(), "notify-token")
	if err := os.WriteFile(tokenFile, []byte(notifyToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	accepted := notifyHints(t, "distribution", "accepted")
	heads := d.RegistryHeads("200")
	ctl := e.StartRun(cfg, "--poll-interval", "1h", "--poll-jitter", "0",
		"--notify-host", "127.0.0.1", "--notify-port", port, "--notify-token-file", tokenFile)
	ctl.WaitReady(t)
	ctl.WaitPasses(t, "control-plane", 0, 1)
	// Distribution retried the seed push's notification until `run`
	// listened: it is the first hint (the digest had not moved), and costs
	// one HEAD besides the poller's first.
	// A metric and Distribution's access log announce nothing: polled.
	testwait.Eventually(t, 30*time.Second, "the seed push's notification", func() bool {
		return notifyHints(t, "distribution", "accepted") == accepted+1
	})
	testwait.Eventually(t, 30*time.Second, "the first poll and the seed notification's ask", func() bool {
		return d.RegistryHeads("200") == heads+2
	})
	heads = d.RegistryHeads("200")

	next := d.Dist.MustPushRandomImage(t, "acme/api", "prod")
	pinned := d.Repo() + ":prod@" + next
	took := e.waitImages(30*time.Second, map[[2]string]string{
		{"jobs-manager", "api"}: pinned, {"requests-proxy", "proxy"}: pinned,
	})
	t.Logf("push → both targets re-pinned to the new digest: %s (poll interval 1h)", took.Round(time.Millisecond))

	if got := notifyHints(t, "distribution", "accepted") - accepted; got != 2 {
		t.Errorf("%d accepted notifications, want 2 (the seed push and this one)", got)
	}
	// The timer did not ask: after the push the registry saw the HEAD the
	// notification caused and the one the reconciler sends before it
	// re-images a target away from a digest it runs, and no other.
	if n := d.RegistryHeads("200") - heads; n != 2 {
		t.Errorf("%d HEADs of acme/api:prod after the push, want 2 (the notified one and the re-check before re-imaging)", n)
	}
	_, metrics := running.Get("http://" + ctl.Metrics + "/metrics")
	for what, text := range map[string]string{"logs": ctl.Logs(), "/metrics": metrics} {
		if strings.Contains(text, notifyToken) {
			t.Errorf("R20: the notification secret is in the controller's %s", what)
		}
	}
}

func TestRun_Notify_R20_TheSecretIsNeverAFlagAndAMissingOneIsExit2(t *testing.T) {
	e := &env{&e2e.Env{T: t}}
	t.Setenv(cli.NotifyTokenEnv, "")
	os.Unsetenv(cli.NotifyTokenEnv)
	cfg := filepath.Join(t.TempDir(), "config.yaml")

	code, _, logs := e.Run("run", "--config", cfg, "--notify-port", "9443")
	if code != cli.ExitInvalid || !strings.Contains(logs, "--notify-token-file") || !strings.Contains(logs, cli.NotifyTokenEnv) {
		t.Errorf("--notify-port without a secret: exit %d, want %d naming --notify-token-file and %s:\n%s", code, cli.ExitInvalid, cli.NotifyTokenEnv, logs)
	}
	if code, _, logs := e.Run("run", "--config", cfg, "--notify-port", "9443", "--notify-token", notifyToken); code != cli.ExitInvalid || strings.Contains(logs, "needs the shared secret") {
		t.Errorf("--notify-token: exit %d, want %d for an unknown flag:\n%s", code, cli.ExitInvalid, logs)
	}
	weak := "short-secret"
	t.Setenv(cli.NotifyTokenEnv, weak)
	code, _, logs = e.Run("run", "--config", cfg, "--notify-port", "9443")
	if code != cli.ExitInvalid || !strings.Contains(logs, cli.NotifyTokenEnv) || strings.Contains(logs, weak) {
		t.Errorf("a weak secret: exit %d, want %d naming %s and not the secret:\n%s", code, cli.ExitInvalid, cli.NotifyTokenEnv, logs)
	}
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(notifyToken), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(cli.NotifyTokenEnv, notifyToken)
	code, _, logs = e.Run("run", "--config", cfg, "--notify-port", "9443", "--notify-token-file", file)
	if code != cli.ExitInvalid || !strings.Contains(logs, "set twice") || strings.Contains(logs, notifyToken) {
		t.Errorf("two secrets: exit %d, want %d saying so without the secret:\n%s", code, cli.ExitInvalid, logs)
	}
}
