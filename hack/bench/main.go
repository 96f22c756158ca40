// Command bench is `make bench`: it measures image-refresh's long-running
// mode (`run`, C1–C5) on a local cluster of its own (etcd,
// kube-apiserver, controller-manager, scheduler, kwok nodes) and a
// registry on loopback, and prints a table of figures, each the median of
// repeated runs with its spread, as aligned text and as markdown for
// docs/performance.md:
//
//  1. latency: revert → re-pin latency (p50/p99 over -reverts reverts);
//  2. stuck: the same with another group's rollout stuck, against alone;
//  3. propagate: a new digest → all 20 and all 100 targets of one
//     repo:tag changed, from the poll that saw it and from the push;
//     promote: the end of a leader group's soak → every target of its
//     follower changed (P1: run's timer, not a poll); promote-across: a
//     promotion attestation published by one installation → every target
//     of another installation's follower changed (P2);
//  4. registry: registry HEADs per poll interval for 1, 20 and 200
//     targets of one repo:tag;
//     pollcost: the same sizes, by request kind (HEAD, ping, token) and new
//     TCP connection, against the ggcr test registry and Distribution with
//     htpasswd and with auth.token; it needs no cluster, and run alone
//     (-phases pollcost) starts none;
//  5. steady: API requests per minute by verb in steady state, 20
//     workloads (the scale phase adds 1,000);
//  6. scale: -workloads (default 10,000) zero-replica workloads: steady
//     state over the first 1,000, manager start → caches synced, a full
//     resync pass and its API requests, process memory; then one
//     controller over all of them: steady state over all, and revert →
//     re-pin over -scale-reverts reverts with the API requests per revert.
//     -large-cluster sizes the cluster for 100,000 (`make bench-100k`;
//     largeCluster in cluster.go says how and why);
//  7. soak (not in the default phases; `make soak`): -workloads
//     Deployments under -soak-for of seeded random reverts, digest pushes,
//     registry 5xx/429 bursts and one kube-apiserver restart, then checks
//     convergence, rollouts against their bound, ReplicaSets per workload,
//     and that heap and goroutines stayed flat (soak.go).
//
// The controller is built in-process by operator.NewManager, the
// constructor internal/cli/run.go uses, with its rest.Config transport
// wrapped to count API requests by verb and the poller's OnChange wrapped
// to timestamp the polls that saw a change.
//
//	go run ./hack/bench [-bin-dir DIR] [-reverts 100] [-workloads 10000] [-phases latency,stuck,propagate,promote,promote-across,registry,pollcost,steady,scale]
//	go run ./hack/bench -phases soak -soak-for 20m -workloads 500 -seed 1
//	go run ./hack/bench -phases scale -workloads 100000 -resync-runs 2 -create-workers 64 -large-cluster
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
)

type options struct {
	binDir, runDir, phases string
	costInterval           time.Duration
	keepRunDir             bool
	reverts                int
	pollInterval           time.Duration
	intervals              int
	steadyInterval         time.Duration
	steadyFor              time.Duration
	workloads              int
	resyncRuns             int
	pushes                 int
	stuckReverts           int
	soakFor                time.Duration
	seed                   uint64
	resyncProfile          string
	heapProfile            string
	latencyProfile         string
	scaleReverts           int
	createWorkers          int
	largeCluster           bool
}

func main() {
	var o options
	flag.StringVar(&o.binDir, "bin-dir", "", "directory of the cluster binaries (default: the output of hack/build-cluster.sh)")
	flag.StringVar(&o.phases, "phases", "latency,stuck,propagate,promote,promote-across,registry,pollcost,steady,scale", "measurements to run, comma-separated")
	flag.DurationVar(&o.costInterval, "pollcost-interval", time.Second, "poll interval of the pollcost measurement (it counts -registry-intervals intervals)")
	flag.IntVar(&o.reverts, "reverts", 100, "reverts timed for the revert → re-pin latency")
	flag.DurationVar(&o.pollInterval, "registry-interval", 2*time.Second, "poll interval of the registry measurement")
	flag.IntVar(&o.intervals, "registry-intervals", 6, "poll intervals counted per size in the registry measurement")
	flag.DurationVar(&o.steadyInterval, "steady-interval", 10*time.Second, "--poll-interval of the steady-state measurement")
	flag.DurationVar(&o.steadyFor, "steady-for", 60*time.Second, "how long the steady-state measurement counts")
	flag.IntVar(&o.resyncRuns, "resync-runs", 3, "controllers started (start time, resync pass, memory) over the scale workloads")
	flag.IntVar(&o.pushes, "pushes", 5, "new digests pushed per group size in the propagate phase, and in the promote phase")
	flag.IntVar(&o.stuckReverts, "stuck-reverts", 30, "reverts timed alone and again with another group stuck rolling")
	o.workloads = 10000
	if v := os.Getenv("BENCH_WORKLOADS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "BENCH_WORKLOADS=%q: want a positive integer\n", v)
			os.Exit(2)
		}
		o.workloads = n
	}
	flag.IntVar(&o.workloads, "workloads", o.workloads, "workloads of the scale phase (zero-replica) and of the soak phase ($BENCH_WORKLOADS sets the default)")
	flag.DurationVar(&o.soakFor, "soak-for", 20*time.Minute, "how long the soak phase's schedule of events runs")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the soak phase's random schedule of events")
	flag.StringVar(&o.resyncProfile, "resync-cpuprofile", "", "write a CPU profile of the scale phase's last resync pass to this file")
	flag.StringVar(&o.heapProfile, "scale-heapprofile", "", "write a heap profile of the scale phase's last controller, after its first passes and a GC, to this file (go tool pprof -sample_index=inuse_space)")
	flag.StringVar(&o.latencyProfile, "latency-cpuprofile", "", "write a CPU profile of the latency phase's revert series to this file")
	flag.IntVar(&o.scaleReverts, "scale-reverts", 30, "reverts timed in the scale phase, over all -workloads, with the controller running over them")
	flag.IntVar(&o.createWorkers, "create-workers", 16, "Deployments the scale phase creates at a time")
	flag.BoolVar(&o.largeCluster, "large-cluster", false, "size the local cluster for 100,000 workloads: etcd quota 8 GiB, apiserver in-flight limits, kube-controller-manager 2000 QPS and 50 deployment/ReplicaSet workers (`make bench-100k`)")
	flag.BoolVar(&o.keepRunDir, "keep-run-dir", false, "keep the run directory (cluster logs, controller.log) after a successful run")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, o)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, o options) int {
	began := time.Now()
	if o.binDir == "" {
		cmd := exec.CommandContext(ctx, "hack/build-cluster.sh")
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			progress("hack/build-cluster.sh: %v", err)
			return 1
		}
		o.binDir = strings.TrimSpace(string(out))
	}
	if !needsCluster(o.phases) {
		return runWithoutCluster(ctx, o, began)
	}
	runDir, err := os.MkdirTemp("", "image-refresh-bench-")
	if err != nil {
		progress("%v", err)
		return 1
	}
	w, err := startWorld(ctx, o.binDir, runDir, o.largeCluster)
	if err != nil {
		progress("%v", err)
		return 1
	}
	// The engine's and controller-runtime's log lines go to controller.log
	// in the run directory.
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(w.log, nil)))
	var rows []row
	failed, interrupted := false, false
	for _, phase := range strings.Split(o.phases, ",") {
		var got []row
		t := time.Now()
		progress("── %s", phase)
		switch strings.TrimSpace(phase) {
		case "latency":
			got, err = measureLatency(ctx, w, o.reverts, o.latencyProfile)
		case "registry":
			got, err = measureRegistry(ctx, w, o.pollInterval, o.intervals)
		case "steady":
			got, err = measureSteady(ctx, w, o.steadyInterval, o.steadyFor)
		case "scale":
			got, err = measureScale(ctx, w, scaleOptions{workloads: o.workloads, runs: o.resyncRuns, reverts: o.scaleReverts,
				steadyInterval: o.steadyInterval, steadyFor: o.steadyFor, profile: o.resyncProfile, heapProfile: o.heapProfile, createWorkers: o.createWorkers})
		case "stuck":
			got, err = measureStuck(ctx, w, o.stuckReverts)
		case "propagate":
			got, err = measurePropagate(ctx, w, o.pushes)
		case "promote":
			got, err = measurePromote(ctx, w, o.pushes)
		case "promote-across":
			got, err = measurePromoteAcross(ctx, w, o.pushes)
		case "pollcost":
			got, err = measurePollCost(ctx, o.costInterval, o.intervals)
		case "soak":
			got, err = measureSoak(ctx, w, soakOptions{duration: o.soakFor, workloads: o.workloads, seed: o.seed})
		default:
			err = fmt.Errorf("unknown phase %q (want latency, stuck, propagate, promote, promote-across, registry, pollcost, steady, scale, soak)", phase)
		}
		rows = append(rows, got...) // a failed phase may still have figures (the soak's checks)
		if ctx.Err() != nil {
			progress("interrupted")
			interrupted = true
			break
		}
		if err != nil {
			progress("%s: FAILED: %v", phase, err)
			failed = true
			break
		}
		progress("%s: done in %s", phase, since(t))
	}
	w.stop()
	if (failed || o.keepRunDir) && !interrupted {
		progress("run directory kept: %s", runDir)
	} else {
		_ = os.RemoveAll(runDir)
	}
	if len(rows) > 0 {
		printReport(rows, began)
	}
	if failed || interrupted {
		return 1
	}
	return 0
}

// needsCluster reports whether a phase other than pollcost is asked for.
func needsCluster(phases string) bool {
	for _, p := range strings.Split(phases, ",") {
		if strings.TrimSpace(p) != "pollcost" {
			return true
		}
	}
	return false
}

// runWithoutCluster runs the pollcost phase alone, with no cluster to
// start.
func runWithoutCluster(ctx context.Context, o options, began time.Time) int {
	progress("── pollcost")
	t := time.Now()
	rows, err := measurePollCost(ctx, o.costInterval, o.intervals)
	if err != nil {
		progress("pollcost: FAILED: %v", err)
		return 1
	}
	progress("pollcost: done in %s", since(t))
	printReport(rows, began)
	return 0
}

// printReport prints the figures as aligned text and as markdown for
// docs/performance.md.
func printReport(rows []row, began time.Time) {
	fmt.Printf("\nimage-refresh run — measured %s on %s (%d CPUs, %s), %s, total %s\n\n",
		time.Now().Format("2006-01-02"), cpuModel(), runtime.NumCPU(), runtime.GOOS+"/"+runtime.GOARCH, runtime.Version(), since(began))
	printText(os.Stdout, rows)
	fmt.Println("\nmarkdown:")
	fmt.Println()
	printMarkdown(os.Stdout, rows)
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}
