package refresh

import (
	"fmt"
	"slices"
	"strings"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/imageref"
)

// PodsRead is the pods of one workload's current template, as read (N1).
type PodsRead struct {
	Pods []RunningPod
	Err  error
}

// RunningPod is one pod: where it runs and, per container, the imageID its
// runtime reports.
type RunningPod struct {
	Name, Node string
	ImageIDs   map[string]string // container name → imageID
	// Failing: per container that cannot run, why (CrashLoopBackOff with
	// its last exit code, ImagePullBackOff, …), V2.
	Failing map[string]string
	// Ready: the pod's Ready condition is True; Restarts: the sum of its
	// containers' restart counts (P1's soak).
	Ready    bool
	Restarts int
}

// RunningDigest is the repository digest of a runtime's imageID
// ("repo@sha256:…", also behind a "docker-pullable://" scheme), or "" when
// it names none: an image ID alone ("sha256:…" of the config blob), which
// some runtimes report, says nothing about the manifest (N1: unknown,
// never a match).
func RunningDigest(imageID string) string {
	i := strings.LastIndexByte(imageID, '@')
	if i < 0 {
		return ""
	}
	d, err := imageref.ParseDigest(imageID[i+1:])
	if err != nil {
		return ""
	}
	return d
}

// Expected is the digest the pods of a target should run: the pin of its
// live reference, or, for a target still on its tag (before its first pin,
// inert on a mirror, during a revert), the recorded digest (N1); on the
// first observation, the digest that pass records.
func Expected(live, recorded string) string {
	if d := imageref.DigestOf(live); d != "" {
		return d
	}
	return recorded
}

// running compares what every target's pods run with what they should
// (N1): a row's Running column, and for a settled target with a pod on
// another digest the running-stale state, a WARN naming pod, node and both
// digests with what to do, an Event on the anchor, and exit 1 only when
// the operator asked for it (failOnRunningStale).
func (d *decision) running() {
	if d.obs.Pods == nil {
		return
	}
	for i := range d.p.Rows {
		r := &d.p.Rows[i]
		t := r.target
		read, ok := d.obs.Pods[t.Workload()]
		if !ok {
			continue
		}
		if _, has := d.obs.Workloads[t.Workload()].Containers[t.Container]; !has {
			continue // no such container (R19 says so): its pods have none to check
		}
		if read.Err != nil {
			r.Running = "unknown"
			d.find(Finding{Severity: SeverityWarn, Image: r.Image, Target: &t,
				Message:     fmt.Sprintf("cannot read the pods of %s to check what they run: %v", t.Workload(), read.Err),
				Remediation: "grant image-refresh list (and, in run, watch) on pods in namespace " + t.Namespace})
			continue
		}
		recorded := r.Recorded
		if recorded == "" && r.State == StateFirstObserved {
			recorded = r.Latest // what this pass records
		}
		want := Expected(r.Live, recorded)
		if want == "" {
			continue
		}
		platforms := d.obs.Platforms[want]
		var on, unknown, notRunning int
		var off []string
		firstOff := ""
		for _, p := range read.Pods {
			id := p.ImageIDs[t.Container]
			got := RunningDigest(id)
			switch {
			case id == "":
				// The pod has no status of the container yet (Pending,
				// pulling): it runs nothing to check, and says nothing
				// about what it would run.
				notRunning++
			case got == "":
				unknown++
			case got == want || slices.Contains(platforms, got):
				on++
			default:
				off = append(off, fmt.Sprintf("pod %s on node %s runs %s", p.Name, orNone(p.Node), got))
				if firstOff == "" {
					firstOff = fmt.Sprintf("%s: %s", orNone(p.Node), got)
				}
			}
		}
		r.PodsOn, r.PodsOff, r.PodsUnknown = on, len(off), unknown
		r.Running = fmt.Sprintf("%d/%d", on, len(read.Pods))
		if len(off) > 0 {
			r.Running += " (" + firstOff + ")"
		}
		if notRunning > 0 {
			r.Running += fmt.Sprintf(" (%d not running)", notRunning)
		}
		if unknown > 0 {
			r.Running += fmt.Sprintf(" (%d unknown)", unknown)
			d.find(Finding{Severity: SeverityNote, Image: r.Image, Target: &t,
				Message: fmt.Sprintf("%d pod(s) of %s report an imageID without a repository digest: what they run is unknown, not counted as on %s", unknown, d.named(t), want)})
		}
		w := d.obs.Workloads[t.Workload()]
		if len(off) == 0 || !w.Settled {
			continue
		}
		msg := fmt.Sprintf("%s runs another build than %s: %s", d.named(t), want, strings.Join(off, "; "))
		rem := runningStaleRemediation(t, r.Live)
		switch r.State {
		case StatePinned, StateInert, StateFirstObserved, StateTagFlapping, StateQuarantined, StateWaiting, StateWindowClosed, StateQueued:
			// Nothing about the target itself is wrong: the stale pods
			// are the finding.
			r.State, r.Message, r.Remediation = StateRunningStale, msg, rem
		case StateDrifted:
			// O2: the target is off its pin (a revert, with its writer
			// and the writer's fix): that is the cause, shown first; the
			// stale pods are its effect, beside it.
			r.Also = append(r.Also, Beside{State: StateRunningStale, Message: msg, Remediation: rem})
		default:
			// A state that needs attention first says more; the stale
			// pods are shown beside it.
			r.Also = append(r.Also, Beside{State: StateRunningStale, Message: msg, Remediation: rem})
			continue
		}
		d.find(Finding{Severity: SeverityWarn, Reason: ReasonRunningStale, Image: r.Image, Target: &t,
			Message: msg, Remediation: rem, NeedsHuman: d.s.FailOnRunningStale, Event: true})
	}
}

func runningStaleRemediation(t config.Target, live string) string {
	if imageref.DigestOf(live) != "" {
		return fmt.Sprintf("delete the listed pods (kubectl -n %s delete pod NAME): they are re-created on the pinned digest", t.Namespace)
	}
	return fmt.Sprintf("the node's cached tag is stale: let image-refresh pin the target, or set imagePullPolicy: Always, then delete the listed pods (kubectl -n %s delete pod NAME)", t.Namespace)
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
