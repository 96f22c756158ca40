package e2e

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// CrashLoop plays the kubelet of a build whose container exits at once:
// on every started pod of one app that runs one digest, it reports each
// container waiting in CrashLoopBackOff with its last exit code, and the
// pod's ContainersReady and Ready False, as a kubelet does once the
// container exited twice. kwok started the pod and does not touch its
// container statuses again, so what CrashLoop writes stays.
type CrashLoop struct {
	e           *Env
	app, digest string
	code        int
}

// StartCrashLoop starts a CrashLoop for the pods of app on digest whose
// containers exit with code; it stops when the test ends.
func (e *Env) StartCrashLoop(app, digest string, code int) *CrashLoop {
	e.T.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &CrashLoop{e: e, app: app, digest: digest, code: code}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ownPods(ctx, e.C.Client, e.NS, app, nil, c.reconcile)
	}()
	e.T.Cleanup(func() { cancel(); <-done })
	return c
}

// reconcile reports every started pod on the digest crashing that is not
// reported so yet. After a failed read or write it returns a timer to try again on.
func (c *CrashLoop) reconcile(ctx context.Context) <-chan time.Time {
	pods := c.e.C.Client.CoreV1().Pods(c.e.NS)
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "app=" + c.app})
	failed := err != nil
	for i := 0; err == nil && i < len(list.Items); i++ {
		p := &list.Items[i]
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil || !onDigest(p, c.digest) {
			continue // not started by kwok yet (it would overwrite the statuses), or not this build
		}
		if crashLooping(p) {
			continue
		}
		if _, perr := pods.Patch(ctx, p.Name, types.StrategicMergePatchType, c.patch(p), metav1.PatchOptions{FieldManager: "kubelet"}, "status"); perr != nil {
			failed = true
		}
	}
	if failed {
		return time.After(100 * time.Millisecond)
	}
	return nil
}

// patch is the status a kubelet reports for p once its containers exited
// with c.code twice.
func (c *CrashLoop) patch(p *corev1.Pod) []byte {
	now := time.Now().UTC().Format(time.RFC3339)
	var statuses []string
	for _, ctr := range p.Spec.Containers {
		statuses = append(statuses, fmt.Sprintf(`{"name":%q,"ready":false,"started":false,"restartCount":2,`+
			`"state":{"running":null,"waiting":{"reason":"CrashLoopBackOff","message":"back-off 20s restarting failed container=%s pod=%s"}},`+
			`"lastState":{"terminated":{"exitCode":%d,"reason":"Error","startedAt":%q,"finishedAt":%q}}}`,
			ctr.Name, ctr.Name, p.Name, c.code, now, now))
	}
	return []byte(fmt.Sprintf(`{"status":{"containerStatuses":[%s],"conditions":[`+
		`{"type":"ContainersReady","status":"False","reason":"ContainersNotReady","lastTransitionTime":%q},`+
		`{"type":"Ready","status":"False","reason":"ContainersNotReady","lastTransitionTime":%q}]}}`,
		strings.Join(statuses, ","), now, now))
}

// crashLooping reports whether every container of p is reported waiting
// in CrashLoopBackOff already.
func crashLooping(p *corev1.Pod) bool {
	if len(p.Status.ContainerStatuses) == 0 {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w == nil || w.Reason != "CrashLoopBackOff" {
			return false
		}
	}
	return true
}

// onDigest reports whether a container of p asks for an image at digest.
func onDigest(p *corev1.Pod, digest string) bool {
	for _, ctr := range p.Spec.Containers {
		if strings.HasSuffix(ctr.Image, "@"+digest) {
			return true
		}
	}
	return false
}
