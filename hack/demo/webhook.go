package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/image-refresh/image-refresh/internal/cli"
	"github.com/image-refresh/image-refresh/internal/pinwebhook"
	"github.com/image-refresh/image-refresh/test/support/freeport"
)

const (
	// managedLabel is the objectSelector label of docs/webhook.md.
	managedLabel = "image-refresh.io/managed"
	webhookName  = "image-refresh" // the MutatingWebhookConfiguration, --webhook-config-name
	pinsSeries   = "image_refresh_admission_pins_total"
	errorsSeries = "image_refresh_admission_errors_total"
)

// 4. B1: the same upgrade, with the webhook in front of the API server: the
// stored objects are pinned at admission, so no pod template ever holds the
// bare tag and each workload rolls out once.
func (d *demo) stepWebhook() {
	d.step(4, nSteps, "The same upgrade with the webhook: the tag never lands")
	d.say("Fix B: `image-refresh run --webhook-port` also serves a mutating admission webhook. The")
	d.say("API server sends it every write of a labelled workload before it stores the write, and")
	d.say("the webhook rewrites repo:%s to the digest recorded on the anchor (docs/webhook.md).", tag)

	d.say("The operator labels the workloads (the webhook's objectSelector; Helm keeps a label it does not render):")
	d.kubectl("-n", namespace, "label", "--overwrite", "deployment/jobs-manager", "deployment/requests-proxy",
		"daemonset/resource-monitor", managedLabel+"=true")

	port := freePort(d)
	manifest := filepath.Join(d.work, "webhook.yaml")
	d.must(os.WriteFile(manifest, []byte(webhookManifest(port)), 0o644), "write the webhook configuration")
	d.say("The MutatingWebhookConfiguration of docs/webhook.md, pointing at the process below instead of a")
	d.say("Service (failurePolicy: Ignore, so it never blocks a deploy; no caBundle yet, run fills it in):")
	d.kubectl("create", "-f", manifest)
	defer d.deleteWebhookConfig()

	ctl := d.startRun(port)
	defer ctl.stop(d)
	d.waitFor(30*time.Second, "run put its CA into the caBundle of "+webhookName, func() bool {
		mwc, err := d.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(d.ctx, webhookName, metav1.GetOptions{})
		return err == nil && strings.Contains(string(mwc.Webhooks[0].ClientConfig.CABundle), "BEGIN CERTIFICATE")
	}, ctl)
	d.ok("run put its self-signed CA into the caBundle (%s after start)", ms(time.Since(ctl.started)))
	d.waitFor(30*time.Second, "run ready (/readyz, with its webhook check)", func() bool {
		code, _ := httpGet("http://" + ctl.health + "/readyz")
		return code == http.StatusOK
	}, ctl)
	probe := []byte(fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":"proxy","image":%q}]}}}}`, d.repo("jobs-manager")+":"+tag))
	d.waitFor(30*time.Second, "the API server calls the webhook", func() bool {
		got, err := d.kube.AppsV1().Deployments(namespace).Patch(d.ctx, "requests-proxy", types.StrategicMergePatchType, probe,
			metav1.PatchOptions{FieldManager: "helm", DryRun: []string{metav1.DryRunAll}})
		return err == nil && got.Spec.Template.Spec.Containers[0].Image == d.pinnedTo(targets[2])
	}, ctl)
	d.say("Check it with a server-side dry run of a re-render (the command of docs/webhook.md):")
	out := d.kubectl("-n", namespace, "patch", "deployment", "requests-proxy", "--dry-run=server", "--field-manager", "helm",
		"-o", "jsonpath={.spec.template.spec.containers[0].image}{\"\\n\"}", "-p", string(probe))
	if strings.TrimSpace(out) != d.pinnedTo(targets[2]) {
		d.failf("the dry-run re-render came back as %q, want %s", strings.TrimSpace(out), d.pinnedTo(targets[2]))
	}
	d.ok("the dry-run re-render to the tag comes back pinned: the API server calls the webhook")

	pins0, errs0 := ctl.metric(d, pinsSeries), ctl.metric(d, errorsSeries)
	rs := d.rollouts()
	bare0 := d.bareTemplates()
	stored := d.watchStored()

	d.say("The same routine upgrade (the next config revision). Step 3's re-pin made field manager")
	d.say("\"image-refresh\" the owner of the image fields again, so Helm 4's server-side apply would")
	d.say("conflict exactly as in step 3: --force-conflicts hands the fields to helm, and the webhook")
	d.say("rewrites the value helm applies before the API server stores it.")
	_, err := d.helm.run(d.ctx, releaseArgs("upgrade", d.o.chart, "", "--reuse-values", "--set", "revision=3", "--force-conflicts")...)
	d.must(err, "helm upgrade --force-conflicts")
	d.expectImages(d.pinnedTo)
	for _, t := range targets {
		if m := d.live(t).ImageManager; m != "helm" {
			d.failf("%s image last written by %q, want helm (the webhook pins helm's own write)", t, m)
		}
	}
	d.showImages("stored right after helm returned")
	d.settleAll(60 * time.Second)
	writes, templateWrites, bare := stored.stop()
	if len(bare) > 0 {
		d.failf("stored objects held the bare tag during the upgrade: %s", strings.Join(bare, "; "))
	}
	if len(templateWrites) != len(workloads) {
		d.failf("the pod templates were written %d times during the upgrade (%s), want %d: helm's apply, once per workload",
			len(templateWrites), strings.Join(templateWrites, ", "), len(workloads))
	}
	d.ok("watched: the API server stored %d versions of the 3 workloads during the upgrade and its rollouts;", writes)
	d.ok("%d changed a pod template (helm's apply, one per workload) and none held a bare tag", len(templateWrites))
	bare1 := d.bareTemplates()
	var added []string
	for n := range bare1 {
		if !bare0[n] {
			added = append(added, n)
		}
	}
	if len(added) > 0 {
		sort.Strings(added)
		d.failf("this upgrade created pod templates with the bare tag: %s", strings.Join(added, ", "))
	}
	d.ok("ReplicaSets and DaemonSet revisions with a bare tag: %d before the upgrade (install, step 3), %d after: none new", len(bare0), len(bare1))
	d.expectRollouts(rs, 1, "one rollout each, straight to the digests (step 3 needed two)")
	d.expectImages(d.pinnedTo)

	pins, errs := ctl.metric(d, pinsSeries)-pins0, ctl.metric(d, errorsSeries)-errs0
	if pins != float64(len(targets)) || errs != 0 {
		d.failf("%s grew by %v (want %d, one per target container), %s by %v (want 0)", pinsSeries, pins, len(targets), errorsSeries, errs)
	}
	for _, l := range ctl.series(d, pinsSeries+"{") {
		d.say("  %s", l)
	}
	d.webhookPins = pins
	d.ok("%s grew by %v: one pin per target container, 0 admission errors (nothing failed open)", pinsSeries, pins)
	if logs := ctl.logs(); strings.Contains(logs, "is not on the pinned digest") || strings.Contains(logs, "re-pinned") {
		d.failf("fix A had a revert to re-pin; the webhook should have prevented it (run's log: %s)", ctl.logFile)
	}
	d.ok("fix A (the same run process, watching) found nothing to re-pin")

	if done, how := ctl.exited(); done {
		d.failf("run exited before the end of the step (%s); its log: %s", how, ctl.logFile)
	}
	ctl.stop(d)
	if done, how := ctl.exited(); !done || ctl.code != 0 {
		d.failf("run did not stop cleanly when its context ended (%s); its log: %s", how, ctl.logFile)
	}
	d.ok("run stopped cleanly (exit 0, %s after its context ended, as on SIGTERM); its log: %s", ms(ctl.stopped), ctl.logFile)
	d.deleteWebhookConfig()
	d.ok("MutatingWebhookConfiguration %s deleted: the next steps show fix A alone", webhookName)
}

// webhookManifest is the MutatingWebhookConfiguration of docs/webhook.md,
// with a URL on loopback in place of the Service: run is a process of the
// demo, not a pod.
func webhookManifest(port int) string {
	return fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: %s
webhooks:
  - name: workloads.image-refresh.io
    admissionReviewVersions: ["v1"]
    clientConfig:
      url: https://127.0.0.1:%d%s
    rules:
      - apiGroups: ["apps"]
        apiVersions: ["v1"]
        resources: ["deployments", "daemonsets", "statefulsets"]
        operations: ["CREATE", "UPDATE"]
        scope: Namespaced
    objectSelector:
      matchLabels: {%s: "true"}
    namespaceSelector:
      matchExpressions:
        - {key: kubernetes.io/metadata.name, operator: In, values: ["%s"]}
    failurePolicy: Ignore
    sideEffects: None
    timeoutSeconds: 3
    reinvocationPolicy: IfNeeded
    matchPolicy: Equivalent
`, webhookName, port, pinwebhook.Path, managedLabel, namespace)
}

// deleteWebhookConfig removes the configuration; also on the way out of a
// failed step, so it must not panic.
func (d *demo) deleteWebhookConfig() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = d.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, webhookName, metav1.DeleteOptions{})
}

// kubectl runs the real kubectl (built by hack/build-cluster.sh) against
// the demo cluster, showing the command and its output.
func (d *demo) kubectl(args ...string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = shellQuote(a)
	}
	d.command("kubectl " + strings.Join(quoted, " "))
	cmd := exec.CommandContext(d.ctx, filepath.Join(d.o.binDir, "kubectl"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+d.cluster.Kubeconfig)
	out := d.output()
	cmd.Stdout, cmd.Stderr = out, out
	err := cmd.Run()
	out.Flush()
	d.must(err, "kubectl "+args[0])
	return out.String()
}

// shellQuote quotes a word for a POSIX shell when it needs it, so that a
// printed command runs as shown when pasted.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:=@%+,-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// controller is `image-refresh run` running in-process in the background.
type controller struct {
	cancel          context.CancelFunc
	done            chan struct{}
	started         time.Time
	stopped         time.Duration
	metrics, health string
	logFile         string
	log             *os.File
	stopOnce        sync.Once

	mu      sync.Mutex
	code    int
	exitErr error
}

// startRun starts `image-refresh run` with the webhook on port, in the
// background; its log goes to a file in the work directory.
func (d *demo) startRun(port int) *controller {
	c := &controller{done: make(chan struct{}), metrics: freeAddr(d), health: freeAddr(d),
		logFile: filepath.Join(d.work, "run.log")}
	f, err := os.Create(c.logFile)
	d.must(err, "create run's log file")
	c.log = f
	args := []string{"run", "--config", d.config, "--poll-interval", "1h",
		"--webhook-port", strconv.Itoa(port), "--webhook-host", "127.0.0.1", "--webhook-config-name", webhookName,
		"--metrics-addr", c.metrics, "--health-addr", c.health}
	d.command("image-refresh " + strings.Join(args, " ") + " &")
	d.say("  (in the background; its log: %s)", c.logFile)
	ctx, cancel := context.WithCancel(d.ctx)
	c.cancel = cancel
	root := cli.NewRoot(f, f)
	root.SetArgs(args)
	c.started = time.Now()
	go func() {
		defer close(c.done)
		err := root.ExecuteContext(ctx)
		if err != nil {
			fmt.Fprintln(f, "image-refresh:", err)
		}
		c.mu.Lock()
		c.code, c.exitErr = cli.ExitCode(err), err
		c.mu.Unlock()
	}()
	return c
}

// exited reports how run ended, if it did.
func (c *controller) exited() (bool, string) {
	select {
	case <-c.done:
		c.mu.Lock()
		defer c.mu.Unlock()
		return true, fmt.Sprintf("exit %d: %v", c.code, c.exitErr)
	default:
		return false, ""
	}
}

// stop cancels run's context, as SIGTERM does, and waits for it; a second
// call does nothing. It must not panic (it runs on the way out of a failed
// step too).
func (c *controller) stop(d *demo) {
	c.stopOnce.Do(func() {
		start := time.Now()
		c.cancel()
		select {
		case <-c.done:
		case <-time.After(30 * time.Second):
			d.line("", "run did not stop within 30 s of its context's end")
		}
		c.stopped = time.Since(start)
		_ = c.log.Close()
	})
}

func (c *controller) logs() string {
	b, _ := os.ReadFile(c.logFile)
	return string(b)
}

// series returns the lines of run's /metrics that start with prefix.
func (c *controller) series(d *demo, prefix string) []string {
	code, body := httpGet("http://" + c.metrics + "/metrics")
	if code != http.StatusOK {
		d.failf("scrape run's /metrics: %d %s", code, body)
	}
	var out []string
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			out = append(out, sc.Text())
		}
	}
	return out
}

// metric sums every series of name on run's /metrics (0 when absent).
func (c *controller) metric(d *demo, name string) float64 {
	var sum float64
	for _, l := range c.series(d, name) {
		i := strings.LastIndexByte(l, ' ')
		if rest := l[len(name):i]; rest != "" && rest[0] != '{' {
			continue // another metric whose name starts with name
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err != nil {
			d.failf("metric %q: %v", l, err)
		}
		sum += v
	}
	return sum
}

// waitFor polls cond until it holds; it fails the demo after timeout, or
// at once when run exited.
func (d *demo) waitFor(timeout time.Duration, what string, cond func() bool, c *controller) {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if done, how := c.exited(); done {
			d.failf("%s: run exited (%s); its log: %s", what, how, c.logFile)
		}
		if time.Now().After(deadline) || d.ctx.Err() != nil {
			d.failf("%s: not within %s; run's log: %s", what, timeout, c.logFile)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func httpGet(url string) (int, string) {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func freeAddr(d *demo) string {
	a, err := freeport.Addr()
	d.must(err, "find a free port")
	return a
}

func freePort(d *demo) int {
	_, p, _ := net.SplitHostPort(freeAddr(d))
	n, _ := strconv.Atoi(p)
	return n
}

// bareTemplates names the ReplicaSets and DaemonSet ControllerRevisions of
// the release whose pod template runs a target image on the bare tag.
func (d *demo) bareTemplates() map[string]bool {
	bareImage := map[string]bool{}
	for _, img := range images {
		bareImage[d.repo(img)+":"+tag] = true
	}
	out := map[string]bool{}
	rss, err := d.kube.AppsV1().ReplicaSets(namespace).List(d.ctx, metav1.ListOptions{})
	d.must(err, "list ReplicaSets")
	for _, rs := range rss.Items {
		for _, c := range rs.Spec.Template.Spec.Containers {
			if bareImage[c.Image] {
				out["ReplicaSet "+rs.Name] = true
			}
		}
	}
	crs, err := d.kube.AppsV1().ControllerRevisions(namespace).List(d.ctx, metav1.ListOptions{})
	d.must(err, "list ControllerRevisions")
	for _, cr := range crs.Items {
		var data struct {
			Spec struct {
				Template struct {
					Spec struct {
						Containers []struct {
							Image string `json:"image"`
						} `json:"containers"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		d.must(json.Unmarshal(cr.Data.Raw, &data), "decode ControllerRevision "+cr.Name)
		if len(data.Spec.Template.Spec.Containers) == 0 {
			d.failf("ControllerRevision %s holds no pod template", cr.Name)
		}
		for _, c := range data.Spec.Template.Spec.Containers {
			if bareImage[c.Image] {
				out["ControllerRevision "+cr.Name] = true
			}
		}
	}
	return out
}

// storedWatch records every version of the release's workloads the API
// server stores while it runs.
type storedWatch struct {
	ws             []watch.Interface
	wg             sync.WaitGroup
	mu             sync.Mutex
	writes         int      // stored versions, status updates included
	templateWrites []string // writes that changed a pod template
	bare           []string // stored versions with a target on the bare tag
	template       map[string]string
}

// watchStored starts watching the Deployments and the DaemonSet from their
// current resource version.
func (d *demo) watchStored() *storedWatch {
	s := &storedWatch{template: map[string]string{}}
	isTarget := map[string]bool{}
	for _, t := range targets {
		isTarget[t.kind+"/"+t.name+"/"+t.container] = true
	}
	bareImage := map[string]bool{}
	for _, img := range images {
		bareImage[d.repo(img)+":"+tag] = true
	}
	key := func(kind, name string) string { return kind + "/" + name }
	encode := func(t corev1.PodTemplateSpec) string { b, _ := json.Marshal(t); return string(b) }
	apps := d.kube.AppsV1()
	deps, err := apps.Deployments(namespace).List(d.ctx, metav1.ListOptions{})
	d.must(err, "list Deployments")
	dss, err := apps.DaemonSets(namespace).List(d.ctx, metav1.ListOptions{})
	d.must(err, "list DaemonSets")
	for _, o := range deps.Items {
		s.template[key("Deployment", o.Name)] = encode(o.Spec.Template)
	}
	for _, o := range dss.Items {
		s.template[key("DaemonSet", o.Name)] = encode(o.Spec.Template)
	}
	wd, err := apps.Deployments(namespace).Watch(d.ctx, metav1.ListOptions{ResourceVersion: deps.ResourceVersion})
	d.must(err, "watch Deployments")
	wds, err := apps.DaemonSets(namespace).Watch(d.ctx, metav1.ListOptions{ResourceVersion: dss.ResourceVersion})
	d.must(err, "watch DaemonSets")
	s.ws = []watch.Interface{wd, wds}
	for _, w := range s.ws {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for ev := range w.ResultChan() {
				var kind, name, rv string
				var tmpl corev1.PodTemplateSpec
				switch o := ev.Object.(type) {
				case *appsv1.Deployment:
					kind, name, rv, tmpl = "Deployment", o.Name, o.ResourceVersion, o.Spec.Template
				case *appsv1.DaemonSet:
					kind, name, rv, tmpl = "DaemonSet", o.Name, o.ResourceVersion, o.Spec.Template
				default:
					continue
				}
				s.mu.Lock()
				s.writes++
				if t := encode(tmpl); t != s.template[key(kind, name)] {
					s.template[key(kind, name)] = t
					s.templateWrites = append(s.templateWrites, kind+" "+name)
				}
				for _, c := range tmpl.Spec.Containers {
					if isTarget[kind+"/"+name+"/"+c.Name] && bareImage[c.Image] {
						s.bare = append(s.bare, fmt.Sprintf("%s %s container %s = %s (resourceVersion %s)", kind, name, c.Name, c.Image, rv))
					}
				}
				s.mu.Unlock()
			}
		}()
	}
	return s
}

// stop ends the watches and returns what they saw.
func (s *storedWatch) stop() (writes int, templateWrites, bare []string) {
	for _, w := range s.ws {
		w.Stop()
	}
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes, s.templateWrites, s.bare
}
