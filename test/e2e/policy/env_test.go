// Package policy holds the end-to-end tests of what holds, rolls back or
// locks out a digest, in tick and in run: the rollout policy (age,
// windows, concurrency: R22, R24), flapping tags (R21), failed rollouts
// (V2), the lockout and the state a rollback leaves (R23, R25), and
// promotion between groups (P1). It is its own test binary, with its own
// cluster, so that it runs beside the other areas (make test).
package policy

import (
	"os"
	"testing"

	"github.com/image-refresh/image-refresh/test/support/e2e"
)

func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }

// env is the harness's Env with the helpers of this package's tests.
type env struct{ *e2e.Env }

func newEnv(t *testing.T) *env { return &env{e2e.New(t)} }
