package localcluster_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/internal/localcluster"
	"github.com/image-refresh/image-refresh/internal/testenv"
)

// machineState is what a real node changes on the machine and must put
// back: network namespaces, the node's cgroups, mounts, host routes and
// iptables rules, the kubelet's sysctls, containerd's shared run directory.
type machineState struct {
	netns, cgroups, mounts, routes, iptables, sysctls, containerdRun string
}

func readMachineState(t *testing.T) machineState {
	t.Helper()
	run := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	glob := func(pattern string) string {
		m, _ := filepath.Glob(pattern)
		sort.Strings(m)
		return strings.Join(m, "\n")
	}
	var mounts []string
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			mounts = append(mounts, f[4])
		}
	}
	sort.Strings(mounts)
	var sysctls []string
	for _, k := range []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"} {
		v, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			t.Fatal(err)
		}
		sysctls = append(sysctls, k+"="+strings.TrimSpace(string(v)))
	}
	var routes []string
	for _, l := range strings.Split(run("ip", "route", "show"), "\n") {
		if strings.Contains(l, "198.18.") || strings.Contains(l, "198.19.") {
			routes = append(routes, l)
		}
	}
	return machineState{
		netns:         glob("/run/netns/irlc-*"),
		cgroups:       glob("/sys/fs/cgroup/*/irlc-*"),
		mounts:        strings.Join(mounts, "\n"),
		routes:        strings.Join(routes, "\n"),
		iptables:      run("iptables-save", "-t", "nat"),
		sysctls:       strings.Join(sysctls, " "),
		containerdRun: glob("/run/containerd/*/*"),
	}
}

// TestRealNode_N1_RunsPodsAndLeavesNothingBehind starts a cluster with a
// real node, proves the node is up (Ready, labelled and tainted, its
// namespace, cgroups and mounts exist, pods reach the API server through
// the kubernetes Service's endpoint), stops it and finds the machine as it
// was: no network namespace, cgroup, mount, route, iptables rule or run
// file left, the kubelet's sysctls put back.
func TestRealNode_N1_RunsPodsAndLeavesNothingBehind(t *testing.T) {
	binDir, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	before := readMachineState(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, err := localcluster.Start(ctx, localcluster.Options{
		BinDir: binDir, RunDir: t.TempDir(), Nodes: []string{"node-1"}, RealNodes: 1, Log: testLog{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = c.Stop()
		}
	})
	rn := c.Real
	if rn == nil || c.RealNodeName() != "real-1" {
		t.Fatalf("cluster has no real node: %+v", rn)
	}
	node, err := c.Client.CoreV1().Nodes().Get(ctx, rn.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if node.Labels[localcluster.RuntimeLabel] != "containerd" {
		t.Errorf("node %s labels %v, want %s=containerd", rn.Name, node.Labels, localcluster.RuntimeLabel)
	}
	tainted := false
	for _, tn := range node.Spec.Taints {
		tainted = tainted || (tn.Key == localcluster.RuntimeLabel && tn.Effect == corev1.TaintEffectNoSchedule)
	}
	if !tainted {
		t.Errorf("node %s taints %v, want %s NoSchedule (only pods that ask land there)", rn.Name, node.Spec.Taints, localcluster.RuntimeLabel)
	}
	if !strings.HasPrefix(node.Status.NodeInfo.ContainerRuntimeVersion, "containerd://") {
		t.Errorf("node %s runs %q, want containerd", rn.Name, node.Status.NodeInfo.ContainerRuntimeVersion)
	}
	// The kubernetes Service's endpoint is the API server's forward into
	// the node's namespace (pods use it through the Service).
	eps, err := c.Client.DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(eps.Endpoints) != 1 || len(eps.Endpoints[0].Addresses) != 1 || eps.Endpoints[0].Addresses[0] != rn.NodeIP {
		t.Errorf("kubernetes endpoints %+v, want %s", eps.Endpoints, rn.NodeIP)
	}
	during := readMachineState(t)
	if !strings.Contains(during.netns, rn.NetNS) || !strings.Contains(during.cgroups, rn.CgroupRoot) ||
		!strings.Contains(during.mounts, rn.RunState) || !strings.Contains(during.routes, rn.PodCIDR) {
		t.Fatalf("the running node is not where the test looks:\nnetns %s\ncgroups %s\nroutes %s", during.netns, during.cgroups, during.routes)
	}

	if err := c.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	stopped = true
	after := readMachineState(t)
	for _, d := range []struct{ what, before, after string }{
		{"network namespaces", before.netns, after.netns},
		{"cgroups", before.cgroups, after.cgroups},
		{"mounts", before.mounts, after.mounts},
		{"routes", before.routes, after.routes},
		{"iptables nat rules", stripCounters(before.iptables), stripCounters(after.iptables)},
		{"sysctls", before.sysctls, after.sysctls},
		{"containerd run files", before.containerdRun, after.containerdRun},
	} {
		if d.before != d.after {
			t.Errorf("%s not restored:\nbefore:\n%s\nafter:\n%s", d.what, d.before, d.after)
		}
	}
	if _, err := os.Stat(rn.RunState); !os.IsNotExist(err) {
		t.Errorf("%s is left: %v", rn.RunState, err)
	}
}

// stripCounters drops iptables-save's comment and counter lines, which
// change with time, not with rules.
func stripCounters(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "#") || strings.HasPrefix(l, ":") {
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}

// TestRealNode_N1_AMissingPartIsNamed: a real node that cannot start says
// what is missing — here the kubelet and kube-proxy of a bin dir that lacks
// them — and starts nothing.
func TestRealNode_N1_AMissingPartIsNamed(t *testing.T) {
	bin := t.TempDir()
	before := readMachineState(t)
	_, err := localcluster.Start(context.Background(), localcluster.Options{BinDir: bin, RunDir: t.TempDir(), RealNodes: 1})
	if err == nil {
		t.Fatal("Start with a bin dir without kubelet succeeded")
	}
	for _, want := range []string{"kubelet in " + bin, "kube-proxy in " + bin, "hack/build-cluster.sh"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q:\n%v", want, err)
		}
	}
	if after := readMachineState(t); after.netns != before.netns {
		t.Errorf("a failed start left network namespaces: %s", after.netns)
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
