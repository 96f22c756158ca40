package chart

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/image-refresh/image-refresh/internal/cli"
	"github.com/image-refresh/image-refresh/test/support/freeport"
	"github.com/image-refresh/image-refresh/test/support/localcluster"
	"github.com/image-refresh/image-refresh/test/support/running"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// world is one install test: a namespace with the workloads, a registry,
// a release namespace, and the chart installed there with real Helm.
type world struct {
	t         *testing.T
	c         *localcluster.Cluster
	h         *helm
	reg       *testregistry.Server
	ns        string // the workloads' namespace
	releaseNS string
	digest    string // what acme/api:prod points to
}

// eachHelm runs test once per Helm major (subtests helm3 and helm4), each
// with a world of its own installed by that Helm.
func eachHelm(t *testing.T, test func(t *testing.T, w *world)) {
	for _, m := range helmMajors {
		t.Run(m.name, func(t *testing.T) {
			start := time.Now()
			test(t, newWorld(t, newHelmMajor(t, m.major)))
			t.Logf("%s: %s", m.name, time.Since(start).Round(time.Millisecond))
		})
	}
}

func newWorld(t *testing.T, h *helm) *world {
	c := testenv.Cluster(t)
	w := &world{t: t, c: c, h: h, reg: testregistry.Start(t),
		ns: testenv.Namespace(t, c.Client), releaseNS: testenv.Namespace(t, c.Client)}
	w.digest = w.reg.MustPushRandomImage(t, "acme/api", "prod")
	return w
}

func (w *world) tagRef() string { return w.reg.Host() + "/acme/api:prod" }

// install installs the chart as release "ir" with the chart's values for a
// group of one image, api, whose anchor and target is Deployment api in
// w.ns, plus extra values; it is uninstalled when the test ends.
func (w *world) install(extra map[string]any) {
	w.t.Helper()
	values := map[string]any{
		"mode":      "cronjob",
		"discovery": map[string]any{"enabled": false},
		"image":     map[string]any{"repository": "registry.example.com/ops/image-refresh"},
		"config": map[string]any{
			"rolloutTimeout":  "30s",
			"registryTimeout": "3s",
			"registries":      []any{map[string]any{"host": w.reg.Host(), "insecure": true}},
			"groups": []any{map[string]any{
				"name":   "web",
				"anchor": map[string]any{"kind": "Deployment", "namespace": w.ns, "name": "api"},
				"images": []any{map[string]any{
					"name": "api", "repository": w.reg.Host() + "/acme/api", "tag": "prod",
					"targets": []any{map[string]any{"kind": "Deployment", "namespace": w.ns, "name": "api", "container": "api"}},
				}},
			}},
		},
	}
	w.installValues(values, extra)
}

// installValues installs the chart as release "ir" with the values files
// of values, in order; it is uninstalled when the test ends.
func (w *world) installValues(values ...map[string]any) {
	w.t.Helper()
	args := []string{"install", "ir", chartDir(w.t), "--namespace", w.releaseNS}
	for _, v := range values {
		args = append(args, "-f", valuesFile(w.t, v))
	}
	out, err := w.h.run(args...)
	if err != nil {
		w.t.Fatalf("helm install: %v\n%s", err, out)
	}
	w.t.Logf("helm install:\n%s", out)
	w.t.Cleanup(func() {
		if out, err := w.h.run("uninstall", "ir", "--namespace", w.releaseNS); err != nil {
			w.t.Logf("helm uninstall: %v\n%s", err, out)
		}
	})
}

// installed returns the args and ServiceAccount of the installed pod
// template, with --config pointing at a local copy of the installed
// ConfigMap's config.yaml: the exact command the pod would run.
func (w *world) installed(pod corev1.PodSpec) (args []string, sa string) {
	w.t.Helper()
	cm, err := w.c.Client.CoreV1().ConfigMaps(w.releaseNS).Get(context.Background(), "ir-image-refresh", metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	path := filepath.Join(w.t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(cm.Data["config.yaml"]), 0o644); err != nil {
		w.t.Fatal(err)
	}
	args = append([]string(nil), pod.Containers[0].Args...)
	for i := range args {
		if args[i] == "/etc/image-refresh/config.yaml" {
			args[i] = path
		}
	}
	return args, pod.ServiceAccountName
}

// saKubeconfig writes a kubeconfig that authenticates as the ServiceAccount
// with a token from the TokenRequest API, as the pod's projected token
// does, against the cluster's server and CA.
func (w *world) saKubeconfig(sa string) (string, kubernetes.Interface) {
	w.t.Helper()
	exp := int64(3600)
	tr, err := w.c.Client.CoreV1().ServiceAccounts(w.releaseNS).CreateToken(context.Background(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		w.t.Fatalf("token for ServiceAccount %s/%s: %v", w.releaseNS, sa, err)
	}
	ca := w.c.Config.CAData
	if len(ca) == 0 {
		if ca, err = os.ReadFile(w.c.Config.CAFile); err != nil {
			w.t.Fatal(err)
		}
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: w.c.Server, CertificateAuthorityData: ca}
	cfg.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: sa}
	cfg.CurrentContext = "local"
	path := filepath.Join(w.t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		w.t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		w.t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		w.t.Fatal(err)
	}
	return path, client
}

// access is one question for a SelfSubjectAccessReview.
type access struct {
	verb, group, resource, ns, name string
	allowed                         bool
}

func (a access) String() string {
	return fmt.Sprintf("%s %s.%s %s/%s", a.verb, a.resource, a.group, a.ns, a.name)
}

// checkAccess asks the API server, as the client's identity, whether each
// request is allowed (kubectl auth can-i).
func checkAccess(t *testing.T, client kubernetes.Interface, want []access) {
	t.Helper()
	for _, a := range want {
		r, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(context.Background(), &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: a.verb, Group: a.group, Resource: a.resource, Namespace: a.ns, Name: a.name,
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("can-i %s: %v", a, err)
		}
		if r.Status.Allowed != a.allowed {
			t.Errorf("can-i %s = %v, want %v", a, r.Status.Allowed, a.allowed)
		}
	}
}

// watchDeployment watches Deployment ns/name, for ctl.UntilWatched.
func (w *world) watchDeployment(ns, name string) testenv.Watcher {
	return func(ctx context.Context) (watch.Interface, error) {
		return w.c.Client.AppsV1().Deployments(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	}
}

// imageOf returns the first container's image of a Deployment.
func (w *world) imageOf(ns, name string) string {
	w.t.Helper()
	d, err := w.c.Client.AppsV1().Deployments(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	return d.Spec.Template.Spec.Containers[0].Image
}

// runCLI runs image-refresh in-process and returns its exit code and logs.
func runCLI(ctx context.Context, args []string) (int, string) {
	var out, logs bytes.Buffer
	root := cli.NewRoot(&out, &logs)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err != nil {
		fmt.Fprintln(&logs, "image-refresh:", err)
	}
	return cli.ExitCode(err), out.String() + logs.String()
}

// tick runs the installed CronJob's command as its ServiceAccount and
// waits for the namespace's Deployments to settle.
func (w *world) tick(args []string, kubeconfig string) {
	w.t.Helper()
	code, logs := runCLI(context.Background(), append(append([]string(nil), args...), "--kubeconfig", kubeconfig, "--log-format", "text"))
	w.t.Logf("tick exit %d:\n%s", code, logs)
	if code != 0 {
		w.t.Fatalf("tick as the chart's ServiceAccount exited %d, want 0", code)
	}
	for _, bad := range []string{"forbidden", "cannot read imagePullSecrets"} {
		if strings.Contains(logs, bad) {
			w.t.Errorf("tick log says %q: the chart's RBAC is not enough", bad)
		}
	}
	if err := testenv.WaitSettled(context.Background(), w.c.Client, "Deployment", w.ns, "api", 30*time.Second); err != nil {
		w.t.Fatal(err)
	}
}

// TestInstall_CronJobRBACIsEnoughAndNoMore installs mode cronjob with real
// Helm, runs the installed CronJob's tick in-process as the chart's
// ServiceAccount until the target is pinned (R5, R7), and asks the API
// server what that ServiceAccount can do beyond it.
func TestInstall_CronJobRBACIsEnoughAndNoMore(t *testing.T) { eachHelm(t, testInstallCronJobRBAC) }

func testInstallCronJobRBAC(t *testing.T, w *world) {
	other := testenv.Namespace(t, w.c.Client)
	ctx := context.Background()
	testenv.Deployment(t, w.c.Client, w.ns, "api", testenv.WithContainer("api", w.tagRef()), testenv.WithPullSecrets("regcred"))
	testenv.Deployment(t, w.c.Client, w.ns, "unmanaged", testenv.WithContainer("api", w.tagRef()))
	testenv.Deployment(t, w.c.Client, other, "api", testenv.WithContainer("api", w.tagRef()))
	for _, name := range []string{"regcred", "unlisted"} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{}}`)}}
		if _, err := w.c.Client.CoreV1().Secrets(w.ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []struct{ ns, name string }{{w.ns, "api"}, {w.ns, "unmanaged"}, {other, "api"}} {
		if err := testenv.WaitSettled(ctx, w.c.Client, "Deployment", d.ns, d.name, 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	w.install(map[string]any{"registryAuth": map[string]any{"pullSecretsEnabled": true, "pullSecrets": []string{"regcred"}}})

	cj, err := w.c.Client.BatchV1().CronJobs(w.releaseNS).Get(ctx, "ir-image-refresh", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the installed CronJob: %v", err)
	}
	args, sa := w.installed(cj.Spec.JobTemplate.Spec.Template.Spec)
	kubeconfig, asSA := w.saKubeconfig(sa)

	w.tick(args, kubeconfig) // R5: first observation, records the digest
	w.tick(args, kubeconfig) // R7: pins the target still on the tag
	if got, want := w.imageOf(w.ns, "api"), w.tagRef()+"@"+w.digest; got != want {
		t.Fatalf("after two ticks as the chart's ServiceAccount the target is %s, want %s", got, want)
	}
	for _, d := range [][2]string{{w.ns, "unmanaged"}, {other, "api"}} {
		if img := w.imageOf(d[0], d[1]); img != w.tagRef() {
			t.Errorf("Deployment %s/%s outside the config was changed: %s", d[0], d[1], img)
		}
	}

	checkAccess(t, asSA, []access{
		{"get", "apps", "deployments", w.ns, "api", true},
		{"patch", "apps", "deployments", w.ns, "api", true},
		{"create", "", "events", w.ns, "", true},
		{"get", "", "secrets", w.ns, "regcred", true},
		// Not more: only the named workload, only its namespace, no lists.
		{"get", "apps", "deployments", w.ns, "unmanaged", false},
		{"patch", "apps", "deployments", w.ns, "unmanaged", false},
		{"get", "apps", "daemonsets", w.ns, "api", false},
		{"list", "apps", "deployments", w.ns, "", false},
		{"watch", "apps", "deployments", w.ns, "", false},
		{"update", "apps", "deployments", w.ns, "api", false},
		{"delete", "apps", "deployments", w.ns, "api", false},
		{"get", "apps", "deployments", other, "api", false},
		{"patch", "apps", "deployments", other, "api", false},
		{"list", "", "secrets", w.ns, "", false},
		{"get", "", "secrets", w.ns, "unlisted", false},
		{"get", "", "pods", w.ns, "", false},
		{"list", "", "pods", w.ns, "", true}, // what the targets' pods run (N1)
		{"watch", "", "pods", w.ns, "", false},
		{"list", "", "pods", other, "", false},
		{"create", "", "events", other, "", false},
		{"create", "coordination.k8s.io", "leases", w.releaseNS, "", false},
		{"get", "", "configmaps", w.releaseNS, "ir-image-refresh", false},
		// The copy of the group's state beside its anchor (R25).
		{"get", "", "configmaps", w.ns, "image-refresh-state-deployment-api", true},
		{"update", "", "configmaps", w.ns, "image-refresh-state-deployment-api", true},
		{"create", "", "configmaps", w.ns, "", true},
		{"get", "", "configmaps", w.ns, "another", false},
		{"update", "", "configmaps", w.ns, "another", false},
		{"list", "", "configmaps", w.ns, "", false},
		{"create", "", "configmaps", other, "", false},
		// The nodes' labels, for the platforms a new digest must serve
		// (V3): list only, cluster-wide.
		{"list", "", "nodes", "", "", true},
		{"watch", "", "nodes", "", "", false},
		{"get", "", "nodes", "", "node-1", false},
		{"patch", "", "nodes", "", "node-1", false},
	})
	// The ticks above wrote the copy as the chart's ServiceAccount.
	if _, err := w.c.Client.CoreV1().ConfigMaps(w.ns).Get(ctx, "image-refresh-state-deployment-api", metav1.GetOptions{}); err != nil {
		t.Errorf("the ticks wrote no copy of the group's state: %v", err)
	}
}

// TestInstall_C1_C3_ControllerRBAC installs mode controller with leader
// election with real Helm and runs the installed Deployment's `run`
// in-process as the chart's ServiceAccount: its informers sync (list/watch),
// it wins its Lease in the release namespace (C3), serves /readyz (C4) and
// re-pins a revert within seconds (C1).
func TestInstall_C1_C3_ControllerRBAC(t *testing.T) { eachHelm(t, testInstallControllerRBAC) }

func testInstallControllerRBAC(t *testing.T, w *world) {
	ctx := context.Background()
	testenv.Deployment(t, w.c.Client, w.ns, "api", testenv.WithContainer("api", w.tagRef()))
	if err := testenv.WaitSettled(ctx, w.c.Client, "Deployment", w.ns, "api", 60*time.Second); err != nil {
		t.Fatal(err)
	}
	w.install(map[string]any{"mode": "controller", "controller": map[string]any{"leaderElection": map[string]any{"enabled": true}}})

	d, err := w.c.Client.AppsV1().Deployments(w.releaseNS).Get(ctx, "ir-image-refresh", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the installed Deployment: %v", err)
	}
	args, sa := w.installed(d.Spec.Template.Spec)
	kubeconfig, asSA := w.saKubeconfig(sa)
	checkAccess(t, asSA, []access{
		{"list", "apps", "deployments", w.ns, "", true},
		{"watch", "apps", "deployments", w.ns, "", true},
		{"watch", "apps", "statefulsets", w.ns, "", false}, // the config names no StatefulSet: not watched
		{"create", "events.k8s.io", "events", w.ns, "", true},
		{"patch", "events.k8s.io", "events", w.ns, "", true},
		{"watch", "", "pods", w.ns, "", true},
		{"get", "", "pods", w.ns, "", false}, // list and watch only (N1)
		{"create", "coordination.k8s.io", "leases", w.releaseNS, "", true},
		{"update", "coordination.k8s.io", "leases", w.releaseNS, "image-refresh", true},
		{"update", "coordination.k8s.io", "leases", w.releaseNS, "someone-else", false},
		{"create", "coordination.k8s.io", "leases", w.ns, "", false},
		{"list", "apps", "deployments", w.releaseNS, "", false},
		{"list", "", "secrets", w.ns, "", false},
		{"get", "", "secrets", w.ns, "regcred", false}, // pull-secret auth is off
		{"list", "", "configmaps", w.ns, "", true},     // the copies of the state, from the cache (R25)
		{"watch", "", "configmaps", w.ns, "", true},
		{"list", "", "configmaps", w.releaseNS, "", false},
	})

	// Pin first (two ticks, as the controller's own ServiceAccount), so the
	// controller's job below is the revert alone.
	tickArgs := []string{"tick", "--config", args[2], "--discovery=false"} // as the release: discovery off
	w.tick(tickArgs, kubeconfig)
	w.tick(tickArgs, kubeconfig)
	pinned := w.tagRef() + "@" + w.digest
	if got := w.imageOf(w.ns, "api"); got != pinned {
		t.Fatalf("setup: target %s, want %s", got, pinned)
	}

	args = append(args, "--kubeconfig", kubeconfig, "--log-format", "text")
	ctl := running.Start(t, args)
	ctl.WaitReady(t) // the informer caches synced
	leases := w.c.Client.CoordinationV1().Leases(w.releaseNS)
	watchLease := func(ctx context.Context) (watch.Interface, error) {
		return leases.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=image-refresh"})
	}
	ctl.UntilWatched(t, 30*time.Second, "Lease image-refresh held in the release namespace", watchLease, func() bool {
		l, err := w.c.Client.CoordinationV1().Leases(w.releaseNS).Get(ctx, "image-refresh", metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != ""
	})
	l, _ := w.c.Client.CoordinationV1().Leases(w.releaseNS).Get(ctx, "image-refresh", metav1.GetOptions{})
	renewed := l.Spec.RenewTime
	ctl.WaitPasses(t, "web", 0, 1) // the first pass over the group finished

	// A `helm upgrade` re-renders the tag (Helm 3's field manager).
	patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":"api","image":%q}]}}}}`, w.tagRef())
	if _, err := w.c.Client.AppsV1().Deployments(w.ns).Patch(ctx, "api", types.StrategicMergePatchType, []byte(patch),
		metav1.PatchOptions{FieldManager: "helm"}); err != nil {
		t.Fatal(err)
	}
	took := ctl.UntilWatched(t, 30*time.Second, "revert re-pinned by the controller", w.watchDeployment(w.ns, "api"), func() bool { return w.imageOf(w.ns, "api") == pinned })
	t.Logf("revert re-pinned %s after the write (poll interval 5m: the watch did it)", took.Round(time.Millisecond))
	ctl.UntilWatched(t, 30*time.Second, "Lease renewed by the leader (update)", watchLease, func() bool {
		l, err := w.c.Client.CoordinationV1().Leases(w.releaseNS).Get(ctx, "image-refresh", metav1.GetOptions{})
		return err == nil && l.Spec.RenewTime != nil && renewed != nil && l.Spec.RenewTime.After(renewed.Time)
	})
	// An RBAC denial names the ServiceAccount ("is forbidden: User
	// \"system:serviceaccount:…\" cannot …"); a write into another test's
	// namespace while it is deleted is forbidden by the namespace's
	// lifecycle, not by RBAC.
	if logs := ctl.Logs(); strings.Contains(logs, "forbidden: User") {
		t.Errorf("controller log has an RBAC denial:\n%s", logs)
	}
}

// TestInstall_B1_WebhookKeepsItsCABundle installs mode controller with the
// webhook and runs the installed `run` as the chart's ServiceAccount: with
// only get/update on the chart's own MutatingWebhookConfiguration it puts
// its self-signed CA into the caBundle, and it can touch no other one.
func TestInstall_B1_WebhookKeepsItsCABundle(t *testing.T) { eachHelm(t, testInstallWebhookCABundle) }

func testInstallWebhookCABundle(t *testing.T, w *world) {
	ctx := context.Background()
	testenv.Deployment(t, w.c.Client, w.ns, "api", testenv.WithContainer("api", w.tagRef()))
	w.install(map[string]any{"mode": "controller", "webhook": map[string]any{"enabled": true}})

	d, err := w.c.Client.AppsV1().Deployments(w.releaseNS).Get(ctx, "ir-image-refresh", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the installed Deployment: %v", err)
	}
	args, sa := w.installed(d.Spec.Template.Spec)
	kubeconfig, asSA := w.saKubeconfig(sa)
	checkAccess(t, asSA, []access{
		{"get", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "ir-image-refresh", true},
		{"update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "ir-image-refresh", true},
		{"update", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "someone-elses", false},
		{"delete", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "ir-image-refresh", false},
		{"list", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "", false},
		{"create", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "", false},
		{"update", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "ir-image-refresh", false},
	})

	port := strings.TrimPrefix(freeport.MustAddr(t), "127.0.0.1:")
	args = running.SetFlag(args, "--webhook-port", port)
	args = append(args, "--webhook-host", "127.0.0.1", "--kubeconfig", kubeconfig, "--log-format", "text")
	ctl := running.Start(t, args)
	ctl.UntilWatched(t, 60*time.Second, "caBundle of the chart's MutatingWebhookConfiguration filled in", func(ctx context.Context) (watch.Interface, error) {
		return w.c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=ir-image-refresh"})
	}, func() bool {
		mwc, err := w.c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "ir-image-refresh", metav1.GetOptions{})
		return err == nil && len(mwc.Webhooks) == 1 && len(mwc.Webhooks[0].ClientConfig.CABundle) > 0
	})
	ctl.Eventually(t, 60*time.Second, "controller ready (caches synced, webhook serving)", func() bool {
		code, _ := running.Get("http://" + ctl.Health + "/readyz")
		return code == http.StatusOK
	})
	if logs := ctl.Logs(); strings.Contains(logs, "forbidden") || strings.Contains(logs, "cannot update the caBundle") {
		t.Errorf("controller log has an RBAC denial:\n%s", logs)
	}
}

// TestInstall_D1_DefaultsInstallAControllerThatPinsALabelledWorkload
// installs the chart with image.repository alone (and the test registry's
// TLS setting) and runs the installed Deployment's `run` as the chart's
// ServiceAccount: discovery mode, cluster-wide, with the RBAC it needs and
// no more; a workload labelled image-refresh.io/enabled=true is pinned.
func TestInstall_D1_DefaultsInstallAControllerThatPinsALabelledWorkload(t *testing.T) {
	eachHelm(t, testInstallDiscoveryDefaults)
}

func testInstallDiscoveryDefaults(t *testing.T, w *world) {
	ctx := context.Background()
	testenv.Deployment(t, w.c.Client, w.ns, "api", testenv.WithContainer("api", w.tagRef()))
	if err := testenv.WaitSettled(ctx, w.c.Client, "Deployment", w.ns, "api", 60*time.Second); err != nil {
		t.Fatal(err)
	}
	w.installValues(map[string]any{
		"image":  map[string]any{"repository": "registry.example.com/ops/image-refresh"},
		"config": map[string]any{"registries": []any{map[string]any{"host": w.reg.Host(), "insecure": true}}},
	})
	d, err := w.c.Client.AppsV1().Deployments(w.releaseNS).Get(ctx, "ir-image-refresh", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the defaults install no controller Deployment: %v", err)
	}
	args, sa := w.installed(d.Spec.Template.Spec)
	kubeconfig, asSA := w.saKubeconfig(sa)
	checkAccess(t, asSA, []access{
		{"list", "", "namespaces", "", "", true},
		{"watch", "apps", "deployments", "", "", true},
		{"patch", "apps", "deployments", w.ns, "api", true},
		{"watch", "batch", "cronjobs", "", "", true},
		{"watch", "", "pods", "", "", true},
		{"get", "", "pods", w.ns, "", false}, // list and watch only (N1)
		// The ServiceAccounts' imagePullSecrets, from the informer cache
		// (R20, C6): list and watch only.
		{"watch", "", "serviceaccounts", "", "", true},
		{"list", "", "serviceaccounts", w.ns, "", true},
		{"get", "", "serviceaccounts", w.ns, "default", false},
		{"delete", "apps", "deployments", w.ns, "api", false},
		{"update", "apps", "deployments", w.ns, "api", false},
		{"list", "", "secrets", w.ns, "", false},
		{"get", "", "secrets", w.ns, "regcred", false},
		{"patch", "", "namespaces", w.ns, "", false},
		{"create", "coordination.k8s.io", "leases", w.releaseNS, "", false}, // no leader election by default
	})

	args = append(args, "--kubeconfig", kubeconfig, "--log-format", "text")
	ctl := running.Start(t, args)
	ctl.WaitReady(t) // the informer caches synced

	label := `{"metadata":{"labels":{"image-refresh.io/enabled":"true"}}}`
	if _, err := w.c.Client.AppsV1().Deployments(w.ns).Patch(ctx, "api", types.MergePatchType, []byte(label), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	key := "image-refresh.io/last-refreshed-api-digest"
	ctl.UntilWatched(t, 30*time.Second, "labelled workload recorded", w.watchDeployment(w.ns, "api"), func() bool {
		d, err := w.c.Client.AppsV1().Deployments(w.ns).Get(ctx, "api", metav1.GetOptions{})
		return err == nil && d.Annotations[key] == w.digest
	})
	// A removed state annotation starts a pass (as a rearm does): the one
	// that pins the target still on its tag (R5, R7).
	for _, patch := range []string{`{"metadata":{"annotations":{"image-refresh.io/kick":"1"}}}`, `{"metadata":{"annotations":{"image-refresh.io/kick":null}}}`} {
		if _, err := w.c.Client.AppsV1().Deployments(w.ns).Patch(ctx, "api", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pinned := w.tagRef() + "@" + w.digest
	ctl.UntilWatched(t, 30*time.Second, "labelled workload pinned", w.watchDeployment(w.ns, "api"), func() bool { return w.imageOf(w.ns, "api") == pinned })
	// An RBAC denial names the ServiceAccount ("is forbidden: User
	// \"system:serviceaccount:…\" cannot …"); a write into another test's
	// namespace while it is deleted is forbidden by the namespace's
	// lifecycle, not by RBAC.
	if logs := ctl.Logs(); strings.Contains(logs, "forbidden: User") {
		t.Errorf("controller log has an RBAC denial:\n%s", logs)
	}
}
