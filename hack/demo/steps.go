package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const nSteps = 10

// 1. R5 first observation, then R7 pins every target.
func (d *demo) stepPin() {
	d.step(1, nSteps, "First observation, then the pin")
	d.say("The first tick only records the digest :prod points to now (R5); it touches no workload.")
	before := d.live(api).Image
	rs := d.rollouts()
	d.tick(0)
	d.expectImages(func(t target) string { return d.repo(t.image) + ":" + tag })
	d.expectRecords()
	d.expectRollouts(rs, 0, "digests recorded on the anchor, nothing rolled")
	d.say("What runs on the nodes (N1): each pod's imageID, compared with the recorded digest.")
	// The target is off its pin (drifted, the cause, O2) and its pods run a
	// stale build beside it.
	if st, running := d.running(monitorTarget); !strings.Contains(st, "running-stale") || !strings.Contains(running, "node-2: "+d.staleBuild) {
		d.failf("resource-monitor: status says %s, running %q; want running-stale naming node-2 and its old build", st, running)
	} else {
		d.ok("resource-monitor is %s: %s (the seed's incident, visible)", st, running)
	}

	d.say("The next tick pins every target to the recorded digest (R7): one rollout per workload (R9).")
	d.tick(0)
	d.expectImages(d.pinnedTo)
	d.expectRollouts(rs, 1, "every target pinned, one rollout each")
	d.settleAll(60 * time.Second)
	if st, running := d.running(monitorTarget); st != "pinned" || running != "3/3" {
		d.failf("resource-monitor after the pin: %s, running %q; want pinned, 3/3", st, running)
	} else {
		d.ok("resource-monitor after the pin: every node runs the pinned digest (%s): node-2 had to pull it by digest", running)
	}
	d.say("Deployment jobs-manager, container api, pod template:")
	d.say("  before: image: %s", before)
	d.say("  after:  image: %s", d.live(api).Image)
}

// 2. R6: the registry moves the tag; every target follows in one rollout.
func (d *demo) stepNewDigest() {
	d.step(2, nSteps, "A new build is published under :prod")
	for _, img := range images {
		d.push(img)
	}
	rs := d.rollouts()
	d.tick(0)
	d.expectImages(d.pinnedTo)
	d.expectRecords()
	d.expectRollouts(rs, 1, "every target re-imaged to the new digests, recorded after the rollouts settled")
	d.showImages("now")
}

// 3. R7/R17: helm upgrade re-renders repo:tag; the next tick re-pins.
func (d *demo) stepHelmUpgrade() {
	d.step(3, nSteps, "helm upgrade re-renders the tags")
	d.say("A routine upgrade (a new config revision) renders every image as %s:%s again.", d.repo("…"), tag)
	rs := d.rollouts()
	args := releaseArgs("upgrade", d.o.chart, "", "--reuse-values", "--set", "revision=2")
	out, err := d.helm.run(d.ctx, args...)
	if err != nil {
		if !strings.Contains(out, "conflict") {
			d.failf("helm upgrade: %v", err)
		}
		d.conflict = strings.TrimSpace(out)
		d.say("Helm 4 applies server-side: the pinned image fields belong to field manager")
		d.say("\"image-refresh\", so the whole upgrade fails (above; Helm records the revision as")
		d.say("failed). This is the documented Helm 4 behaviour (R17); the answer is --force-conflicts:")
		_, err = d.helm.run(d.ctx, append(args, "--force-conflicts")...)
		d.must(err, "helm upgrade --force-conflicts")
	}
	upgraded := time.Now()
	d.expectImages(func(t target) string { return d.repo(t.image) + ":" + tag })
	for _, t := range targets {
		if m := d.live(t).ImageManager; m != "helm" {
			d.failf("%s image last written by %q, want helm", t, m)
		}
	}
	d.showImages("reverted by Helm")

	pinned := d.watchPinned()
	d.settleAll(60 * time.Second)
	d.ok("Helm's own rollout settled %s after helm returned (the settled guard, R4, waits for it)", ms(time.Since(upgraded)))
	d.tick(0)
	at := <-pinned
	if at.IsZero() {
		d.failf("the tick returned but not every target is re-pinned")
	}
	d.repinLatency = at.Sub(upgraded)
	d.expectImages(d.pinnedTo)
	d.expectRollouts(rs, 2, "two rollouts each: Helm's, then the re-pin (the webhook of step 4 avoids the first)")
	d.ok("re-pinned: every target back on its digest %s after helm upgrade returned", ms(d.repinLatency))
	var fromHelm string
	for _, m := range d.events("Repinned") {
		if strings.Contains(m, "container api") && strings.Contains(m, "written by helm") {
			fromHelm = m
		}
	}
	if fromHelm == "" {
		d.failf("no Repinned event on jobs-manager names helm as the writer: %q", d.events("Repinned"))
	}
	d.ok("Event Repinned on Deployment jobs-manager:")
	d.say("  %s", fromHelm)
}

// watchPinned reports when every target's spec is on its digest again
// (the zero time if the demo gave up first).
func (d *demo) watchPinned() <-chan time.Time {
	done := make(chan time.Time, 1)
	go func() {
		ctx, cancel := context.WithTimeout(d.ctx, 2*time.Minute)
		defer cancel()
		for ctx.Err() == nil {
			all := true
			for _, t := range targets {
				obj, err := d.wl.Get(ctx, t.ref())
				if err != nil {
					all = false
					break
				}
				if c, _ := obj.Container(t.container); c.Image != d.pinnedTo(t) {
					all = false
					break
				}
			}
			if all {
				done <- time.Now()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		done <- time.Time{}
	}()
	return done
}

// rearmCommand finds the command a lockout message names (R18).
var rearmCommand = regexp.MustCompile(`image-refresh rearm --config (\S+) --group ([\w.-]+)`)

// 5. R10/R12/R18: a node dies mid-rollout; attempts count up to a loud
// lockout; the node comes back; the printed rearm command; converged.
func (d *demo) stepNodeDown() {
	d.step(5, nSteps, "A node goes NotReady during a rollout")
	node := d.quietNode()
	d.say("%s (it runs a resource-monitor pod and nothing else) stops heartbeating: its kwok", node)
	d.say("agent stops. It still reads Ready for ~20-40 s, but the pod the next rollout sends it")
	d.say("never runs. Meanwhile a new resource-monitor build is published.")
	d.must(d.cluster.StopNodeAgent(node), "stop the agent of "+node)
	d.push("resource-monitor")

	logs := ""
	for attempt := 1; ; attempt++ {
		logs = d.tick(1)
		got := d.anchor()[keys.Attempt()]
		if strings.Contains(logs, "LOCKED OUT") {
			break
		}
		if got != strconv.Itoa(attempt) {
			d.failf("after tick %d refresh-attempt=%q, want %d", attempt, got, attempt)
		}
		d.ok("the rollout did not settle within rolloutTimeout: refresh-attempt=%s of maxRefreshAttempts 2", got)
	}
	if d.anchor()[keys.Flap()] != "2" {
		d.failf("locked out, but %s=%q, want 2", keys.Flap(), d.anchor()[keys.Flap()])
	}
	m := rearmCommand.FindStringSubmatch(logs)
	if m == nil || m[1] != d.config || m[2] != group {
		d.failf("the lockout WARN does not name `image-refresh rearm --config %s --group %s`", d.config, group)
	}
	d.ok("LOCKED OUT, loudly: WARN with the exact command, exit 1, %s=2,", keys.Flap())
	d.ok("and an Event on the anchor: %s", first(d.events("RefreshLockedOut")))
	d.say("%s: %s", node, d.nodeReady(node))

	d.say("The node comes back; its pods run; the operator runs the command the WARN printed.")
	d.must(d.cluster.NodeUp(d.ctx, node), "bring "+node+" back")
	d.settleAll(90 * time.Second)
	d.ok("%s Ready, DaemonSet resource-monitor settled", node)
	if code, _, _ := d.imageRefresh("rearm", "--config", m[1], "--group", m[2]); code != 0 {
		d.failf("rearm exited %d", code)
	}
	d.observed()
	d.tick(0)
	d.expectImages(d.pinnedTo)
	d.expectRecords()
	if a := d.anchor(); a[keys.Attempt()] != "" || a[keys.Flap()] != "" {
		d.failf("converged, but the anchor still has %s=%q %s=%q", keys.Attempt(), a[keys.Attempt()], keys.Flap(), a[keys.Flap()])
	}
	d.ok("converged: resource-monitor on %s, recorded, attempt counter and lockout cleared", short(d.digests["resource-monitor"]))
}

// quietNode picks the node to break: node-2, unless a Deployment's pod
// runs there (then the story would also stall a Deployment).
func (d *demo) quietNode() string {
	pods, err := d.kube.CoreV1().Pods(namespace).List(d.ctx, metav1.ListOptions{})
	d.must(err, "list pods")
	busy := map[string]bool{}
	for _, p := range pods.Items {
		if len(p.OwnerReferences) > 0 && p.OwnerReferences[0].Kind == "ReplicaSet" {
			busy[p.Spec.NodeName] = true
		}
	}
	for _, n := range []string{"node-2", "node-3", "node-1"} {
		if !busy[n] {
			return n
		}
	}
	d.failf("every node runs a Deployment pod")
	return ""
}

func (d *demo) nodeReady(name string) string {
	n, err := d.kube.CoreV1().Nodes().Get(d.ctx, name, metav1.GetOptions{})
	d.must(err, "read node "+name)
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			if c.Status == corev1.ConditionTrue {
				return "still Ready (its lease has not expired yet)"
			}
			return "NotReady (" + c.Reason + ")"
		}
	}
	return "no Ready condition"
}

// 8. The closing picture.
func (d *demo) stepStatus() {
	d.step(10, nSteps, "image-refresh status")
	code, out, _ := d.imageRefresh("status", "--config", d.config)
	if code != 0 {
		d.failf("status exited %d", code)
	}
	// The release's targets and those adopted by their label (steps 6 and 7).
	want := len(targets) + 1
	if d.cluster.Real != nil {
		want += 2 // storefront's container and its migration, an init container
	}
	if n := strings.Count(out, " pinned "); n != want || strings.Contains(out, "fix:") {
		d.failf("status does not show every target pinned (%d of %d rows)", n, want)
	}
	if d.cluster.Real == nil {
		d.ok("every target pinned")
		return
	}
	if row := statusRow(out, "storefront/"+storefront.container); !strings.Contains(row, " pinned ") || !strings.HasSuffix(row, " 1/1 ") {
		d.failf("status does not show storefront pinned with its pod on the digest (step 7): %q", row)
	}
	if row := statusRow(out, "storefront/migrate"); !strings.Contains(row, " (init container) pinned ") || !strings.HasSuffix(row, " 1/1 ") {
		d.failf("status does not show storefront's migration pinned with its pod on the digest (step 7): %q", row)
	}
	d.ok("every target pinned; storefront's pod on %s runs the pinned build (1/1), its migration too", d.cluster.RealNodeName())
}

// running is the status state of t, with the states beside it as status
// shows them ("drifted (+running-stale)"), and its RUNNING (N1), from
// status -o json.
func (d *demo) running(t target) (state, running string) {
	code, out, _ := d.imageRefresh("status", "--config", d.config, "-o", "json")
	if code != 0 {
		d.failf("status exited %d", code)
	}
	var rows []map[string]any
	d.must(json.Unmarshal([]byte(out), &rows), "decode status -o json")
	for _, r := range rows {
		if strings.HasSuffix(fmt.Sprint(r["target"]), "/"+t.name+" container "+t.container) {
			state = fmt.Sprint(r["state"])
			also, _ := r["also"].([]any)
			for _, a := range also {
				if m, ok := a.(map[string]any); ok {
					state += fmt.Sprintf(" (+%v)", m["state"])
				}
			}
			return state, fmt.Sprint(r["running"])
		}
	}
	d.failf("status has no row for %s", t)
	return "", ""
}

func first(s []string) string {
	if len(s) == 0 {
		return "(none)"
	}
	return s[0]
}
