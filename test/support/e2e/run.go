package e2e

import (
	"testing"

	"github.com/image-refresh/image-refresh/internal/cli"
	"github.com/image-refresh/image-refresh/test/support/running"
)

// Kick makes the groups of Deployment deploy run a pass and changes
// nothing a pass reads: it adds an annotation under the state prefix and
// removes it again (a removed state key starts a pass, as a rearm does;
// no pass reads this key). The removal reaches the controller's cache
// after every earlier write to the namespace's Deployments, so the pass it
// starts reads them. For a controller whose resync is an hour away, which
// nothing else may make run a pass.
func (e *Env) Kick(deploy string) {
	e.T.Helper()
	k := e.Key("test-kick")
	e.Annotate(deploy, map[string]*string{k: Ptr("1")})
	e.Annotate(deploy, map[string]*string{k: nil})
}

// KickedPasses waits for two more passes of group, kicking deploy for
// each so that they come: the first may be a pass that was in flight when
// it was called, reading a cache from before the writes under test; the
// second began after the first ended, so after the call.
func (c *RunningController) KickedPasses(t *testing.T, e *Env, group, deploy string) int {
	t.Helper()
	from := c.Passes(t, group)
	e.Kick(deploy)
	c.WaitPasses(t, group, from, 1)
	e.Kick(deploy)
	return c.WaitPasses(t, group, from, 2)
}

// RunningController is one `image-refresh run` running in-process
// (running.Controller), with the waits that need an env.
type RunningController struct{ *running.Controller }

// StartRun starts `image-refresh run` with the env's kubeconfig (and its
// clock, if set); it is stopped (as by SIGTERM) when the test ends.
func (e *Env) StartRun(cfg string, extra ...string) *RunningController {
	e.T.Helper()
	args := append([]string{"run", "--config", cfg, "--kubeconfig", e.Kubeconfig}, extra...)
	var opts []cli.Option
	if e.Clock != nil {
		opts = append(opts, cli.WithClock(e.Clock.Now))
	}
	return &RunningController{running.Start(e.T, args, opts...)}
}
