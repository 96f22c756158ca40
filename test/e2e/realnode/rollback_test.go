package realnode

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/internal/cli"
	"github.com/image-refresh/image-refresh/test/support/localcluster"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

const crashGroup = `groups:
  - name: crash
    onFailedRollout: rollback
    anchor: {kind: Deployment, namespace: {{ns}}, name: crash}
    images:
      - name: app
        repository: {{reg}}/acme/crash
        tag: prod
        targets:
          - {kind: Deployment, namespace: {{ns}}, name: crash, container: app}
`

// pushCrashing pushes a build of nodeapp that exits with code at once.
func (w *world) pushCrashing(repo, tag, build string, code int) string {
	w.t.Helper()
	img, err := localcluster.CrashingAppImage(w.c.BinDir, build, code)
	return w.push(repo, tag, build, img, err)
}

// syncBuffer is the log of an in-process `run`.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRealNode_V2_ABuildWhoseContainerExits1IsRolledBack: on the real node
// a new build whose container exits 1 crash-loops; `run` reads the
// kubelet's CrashLoopBackOff and the exit code from the pod and rolls the
// Deployment back to the recorded build, quarantining the broken digest.
// The engine's clock is frozen, so rolloutTimeout never passes: only the
// pods' own failure can have triggered the rollback.
func TestRealNode_V2_ABuildWhoseContainerExits1IsRolledBack(t *testing.T) {
	w := newWorld(t)
	a := w.pushBuild("acme/crash", "prod", "A")
	tag := w.host + "/acme/crash:prod"
	testenv.Deployment(t, w.c.Client, w.ns, "crash", testenv.WithContainer("app", tag), testenv.WithReplicas(1), testenv.OnRealNode())
	// Ready when it serves: without a readiness probe a container that
	// exits right after it started counts as available for a moment, and
	// Kubernetes (like kubectl rollout status) calls the rollout done.
	probe := `{"spec":{"template":{"spec":{"containers":[{"name":"app","readinessProbe":{"periodSeconds":1,"httpGet":{"port":8080}}}]}}}}`
	if _, err := w.c.Client.AppsV1().Deployments(w.ns).Patch(context.Background(), "crash", types.StrategicMergePatchType, []byte(probe), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	w.readyPod("crash")
	cfg := w.config(crashGroup)
	for i := range 2 {
		if code, _, logs := w.run("tick", "--config", cfg, "--kubeconfig", w.c.Kubeconfig, "--discovery=false"); code != 0 {
			t.Fatalf("setup tick %d: exit %d:\n%s", i+1, code, logs)
		}
	}
	w.waitImage("crash", tag+"@"+a, time.Minute)

	frozen := time.Now()
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	root := cli.NewRoot(logs, logs, cli.WithClock(func() time.Time { return frozen }))
	root.SetArgs([]string{"run", "--config", cfg, "--kubeconfig", w.c.Kubeconfig, "--discovery=false",
		"--poll-interval", "1s", "--poll-jitter", "0", "--metrics-addr", "127.0.0.1:0", "--health-addr", "127.0.0.1:0"})
	go func() {
		defer close(done)
		if err := root.ExecuteContext(ctx); err != nil {
			fmt.Fprintln(logs, "image-refresh:", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("run's log:\n%s", logs.String())
		}
	})

	b := w.pushCrashing("acme/crash", "prod", "B", 1)
	w.waitImage("crash", tag+"@"+b, 2*time.Minute)
	back := w.waitImage("crash", tag+"@"+a, 4*time.Minute)
	note := back.Annotations["image-refresh.io/rolled-back-app"]
	if !strings.HasPrefix(note, b+" ") || !strings.Contains(note, "CrashLoopBackOff") || !strings.Contains(note, "exit code 1") {
		t.Errorf("rolled-back note %q, want %s with the kubelet's CrashLoopBackOff and exit code 1", note, b)
	}
	if got := back.Annotations["image-refresh.io/locked-on-app"]; got != b {
		t.Errorf("quarantine %q, want %s", got, b)
	}
	if got := w.logs(w.readyPod("crash")); !strings.Contains(got, "serving build A") {
		t.Errorf("after the rollback the pod says %q, want build A", got)
	}
}
