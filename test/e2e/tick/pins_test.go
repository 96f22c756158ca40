package tick

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/test/support/distribution"
	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// V4: every tick checks, with one HEAD by digest, that the registry still
// holds the digest the targets are pinned to (and, with onFailedRollout:
// rollback, the one a failed rollout retreats to). Only a 404 is gone.

// digestHeads counts the manifest HEADs by digest d since the last reset.
func (e *env) digestHeads(d string) int {
	return e.Reg.Count(http.MethodHead, "/v2/acme/api/manifests/"+d)
}

// pinRows are the states of the seed's two targets.
func (e *env) pinRows(cfg string) (jobs, proxy map[string]any) {
	rows := e.Status(cfg)
	return e2e.Row(rows, "jobs-manager", "api"), e2e.Row(rows, "requests-proxy", "proxy")
}

func TestTick_V4_APinnedDigestDeletedAfterTheTagMovedOnIsPinMissing(t *testing.T) {
	e := newEnv(t)
	old, _ := e.Pinned()
	// The tag moves on and the new build waits (minDigestAge): the targets
	// stay pinned to old, now untagged, which a retention rule deletes.
	cfg := e.Config("minDigestAge: 1h\n" + e2e.SeedShape)
	next := e.Push("api", "prod")
	if code, _ := e.Tick(cfg); code != 0 {
		t.Fatalf("tick with the new build waiting: exit %d, want 0 (the old digest is still there)", code)
	}
	e.Reg.MustDeleteManifest(t, "acme/api", old)

	metricsFile := filepath.Join(t.TempDir(), "metrics.prom")
	e.Reg.ResetRequests()
	code, logs := e.Tick(cfg, "--metrics-file", metricsFile)
	if code != 1 {
		t.Errorf("tick exit %d, want 1: a pinned digest the registry lost needs a human", code)
	}
	if n := e.digestHeads(old); n != 1 {
		t.Errorf("%d HEADs of %s in the tick, want 1 for its two targets", n, old)
	}
	if n := e.digestHeads(next); n != 0 {
		t.Errorf("%d HEADs of %s in the tick, want 0: no target is pinned to the waiting build", n, next)
	}
	if len(e2e.LogLines(logs, "ERROR", "the registry no longer holds "+e.Repo("api")+"@"+old, "jobs-manager", "requests-proxy",
		"a new pod, a reschedule or a scale-up cannot pull it", "retention rule", "publish a build under "+e.Repo("api")+":prod")) != 1 {
		t.Errorf("want one ERROR line naming the digest, both targets, what fails and the fix")
	}
	if !e2e.HasEvent(e.Events("jobs-manager"), "PinMissing", old) {
		t.Errorf("no PinMissing Event on the anchor naming %s: %v", old, e.Events("jobs-manager"))
	}
	prom, err := os.ReadFile(metricsFile)
	if err != nil {
		t.Fatal(err)
	}
	if want := `image_refresh_group_needs_attention{group="control-plane",reason="PinMissing"} 1`; !strings.Contains(string(prom), want) {
		t.Errorf("the metrics file lacks %s", want)
	}
	jobs, proxy := e.pinRows(cfg)
	for name, row := range map[string]map[string]any{"jobs-manager": jobs, "requests-proxy": proxy} {
		if row["state"] != "pin-missing" || !strings.Contains(row["message"].(string), old) {
			t.Errorf("%s: state %v (%v), want pin-missing naming %s", name, row["state"], row["message"], old)
		}
	}
	if got, want := e.Image("jobs-manager", "api"), e.Repo("api")+":prod@"+old; got != want {
		t.Errorf("jobs-manager runs %s, want it left on %s", got, want)
	}

	// Publishing the build (here: its wait ends) pins it; the lost digest
	// is no longer pinned, no longer checked, and nothing is missing.
	now := e.Config(e2e.SeedShape)
	if code, _ := e.Tick(now); code != 0 {
		t.Fatalf("tick rolling the new build: exit %d, want 0", code)
	}
	e.Reg.ResetRequests()
	if code, logs := e.Tick(now); code != 0 || strings.Contains(logs, "no longer holds") {
		t.Errorf("tick on the new pin: exit %d, want 0 and no pin-missing", code)
	}
	if n, m := e.digestHeads(old), e.digestHeads(next); n != 0 || m != 1 {
		t.Errorf("HEADs by digest: %d of the lost one, %d of the new pin; want 0 and 1", n, m)
	}
}

func TestTick_V4_ADeletedDigestNoOnePinsIsIgnoredAndEachTickChecksThePinOnce(t *testing.T) {
	e := newEnv(t)
	older := e.Push("api", "prod") // an earlier build, never pinned
	pinned, cfg := e.Pinned()
	e.Reg.MustDeleteManifest(t, "acme/api", older)
	for i := range 3 {
		e.Reg.ResetRequests()
		code, logs := e.Tick(cfg)
		if code != 0 || strings.Contains(logs, "no longer holds") {
			t.Errorf("tick %d: exit %d, want 0 and nothing missing: no target is pinned to %s", i+1, code, older)
		}
		if n := e.digestHeads(older); n != 0 {
			t.Errorf("tick %d: %d HEADs of %s, want 0 (a digest no one pins is not checked)", i+1, n, older)
		}
		if n := e.digestHeads(pinned); n != 1 {
			t.Errorf("tick %d: %d HEADs of the pinned %s, want 1 (once per digest per tick, two targets)", i+1, n, pinned)
		}
	}
	jobs, proxy := e.pinRows(cfg)
	if jobs["state"] != "pinned" || proxy["state"] != "pinned" {
		t.Errorf("states %v, %v; want pinned, pinned", jobs["state"], proxy["state"])
	}
}

// V4, R1: a registry that cannot tell (a 5xx, a 401) is no verdict but a
// read failure: a WARN per check, and maxReadFailures (3) checks in a row
// an ERROR that needs a human; a check it answers ends the streak.
func TestTick_V4_ARegistryThatCannotTellIsNotMissingButAReadFailure(t *testing.T) {
	e := newEnv(t)
	pinned, _ := e.Pinned()
	cfg := e.Config("maxReadFailures: 3\n" + e2e.SeedShape)
	streak := e.Key("pin-check-failure-streak-api")
	for i, status := range []int{http.StatusInternalServerError, http.StatusServiceUnavailable, http.StatusUnauthorized} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			e := &env{e.WithT(t)}
			// Only the check by digest fails; the tag resolves.
			e.Reg.SetFault(testregistry.Fault{PathContains: "/manifests/" + pinned, Method: http.MethodHead, Status: status})
			defer e.Reg.ClearFault()
			e.Reg.ResetRequests()
			code, logs := e.Tick(cfg)
			if n := e.digestHeads(pinned); n != 1 {
				t.Fatalf("%d HEADs of the pinned digest, want 1: the check ran", n)
			}
			wantCode, level := 0, "WARN"
			if i == 2 {
				wantCode, level = 1, "ERROR"
			}
			if code != wantCode || strings.Contains(logs, "no longer holds") {
				t.Errorf("check %d: tick exit %d, want %d and no pin-missing: HTTP %d is no verdict", i+1, code, wantCode, status)
			}
			if len(e2e.LogLines(logs, level, "cannot tell whether the registry still holds "+e.Repo("api")+"@"+pinned, "not taken as missing", fmt.Sprintf("failure %d of 3 in a row", i+1))) != 1 {
				t.Errorf("want one %s saying the pin could not be checked, failure %d of 3:\n%s", level, i+1, logs)
			}
			if got := e.Annotations("jobs-manager")[streak]; got != strconv.Itoa(i+1) {
				t.Errorf("streak %q, want %d", got, i+1)
			}
			if e2e.HasEvent(e.Events("jobs-manager"), "PinMissing", "") {
				t.Errorf("a PinMissing Event after HTTP %d", status)
			}
		})
	}
	if code, logs := e.Tick(cfg); code != 0 {
		t.Fatalf("tick with the registry answering again: exit %d:\n%s", code, logs)
	}
	if got, ok := e.Annotations("jobs-manager")[streak]; ok {
		t.Errorf("streak %q after a check the registry answered, want none", got)
	}
}

func TestTick_V4_ALostRollbackTargetSaysTheRollbackCannotRetreat(t *testing.T) {
	e := newEnv(t)
	pinned, _ := e.Pinned()
	cfg := e.Config(strings.Replace(e2e.SeedShape, "    anchor:", "    onFailedRollout: rollback\n    anchor:", 1))
	e.Reg.MustDeleteManifest(t, "acme/api", pinned)
	code, logs := e.Tick(cfg)
	if code != 1 {
		t.Errorf("tick exit %d, want 1", code)
	}
	if len(e2e.LogLines(logs, "ERROR", "the registry no longer holds", pinned, "the rollback cannot retreat to it")) != 1 {
		t.Errorf("want one ERROR line saying the rollback cannot retreat to %s", pinned)
	}
	jobs, _ := e.pinRows(cfg)
	if jobs["state"] != "pin-missing" || !strings.Contains(jobs["message"].(string), "cannot retreat") {
		t.Errorf("jobs-manager: %v (%v), want pin-missing saying the rollback cannot retreat", jobs["state"], jobs["message"])
	}
}

// distDigestHeads counts image-refresh's manifest HEADs of acme/api by
// digest d that Distribution answered with status, from its access log.
func distDigestHeads(d *e2e.DistEnv, digest, status string) int {
	n := 0
	for _, l := range strings.Split(d.Dist.Log(), "\n") {
		if strings.Contains(l, `"HEAD /v2/acme/api/manifests/`+digest+` HTTP/`) && strings.Contains(l, `" `+status+` `) && strings.Contains(l, `"image-refresh/`) {
			n++
		}
	}
	return n
}

func TestTick_V4_DistributionAPinnedDigestDeletedByTheRegistryIsPinMissing(t *testing.T) {
	d := e2e.NewDistEnv(t)
	old := d.SeedDist(distribution.Password)
	d.PinDist(d.DistConfig(true), old)
	// The tag moves on, the new build waits (minDigestAge), and the
	// registry deletes the untagged manifest the targets are pinned to.
	cfg := d.Config("  - host: " + d.Dist.Host + "\n    caFile: " + d.Dist.CAFile + "\nminDigestAge: 1h\n" +
		strings.ReplaceAll(e2e.SeedShape, "{{reg}}", d.Dist.Host))
	d.Dist.MustPushRandomImage(t, "acme/api", "prod")
	if code, _ := d.Tick(cfg); code != 0 {
		t.Fatalf("tick with the new build waiting: exit %d, want 0", code)
	}
	if n := distDigestHeads(d, old, "200"); n != 1 {
		t.Errorf("%d HEADs of the pinned digest answered 200, want 1 (one tick, two targets)", n)
	}
	d.Dist.MustDeleteManifest(t, "acme/api", old)
	code, logs := d.Tick(cfg)
	if code != 1 {
		t.Errorf("tick exit %d, want 1", code)
	}
	if n := distDigestHeads(d, old, "404"); n != 1 {
		t.Errorf("%d HEADs of the deleted digest answered 404, want 1", n)
	}
	if len(e2e.LogLines(logs, "ERROR", "the registry no longer holds "+d.Repo()+"@"+old, "a new pod, a reschedule or a scale-up")) != 1 {
		t.Errorf("want one ERROR line naming %s", old)
	}
	if !e2e.HasEvent(d.Events("jobs-manager"), "PinMissing", old) {
		t.Errorf("no PinMissing Event naming %s", old)
	}
	d.AssertNoLeakAnywhere(logs)
}
