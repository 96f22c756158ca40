package localcluster_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/test/support/localcluster"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// machineState is what a real node changes on the machine and must put
// back: network namespaces, the node's cgroups, mounts, host routes and
// iptables rules, the kubelet's sysctls, containerd's shared run directory.
type machineState struct {
	netns, links, cgroups, mounts, routes, iptables, sysctls, containerdRun string
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
	var links []string // the host ends of the real nodes' veths
	for _, l := range strings.Split(run("ip", "-o", "link", "show"), "\n") {
		if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], "irlc-") {
			links = append(links, strings.SplitN(strings.TrimSuffix(f[1], ":"), "@", 2)[0])
		}
	}
	sort.Strings(links)
	return machineState{
		netns:         glob("/run/netns/irlc-*"),
		links:         strings.Join(links, "\n"),
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
	alone := func() bool { m, _ := filepath.Glob("/run/irlc-[0-9]*.json"); return len(m) == 0 }
	aloneBefore := alone()
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
	if !strings.Contains(during.netns, rn.NetNS) || !strings.Contains(during.links, rn.NetNS) || !strings.Contains(during.cgroups, rn.CgroupRoot) ||
		!strings.Contains(during.mounts, rn.RunState) || !strings.Contains(during.routes, rn.PodCIDR) {
		t.Fatalf("the running node is not where the test looks:\nnetns %s\nlinks %s\ncgroups %s\nroutes %s", during.netns, during.links, during.cgroups, during.routes)
	}

	if err := c.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	stopped = true
	after := readMachineState(t)
	// Other test binaries may run real nodes of their own meanwhile (other
	// slots): what must be gone is this node's; the host's iptables rules
	// no node touches.
	mine := func(s string) string {
		var keep []string
		for _, l := range strings.Split(s, "\n") {
			if strings.Contains(l, rn.NetNS) || strings.Contains(l, rn.RunState) || strings.Contains(l, rn.Dir) ||
				strings.Contains(l, fmt.Sprintf("198.18.%d.", rn.Slot)) || strings.Contains(l, fmt.Sprintf("198.19.%d.", rn.Slot)) {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	}
	for _, d := range []struct{ what, before, after string }{
		{"network namespaces", mine(before.netns), mine(after.netns)},
		// The veth's host end is gone when Stop returns, not later: the
		// next cluster to take this slot creates it again.
		{"host links", mine(before.links), mine(after.links)},
		{"cgroups", mine(before.cgroups), mine(after.cgroups)},
		{"mounts", mine(before.mounts), mine(after.mounts)},
		{"routes", mine(before.routes), mine(after.routes)},
		{"iptables nat rules", stripCounters(before.iptables), stripCounters(after.iptables)},
	} {
		if d.before != d.after {
			t.Errorf("%s not restored:\nbefore:\n%s\nafter:\n%s", d.what, d.before, d.after)
		}
	}
	for _, path := range []string{rn.RunState, fmt.Sprintf("/run/irlc-%d.json", rn.Slot)} {
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("%s is left: %v", path, err)
		}
	}
	// The sysctls are put back by the last real node on the machine
	// (TestRealNode_N1_TheLastNodePutsTheSysctlsBack); alone, that was this one.
	if aloneBefore && alone() {
		if before.sysctls != after.sysctls || before.containerdRun != after.containerdRun {
			t.Errorf("alone on the machine, not restored: sysctls %s → %s, containerd run files %q → %q", before.sysctls, after.sysctls, before.containerdRun, after.containerdRun)
		}
	} else {
		t.Logf("another real node ran meanwhile: the sysctls stay as its kubelet set them")
	}
}

// TestRealNode_N1_ASlotIsFreeAgainTheMomentItsNodeStopped: the kernel takes
// a deleted network namespace's devices down in the background, and with
// the node's end of the veth goes the host's; a node that only deleted its
// namespace left irlc-N on the host for a while, and the next cluster to
// claim the slot failed "RTNETLINK answers: File exists" (CI saw it, with
// the realnode and localcluster packages run side by side). Teardown
// deletes the host end first; claiming and tearing down in a tight loop
// finds the slot free every time.
func TestRealNode_N1_ASlotIsFreeAgainTheMomentItsNodeStopped(t *testing.T) {
	for i := range 5 {
		rn, err := localcluster.ClaimRealNodeNetwork(t.TempDir(), fmt.Sprintf("slot-test-%d", i))
		if err != nil {
			t.Fatalf("claim %d: %v", i+1, err)
		}
		if _, err := net.InterfaceByName(rn.NetNS); err != nil {
			_ = rn.TearDown()
			t.Fatalf("claim %d: the host end %s of the veth is not there: %v", i+1, rn.NetNS, err)
		}
		if err := rn.TearDown(); err != nil {
			t.Fatalf("teardown %d: %v", i+1, err)
		}
		if _, err := os.Stat(fmt.Sprintf("/run/irlc-%d.json", rn.Slot)); os.IsNotExist(err) { // no other cluster took the slot meanwhile
			if _, err := net.InterfaceByName(rn.NetNS); err == nil {
				t.Fatalf("teardown %d returned with the host end %s of the veth still there", i+1, rn.NetNS)
			}
		}
	}
}

// TestRealNode_N1_TheLastNodePutsTheSysctlsBack: the first real node records
// the sysctls the kubelet changes, a node that stops while another runs
// leaves them, and the last one puts them back and drops the record.
func TestRealNode_N1_TheLastNodePutsTheSysctlsBack(t *testing.T) {
	dir := t.TempDir()
	root, record := filepath.Join(dir, "sys"), filepath.Join(dir, "record.json")
	for k, v := range map[string]string{"vm/overcommit_memory": "0", "kernel/panic": "0", "kernel/panic_on_oops": "0"} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(k)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, k), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	defer localcluster.SetSysctlPaths(root, record, filepath.Join(dir, "slot-*.json"))()
	read := func() string {
		b, err := os.ReadFile(filepath.Join(root, "kernel/panic"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	kubelet := func() { _ = os.WriteFile(filepath.Join(root, "kernel/panic"), []byte("10"), 0o644) }

	if err := localcluster.RecordSysctls(); err != nil { // first node
		t.Fatal(err)
	}
	kubelet()
	if err := localcluster.RecordSysctls(); err != nil { // second node: the record stays the first's
		t.Fatal(err)
	}
	other := filepath.Join(dir, "slot-2.json")
	if err := os.WriteFile(other, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.RestoreSysctls(); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "10" {
		t.Errorf("a node stopping while another runs set kernel/panic to %s; want it left at the running kubelet's 10", got)
	}
	if err := os.Remove(other); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.RestoreSysctls(); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "0" {
		t.Errorf("the last node left kernel/panic at %s, want the machine's 0", got)
	}
	if _, err := os.Stat(record); !os.IsNotExist(err) {
		t.Errorf("the record is left after the last node: %v", err)
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
