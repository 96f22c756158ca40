package tick

import (
	"context"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// A CronJob is a target kind by one entry of internal/workload's kind
// table plus its settledness rule (no rollout: settled once the write is
// stored). The group below has only the CronJob, as anchor and target, so
// every path runs on it: the state annotations, the pin under
// spec.jobTemplate, the digest change, the revert seen by `run`'s watch.
var cronGroup = e2e.Groups(e2e.GroupOf("nightly", "CronJob", "nightly",
	e2e.ImageOf("job", "job", "prod", e2e.Target("CronJob", "nightly", "job"))))

// cronImage is the image of container of CronJob name.
func (e *env) cronImage(name, container string) string {
	e.T.Helper()
	cj, err := e.C.Client.BatchV1().CronJobs(e.NS).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	for _, c := range cj.Spec.JobTemplate.Spec.Template.Spec.Containers {
		if c.Name == container {
			return c.Image
		}
	}
	e.T.Fatalf("CronJob %s has no container %s", name, container)
	return ""
}

func (e *env) cronAnnotations(name string) map[string]string {
	e.T.Helper()
	cj, err := e.C.Client.BatchV1().CronJobs(e.NS).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	return cj.Annotations
}

func TestTick_R5_R6_CronJobTargetIsPinnedAndFollowsItsTag(t *testing.T) {
	e := newEnv(t)
	first := e.Push("job", "prod")
	tag := e.Repo("job") + ":prod"
	testenv.CronJob(t, e.C.Client, e.NS, "nightly", testenv.WithContainer("job", tag), testenv.WithContainer("sidecar", "example.invalid/side:v1"))
	cfg := e.Config(cronGroup)

	e.PinAll(cfg)
	if got := e.cronImage("nightly", "job"); got != tag+"@"+first {
		t.Fatalf("after the first ticks the CronJob runs %s, want %s@%s", got, tag, first)
	}
	if got := e.cronAnnotations("nightly")[e.Key("last-refreshed-job-digest")]; got != first {
		t.Errorf("record on the CronJob anchor = %q, want %s", got, first)
	}

	next := e.Push("job", "prod")
	code, logs := e.Tick(cfg)
	if code != 0 {
		t.Fatalf("tick after the tag moved: exit %d\n%s", code, logs)
	}
	if got := e.cronImage("nightly", "job"); got != tag+"@"+next {
		t.Errorf("after the tag moved the CronJob runs %s, want %s@%s", got, tag, next)
	}
	if got := e.cronImage("nightly", "sidecar"); got != "example.invalid/side:v1" {
		t.Errorf("the other container changed: %s (R16)", got)
	}
	ann := e.cronAnnotations("nightly")
	if got := ann[e.Key("last-refreshed-job-digest")]; got != next {
		t.Errorf("record = %q, want %s: a CronJob is settled once its write is stored (R4, R6)", got, next)
	}
	if _, has := ann[e.Key("refresh-attempt")]; has {
		t.Errorf("attempt left on the anchor after a settled change: %v", ann)
	}
	if strings.Contains(logs, "not settled") {
		t.Errorf("a CronJob was reported as not settled:\n%s", logs)
	}
}

func TestRun_C1_ARevertOfACronJobIsRepinnedFromTheWatch(t *testing.T) {
	e := newEnv(t)
	first := e.Push("job", "prod")
	tag := e.Repo("job") + ":prod"
	testenv.CronJob(t, e.C.Client, e.NS, "nightly", testenv.WithContainer("job", tag))
	cfg := e.Config(cronGroup)
	e.PinAll(cfg)
	pinned := tag + "@" + first

	ctl := e.StartRun(cfg, "--poll-interval", "1h")
	ctl.WaitReady(t)
	ctl.WaitPasses(t, "nightly", 0, 1)
	e.WriteImageAs("helm", "CronJob", "nightly", "job", tag)
	took := e.UntilWorkload("CronJob", "nightly", 30*time.Second, "the CronJob's revert re-pinned", func() bool { return e.cronImage("nightly", "job") == pinned })
	t.Logf("CronJob revert re-pinned %s after the write", took.Round(time.Millisecond))
	e.UntilEvents(30*time.Second, "Repinned event naming helm on the CronJob", func() bool {
		return e2e.HasEvent(e.Events("nightly"), "Repinned", "helm")
	})
}

// Events in `run` go through the manager's events.k8s.io recorder, which
// folds a repeat into an EventSeries: a group that stays locked out is
// reported on every pass (log), but its Event is written once, plus once
// when the repeat starts a series, and then not again on every pass
// (client-go's recorder refreshes a series every 30 minutes).
func TestRun_R15_ALockedOutGroupDoesNotWriteAnEventOnEveryPass(t *testing.T) {
	e := newEnv(t)
	first := e.Push("web", "prod")
	tag := e.Repo("web") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "web", testenv.WithContainer("web", tag), testenv.WithReplicas(1))
	e.Settle("Deployment", "web")
	cfg := e.Config("groups:\n" + e2e.OneGroup("locked", "web", "web", "web"))
	e.PinAll(cfg)
	if got := e.Image("web", "web"); got != tag+"@"+first {
		t.Fatalf("setup: web runs %s", got)
	}
	e.Annotate("web", map[string]*string{e.Key("refresh-attempt"): e2e.Ptr("3")})

	ctl := e.StartRun(cfg, "--poll-interval", "1s", "--poll-jitter", "0")
	ctl.WaitReady(t)
	e.UntilEvents(60*time.Second, "a RefreshLockedOut Event", func() bool {
		return e2e.HasEvent(e.Events("web"), "RefreshLockedOut", "rearm")
	})
	// The second report starts the series (one patch); wait past it.
	from := ctl.WaitPasses(t, "locked", 0, 3)
	e.UntilEvents(30*time.Second, "the series of the repeated Event", func() bool {
		for _, ev := range e.lockoutEvents() {
			if ev.Series != nil && ev.Series.Count >= 2 {
				return true
			}
		}
		return false
	})
	before := e.lockoutEvents()
	reports := strings.Count(ctl.Logs(), "LOCKED OUT")
	ctl.WaitPasses(t, "locked", from, 4)
	// The passes reported the lockout again: the recorder was called.
	if now := strings.Count(ctl.Logs(), "LOCKED OUT"); now <= reports {
		t.Fatalf("the lockout was not reported again in 4 passes: the check below would prove nothing")
	}
	after := e.lockoutEvents()
	if len(before) != 1 || len(after) != 1 {
		t.Fatalf("RefreshLockedOut Events: %d, then %d; want exactly one", len(before), len(after))
	}
	if before[0].Name != after[0].Name || before[0].ResourceVersion != after[0].ResourceVersion {
		t.Errorf("the Event was written again by later passes: %s rv %s -> %s rv %s",
			before[0].Name, before[0].ResourceVersion, after[0].Name, after[0].ResourceVersion)
	}
}

// lockoutEvents are the RefreshLockedOut Events of the namespace, through
// the events.k8s.io API the controller records with.
func (e *env) lockoutEvents() []eventsv1.Event {
	e.T.Helper()
	list, err := e.C.Client.EventsV1().Events(e.NS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	var out []eventsv1.Event
	for _, ev := range list.Items {
		if ev.Reason == "RefreshLockedOut" {
			out = append(out, ev)
		}
	}
	return out
}
