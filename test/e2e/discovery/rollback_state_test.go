package discovery

import (
	"testing"

	"github.com/image-refresh/image-refresh/test/support/e2e"
)

// R25 with D1: a labelled workload's copy of its state is written with
// its annotations, and deleted when the workload is let go, so that the
// workload, labelled again, starts over from first observation rather
// than from the state the copy would bring back.
func TestTick_R25_D1_ALetGoWorkloadLosesTheCopyOfItsState(t *testing.T) {
	e, digest, _ := labelledAPI(t)
	cfg := e.settings()
	for i := range 2 {
		if code, _ := e.DiscoveryTick(cfg); code != 0 {
			t.Fatalf("tick %d exit %d, want 0", i+1, code)
		}
	}
	if cp := e.StateCopy("api"); cp["last-refreshed-api-digest"] != digest || cp["discovered-group"] == "" {
		t.Fatalf("setup: the copy %v lacks the record or the discovered-group mark", cp)
	}

	e.Label("Deployment", "api", map[string]*string{e.Key("enabled"): nil})
	if code, logs := e.DiscoveryTick(cfg); code != 0 || len(e2e.LogLines(logs, "INFO", "let go", "state annotations were removed")) != 1 {
		t.Fatalf("tick after the label went: exit %d, want 0 and the let-go logged:\n%s", code, logs)
	}
	if cp := e.StateCopy("api"); cp != nil {
		t.Errorf("the copy of a let-go workload's state is still there: %v", cp)
	}
	e.Enable("Deployment", "api")
	code, logs := e.DiscoveryTick(cfg)
	if code != 0 || len(e2e.LogLines(logs, "INFO", "first observation")) != 1 {
		t.Errorf("the workload labelled again: exit %d, want 0 and a first observation (its old state gone):\n%s", code, logs)
	}
}
