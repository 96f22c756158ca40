package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/statestore"
)

// SuspendCmd runs suspend or resume (args[0]) with the env's kubeconfig
// (O1).
func (e *Env) SuspendCmd(cfg string, args ...string) (int, string, string) {
	e.T.Helper()
	return e.Run(append([]string{args[0], "--config", cfg, "--kubeconfig", e.Kubeconfig}, args[1:]...)...)
}

// RolloutUndo runs `kubectl rollout undo deployment/NAME` with the
// cluster's own kubectl binary and fails the test when it fails: the undo
// puts the previous ReplicaSet's pod template and annotations back on the
// Deployment, and with them an older copy of the group's state (R25).
func (e *Env) RolloutUndo(name string) {
	e.T.Helper()
	cmd := exec.Command(filepath.Join(e.C.BinDir, "kubectl"), "--kubeconfig", e.Kubeconfig, "-n", e.NS, "rollout", "undo", "deployment/"+name)
	out, err := cmd.CombinedOutput()
	if err != nil {
		e.T.Fatalf("kubectl rollout undo deployment/%s: %v\n%s", name, err, out)
	}
	e.T.Logf("kubectl rollout undo deployment/%s: %s", name, strings.TrimSpace(string(out)))
}

// StateCopy returns the data of the copy of the state of the Deployment
// anchor (nil: there is none) (R25).
func (e *Env) StateCopy(anchor string) map[string]string {
	e.T.Helper()
	name := statestore.Name(config.Workload{Kind: "Deployment", Namespace: e.NS, Name: anchor})
	cm, err := e.C.Client.CoreV1().ConfigMaps(e.NS).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.T.Fatal(err)
	}
	return cm.Data
}
