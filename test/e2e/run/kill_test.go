package run

// SIGKILL at each step of a tick (docs/reliability.md, "Process faults").
// A real `image-refresh tick` process talks to the kube-apiserver through
// killProxy, which holds one chosen request of the tick: when it arrives the
// test SIGKILLs the process, and the request is dropped, or it was forwarded
// on arrival and its answer goes nowhere (the write landed). Fresh tick processes must then
// converge with exactly the one rollout that was in flight and no lost
// digest record (R6, R10, R11, R13).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// killShape is one group on one image: the anchor Deployment web and the
// DaemonSet agent (on every node).
var killShape = e2e.Groups(e2e.GroupOf("fleet", "Deployment", "web",
	e2e.ImageOf("api", "api", "prod", e2e.Target("Deployment", "web", "app"), e2e.Target("DaemonSet", "agent", "agent"))))

// killRequest is one request the proxy saw.
type killRequest struct {
	Method, Path, ContentType, Body string
}

func (r killRequest) String() string {
	s := r.Method + " " + r.Path
	if r.Method == http.MethodPatch && strings.HasPrefix(r.ContentType, ctJSONPatch) {
		s += " (image)"
	}
	return s
}

// imagePatch reports whether r is an image write (R9: one JSON patch per
// workload) to the workload called name, or to any workload with name "".
func (r killRequest) imagePatch(name string) bool {
	return r.Method == http.MethodPatch && strings.HasPrefix(r.ContentType, ctJSONPatch) &&
		strings.Contains(r.Path, "/apis/apps/") && (name == "" || strings.HasSuffix(r.Path, "/"+name))
}

// annotationWrite reports whether r is an annotation write (a merge patch)
// whose body holds substr.
func (r killRequest) annotationWrite(substr string) bool {
	return r.Method == http.MethodPatch && strings.HasPrefix(r.ContentType, ctMergePatch) && strings.Contains(r.Body, substr)
}

// workloadRead reports whether r reads a workload.
func (r killRequest) workloadRead() bool {
	return r.Method == http.MethodGet && strings.Contains(r.Path, "/apis/apps/")
}

// heldRequest is a request the proxy holds until the test killed its
// client.
type heldRequest struct {
	req  killRequest
	code int // the API server's status code when forwarded; 0 when dropped
	// killed is closed by the test once the client is dead.
	killed chan struct{}
}

// killProxy is a TLS reverse proxy to the cluster's kube-apiserver, like
// apiProxy, that holds the first request a rule picks (before it reaches the
// API server) and hands it to the test.
type killProxy struct {
	srv        *httptest.Server
	kubeconfig string
	closing    chan struct{}
	held       chan *heldRequest

	mu      sync.Mutex
	log     []killRequest
	hold    func(before []killRequest, r killRequest) bool
	forward bool
	// onRecord runs before a digest-record write is forwarded.
	onRecord func(r killRequest)
}

func (e *env) newKillProxy() *killProxy {
	e.T.Helper()
	p := &killProxy{closing: make(chan struct{}), held: make(chan *heldRequest, 1)}
	p.srv, p.kubeconfig = e.StartAPIProxy("kubeconfig-kill-proxy", p.closing, p.serve)
	return p
}

// arm makes the proxy hold the first request for which hold is true; before
// is what the proxy saw since the last take. With forward the request goes
// to the API server at once (the write lands, as it would have) and only
// its answer is held (a request that did not land is answered, and the next
// one is held); otherwise it never reaches the API server.
func (p *killProxy) arm(hold func(before []killRequest, r killRequest) bool, forward bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold, p.forward = hold, forward
}

// take returns the requests seen since the last take and forgets them.
func (p *killProxy) take() []killRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.log
	p.log = nil
	return out
}

func (p *killProxy) seen() []killRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]killRequest(nil), p.log...)
}

func (p *killProxy) serve(w http.ResponseWriter, r *http.Request, rp *httputil.ReverseProxy) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	req := killRequest{Method: r.Method, Path: r.URL.Path, ContentType: r.Header.Get("Content-Type"), Body: string(body)}
	p.mu.Lock()
	before := p.log[:len(p.log):len(p.log)]
	p.log = append(p.log, req)
	rule, forward := p.hold, p.forward
	held := rule != nil && rule(before, req)
	if held {
		p.hold = nil
	}
	onRecord := p.onRecord
	p.mu.Unlock()

	if onRecord != nil && req.annotationWrite("/last-refreshed-") {
		onRecord(req)
	}
	if !held {
		rp.ServeHTTP(w, r)
		return
	}
	h := &heldRequest{req: req, killed: make(chan struct{})}
	if forward {
		// The write lands now; the client waits for an answer it never gets.
		rec := httptest.NewRecorder()
		rp.ServeHTTP(rec, r.WithContext(context.WithoutCancel(r.Context())))
		if rec.Code < 200 || rec.Code > 299 {
			// It did not land (say, a 409 on a stale resourceVersion, which
			// the client retries): answer it and wait for one that lands.
			p.mu.Lock()
			p.hold = rule
			p.mu.Unlock()
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
			return
		}
		h.code = rec.Code
	}
	select {
	case p.held <- h:
	case <-p.closing:
		panic(http.ErrAbortHandler)
	}
	select {
	case <-h.killed:
	case <-p.closing:
	}
	panic(http.ErrAbortHandler)
}

// tickProcess is one `image-refresh tick` process.
type tickProcess struct {
	cmd    *exec.Cmd
	logs   bytes.Buffer // stderr; read only after exited is closed
	exited chan struct{}
	err    error
}

func startTick(t *testing.T, bin, cfg, kubeconfig string) *tickProcess {
	t.Helper()
	tp := &tickProcess{exited: make(chan struct{})}
	tp.cmd = exec.Command(bin, "tick", "--config", cfg, "--kubeconfig", kubeconfig)
	tp.cmd.Stderr = &tp.logs
	if err := tp.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		tp.err = tp.cmd.Wait()
		close(tp.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-tp.exited:
		default:
			_ = tp.cmd.Process.Kill()
			<-tp.exited
		}
	})
	return tp
}

// wait returns the exit code (-1 when killed by a signal) and the logs.
func (tp *tickProcess) wait(t *testing.T, timeout time.Duration) (int, string) {
	t.Helper()
	select {
	case <-tp.exited:
	case <-time.After(timeout):
		_ = tp.cmd.Process.Kill()
		<-tp.exited
		t.Fatalf("tick still running after %s (R14: bounded):\n%s", timeout, tp.logs.String())
	}
	var ee *exec.ExitError
	if tp.err != nil && !errors.As(tp.err, &ee) {
		t.Fatalf("tick: %v", tp.err)
	}
	return tp.cmd.ProcessState.ExitCode(), tp.logs.String()
}

// expireHolder moves the time of the attempt holder on anchor back, so
// that until (when a tick said it leaves that holder's attempt alone up to)
// is a second before the holder's old time: the next tick finds it
// expired, with nothing else about the holder changed.
func (e *env) expireHolder(anchor string, until time.Time) {
	e.T.Helper()
	key := e.Key("refresh-attempt-holder")
	v, ok := e.Annotations(anchor)[key]
	h, err := state.ParseHolder(v, ok)
	if err != nil || !ok || until.Before(h.Since) {
		e.T.Fatalf("attempt holder %q (present %v, %v) left alone until %s", v, ok, err, until)
	}
	h.Since = h.Since.Add(-until.Sub(h.Since) - time.Second)
	e.Annotate(anchor, map[string]*string{key: e2e.Ptr(h.String())})
}

// raceEnabled reports whether this test binary was built with -race.
// leftAloneUntil reads, from a tick's log, until when it left another
// instance's fresh attempt on a settled group alone (heldElsewhere's WARN,
// "not finished yet": the 2 s write grace). An unsettled group is waited
// for by settling, not by the clock.
func leftAloneUntil(logs string) (time.Time, bool) {
	const marker = "until that instance ends the attempt or "
	i := strings.LastIndex(logs, marker)
	if i < 0 || !strings.Contains(logs[:i], "not finished yet") {
		return time.Time{}, false
	}
	rest := logs[i+len(marker):]
	j := strings.Index(rest, " passes")
	if j < 0 {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339, rest[:j])
	return t, err == nil
}

// rolledOut reports whether every replica of the Deployment runs its
// current pod template and is available, read from its ReplicaSets, which
// unlike observedGeneration do not lag an annotation write to the anchor.
// It runs on the proxy's goroutine, so it returns errors instead of failing.
func (e *env) rolledOut(ctx context.Context, name string) (bool, string, error) {
	d, err := e.C.Client.AppsV1().Deployments(e.NS).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, "", err
	}
	want := *d.Spec.Replicas
	image := d.Spec.Template.Spec.Containers[0].Image
	list, err := e.C.Client.AppsV1().ReplicaSets(e.NS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		return false, "", err
	}
	for _, rs := range list.Items {
		current := rs.Spec.Template.Spec.Containers[0].Image == image
		switch {
		case current && rs.Status.AvailableReplicas < want:
			return false, fmt.Sprintf("%s (current) has %d of %d replicas available", rs.Name, rs.Status.AvailableReplicas, want), nil
		case !current && rs.Status.Replicas > 0:
			return false, fmt.Sprintf("%s (old) still has %d replicas", rs.Name, rs.Status.Replicas), nil
		}
	}
	return true, "", nil
}

func errOrNil(err error) string {
	if err == nil {
		return ""
	}
	return " (" + err.Error() + ")"
}

// setMinReadySeconds sets a DaemonSet's minReadySeconds, as an operator
// would, and waits until the controller observed it.
func (e *env) setMinReadySeconds(ds string, seconds int) {
	e.T.Helper()
	patch := []byte(fmt.Sprintf(`{"spec":{"minReadySeconds":%d}}`, seconds))
	if _, err := e.C.Client.AppsV1().DaemonSets(e.NS).Patch(context.Background(), ds, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "kubectl"}); err != nil {
		e.T.Fatal(err)
	}
	e.Settle("DaemonSet", ds)
}

// revisions counts a DaemonSet's ControllerRevisions: one per pod template
// it ran, as ReplicaSets are for a Deployment.
func (e *env) revisions(ds string) int {
	e.T.Helper()
	list, err := e.C.Client.AppsV1().ControllerRevisions(e.NS).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + ds})
	if err != nil {
		e.T.Fatal(err)
	}
	return len(list.Items)
}

// killStep is one point of a tick at which its process is SIGKILLed.
type killStep struct {
	name string
	// hold picks the request the tick is killed at; before is every request
	// of the tick before it.
	hold func(before []killRequest, r killRequest) bool
	// forward: the held request reached the API server (the write landed)
	// and its answer never came; otherwise it is dropped.
	forward bool
	// slowRollout makes the DaemonSet's rollout take seconds (each new pod
	// counts as available only after minReadySeconds), so that the process
	// is killed while it is surely not settled.
	slowRollout bool

	// The cluster right after the kill.
	recordAdvanced   bool   // the record write was sent after the settle
	attempt          string // refresh-attempt; "" absent
	webNew, agentNew bool   // the workload runs the new digest

	// The converging ticks.
	reimage []string // workloads they write an image to
	saw     string   // a log line they print ("" for none in particular)
}

func TestKill_R10_R11_SIGKILLAtEachStepOfATickConvergesWithoutAnExtraRollout(t *testing.T) {
	bin := e2e.BuildImageRefresh(t)
	e := newEnv(t)
	attemptKey, recordKey := e.Key("refresh-attempt"), e.Key("last-refreshed-api-digest")
	first := e.Push("api", "prod")
	tag := e.Repo("api") + ":prod"
	testenv.Deployment(t, e.C.Client, e.NS, "web", testenv.WithContainer("app", tag))
	testenv.DaemonSet(t, e.C.Client, e.NS, "agent", testenv.WithTolerateAll(), testenv.WithContainer("agent", tag))
	e.Settle("Deployment", "web")
	e.Settle("DaemonSet", "agent")
	// Seven digest changes in a row: the flapping-tag bound is off.
	cfg := e.Config("apiTimeout: 5s\nrolloutTimeout: 45s\ndigestChangeWindow: 0s\n" + killShape)
	e.PinAll(cfg)
	e.Settle("DaemonSet", "agent")
	if got, want := e.DaemonSetImage("agent"), tag+"@"+first; got != want {
		t.Fatalf("setup: agent runs %s, want %s", got, want)
	}
	p := e.newKillProxy()

	// afterLast returns the requests after the last one that matches.
	afterLast := func(reqs []killRequest, match func(killRequest) bool) ([]killRequest, bool) {
		for i := len(reqs) - 1; i >= 0; i-- {
			if match(reqs[i]) {
				return reqs[i+1:], true
			}
		}
		return nil, false
	}
	isAgentImagePatch := func(r killRequest) bool { return r.imagePatch("agent") }

	steps := []killStep{{
		name:    "after the attempt write, at the first image patch (dropped)",
		hold:    func(_ []killRequest, r killRequest) bool { return r.imagePatch("") },
		attempt: "1",
		reimage: []string{"web", "agent"}, saw: "re-imaged",
	}, {
		name:    "after the Deployment's image patch, at the DaemonSet's (dropped)",
		hold:    func(_ []killRequest, r killRequest) bool { return r.imagePatch("agent") },
		attempt: "1", webNew: true,
		reimage: []string{"agent"}, saw: "re-imaged",
	}, {
		name:    "at the last image patch (landed, answer withheld)",
		hold:    func(_ []killRequest, r killRequest) bool { return r.imagePatch("agent") },
		forward: true,
		attempt: "1", webNew: true, agentNew: true,
		saw: "never confirmed settling",
	}, {
		name: "during the rollout wait, the rollout not settled",
		hold: func(before []killRequest, r killRequest) bool {
			after, ok := afterLast(before, isAgentImagePatch)
			reads := 0
			for _, a := range after {
				if a.workloadRead() {
					reads++
				}
			}
			return ok && r.workloadRead() && reads >= 2 // the wait's third poll
		},
		slowRollout: true,
		attempt:     "1", webNew: true, agentNew: true,
		saw: "never confirmed settling",
	}, {
		name:    "after the settle, at the attempt clear (dropped)",
		hold:    func(_ []killRequest, r killRequest) bool { return r.annotationWrite(`"` + attemptKey + `":null`) },
		attempt: "1", webNew: true, agentNew: true,
		saw: "never confirmed settling",
	}, {
		name:   "after the attempt clear, at the digest record write (dropped)",
		hold:   func(_ []killRequest, r killRequest) bool { return r.annotationWrite(`"` + recordKey + `":"sha256:`) },
		webNew: true, agentNew: true,
		saw: "every target already runs it",
	}, {
		name:           "at the digest record write (landed, answer withheld)",
		hold:           func(_ []killRequest, r killRequest) bool { return r.annotationWrite(`"` + recordKey + `":"sha256:`) },
		forward:        true,
		recordAdvanced: true, webNew: true, agentNew: true,
	}}

	var summary []string
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			e := &env{e.WithT(t)}
			old := e.Annotations("web")[recordKey]
			if v, ok := e.Annotations("web")[attemptKey]; ok || e.Image("web", "app") != tag+"@"+old || e.DaemonSetImage("agent") != tag+"@"+old {
				t.Fatalf("precondition: the group is not converged on %s (attempt %q): web %s, agent %s", old, v, e.Image("web", "app"), e.DaemonSetImage("agent"))
			}
			next := e.Push("api", "prod")
			oldRef, newRef := tag+"@"+old, tag+"@"+next
			beforeRS, beforeCR := e.Rollouts("web"), e.revisions("agent")

			// R6: a record write must never reach the API server while a
			// rollout is unsettled.
			var violations []string
			var vmu sync.Mutex
			p.mu.Lock()
			p.onRecord = func(r killRequest) {
				if !strings.Contains(r.Body, next) {
					return
				}
				var why []string
				if ok, reason, err := e.rolledOut(context.Background(), "web"); err != nil || !ok {
					why = append(why, fmt.Sprintf("web: %s%s", reason, errOrNil(err)))
				}
				if s, err := testenv.Settled(context.Background(), e.C.Client, "DaemonSet", e.NS, "agent"); err != nil || !s.Settled {
					why = append(why, fmt.Sprintf("agent: %s%s", s.Reason, errOrNil(err)))
				}
				if len(why) > 0 {
					vmu.Lock()
					violations = append(violations, strings.Join(why, "; "))
					vmu.Unlock()
				}
			}
			p.mu.Unlock()
			t.Cleanup(func() {
				p.mu.Lock()
				p.onRecord = nil
				p.mu.Unlock()
			})

			if st.slowRollout {
				e.setMinReadySeconds("agent", 2)
				t.Cleanup(func() { e.setMinReadySeconds("agent", 0) })
			}

			// The tick, killed at the step.
			p.take()
			p.arm(st.hold, st.forward)
			tp := startTick(t, bin, cfg, p.kubeconfig)
			var h *heldRequest
			select {
			case h = <-p.held:
			case <-tp.exited:
				p.arm(nil, false)
				code, logs := tp.wait(t, time.Second)
				t.Fatalf("the tick ended (exit %d) before reaching the step; requests %v\n%s", code, p.seen(), logs)
			case <-time.After(60 * time.Second):
				t.Fatalf("the tick did not reach the step in 60s; requests %v", p.seen())
			}
			if err := tp.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			_, killedLogs := tp.wait(t, 10*time.Second)
			if ws, ok := tp.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("the tick was not killed by SIGKILL: %v", tp.cmd.ProcessState)
			}
			close(h.killed)
			if st.forward && (h.code < 200 || h.code > 299) {
				t.Fatalf("the held %s was forwarded and answered %d", h.req, h.code)
			}
			t.Logf("killed at %s (forwarded %v); the killed tick's requests %v; its log:\n%s\nevents on web: %q", h.req, st.forward, p.take(), killedLogs, e.Events("web"))

			// The cluster as the kill left it.
			a := e.Annotations("web")
			wantRecord := old
			if st.recordAdvanced {
				wantRecord = next
			}
			if got := a[recordKey]; got != wantRecord {
				t.Errorf("after the kill the record is %q, want %q (R6/R13: it moves only with a record write sent after the settle)", got, wantRecord)
			}
			if got := a[attemptKey]; got != st.attempt {
				t.Errorf("after the kill refresh-attempt is %q, want %q", got, st.attempt)
			}
			for _, w := range []struct {
				name, got string
				isNew     bool
			}{{"web", e.Image("web", "app"), st.webNew}, {"agent", e.DaemonSetImage("agent"), st.agentNew}} {
				want := oldRef
				if w.isNew {
					want = newRef
				}
				if w.got != want {
					t.Errorf("after the kill %s runs %s, want %s", w.name, w.got, want)
				}
			}
			if st.slowRollout {
				if s, err := testenv.Settled(context.Background(), e.C.Client, "DaemonSet", e.NS, "agent"); err != nil || s.Settled {
					t.Fatalf("the DaemonSet settled before the kill (err %v): the kill was not during an unsettled wait", err)
				} else {
					t.Logf("at the kill the DaemonSet was not settled: %s", s.Reason)
				}
			}

			// Restart: fresh tick processes until the group converged.
			converged := func() bool {
				a := e.Annotations("web")
				_, attempt := a[attemptKey]
				_, skip := a[e.Key("refresh-skip-streak")]
				return a[recordKey] == next && !attempt && !skip && e.Image("web", "app") == newRef && e.DaemonSetImage("agent") == newRef
			}
			var allLogs []string
			var patched []string
			writes := 0
			ticks := 0
			for ticks == 0 || (ticks < 4 && !converged()) {
				ticks++
				tp := startTick(t, bin, cfg, p.kubeconfig)
				code, logs := tp.wait(t, 90*time.Second)
				reqs := p.take()
				for _, r := range reqs {
					if r.imagePatch("") {
						patched = append(patched, r.Path[strings.LastIndexByte(r.Path, '/')+1:])
					}
					if r.Method == http.MethodPatch {
						writes++
					}
				}
				t.Logf("restart tick %d exit %d at %s after the kill, requests %v:\n%s", ticks, code, time.Since(killed).Round(time.Millisecond), reqs, logs)
				allLogs = append(allLogs, logs)
				if code != 0 {
					t.Errorf("restart tick %d exit %d, want 0", ticks, code)
				}
				if st.slowRollout && ticks == 1 {
					// The killed tick's holder is fresh: its rollout is left
					// to finish (C3), not counted as a new attempt (R11 waits
					// for it once the holder's time is up or it settled).
					if slices.ContainsFunc(reqs, func(r killRequest) bool { return r.Method == http.MethodPatch }) {
						t.Errorf("the restarted tick wrote while the killed tick's attempt was still rolling out: %v", reqs)
					}
					if len(e2e.LogLines(logs, "WARN", "rolling out under attempt 1", "leaves it alone")) == 0 {
						t.Errorf("the restarted tick did not say it leaves the unsettled rollout of the killed tick's attempt alone:\n%s", logs)
					}
				}
				// Ticks run back to back here instead of minutes apart, so
				// a tick that left the killed tick's fresh holder alone is
				// followed by one that finds the holder's time up, as a
				// tick minutes later would: its time is moved back instead
				// of waited for.
				if until, ok := leftAloneUntil(logs); ok {
					e.expireHolder("web", until)
				}
				_ = testenv.WaitSettled(context.Background(), e.C.Client, "Deployment", e.NS, "web", 60*time.Second)
				_ = testenv.WaitSettled(context.Background(), e.C.Client, "DaemonSet", e.NS, "agent", 60*time.Second)
			}
			took := time.Since(killed)
			if !converged() {
				t.Fatalf("not converged after %d restart ticks: record %q, attempt %q, web %s, agent %s", ticks,
					e.Annotations("web")[recordKey], e.Annotations("web")[attemptKey], e.Image("web", "app"), e.DaemonSetImage("agent"))
			}
			logs := strings.Join(allLogs, "\n")
			a = e.Annotations("web")
			for _, k := range []string{e.Key("refresh-flap-detected"), e.Key("refresh-skip-streak")} {
				if v, ok := a[k]; ok {
					t.Errorf("%s=%q left after convergence", k, v)
				}
			}
			if got := e.Rollouts("web"); got != beforeRS+1 {
				t.Errorf("web has %d ReplicaSets, want %d: exactly the one rollout in flight", got, beforeRS+1)
			}
			if got := e.revisions("agent"); got != beforeCR+1 {
				t.Errorf("agent has %d ControllerRevisions, want %d: exactly the one rollout in flight", got, beforeCR+1)
			}
			if strings.Join(patched, ",") != strings.Join(st.reimage, ",") {
				t.Errorf("the restart ticks re-imaged %q, want %q (R9: no write to a workload already on the digest)", patched, st.reimage)
			}
			if st.saw != "" && !strings.Contains(logs, st.saw) {
				t.Errorf("the restart ticks never logged %q:\n%s", st.saw, logs)
			}
			if st.recordAdvanced && (ticks != 1 || writes != 0) {
				t.Errorf("the kill left the group converged, yet %d restart ticks wrote %d times (R9: want one tick, no write)", ticks, writes)
			}
			vmu.Lock()
			for _, v := range violations {
				t.Errorf("a record write of %s reached the API server while a rollout was unsettled: %s", next, v)
			}
			vmu.Unlock()
			line := fmt.Sprintf("%s: converged after %d restart tick(s) in %s", st.name, ticks, took.Round(100*time.Millisecond))
			if warn := e2e.LogLines(logs, "WARN"); len(warn) > 0 {
				line += "; WARN: " + strings.Join(warn, " | ")
			}
			summary = append(summary, line)
		})
	}
	t.Logf("per step:\n%s", strings.Join(summary, "\n"))
}
