// Command demo is `make demo`: image-refresh's main job, narrated, on the
// embedded local cluster (hack/build-cluster.sh) and a loopback registry.
// It installs hack/demo-chart with the real Helm CLI, then runs the real
// image-refresh commands in-process and checks that every step shows what
// it narrates: any surprise exits non-zero, so the demo is also an
// end-to-end check.
//
// Steps 7, 8 and 9 run on a real node (a kubelet with containerd, docs/local-cluster.md),
// which needs root and the packages of hack/install-real-node.sh;
// -real-node=false (make demo REAL_NODES=0) leaves it out.
//
//	go run ./hack/demo [-bin-dir DIR] [-run-dir DIR] [-real-node=false] [-localcluster BIN]   # KEEP=1 keeps the cluster
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/localcluster"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

type options struct {
	binDir, runDir, chart string
	keep                  bool
	realNode              bool
	localcluster          string // the hack/localcluster binary, for KEEP=1 with the real node
}

func main() {
	var o options
	flag.StringVar(&o.binDir, "bin-dir", "", "directory of the cluster binaries and helm (default: the output of hack/build-cluster.sh)")
	flag.StringVar(&o.runDir, "run-dir", "", "with KEEP=1: run directory of the kept cluster, the one `make cluster-down` stops (required then)")
	flag.StringVar(&o.chart, "chart", "hack/demo-chart", "the demo Helm chart")
	flag.BoolVar(&o.realNode, "real-node", true, "start the real node (root, hack/install-real-node.sh) and run steps 7, 8 and 9 on it")
	flag.StringVar(&o.localcluster, "localcluster", "", "with KEEP=1 and the real node: the hack/localcluster binary, whose node-forward keeps the kept cluster's real node reachable (make demo passes bin/localcluster)")
	flag.Parse()
	o.keep = os.Getenv("KEEP") != "" && os.Getenv("KEEP") != "0"

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, o)
	stop()
	os.Exit(code)
}

// demo is the world the story happens in.
type demo struct {
	*narrator
	ctx context.Context
	o   options

	work    string // config file and Helm's homes
	cluster *localcluster.Cluster
	kube    kubernetes.Interface
	wl      *workload.Client
	reg     *testregistry.Server
	nodeReg string // the registry as the real node, its pods and the host reach it
	helm    *helm
	config  string
	digests map[string]string // image name → the digest :prod points to now
	// staleBuild is the resource-monitor build node-2 keeps for :prod.
	staleBuild string

	repinLatency time.Duration
	conflict     string  // Helm's field-manager conflict, if it hit one
	webhookPins  float64 // admission pins of the upgrade of step 4
}

// failure is how a step that did not show what it narrates ends the demo.
type failure struct{ msg string }

func (d *demo) failf(format string, args ...any) {
	if d.ctx.Err() != nil {
		panic(failure{"interrupted"})
	}
	panic(failure{fmt.Sprintf(format, args...)})
}

func (d *demo) must(err error, what string) {
	if err != nil {
		d.failf("%s: %v", what, err)
	}
}

func run(ctx context.Context, o options) (code int) {
	d := &demo{narrator: newNarrator(os.Stdout), ctx: ctx, o: o, digests: map[string]string{}}
	defer d.cleanup(&code)
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(failure)
			if !ok {
				panic(r)
			}
			d.line("", "")
			d.line("✘ ", "DEMO FAILED: "+f.msg)
			code = 1
		}
	}()
	d.setup()
	d.say("The IDs in parentheses (R5, N1, …) name the rules the demo shows; each is explained in docs/rules.md.")
	steps := []func(){d.stepPin, d.stepNewDigest, d.stepHelmUpgrade, d.stepWebhook, d.stepNodeDown, d.stepAdopt, d.stepRealNode, d.stepSafety, d.stepPromotion, d.stepStatus}
	for _, step := range steps {
		step()
	}
	d.line("", "")
	d.line("", fmt.Sprintf("━━ done in %s: every step showed what it narrated", time.Since(d.start).Round(100*time.Millisecond)))
	d.say("helm upgrade returned → every target re-pinned: %s", ms(d.repinLatency))
	d.say("the same upgrade with the webhook: %v admission pins, no bare tag stored, one rollout each", d.webhookPins)
	if d.cluster.Real != nil {
		d.say("on %s, a real node: a new pod ran the cached build A of :%s after the tag moved; pinned, it runs B", d.cluster.RealNodeName(), tag)
	}
	return 0
}

// setup starts the cluster and the registry, pushes the images, installs
// the chart with Helm and writes the image-refresh config.
func (d *demo) setup() {
	nodes := "3 kwok nodes"
	if d.o.realNode {
		nodes += " and a real one"
	}
	d.line("", "━━ setup: a local cluster ("+nodes+"), a loopback registry, the chart installed with Helm")
	if d.o.binDir == "" {
		d.say("hack/build-cluster.sh (builds the cluster binaries and helm once; later runs reuse them)")
		cmd := exec.CommandContext(d.ctx, "hack/build-cluster.sh")
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		d.must(err, "hack/build-cluster.sh")
		d.o.binDir = strings.TrimSpace(string(out))
	}
	runDir := d.runDir()
	d.work = filepath.Join(runDir, "demo")
	d.must(os.MkdirAll(d.work, 0o755), "create the work directory")

	log := d.output()
	opts := localcluster.Options{BinDir: d.o.binDir, RunDir: runDir, Detach: d.o.keep, Log: log}
	if d.o.realNode {
		opts.RealNodes = 1
		if d.o.keep {
			// The real node reaches the API server through a forwarder that
			// must outlive the demo: hack/localcluster's, as cluster-up runs it.
			if d.o.localcluster == "" {
				d.failf("KEEP=1 with the real node needs -localcluster (make demo passes bin/localcluster)")
			}
			opts.ForwardCommand = []string{d.o.localcluster, "node-forward"}
		}
	}
	c, err := localcluster.Start(d.ctx, opts)
	log.Flush()
	d.must(err, "start the local cluster")
	d.cluster, d.kube = c, c.Client
	d.wl = workload.New(c.Client, 15*time.Second)
	// The image-refresh commands below run exactly as printed, as they would
	// from a shell with this kubeconfig exported.
	d.must(os.Setenv("KUBECONFIG", c.Kubeconfig), "set KUBECONFIG")

	d.reg = testregistry.New()
	d.must(d.reg.Start("127.0.0.1:0"), "start the registry")
	d.ok("registry on http://%s", d.reg.Host())
	if c.Real != nil {
		_, port, _ := strings.Cut(d.reg.Host(), ":")
		p, err := strconv.Atoi(port)
		d.must(err, "the registry's port")
		d.nodeReg, err = c.Expose(p)
		d.must(err, "expose the registry to "+c.RealNodeName())
		d.ok("the same registry as %s's containerd and pods reach it: http://%s", c.RealNodeName(), d.nodeReg)
	}
	for _, img := range images {
		d.push(img)
	}
	// The seed's incident: node-2 pulled resource-monitor:prod before the
	// tag moved, and its runtime keeps running that build for the tag.
	monitor := d.repo(monitorTarget.image) + ":" + tag
	d.staleBuild = d.digests[monitorTarget.image]
	d.must(c.SetNodeImageCache("node-2", monitor, d.digests[monitorTarget.image]), "make node-2's image cache stale")
	d.push(monitorTarget.image)
	d.say("node-2 pulled %s before the tag moved: its cache still holds the old build.", monitor)

	d.helm = &helm{n: d.narrator, bin: filepath.Join(d.o.binDir, "helm"), kubeconfig: c.Kubeconfig, home: filepath.Join(d.work, "helm")}
	_, err = d.helm.run(d.ctx, releaseArgs("install", d.o.chart, d.reg.Host())...)
	d.must(err, "helm install")
	d.settleAll(60 * time.Second)
	d.showImages("installed, every target on the floating tag")
	d.expectImages(func(t target) string { return d.repo(t.image) + ":" + tag })

	d.config = filepath.Join(d.work, "config.yaml")
	text := d.configText()
	d.must(os.WriteFile(d.config, []byte(text), 0o644), "write the config")
	d.say("image-refresh config (%s):", d.config)
	for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		d.line("       ", l)
	}
}

// runDir is a fresh temporary directory, or with KEEP=1 the Makefile's run
// directory, so that `make cluster-down` stops what the demo leaves running.
func (d *demo) runDir() string {
	if !d.o.keep {
		dir, err := os.MkdirTemp("", "image-refresh-demo-")
		d.must(err, "create the run directory")
		return dir
	}
	if d.o.runDir == "" {
		d.failf("KEEP=1 needs -run-dir (make demo passes $(RUN_DIR))")
	}
	if c, err := localcluster.Attach(d.o.runDir); err == nil && len(c.Processes()) > 0 {
		d.failf("a cluster already runs from %s; stop it with `make cluster-down` first", d.o.runDir)
	}
	d.must(os.RemoveAll(d.o.runDir), "clear the run directory")
	return d.o.runDir
}

// cleanup stops every process the demo started, unless KEEP=1 asked to
// leave the cluster running.
func (d *demo) cleanup(code *int) {
	if d.reg != nil {
		_ = d.reg.Close()
	}
	if d.cluster == nil {
		return
	}
	d.line("", "")
	if d.o.keep {
		d.line("", "━━ KEEP=1: the cluster keeps running ("+d.cluster.RunDir+")")
		d.say("export KUBECONFIG=%s", d.cluster.Kubeconfig)
		d.say("export PATH=%s:$PATH   # kubectl and helm, built for this cluster", d.o.binDir)
		d.say("kubectl -n %s get deploy,ds,rs,pods -o wide", namespace)
		d.say("The registry ran inside the demo and stopped with it: image-refresh ticks")
		d.say("against %s would now fail to resolve.", d.config)
		d.say("Stop the cluster: make cluster-down RUN_DIR=%s", d.cluster.RunDir)
		return
	}
	if err := d.cluster.Stop(); err != nil {
		d.line("", "stop the cluster: "+err.Error())
		*code = 1
	}
	if *code == 0 || d.ctx.Err() != nil {
		_ = os.RemoveAll(d.cluster.RunDir)
		d.line("", "cluster and registry stopped; nothing left running")
	} else {
		d.line("", "cluster and registry stopped; cluster logs kept in "+filepath.Join(d.cluster.RunDir, "logs"))
	}
}

// push publishes a new build of img under :prod.
func (d *demo) push(img string) {
	digest, err := d.reg.PushRandomImage("acme/"+img, tag)
	d.must(err, "push "+img)
	if old := d.digests[img]; old != "" {
		d.ok("pushed %s:%s  %s → %s", d.repo(img), tag, short(old), short(digest))
	} else {
		d.ok("pushed %s:%s  %s", d.repo(img), tag, short(digest))
	}
	d.digests[img] = digest
}

func (d *demo) repo(img string) string { return d.reg.Host() + "/acme/" + img }
