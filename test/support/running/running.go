// Package running runs `image-refresh run` in-process for a test, with its
// metrics and health endpoints on free loopback addresses, and reads the
// signals a test waits on: readiness, and image_refresh_passes_total (a
// pass completed), which every negative check waits for.
package running

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/image-refresh/image-refresh/internal/cli"
	"github.com/image-refresh/image-refresh/test/support/freeport"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

// Controller is one `image-refresh run` running in-process.
type Controller struct {
	Metrics string // the address of /metrics
	Health  string // the address of /healthz and /readyz

	cancel context.CancelFunc
	done   chan struct{}
	code   int
	mu     sync.Mutex
	logs   bytes.Buffer
	logged chan struct{}  // closed and replaced on each write to logs, and at exit
	base   map[string]int // image_refresh_passes_total by group when it started
}

// Start starts `image-refresh <args>` (args[0] is "run") with
// --metrics-addr and --health-addr set to free loopback addresses (over any
// value args give them); it is stopped, as by SIGTERM, when the test ends,
// and its logs are printed if the test failed.
func Start(t testing.TB, args []string, opts ...cli.Option) *Controller {
	t.Helper()
	c := &Controller{done: make(chan struct{}), logged: make(chan struct{}), Metrics: freeport.MustAddr(t), Health: freeport.MustAddr(t), base: processPasses(t)}
	args = SetFlag(SetFlag(args, "--metrics-addr", c.Metrics), "--health-addr", c.Health)
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	root := cli.NewRoot(io.Discard, c, opts...)
	root.SetArgs(args)
	go func() {
		defer c.announce() // a wait on the logs learns of the exit
		defer close(c.done)
		err := root.ExecuteContext(ctx)
		if err != nil {
			fmt.Fprintln(c, "image-refresh:", err)
		}
		c.code = cli.ExitCode(err)
	}()
	t.Cleanup(func() {
		c.Stop(t)
		if t.Failed() {
			t.Logf("controller logs:\n%s", c.Logs())
		}
	})
	return c
}

// SetFlag sets flag to value in args: in place if args has it, else at the
// end.
func SetFlag(args []string, flag, value string) []string {
	out := append([]string(nil), args...)
	for i := range out {
		if out[i] == flag && i+1 < len(out) {
			out[i+1] = value
			return out
		}
	}
	return append(out, flag, value)
}

// Write takes the controller's log lines.
func (c *Controller) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.logged)
	c.logged = make(chan struct{})
	return c.logs.Write(p)
}

func (c *Controller) announce() {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.logged)
	c.logged = make(chan struct{})
}

// logChanged is closed at the controller's next log line or its exit.
func (c *Controller) logChanged() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.logged
}

// UntilLogged waits until cond, a check of Logs, holds: checked at once
// and again on each line the controller logs, not on a timer; the test's
// deadline bounds a hang. It fails at once, with the logs, if the
// controller exited.
func (c *Controller) UntilLogged(t testing.TB, what string, cond func(logs string) bool) {
	t.Helper()
	testwait.Until(t, what, c.logChanged, func() bool {
		select {
		case <-c.done:
			t.Fatalf("%s: the controller exited %d:\n%s", what, c.code, c.Logs())
		default:
		}
		return cond(c.Logs())
	})
}

// Logs is everything the controller logged so far.
func (c *Controller) Logs() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.logs.String()
}

// Stop cancels the controller's context, as SIGTERM does, waits for it to
// exit and returns how long that took.
func (c *Controller) Stop(t testing.TB) time.Duration {
	t.Helper()
	start := time.Now()
	c.cancel()
	testwait.Recv(t, c.done, "the controller to stop after SIGTERM")
	return time.Since(start)
}

// Code is the exit code of a stopped controller.
func (c *Controller) Code() int {
	<-c.done
	return c.code
}

// Eventually is testwait.Eventually that fails at once, with the
// controller's logs, if the controller exited.
func (c *Controller) Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	return testwait.Eventually(t, timeout, what, func() bool {
		select {
		case <-c.done:
			t.Fatalf("%s: the controller exited %d:\n%s", what, c.code, c.Logs())
		default:
		}
		return cond()
	})
}

// UntilWatched waits until cond, a check of what open watches, holds and
// returns how long that took: cond is checked at once and again on every
// change the watch delivers (testenv.UntilWatched), not on a timer.
// timeout bounds a hang; the test fails naming what if it passes first,
// and at once, with the logs, if the controller exits.
func (c *Controller) UntilWatched(t testing.TB, timeout time.Duration, what string, open testenv.Watcher, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	go func() { // an exit ends the wait
		select {
		case <-c.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := testenv.UntilWatched(ctx, open, func(context.Context) (bool, error) { return cond(), nil })
	select {
	case <-c.done:
		if err != nil {
			t.Fatalf("%s: the controller exited %d:\n%s", what, c.code, c.Logs())
		}
	default:
	}
	if err != nil {
		t.Fatalf("%s: not within %s (%v)", what, timeout, err)
	}
	return time.Since(start)
}

// WaitReady waits until /readyz answers 200 (the informer caches synced).
func (c *Controller) WaitReady(t testing.TB) {
	t.Helper()
	c.Eventually(t, 60*time.Second, "controller ready", func() bool {
		code, _ := Get("http://" + c.Health + "/readyz")
		return code == http.StatusOK
	})
}

// Passes reads image_refresh_passes_total of group from /metrics, less what
// it was when c started: the signal that a pass completed. Every
// controller of this process serves the one registry controller-runtime
// keeps (metrics.NewOn), so the total also holds the passes of controllers
// that ran before c (earlier tests reuse group names), subtracted here, and
// of any controller running beside c under the same group name, which are
// not: controllers that run at once and must be told apart are given
// different group names.
func (c *Controller) Passes(t testing.TB, group string) int {
	t.Helper()
	_, body := Get("http://" + c.Metrics + "/metrics")
	v, ok := MetricValue(body, "image_refresh_passes_total", map[string]string{"group": group})
	if !ok {
		return 0
	}
	n, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("image_refresh_passes_total = %q", v)
	}
	return int(n) - c.base[group]
}

// WaitPasses waits until group completed n more passes than it had at from
// and returns the count.
func (c *Controller) WaitPasses(t testing.TB, group string, from, n int) int {
	t.Helper()
	testwait.Eventually(t, 2*time.Minute, fmt.Sprintf("%d more passes of group %s", n, group), func() bool {
		return c.Passes(t, group) >= from+n
	})
	return c.Passes(t, group)
}

// processPasses reads image_refresh_passes_total by group from the
// process-wide registry, before a controller serves it.
func processPasses(t testing.TB) map[string]int {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	out := map[string]int{}
	for _, f := range families {
		if f.GetName() != "image_refresh_passes_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "group" {
					out[l.GetValue()] = int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return out
}

// Get returns the status and body of a GET of url (0 and the error's text
// if it failed).
func Get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// MetricValue returns the value of the sample of metric, in the Prometheus
// text format /metrics serves, whose labels include every one of labels.
func MetricValue(text, metric string, labels map[string]string) (string, bool) {
	line := regexp.MustCompile(`^` + regexp.QuoteMeta(metric) + `\{(.*)\} (\S+)$`)
	pair := regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)
	for _, l := range strings.Split(text, "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		have := map[string]string{}
		for _, p := range pair.FindAllStringSubmatch(m[1], -1) {
			have[p[1]] = p[2]
		}
		match := true
		for k, v := range labels {
			match = match && have[k] == v
		}
		if match {
			return m[2], true
		}
	}
	return "", false
}
