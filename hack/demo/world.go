package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/internal/cli"
	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// The demo chart's release, in the seed's shape: jobs-manager (api and a
// metrics sidecar), requests-proxy on the jobs-manager image, and the
// resource-monitor DaemonSet on every node.
const (
	namespace = "acme"
	release   = "acme"
	group     = "acme"
	tag       = "prod"
	prefix    = "image-refresh.io"
)

var keys = state.Keys{Prefix: prefix}

type target struct{ kind, name, container, image string }

func (t target) ref() config.Workload {
	return config.Workload{Kind: t.kind, Namespace: namespace, Name: t.name}
}
func (t target) String() string { return fmt.Sprintf("%s %s/%s", t.kind, t.name, t.container) }

var (
	images  = []string{"jobs-manager", "metrics", "resource-monitor"}
	api     = target{"Deployment", "jobs-manager", "api", "jobs-manager"}
	targets = []target{
		api,
		{"Deployment", "jobs-manager", "metrics", "metrics"},
		{"Deployment", "requests-proxy", "proxy", "jobs-manager"},
		{"DaemonSet", "resource-monitor", "monitor", "resource-monitor"},
	}
	workloads     = []config.Workload{api.ref(), targets[2].ref(), targets[3].ref()}
	monitorTarget = targets[3]
)

// configText is the image-refresh config: one group (the Helm release)
// anchored on jobs-manager, short timeouts so that the lockout story fits
// in a minute, and the registry under both its names.
func (d *demo) configText() string {
	var b strings.Builder
	fmt.Fprintf(&b, `annotationPrefix: %s
rolloutTimeout: 15s
registryTimeout: 5s
maxRefreshAttempts: 2
registries:
  - {host: "%s", insecure: true}
`, prefix, d.reg.Host())
	if d.nodeReg != "" {
		// The same registry under the name the real node uses (step 7).
		fmt.Fprintf(&b, "  - {host: \"%s\", insecure: true}\n", d.nodeReg)
	}
	fmt.Fprintf(&b, `groups:
  - name: %s
    anchor: {kind: Deployment, namespace: %s, name: jobs-manager}
    images:
`, group, namespace)
	for _, img := range images {
		fmt.Fprintf(&b, "      - name: %s\n        repository: %s\n        tag: %s\n        targets:\n", img, d.repo(img), tag)
		for _, t := range targets {
			if t.image == img {
				fmt.Fprintf(&b, "          - {kind: %s, namespace: %s, name: %s, container: %s}\n", t.kind, namespace, t.name, t.container)
			}
		}
	}
	return b.String()
}

// imageRefresh runs an image-refresh command in-process, exactly as the
// binary would, showing its output and logs as they come.
func (d *demo) imageRefresh(args ...string) (code int, stdout, logs string) {
	d.command("image-refresh " + strings.Join(args, " "))
	out, log := d.output(), d.output()
	root := cli.NewRoot(out, log)
	root.SetArgs(args)
	err := root.ExecuteContext(d.ctx)
	if err != nil {
		fmt.Fprintln(log, "image-refresh:", err)
	}
	out.Flush()
	log.Flush()
	code = cli.ExitCode(err)
	d.line("     ", fmt.Sprintf("→ exit %d", code))
	return code, out.String(), log.String()
}

// tick runs one tick, fails unless it exits with want, and lets the
// Deployments observe its annotation writes.
func (d *demo) tick(want int) string {
	code, _, logs := d.imageRefresh("tick", "--config", d.config)
	if code != want {
		d.failf("tick exited %d, want %d", code, want)
	}
	d.observed()
	return logs
}

// observed waits until the Deployments observed the last annotation write
// (each bumps a Deployment's generation), as the minutes between two
// CronJob ticks would; a tick right away would skip as "not settled" (R4).
func (d *demo) observed() {
	for _, w := range workloads[:2] {
		_, err := d.wl.WaitSettled(d.ctx, w, 30*time.Second)
		d.must(err, "wait for "+w.String())
	}
}

// settleAll waits until every workload of the release finished rolling out.
func (d *demo) settleAll(timeout time.Duration) {
	for _, w := range workloads {
		_, err := d.wl.WaitSettled(d.ctx, w, timeout)
		d.must(err, "wait for "+w.String()+" to settle")
	}
}

// live reads a target's container as the API server has it now.
func (d *demo) live(t target) workload.Container {
	obj, err := d.wl.Get(d.ctx, t.ref())
	d.must(err, "read "+t.ref().String())
	c, ok := obj.Container(t.container)
	if !ok {
		d.failf("%s has no container %s", t.ref(), t.container)
	}
	return c
}

// pinnedTo is the image a target runs once pinned (pinFormat tag+digest).
func (d *demo) pinnedTo(t target) string {
	return d.repo(t.image) + ":" + tag + "@" + d.digests[t.image]
}

// expectImages fails unless every target runs the image want gives it.
func (d *demo) expectImages(want func(target) string) {
	for _, t := range targets {
		if got := d.live(t).Image; got != want(t) {
			d.failf("%s runs %s, want %s", t, got, want(t))
		}
	}
}

// showImages prints every target's live image and who last wrote it.
func (d *demo) showImages(title string) {
	d.say("%s:", title)
	for _, t := range targets {
		c := d.live(t)
		img := strings.TrimPrefix(c.Image, d.reg.Host()+"/")
		if i := strings.IndexByte(img, '@'); i >= 0 {
			img = img[:i+1] + short(img[i+1:])
		}
		d.say("  %-36s %-50s (written by %s)", t, img, c.ImageManager)
	}
}

// expectRecords fails unless the anchor records the current digests.
func (d *demo) expectRecords() {
	a := d.anchor()
	for _, img := range images {
		if got := a[keys.Record(img)]; got != d.digests[img] {
			d.failf("anchor records %s=%q, want %s", keys.Record(img), got, d.digests[img])
		}
	}
}

func (d *demo) anchor() map[string]string {
	obj, err := d.wl.Get(d.ctx, api.ref())
	d.must(err, "read the anchor")
	return obj.Annotations
}

// rollouts counts, per workload, the pod templates it has run:
// ReplicaSets of a Deployment, ControllerRevisions of a DaemonSet.
func (d *demo) rollouts() map[string]int {
	out := map[string]int{}
	for _, w := range workloads {
		sel := metav1.ListOptions{LabelSelector: "app=" + w.Name}
		var n int
		if w.Kind == "Deployment" {
			l, err := d.kube.AppsV1().ReplicaSets(namespace).List(d.ctx, sel)
			d.must(err, "list ReplicaSets")
			n = len(l.Items)
		} else {
			l, err := d.kube.AppsV1().ControllerRevisions(namespace).List(d.ctx, sel)
			d.must(err, "list ControllerRevisions")
			n = len(l.Items)
		}
		out[w.Kind+" "+w.Name] = n
	}
	return out
}

// expectRollouts fails unless every workload rolled exactly n more times
// than in before, and prints the counts.
func (d *demo) expectRollouts(before map[string]int, n int, why string) map[string]int {
	after := d.rollouts()
	var parts []string
	for _, w := range workloads {
		k := w.Kind + " " + w.Name
		unit := "ReplicaSets"
		if w.Kind == "DaemonSet" {
			unit = "revisions"
		}
		parts = append(parts, fmt.Sprintf("%s %d→%d %s", w.Name, before[k], after[k], unit))
		if after[k]-before[k] != n {
			d.failf("%s rolled out %d times, want %d (%s)", k, after[k]-before[k], n, why)
		}
	}
	d.ok("%s: %s", why, strings.Join(parts, ", "))
	return after
}

// events returns the messages of the Events with reason on the anchor,
// oldest first.
func (d *demo) events(reason string) []string {
	l, err := d.kube.CoreV1().Events(namespace).List(d.ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.name=jobs-manager,reason=" + reason})
	d.must(err, "list events")
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].LastTimestamp.Before(&l.Items[j].LastTimestamp) })
	var out []string
	for _, e := range l.Items {
		out = append(out, e.Message)
	}
	return out
}
