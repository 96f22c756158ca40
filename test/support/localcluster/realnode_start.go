package localcluster

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// containerdConfig is the node's containerd 1.6 configuration. Everything
// it writes is under the node's directories; restrict_oom_score_adj because
// root here lacks CAP_SYS_RESOURCE (the pause container's oom_score_adj
// fails otherwise: "can't get final child's PID from pipe: EOF").
const containerdConfig = `version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %[3]q

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[9]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[6]q
    conf_dir = %[7]q
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = %[8]q
`

// cniConfig is the pods' network: a bridge in the node's namespace, the
// node's pod range, the bridge as the pods' default gateway.
const cniConfig = `{
  "cniVersion": "1.0.0",
  "name": "localcluster",
  "plugins": [{
    "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}
  }]
}
`

// kubeletConfig is the real node's kubelet configuration: cgroup v1 allowed
// (failCgroupV1: false), the cgroupfs driver under the node's own cgroup,
// x509 and webhook authentication and authorization (the API server's
// kubelet client certificate is system:masters), the runtime-label taint.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %[1]s
address: %[2]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[3]q}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://%[4]s
resolvConf: %[5]q
podLogsDirectory: %[6]q
failSwapOn: false
serializeImagePulls: false
maxPods: 60
registerWithTaints:
- {key: %[7]q, value: containerd, effect: NoSchedule}
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%", imagefs.inodesFree: "1%%"}
`

// startRealNode brings up rn: its network, cgroups, containerd (with the
// pause image imported), kubelet and kube-proxy. It returns once the
// processes run; Start then waits for the node to be Ready and run a pod.
func (c *Cluster) startRealNode(ctx context.Context, rn *RealNode, p *pki, apiPort int) error {
	if err := rn.setupNetwork(); err != nil {
		return err
	}
	if err := rn.setupCgroups(); err != nil {
		return err
	}
	if err := recordSysctls(); err != nil {
		return err
	}
	dirs := map[string]string{}
	for _, d := range []string{"containerd", "cni/net.d", "cni/ipam", "certs.d", "pod-logs", "opt", "pki"} {
		dirs[d] = filepath.Join(rn.Dir, d)
		if err := os.MkdirAll(dirs[d], 0o755); err != nil {
			return err
		}
	}
	for _, d := range []string{"containerd", "kubelet"} {
		if err := os.MkdirAll(filepath.Join(rn.RunState, d), 0o755); err != nil {
			return err
		}
	}
	sock := filepath.Join(rn.RunState, "containerd.sock")
	write := func(path, text string) error { return os.WriteFile(path, []byte(text), 0o644) }
	cfg := fmt.Sprintf(containerdConfig, dirs["containerd"], filepath.Join(rn.RunState, "containerd"), sock, dirs["opt"],
		PauseImage, cniBinDir, dirs["cni/net.d"], dirs["certs.d"], filepath.Join(rn.RunState, "runc"))
	if err := write(filepath.Join(rn.Dir, "containerd.toml"), cfg); err != nil {
		return err
	}
	if err := write(filepath.Join(dirs["cni/net.d"], "10-localcluster.conflist"), fmt.Sprintf(cniConfig, rn.PodCIDR, dirs["cni/ipam"])); err != nil {
		return err
	}
	// Forward the API server into the namespace first: the kubelet and
	// kube-proxy reach it at NodeIP:apiPort, as pods do through the
	// `kubernetes` Service.
	if err := c.forward(apiPort); err != nil {
		return err
	}

	if err := c.runInNode(rn, "containerd-"+rn.Name, "containerd", "--config", filepath.Join(rn.Dir, "containerd.toml")); err != nil {
		return err
	}
	if err := c.poll(ctx, "wait for the containerd of "+rn.Name, 30*time.Second, "containerd-"+rn.Name, func(context.Context) error {
		out, err := exec.Command("ctr", "--address", sock, "version").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s: %w", err, strings.TrimSpace(string(out)), errNotReady)
		}
		return nil
	}); err != nil {
		return err
	}
	pauseTar := filepath.Join(rn.Dir, "pause.tar")
	if err := writePauseTar(c.BinDir, pauseTar); err != nil {
		return err
	}
	if out, err := exec.Command("ctr", "--address", sock, "-n", "k8s.io", "images", "import", pauseTar).CombinedOutput(); err != nil {
		return fmt.Errorf("localcluster: import %s into the containerd of %s: %v: %s", PauseImage, rn.Name, err, out)
	}

	// Credentials: the kubelet as system:node:NAME (the Node authorizer),
	// kube-proxy as system:kube-proxy (the default node-proxier binding).
	server := "https://" + rn.Addr(apiPort)
	kubeletKP, err := p.ca.sign(dirs["pki"], "kubelet", pkix.Name{CommonName: "system:node:" + rn.Name, Organization: []string{"system:nodes"}}, x509.ExtKeyUsageClientAuth, nil, nil)
	if err != nil {
		return err
	}
	proxyKP, err := p.ca.sign(dirs["pki"], "kube-proxy", pkix.Name{CommonName: "system:kube-proxy"}, x509.ExtKeyUsageClientAuth, nil, nil)
	if err != nil {
		return err
	}
	kubeletKubeconfig := filepath.Join(rn.Dir, "kubelet.kubeconfig")
	if err := writeClientKubeconfig(kubeletKubeconfig, server, p.ca.certFile, kubeletKP); err != nil {
		return err
	}
	proxyKubeconfig := filepath.Join(rn.Dir, "kube-proxy.kubeconfig")
	if err := writeClientKubeconfig(proxyKubeconfig, server, p.ca.certFile, proxyKP); err != nil {
		return err
	}
	resolv := filepath.Join(rn.Dir, "resolv.conf")
	if err := write(resolv, "# no DNS: pods reach the API server by the kubernetes Service's address\n"); err != nil {
		return err
	}
	kcfg := fmt.Sprintf(kubeletConfig, rn.CgroupRoot, rn.NodeIP, p.ca.certFile, sock, resolv, dirs["pod-logs"], RuntimeLabel)
	if err := write(filepath.Join(rn.Dir, "kubelet.yaml"), kcfg); err != nil {
		return err
	}
	if err := c.runInNode(rn, "kubelet-"+rn.Name, filepath.Join(c.BinDir, "kubelet"),
		"--config="+filepath.Join(rn.Dir, "kubelet.yaml"), "--kubeconfig="+kubeletKubeconfig,
		"--root-dir="+filepath.Join(rn.RunState, "kubelet"), "--hostname-override="+rn.Name,
		"--node-ip="+rn.NodeIP, "--node-labels="+RuntimeLabel+"=containerd,type=real", "--v=1",
	); err != nil {
		return err
	}
	return c.runInNode(rn, "kube-proxy-"+rn.Name, filepath.Join(c.BinDir, "kube-proxy"),
		"--kubeconfig="+proxyKubeconfig, "--hostname-override="+rn.Name, "--proxy-mode=iptables",
		"--cluster-cidr="+rn.PodCIDR, "--conntrack-max-per-core=0",
		"--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256", "--v=1",
	)
}

// runInNode starts bin in the node's network namespace and cgroup (every
// hierarchy), so that teardown finds it and everything it starts.
func (c *Cluster) runInNode(rn *RealNode, name, bin string, args ...string) error {
	if !filepath.IsAbs(bin) {
		path, err := exec.LookPath(bin)
		if err != nil {
			return fmt.Errorf("localcluster: %s: %w", bin, err)
		}
		bin = path
	}
	var join strings.Builder
	for _, h := range cgroupHierarchies() {
		fmt.Fprintf(&join, "echo $$ > %q/cgroup.procs || exit 1; ", filepath.Join(h, rn.CgroupRoot, "system"))
	}
	script := join.String() + `exec nsenter --net=/run/netns/"$0" -- "$@"`
	p, err := startProcess(c.RunDir, name, "/bin/sh", append([]string{"-c", script, rn.NetNS, bin}, args...), c.Detach)
	if err != nil {
		return err
	}
	c.Procs[name] = p
	return c.save()
}

// forward makes port on loopback reachable at NodeIP:port, for the node,
// its pods and the host, and waits until it is.
func (c *Cluster) forward(port int) error {
	rn := c.Real
	for _, p := range rn.Forwards {
		if p == port {
			return nil
		}
	}
	rn.Forwards = append(rn.Forwards, port)
	if err := c.save(); err != nil {
		return err
	}
	_ = rn.record()
	return c.poll(context.Background(), "wait for the forward of "+rn.Addr(port), 20*time.Second, "", func(context.Context) error {
		conn, err := net.DialTimeout("tcp", rn.Addr(port), time.Second)
		if err != nil {
			return fmt.Errorf("%v: %w", err, errNotReady)
		}
		conn.Close()
		return nil
	})
}

// Expose makes a registry listening on loopback at hostPort reachable as
// NodeIP:hostPort from the host's shell, the real node's containerd (plain
// HTTP, configured in its hosts directory) and pods, and returns that
// address: the name to give images that the real node runs. Without a real
// node it returns 127.0.0.1:hostPort.
func (c *Cluster) Expose(hostPort int) (string, error) {
	if c.Real == nil {
		return addr(hostPort), nil
	}
	return c.expose(hostPort, "")
}

// ExposeTLS is Expose for a registry serving TLS under a certificate for
// NodeIP that caFile's CA signed: the node's containerd trusts caFile for
// it.
func (c *Cluster) ExposeTLS(hostPort int, caFile string) (string, error) {
	if c.Real == nil {
		return "", fmt.Errorf("localcluster: ExposeTLS needs a real node (Options.RealNodes)")
	}
	return c.expose(hostPort, caFile)
}

func (c *Cluster) expose(hostPort int, caFile string) (string, error) {
	rn := c.Real
	host := rn.Addr(hostPort)
	dir := filepath.Join(rn.Dir, "certs.d", host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	hosts := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+host, "http://"+host)
	if caFile != "" {
		hosts = fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = %q\n", "https://"+host, "https://"+host, caFile)
	}
	if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		return "", err
	}
	if err := c.forward(hostPort); err != nil {
		return "", err
	}
	return host, nil
}

func writeClientKubeconfig(path, server, caFile string, kp keyPair) error {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["node"] = &clientcmdapi.AuthInfo{ClientCertificate: kp.certFile, ClientKey: kp.keyFile}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "node"}
	cfg.CurrentContext = "local"
	return clientcmd.WriteToFile(*cfg, path)
}
