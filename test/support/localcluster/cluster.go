// Package localcluster starts and stops a real Kubernetes control plane on
// loopback — etcd, kube-apiserver (RBAC on), kube-controller-manager,
// kube-scheduler — with fake nodes, each managed by its own kwok process so
// that any one can be made NotReady for real (its heartbeat stops), and by
// its own image agent (agent.go), which keeps the node's image cache and
// reports pods' image IDs as a kubelet does. Tests use it from TestMain;
// `make cluster-up` uses it through hack/localcluster.
//
// The binaries come from hack/build-cluster.sh (a cache outside the repo).
package localcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Options configures a cluster.
type Options struct {
	// BinDir holds etcd, kube-apiserver, kube-controller-manager,
	// kube-scheduler, kwok and kwok's stage/ documents.
	BinDir string
	// RunDir receives certificates, kubeconfig, data, logs and state.json.
	RunDir string
	// Nodes are the fake nodes to create; default node-1, node-2, node-3.
	Nodes []string
	// Detach lets the processes outlive this one (command-line use).
	Detach bool
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// AgentCommand runs a node's image agent as a process of its own:
	// the command and its first arguments, to which RunDir and the node
	// name are appended (hack/localcluster: [self, "node-agent"]). Empty:
	// each agent is a goroutine of this process, which is what tests want;
	// with Detach the agents then end with this process, and the nodes
	// start no new pod until NodeUp (`make cluster-node-up`) restarts them.
	AgentCommand []string
	// RealNodes is how many nodes run a real kubelet with containerd beside
	// the kwok ones (0 or 1; realnode.go): node real-1, labelled and tainted
	// RuntimeLabel=containerd. Missing packages or kernel features fail
	// Start with an error naming them.
	RealNodes int
	// ForwardCommand runs the real node's forwarder (RunNodeForwarder) as a
	// process of its own, RunDir appended (hack/localcluster: [self,
	// "node-forward"]); needed with Detach, since the forwarder must
	// outlive this process. Empty: a goroutine of this process.
	ForwardCommand []string
	// ExtraArgs are more flags per process ("etcd", "kube-apiserver",
	// "kube-controller-manager", "kube-scheduler"), after the defaults, so
	// a flag given again here wins. The bench's 100,000-workload cluster
	// uses them (a larger etcd quota, the controller-manager's budget).
	ExtraArgs map[string][]string
}

// NodeLeaseSeconds is each fake node's lease; with the controller-manager's
// 20 s grace period a stopped node turns NotReady in about 20–40 s.
const NodeLeaseSeconds = 40

// Cluster is a running local cluster.
type Cluster struct {
	RunDir     string              `json:"runDir"`
	BinDir     string              `json:"binDir"`
	Kubeconfig string              `json:"kubeconfig"`
	Server     string              `json:"server"`
	Procs      map[string]*process `json:"procs"`
	NodeNames  []string            `json:"nodes"`
	Detach     bool                `json:"detach"`
	// AgentCommand is Options.AgentCommand.
	AgentCommand []string `json:"agentCommand,omitempty"`
	// Real is the real node, if the cluster has one.
	Real *RealNode `json:"real,omitempty"`

	Config *rest.Config          `json:"-"`
	Client *kubernetes.Clientset `json:"-"`
	log    io.Writer
	// extraArgs is Options.ExtraArgs (kept in each process's Args).
	extraArgs map[string][]string

	agentsMu sync.Mutex
	agents   map[string]*agentRun // agents running in this process, by node

	stopForward context.CancelFunc // the real node's forwarder goroutine
	forwardDone chan struct{}
}

// Start brings a cluster up and returns once the API serves, the default
// ServiceAccount exists (pods are admitted only after it does) and every
// node is Ready. On error every process already started is stopped.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if opts.BinDir == "" || opts.RunDir == "" {
		return nil, errors.New("localcluster: BinDir and RunDir are required")
	}
	if len(opts.Nodes) == 0 {
		opts.Nodes = []string{"node-1", "node-2", "node-3"}
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	start := time.Now()
	if err := os.MkdirAll(opts.RunDir, 0o755); err != nil {
		return nil, err
	}
	c = &Cluster{RunDir: opts.RunDir, BinDir: opts.BinDir, Procs: map[string]*process{}, NodeNames: opts.Nodes, Detach: opts.Detach, AgentCommand: opts.AgentCommand, log: opts.Log, extraArgs: opts.ExtraArgs}
	started := c // the returns below set c to nil
	defer func() {
		if err != nil {
			_ = started.Stop()
		}
	}()
	if opts.RealNodes > 1 {
		return nil, fmt.Errorf("localcluster: RealNodes is %d; one real node per cluster is supported", opts.RealNodes)
	}
	var extraIPs []net.IP
	if opts.RealNodes > 0 {
		if err := checkRealNodeHost(opts.BinDir); err != nil {
			return nil, err
		}
		if c.Real, err = claimRealNode(opts.RunDir, "real-1"); err != nil {
			return nil, err
		}
		extraIPs = []net.IP{net.ParseIP(c.Real.NodeIP), net.ParseIP(c.Real.ServiceIP())}
	}
	p, err := newPKI(filepath.Join(opts.RunDir, "pki"), extraIPs...)
	if err != nil {
		return nil, fmt.Errorf("generate certificates: %w", err)
	}
	ports, err := freePorts(6)
	if err != nil {
		return nil, err
	}
	etcdPort, peerPort, apiPort, cmPort, schedPort := ports[0], ports[1], ports[2], ports[3], ports[4]
	c.Server = "https://" + addr(apiPort)
	c.Kubeconfig = filepath.Join(opts.RunDir, "kubeconfig")
	if err := writeKubeconfig(c.Kubeconfig, c.Server, p); err != nil {
		return nil, err
	}
	if c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		return nil, err
	}
	c.Config.QPS, c.Config.Burst = 200, 400
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return nil, err
	}

	if err := c.run("etcd", "etcd",
		"--name=default", "--data-dir="+filepath.Join(opts.RunDir, "etcd"),
		"--listen-client-urls=http://"+addr(etcdPort), "--advertise-client-urls=http://"+addr(etcdPort),
		"--listen-peer-urls=http://"+addr(peerPort), "--initial-advertise-peer-urls=http://"+addr(peerPort),
		"--initial-cluster=default=http://"+addr(peerPort),
		"--unsafe-no-fsync", "--log-level=warn", "--listen-metrics-urls=",
	); err != nil {
		return nil, err
	}
	// No --advertise-address without a real node: the apiserver refuses
	// 127.0.0.0/8; with no endpoint reconciler it never publishes one
	// either. With a real node, the `kubernetes` Service's endpoint is the
	// API server's forward into the node's namespace, and Services get the
	// node's range.
	serviceRange, endpoints := "--service-cluster-ip-range=10.0.0.0/24", []string{"--endpoint-reconciler-type=none"}
	if c.Real != nil {
		serviceRange = "--service-cluster-ip-range=" + c.Real.ServiceCIDR
		endpoints = []string{"--endpoint-reconciler-type=lease", "--advertise-address=" + c.Real.NodeIP}
	}
	if err := c.run("kube-apiserver", "kube-apiserver", append(endpoints,
		"--etcd-servers=http://"+addr(etcdPort),
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", apiPort),
		"--tls-cert-file="+p.apiserver.certFile, "--tls-private-key-file="+p.apiserver.keyFile,
		"--client-ca-file="+p.ca.certFile,
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+p.saPubFile, "--service-account-signing-key-file="+p.saKeyFile,
		serviceRange,
		"--kubelet-client-certificate="+p.kubeletClient.certFile, "--kubelet-client-key="+p.kubeletClient.keyFile,
		"--kubelet-preferred-address-types=InternalIP",
		// Front-proxy (requestheader) flags: without them the
		// controller-manager and scheduler log errors forever.
		"--requestheader-client-ca-file="+p.frontProxyCA.certFile,
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file="+p.frontProxyClient.certFile, "--proxy-client-key-file="+p.frontProxyClient.keyFile,
		"--allow-privileged=true", "--profiling=false", "--v=1",
	)...); err != nil {
		return nil, err
	}
	if err := c.waitAPI(ctx); err != nil {
		return nil, err
	}
	if err := c.run("kube-controller-manager", "kube-controller-manager",
		"--kubeconfig="+c.Kubeconfig, "--authentication-kubeconfig="+c.Kubeconfig, "--authorization-kubeconfig="+c.Kubeconfig,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", cmPort),
		"--controllers=*", "--leader-elect=false", "--use-service-account-credentials=false",
		"--service-account-private-key-file="+p.saKeyFile, "--root-ca-file="+p.ca.certFile,
		"--cluster-signing-cert-file="+p.ca.certFile, "--cluster-signing-key-file="+p.ca.keyFile,
		"--node-monitor-grace-period=20s", "--node-monitor-period=2s",
		// The default client budget (20 QPS, burst 30) makes a cluster of
		// thousands of Deployments take half an hour to get a ReplicaSet
		// and a status each (the bench's scale phase); the local
		// apiserver takes far more.
		"--kube-api-qps=200", "--kube-api-burst=400",
		"--profiling=false", "--v=1",
	); err != nil {
		return nil, err
	}
	if err := c.run("kube-scheduler", "kube-scheduler",
		"--kubeconfig="+c.Kubeconfig, "--authentication-kubeconfig="+c.Kubeconfig, "--authorization-kubeconfig="+c.Kubeconfig,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", schedPort),
		"--leader-elect=false", "--profiling=false", "--v=1",
	); err != nil {
		return nil, err
	}
	for i, n := range opts.Nodes {
		if err := c.createNode(ctx, n); err != nil {
			return nil, err
		}
		if err := c.startNode(n, i); err != nil {
			return nil, err
		}
	}
	if err := c.waitDefaultServiceAccount(ctx); err != nil {
		return nil, err
	}
	for _, n := range opts.Nodes {
		if err := c.WaitNodeReady(ctx, n, true); err != nil {
			return nil, err
		}
	}
	if err := c.checkNodesRunPods(ctx, opts.Nodes, nodeCheckTimeout); err != nil {
		return nil, err
	}
	if c.Real != nil {
		if err := c.startForwarder(opts.ForwardCommand); err != nil {
			return nil, err
		}
		if err := c.startRealNode(ctx, c.Real, p, apiPort); err != nil {
			return nil, err
		}
		if err := c.WaitNodeReady(ctx, c.Real.Name, true); err != nil {
			return nil, err
		}
		if err := c.checkNodesRunPods(ctx, []string{c.Real.Name}, realNodeCheckTimeout); err != nil {
			return nil, err
		}
	}
	if err := c.save(); err != nil {
		return nil, err
	}
	real := ""
	if c.Real != nil {
		real = fmt.Sprintf(" and real node %s (%s, network namespace %s)", c.Real.Name, c.Real.NodeIP, c.Real.NetNS)
	}
	c.logf("cluster ready in %s (%d kwok nodes%s): KUBECONFIG=%s", time.Since(start).Round(time.Millisecond), len(opts.Nodes), real, c.Kubeconfig)
	return c, nil
}

// Attach loads the cluster recorded in runDir by an earlier Start.
func Attach(runDir string) (*Cluster, error) {
	b, err := os.ReadFile(filepath.Join(runDir, "state.json"))
	if err != nil {
		return nil, fmt.Errorf("no cluster recorded in %s (start one with `make cluster-up`): %w", runDir, err)
	}
	c := &Cluster{log: io.Discard}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("read %s/state.json: %w", runDir, err)
	}
	if c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		return nil, err
	}
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return nil, err
	}
	return c, nil
}

// SetLog sets where progress lines go.
func (c *Cluster) SetLog(w io.Writer) { c.log = w }

// Stop stops every process the cluster started, the nodes (kwok, image
// agents) first and etcd last.
func (c *Cluster) Stop() error {
	order := []string{"kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"}
	var errs []error
	c.agentsMu.Lock()
	agents := c.agents
	c.agents = nil
	c.agentsMu.Unlock()
	for _, run := range agents {
		run.cancel()
		<-run.done
	}
	if c.Real != nil {
		if c.stopForward != nil {
			c.stopForward()
			<-c.forwardDone
		}
		errs = append(errs, c.Real.teardown(func() {
			for _, name := range []string{"kube-proxy-", "kubelet-", "containerd-"} {
				if p, ok := c.Procs[name+c.Real.Name]; ok {
					_ = p.stop(10 * time.Second)
				}
			}
		}))
	}
	for name, p := range c.Procs {
		if !contains(order, name) {
			errs = append(errs, p.stop(5*time.Second))
		}
	}
	for _, name := range order {
		if p, ok := c.Procs[name]; ok {
			errs = append(errs, p.stop(10*time.Second))
		}
	}
	_ = os.Remove(filepath.Join(c.RunDir, "state.json"))
	return errors.Join(errs...)
}

// Processes returns the PIDs of every process the cluster runs, by name.
func (c *Cluster) Processes() map[string]int {
	m := map[string]int{}
	for n, p := range c.Procs {
		if p.alive() {
			m[n] = p.PID
		}
	}
	return m
}

func (c *Cluster) run(name, bin string, args ...string) error {
	args = append(args, c.extraArgs[name]...)
	p, err := startProcess(c.RunDir, name, filepath.Join(c.BinDir, bin), args, c.Detach)
	if err != nil {
		return err
	}
	c.Procs[name] = p
	return c.save()
}

func (c *Cluster) save() error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	// Replaced whole: a node agent starting meanwhile reads it (Attach).
	tmp := filepath.Join(c.RunDir, "state.json.tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(c.RunDir, "state.json"))
}

func (c *Cluster) logf(format string, args ...any) {
	fmt.Fprintf(c.log, "[localcluster %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// poll calls cond every interval until it returns true, an error that is
// not errNotReady, or the timeout; a dead process named by proc fails fast.
func (c *Cluster) poll(ctx context.Context, what string, timeout time.Duration, proc string, cond func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if proc != "" && !c.Procs[proc].alive() {
			return fmt.Errorf("%s: %s exited; last log lines:\n%s", what, proc, c.Procs[proc].tail(20))
		}
		last = cond(ctx)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not done after %s: %v", what, timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Cluster) waitAPI(ctx context.Context) error {
	return c.poll(ctx, "wait for kube-apiserver /readyz", 90*time.Second, "kube-apiserver", func(ctx context.Context) error {
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("%w: %s", err, body)
		}
		return nil
	})
}

func (c *Cluster) waitDefaultServiceAccount(ctx context.Context) error {
	return c.poll(ctx, "wait for the default ServiceAccount", 60*time.Second, "kube-controller-manager", func(ctx context.Context) error {
		_, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

func writeKubeconfig(path, server string, p *pki) error {
	caPEM, err := os.ReadFile(p.ca.certFile)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificate: p.admin.certFile, ClientKey: p.admin.keyFile}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "admin"}
	cfg.CurrentContext = "local"
	return clientcmd.WriteToFile(*cfg, path)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
