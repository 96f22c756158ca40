package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// OwnerKey is an annotation of the operator's own on an anchor: it must
// survive every write of image-refresh (R16).
const OwnerKey = "acme.example/owner"

// CfWebGroup is a group of one Deployment "web" that is its own anchor.
var CfWebGroup = "groups:\n" + OneGroup("web", "web", "web", "web")

// LBGate is the readiness gate of Gated's Deployments, as a load
// balancer controller sets one.
const LBGate = "lb.acme.example/target-healthy"

// Gated creates Deployment name on tag whose new pods become available
// only while the gate owner it returns says they are healthy (and 4 s
// after that), and waits until it settled. The owner runs from the start,
// as a load balancer controller does: a pod whose gate nobody sets is
// never Ready.
func (e *Env) Gated(name, tag string, replicas int32) *GateOwner {
	e.T.Helper()
	testenv.Deployment(e.T, e.C.Client, e.NS, name, testenv.WithContainer("web", tag), testenv.WithReplicas(replicas),
		testenv.WithReadinessGate(LBGate), testenv.WithMinReadySeconds(4))
	lb := e.StartGateOwner(name, LBGate)
	e.Settle("Deployment", name)
	return lb
}

// StateOf returns the annotations of a Deployment that image-refresh keeps
// (prefix P) and the operator's own ownerKey.
func (e *Env) StateOf(deploy string) map[string]string {
	e.T.Helper()
	out := map[string]string{}
	for k, v := range e.Annotations(deploy) {
		if k == e.Key("state-generation") {
			continue // it numbers every write of the state, not what it holds (R25)
		}
		if strings.HasPrefix(k, e.Prefix+"/") || k == OwnerKey {
			out[k] = v
		}
	}
	return out
}

// PodCondition is the status of the pod's condition typ ("" if absent).
func PodCondition(p *corev1.Pod, typ corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

// GateOwner plays the owner of a readiness gate, as a load balancer
// controller does for the pods of one Deployment: it sets the gate True on
// every pod that runs a healthy target, and leaves it unset on the pods of
// the digest it is told is unhealthy (False, should it have set it True
// before). It writes only its gate: the node (kwok's pod-ready and
// pod-readiness stages, as a kubelet) keeps a pod Ready only while every
// gate is True, so a pod whose gate nobody sets is never Ready.
type GateOwner struct {
	E         *Env
	App, Gate string
	Mu        sync.Mutex
	Unhealthy string // a digest; "" = every target healthy
	OnTag     bool   // pods on a bare tag (no digest) are unhealthy too
	Cancel    context.CancelFunc
	Done      chan struct{}
	told      chan struct{} // Fail and FailOnTag wake the loop
}

// StartGateOwner starts a GateOwner for the pods of app; it stops when the
// test ends.
func (e *Env) StartGateOwner(app, gate string) *GateOwner {
	e.T.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	g := &GateOwner{E: e, App: app, Gate: gate, Cancel: cancel, Done: make(chan struct{}), told: make(chan struct{}, 1)}
	go g.Loop(ctx)
	e.T.Cleanup(func() { g.Cancel(); <-g.Done })
	return g
}

// Fail makes the owner report pods on digest unhealthy ("" heals them).
func (g *GateOwner) Fail(digest string) {
	g.Mu.Lock()
	g.Unhealthy = digest
	g.Mu.Unlock()
	g.tell()
}

// FailOnTag makes the owner report pods whose image has no digest (a
// revert to the bare tag) unhealthy.
func (g *GateOwner) FailOnTag() {
	g.Mu.Lock()
	g.OnTag = true
	g.Mu.Unlock()
	g.tell()
}

func (g *GateOwner) tell() {
	select {
	case g.told <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// Loop sets the gate on the pods it watches until ctx ends (ownPods).
func (g *GateOwner) Loop(ctx context.Context) {
	defer close(g.Done)
	ownPods(ctx, g.E.C.Client, g.E.NS, g.App, g.told, g.reconcile)
}

// reconcile writes the gate on every pod of the app whose gate differs
// from the verdict: True on a healthy one; on an unhealthy one False if it
// was True, else nothing. After a failed read or write it returns a timer
// to try again on (nil: nothing failed).
func (g *GateOwner) reconcile(ctx context.Context) <-chan time.Time {
	pods := g.E.C.Client.CoreV1().Pods(g.E.NS)
	g.Mu.Lock()
	bad, onTag := g.Unhealthy, g.OnTag
	g.Mu.Unlock()
	gate := corev1.PodConditionType(g.Gate)
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "app=" + g.App})
	failed := err != nil
	for i := 0; err == nil && i < len(list.Items); i++ {
		p := &list.Items[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		want, reason := corev1.ConditionTrue, "TargetHealthy"
		if img := p.Spec.Containers[0].Image; (bad != "" && strings.HasSuffix(img, "@"+bad)) || (onTag && !strings.Contains(img, "@")) {
			want, reason = corev1.ConditionFalse, "TargetUnhealthy"
		}
		if has := PodCondition(p, gate); has == want || (want == corev1.ConditionFalse && has != corev1.ConditionTrue) {
			continue
		}
		patch := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":%q,"reason":%q,"lastTransitionTime":%q}]}}`,
			g.Gate, want, reason, time.Now().UTC().Format(time.RFC3339))
		if _, perr := pods.Patch(ctx, p.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "lb-controller"}, "status"); perr != nil {
			failed = true
		}
	}
	if failed {
		return time.After(100 * time.Millisecond)
	}
	return nil
}
