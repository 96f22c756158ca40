package localcluster

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A real node is a kubelet with containerd and runc, beside the kwok nodes,
// for what only a real node shows: what a node's image cache makes a
// container run, and the product running as a pod. docs/local-cluster.md.
//
// Its network lives in a network namespace the cluster makes (irlc-S, S
// the node's slot), all in 198.18.0.0/15, the range reserved for testing:
//
//	host  198.18.S.1 ── veth ── 198.18.S.2  node (kubelet, containerd, kube-proxy)
//	                                  └── bridge cni0 198.19.S.1 ── pods 198.19.S.0/24
//	Services 198.18.S.128/25 (kube-proxy, iptables mode, in the namespace)
//
// The host routes the pod and Service ranges to the namespace, so that the
// host's shell and kube-apiserver (webhooks, logs, exec) reach them. The
// control plane and the registries keep listening on loopback only; the
// node reaches them through forwarders listening on 198.18.S.2 inside the
// namespace (forward.go), on the same port numbers: kube-apiserver at
// 198.18.S.2:PORT (the `kubernetes` Service's endpoint) and each exposed
// registry at 198.18.S.2:PORT (Expose), the name pods, the node's
// containerd and the host all use.

// RuntimeLabel marks a real node (value "containerd"); the same key is its
// NoSchedule taint, so that only pods that ask for it land there.
const RuntimeLabel = "localcluster.image-refresh/runtime"

// maxRealSlots bounds the real nodes on one machine at once (one per
// cluster): 198.18.S.0/24 and 198.19.S.0/24 for S in 1..maxRealSlots.
const maxRealSlots = 60

// RealNode is the state of a real node, recorded in state.json and in
// /run/irlc-S.json (so that a node whose cluster process died is found
// and cleaned up by the next one).
type RealNode struct {
	Name  string `json:"name"`
	Slot  int    `json:"slot"`
	NetNS string `json:"netns"`
	// HostIP is the host end of the veth; NodeIP the node's address inside
	// NetNS (its InternalIP, where the forwarders listen).
	HostIP      string `json:"hostIP"`
	NodeIP      string `json:"nodeIP"`
	PodCIDR     string `json:"podCIDR"`
	ServiceCIDR string `json:"serviceCIDR"`
	// Dir holds containerd's root, the kubelet's root and the configs;
	// RunState containerd's state and sockets (short paths: unix sockets).
	Dir      string `json:"dir"`
	RunState string `json:"runState"`
	// CgroupRoot is the node's cgroup (every v1 hierarchy): the kubelet's
	// cgroupRoot, and the cgroup of containerd, the kubelet and kube-proxy.
	CgroupRoot string `json:"cgroupRoot"`
	// Owner is the PID of the process that started the node, or of a
	// detached cluster's forwarder process, which outlives it.
	Owner int `json:"owner"`
	// Forwards are the ports forwarded from NodeIP to loopback.
	Forwards []int `json:"forwards,omitempty"`
}

func slotFile(slot int) string { return fmt.Sprintf("/run/irlc-%d.json", slot) }

// ServiceIP is the `kubernetes` Service's ClusterIP (the range's first).
func (rn *RealNode) ServiceIP() string { return fmt.Sprintf("198.18.%d.129", rn.Slot) }

// Addr is NodeIP:port, how the node and its pods reach a forwarded port.
func (rn *RealNode) Addr(port int) string { return rn.NodeIP + ":" + strconv.Itoa(port) }

// realNodeTools are the programs a real node needs, with the Debian package
// that has each (hack/real-node-deps.sh installs them).
var realNodeTools = map[string]string{
	"containerd": "containerd", "containerd-shim-runc-v2": "containerd", "ctr": "containerd",
	"runc": "runc", "ip": "iproute2", "nsenter": "util-linux", "iptables": "iptables",
}

// realNodeCNIPlugins are the CNI plugins the node's network uses.
var realNodeCNIPlugins = []string{"bridge", "host-local", "loopback"}

// cniBinDir is where Debian's containernetworking-plugins installs them.
const cniBinDir = "/usr/lib/cni"

// realNodeSysctls are the settings the kubelet changes machine-wide at
// start; the first real node records them and the last one to stop puts
// them back.
var realNodeSysctls = []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"}

// sysctlRoot, sysctlRecord and slotFiles are where the sysctls, their record
// and the real nodes' slot files are (variables for the tests).
var (
	sysctlRoot   = "/proc/sys"
	sysctlRecord = "/run/irlc-sysctls.json"
	slotFiles    = "/run/irlc-[0-9]*.json"
)

// checkRealNodeHost fails with an error that names what is missing: a
// program, a CNI plugin, a kernel feature, the binaries or root.
func checkRealNodeHost(binDir string) error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (a real node mounts, makes cgroups and network namespaces)")
	}
	tools := make([]string, 0, len(realNodeTools))
	for t := range realNodeTools {
		tools = append(tools, t)
	}
	sort.Strings(tools)
	for _, t := range tools {
		if _, err := exec.LookPath(t); err != nil {
			missing = append(missing, fmt.Sprintf("program %s (Debian package %s; hack/real-node-deps.sh installs it)", t, realNodeTools[t]))
		}
	}
	for _, p := range realNodeCNIPlugins {
		if _, err := os.Stat(filepath.Join(cniBinDir, p)); err != nil {
			missing = append(missing, fmt.Sprintf("CNI plugin %s in %s (Debian package containernetworking-plugins)", p, cniBinDir))
		}
	}
	for _, b := range []string{"kubelet", "kube-proxy"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			missing = append(missing, fmt.Sprintf("%s in %s (hack/build-cluster.sh builds it)", b, binDir))
		}
	}
	if b, err := os.ReadFile("/proc/filesystems"); err != nil || !strings.Contains(string(b), "overlay") {
		missing = append(missing, "kernel feature overlayfs (/proc/filesystems has no overlay; modprobe overlay)")
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		missing = append(missing, "kernel feature network namespaces (/proc/self/ns/net)")
	}
	if len(cgroupHierarchies()) == 0 {
		missing = append(missing, "kernel feature cgroups (no hierarchy mounted under /sys/fs/cgroup)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("localcluster: a real node cannot start here; missing:\n  - %s", strings.Join(missing, "\n  - "))
	}
	return nil
}

// cgroupHierarchies lists the mounted cgroup hierarchies' directories: the
// v1 ones (cpu, memory, pids, …, name=systemd) or the v2 unified one.
func cgroupHierarchies() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var dirs []string
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, " - ", 2)
		if len(parts) != 2 {
			continue
		}
		pre, post := strings.Fields(parts[0]), strings.Fields(parts[1])
		if len(pre) < 5 || len(post) < 1 || (post[0] != "cgroup" && post[0] != "cgroup2") {
			continue
		}
		dirs = append(dirs, pre[4])
	}
	return dirs
}

// claimRealNode takes the first free slot (creating its network namespace
// is the claim: `ip netns add` fails on an existing one), after cleaning up
// the slots of real nodes whose cluster process is gone.
func claimRealNode(runDir, name string) (*RealNode, error) {
	reapStaleRealNodes()
	for s := 1; s <= maxRealSlots; s++ {
		ns := fmt.Sprintf("irlc-%d", s)
		if _, err := os.Stat("/run/netns/" + ns); err == nil {
			continue
		}
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			if strings.Contains(string(out), "exists") {
				continue
			}
			return nil, fmt.Errorf("localcluster: create network namespace %s: %v: %s", ns, err, out)
		}
		rn := &RealNode{
			Name: name, Slot: s, NetNS: ns,
			HostIP: fmt.Sprintf("198.18.%d.1", s), NodeIP: fmt.Sprintf("198.18.%d.2", s),
			PodCIDR: fmt.Sprintf("198.19.%d.0/24", s), ServiceCIDR: fmt.Sprintf("198.18.%d.128/25", s),
			Dir: filepath.Join(runDir, "real", name), RunState: fmt.Sprintf("/run/irlc-%d", s),
			CgroupRoot: fmt.Sprintf("/irlc-%d", s), Owner: os.Getpid(),
		}
		if err := rn.record(); err != nil {
			rn.teardown(nil)
			return nil, err
		}
		return rn, nil
	}
	return nil, fmt.Errorf("localcluster: no free real-node slot (network namespaces irlc-1…irlc-%d all exist; `make cluster-down` or `ip netns del` the stale ones)", maxRealSlots)
}

func (rn *RealNode) record() error {
	b, err := json.Marshal(rn)
	if err != nil {
		return err
	}
	return os.WriteFile(slotFile(rn.Slot), b, 0o644)
}

// reapStaleRealNodes tears down every recorded real node whose owner process
// no longer runs (a test binary that was killed).
func reapStaleRealNodes() {
	files, _ := filepath.Glob(slotFiles)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var rn RealNode
		if json.Unmarshal(b, &rn) != nil || rn.Slot == 0 {
			continue
		}
		if rn.Owner > 0 && syscall.Kill(rn.Owner, 0) == nil {
			continue
		}
		rn.teardown(nil)
	}
}

// delHostLink deletes the host end of a real node's veth, if it exists.
func delHostLink(name string) error {
	if _, err := net.InterfaceByName(name); err != nil {
		return nil // no such device
	}
	if err := ip("", "link", "del", name); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
		return err
	}
	return nil
}

// ip runs an iproute2 command, in the node's namespace when ns is set.
func ip(ns string, args ...string) error {
	if ns != "" {
		args = append([]string{"-n", ns}, args...)
	}
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setupNetwork makes the veth between the host and the node's namespace,
// addresses and routes (see the package comment above).
func (rn *RealNode) setupNetwork() error {
	host, peer := rn.NetNS, rn.NetNS+"-n"
	// A host end left by a node of this slot whose namespace the kernel is
	// still taking down (or by a killed test binary) is not this node's.
	if err := delHostLink(host); err != nil {
		return fmt.Errorf("localcluster: real node network: %w", err)
	}
	steps := [][]string{
		{"", "link", "add", host, "type", "veth", "peer", "name", peer, "netns", rn.NetNS},
		{"", "addr", "add", rn.HostIP + "/30", "dev", host},
		{"", "link", "set", host, "up"},
		{rn.NetNS, "link", "set", "lo", "up"},
		{rn.NetNS, "addr", "add", rn.NodeIP + "/30", "dev", peer},
		{rn.NetNS, "link", "set", peer, "up"},
		{"", "route", "add", rn.PodCIDR, "via", rn.NodeIP},
		{"", "route", "add", rn.ServiceCIDR, "via", rn.NodeIP},
	}
	for _, s := range steps {
		if err := ip(s[0], s[1:]...); err != nil {
			return fmt.Errorf("localcluster: real node network: %w", err)
		}
	}
	// The namespace routes between its veth and the pods' bridge.
	if out, err := exec.Command("nsenter", "--net=/run/netns/"+rn.NetNS, "sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
		return fmt.Errorf("localcluster: real node network: net.ipv4.ip_forward in %s: %v: %s", rn.NetNS, err, out)
	}
	return nil
}

// setupCgroups makes the node's cgroup in every hierarchy (the kubelet
// refuses a cgroupRoot that is missing from one).
func (rn *RealNode) setupCgroups() error {
	for _, h := range cgroupHierarchies() {
		dir := filepath.Join(h, rn.CgroupRoot, "system")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("localcluster: real node cgroup %s: %w", dir, err)
		}
		if filepath.Base(h) == "cpuset" {
			// A v1 cpuset cgroup runs nothing until it has cpus and mems.
			for _, d := range []string{filepath.Join(h, rn.CgroupRoot), dir} {
				for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
					b, err := os.ReadFile(filepath.Join(h, f))
					if err != nil {
						return fmt.Errorf("localcluster: real node cgroup: read %s: %w", filepath.Join(h, f), err)
					}
					if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
						return fmt.Errorf("localcluster: real node cgroup: write %s: %w", filepath.Join(d, f), err)
					}
				}
			}
		}
	}
	return nil
}

// recordSysctls keeps the machine's values of realNodeSysctls before the
// first real node's kubelet changes them.
func recordSysctls() error {
	if _, err := os.Stat(sysctlRecord); err == nil {
		return nil
	}
	m := map[string]string{}
	for _, k := range realNodeSysctls {
		b, err := os.ReadFile(filepath.Join(sysctlRoot, k))
		if err != nil {
			return fmt.Errorf("localcluster: read sysctl %s: %w", k, err)
		}
		m[k] = strings.TrimSpace(string(b))
	}
	b, _ := json.Marshal(m)
	return os.WriteFile(sysctlRecord, b, 0o644)
}

// restoreSysctls puts the recorded values back once no real node is left.
func restoreSysctls() error {
	if others, _ := filepath.Glob(slotFiles); len(others) > 0 {
		return nil
	}
	b, err := os.ReadFile(sysctlRecord)
	if err != nil {
		return nil
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	var errs []error
	for k, v := range m {
		if err := os.WriteFile(filepath.Join(sysctlRoot, k), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", k, v, err))
		}
	}
	if len(errs) == 0 {
		_ = os.Remove(sysctlRecord)
	}
	return errors.Join(errs...)
}

// killCgroup SIGKILLs every process in the node's cgroups (containers,
// shims, containerd, the kubelet) until none is left.
func (rn *RealNode) killCgroup() error {
	var left []string
	for i := 0; i < 100; i++ {
		left = left[:0]
		for _, h := range cgroupHierarchies() {
			root := filepath.Join(h, rn.CgroupRoot)
			_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err != nil || !d.IsDir() {
					return nil
				}
				b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
				if err != nil {
					return nil
				}
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
						_ = syscall.Kill(pid, syscall.SIGKILL)
						left = append(left, f)
					}
				}
				return nil
			})
		}
		if len(left) == 0 {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("processes %v still in cgroup %s after SIGKILL", left, rn.CgroupRoot)
}

// unmountUnder unmounts, deepest first, every mount under the node's
// directories (container root filesystems, pod volumes, sandbox network
// namespaces).
func (rn *RealNode) unmountUnder() error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		p := unescapeMount(f[4])
		for _, prefix := range []string{rn.Dir + "/", rn.RunState + "/"} {
			if strings.HasPrefix(p, prefix) {
				points = append(points, p)
			}
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// shimSocketDir is where containerd 1.6 puts its shims' sockets whatever its
// state directory: /run/containerd/s/<sha256 of address/namespace/id>.
const shimSocketDir = "/run/containerd/s"

// removeShimSockets removes the sockets of the node's shims, which a killed
// shim leaves behind; the hash names them, so no other containerd's are
// touched.
func (rn *RealNode) removeShimSockets() {
	address := filepath.Join(rn.RunState, "containerd.sock")
	tasks, _ := filepath.Glob(filepath.Join(rn.RunState, "containerd", "io.containerd.runtime.v2.task", "*", "*"))
	for _, t := range tasks {
		ns, id := filepath.Base(filepath.Dir(t)), filepath.Base(t)
		sum := sha256.Sum256([]byte(filepath.Join(address, ns, id)))
		_ = os.Remove(filepath.Join(shimSocketDir, hex.EncodeToString(sum[:])))
	}
	// Empty directories only: another containerd may be using them.
	_ = os.Remove(shimSocketDir)
	_ = os.Remove(filepath.Dir(shimSocketDir))
}

// removeCgroups removes the node's cgroups, deepest first, in every
// hierarchy.
func (rn *RealNode) removeCgroups() error {
	var errs []error
	for _, h := range cgroupHierarchies() {
		root := filepath.Join(h, rn.CgroupRoot)
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			var err error
			for try := 0; try < 50; try++ {
				if err = syscall.Rmdir(dirs[i]); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(50 * time.Millisecond) // a killed task leaves its cgroup a moment later
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// teardown leaves nothing of the node on the machine: its processes, mounts,
// cgroups, network namespace (with the veth, the bridge, the routes and
// kube-proxy's iptables rules in it) and state; the sysctls are put back
// when it is the last real node. stopProcs, when set, first stops the
// processes the cluster knows gracefully.
func (rn *RealNode) teardown(stopProcs func()) error {
	if stopProcs != nil {
		stopProcs()
	}
	var errs []error
	errs = append(errs, rn.killCgroup())
	errs = append(errs, rn.unmountUnder())
	errs = append(errs, rn.removeCgroups())
	// The host end of the veth goes first, and at once: deleting it deletes
	// both ends, whereas the devices of a deleted namespace (and with them
	// the host end) are removed by the kernel in the background, where the
	// next cluster to claim this slot would find irlc-N still there (CI saw
	// "RTNETLINK answers: File exists").
	errs = append(errs, delHostLink(rn.NetNS))
	if _, err := os.Stat("/run/netns/" + rn.NetNS); err == nil {
		if err := ip("", "netns", "del", rn.NetNS); err != nil {
			errs = append(errs, err)
		}
	}
	rn.removeShimSockets()
	_ = os.RemoveAll(rn.RunState)
	_ = os.Remove(slotFile(rn.Slot))
	errs = append(errs, restoreSysctls())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("localcluster: tear down real node %s: %w", rn.Name, err)
	}
	return nil
}
