package run

import (
	"os"
	"testing"

	"github.com/image-refresh/image-refresh/test/support/e2e"
)

func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }

// env is the harness's Env with the helpers of this package's tests.
type env struct{ *e2e.Env }

func newEnv(t *testing.T) *env { return &env{e2e.New(t)} }
