package chart

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/pinwebhook"
	"github.com/image-refresh/image-refresh/internal/statestore"
)

// mode is one way to run the chart, with what its rendering must hold.
type mode struct {
	values        string // ci/<values>-values.yaml
	controller    bool
	leaderElect   bool
	webhook       bool
	wantReplicas  int32
	wantResources []string // workload resources the Roles grant list/watch on: the kinds the config names
}

var modes = map[string]mode{
	"cronjob runs tick on a schedule with get/patch by name only": {values: "cronjob"},
	"controller runs one replica of run with list/watch added": {values: "controller", controller: true, wantReplicas: 1,
		wantResources: []string{"daemonsets", "deployments", "statefulsets"}},
	"controller with leader election runs two replicas and may hold its Lease": {values: "leader-election", controller: true, leaderElect: true, wantReplicas: 2,
		wantResources: []string{"daemonsets", "deployments", "statefulsets"}},
	"controller with the webhook serves it behind a fail-open MutatingWebhookConfiguration": {values: "webhook", controller: true, leaderElect: true, webhook: true, wantReplicas: 2,
		wantResources: []string{"daemonsets", "deployments", "statefulsets", "cronjobs"}},
	"controller with the monitoring glue adds a metrics Service, ServiceMonitor, PrometheusRule and dashboard": {values: "monitoring", controller: true, wantReplicas: 1,
		wantResources: []string{"daemonsets", "deployments", "statefulsets"}},
}

func TestChart_LintAndRenderEachMode(t *testing.T) {
	h := newHelm(t)
	for name, md := range modes {
		t.Run(name, func(t *testing.T) {
			h := &helm{t: t, bin: h.bin, home: h.home, kubeconfig: h.kubeconfig}
			if out, err := h.run("lint", "--strict", chartDir(t), "-f", ciValues(t, md.values)); err != nil {
				t.Fatalf("helm lint: %v\n%s", err, out)
			}
			m := h.template(ciValues(t, md.values))
			cfg, err := config.Parse(configOf(t, m), "config.yaml")
			if err != nil {
				t.Fatalf("rendered config.yaml: %v", err)
			}
			checkRBAC(t, m, cfg, md)
			var pod corev1.PodSpec
			if md.controller {
				if n := len(all[*batchv1.CronJob](m)); n != 0 {
					t.Errorf("controller mode rendered %d CronJobs", n)
				}
				pod = checkDeployment(t, m, md)
			} else {
				if n := len(all[*appsv1.Deployment](m)); n != 0 {
					t.Errorf("cronjob mode rendered %d Deployments", n)
				}
				pod = checkCronJob(t, m)
			}
			checkHardened(t, pod)
			if md.webhook {
				checkWebhook(t, m, pod)
			}
		})
	}
}

// checkRBAC: Roles only in the config's namespaces (and the release
// namespace for the Lease), get/patch by resourceNames exactly the config's
// workloads, list/watch only for the controller, secrets by name only where
// targets are, no wildcard, a comment on every rule.
func checkRBAC(t *testing.T, m *manifest, cfg *config.Config, md mode) {
	t.Helper()
	fullname := release + "-image-refresh"
	want := map[string]map[string][]string{} // namespace → resource → names
	copies := map[string][]string{}          // namespace → the state copies' names (R25)
	for _, g := range cfg.Groups {
		a := g.Anchor
		name := statestore.Name(a)
		if !slices.Contains(copies[a.Namespace], name) {
			copies[a.Namespace] = append(copies[a.Namespace], name)
		}
		for _, w := range g.Workloads() {
			if want[w.Namespace] == nil {
				want[w.Namespace] = map[string][]string{}
			}
			res := strings.ToLower(string(w.Kind)) + "s"
			if !slices.Contains(want[w.Namespace][res], w.Name) {
				want[w.Namespace][res] = append(want[w.Namespace][res], w.Name)
			}
		}
	}
	roles := rolesByNamespace(m)
	for ns := range roles {
		if _, ok := want[ns]; !ok && !(md.leaderElect && ns == releaseNS) {
			t.Errorf("a Role in namespace %s, which holds no anchor or target", ns)
		}
	}
	for ns, byRes := range want {
		rules, ok := roles[ns][fullname]
		if !ok {
			t.Errorf("no Role %s in namespace %s, which holds workloads of the config", fullname, ns)
			continue
		}
		got := map[string][]string{}
		var listWatch []string
		var events, seriesEvents, secrets bool
		pods := ""
		var copyNames []string
		copyVerbs := ""
		for _, r := range rules {
			switch {
			case slices.Equal(r.APIGroups, []string{""}) && slices.Equal(r.Resources, []string{"configmaps"}) && len(r.ResourceNames) > 0:
				if !slices.Equal(r.Verbs, []string{"get", "update"}) {
					t.Errorf("%s: the named configmaps rule is not get, update: %s", ns, fmtRules([]rbacv1.PolicyRule{r}))
				}
				copyNames = r.ResourceNames
			case slices.Equal(r.APIGroups, []string{""}) && slices.Equal(r.Resources, []string{"configmaps"}):
				copyVerbs = strings.Join(r.Verbs, ",")
			case workloadGroup(r.APIGroups) && slices.Equal(r.Verbs, []string{"get", "patch"}):
				if len(r.Resources) != 1 || len(r.ResourceNames) == 0 {
					t.Errorf("%s: get/patch rule not narrowed to one kind by resourceNames: %v", ns, fmtRules([]rbacv1.PolicyRule{r}))
					continue
				}
				got[r.Resources[0]] = r.ResourceNames
			case workloadGroup(r.APIGroups) && slices.Equal(r.Verbs, []string{"list", "watch"}):
				listWatch = append(listWatch, r.Resources...)
				if len(r.ResourceNames) > 0 {
					t.Errorf("%s: list/watch with resourceNames does not work for informers", ns)
				}
			case slices.Equal(r.APIGroups, []string{"events.k8s.io"}) && slices.Equal(r.Resources, []string{"events"}):
				seriesEvents = slices.Equal(r.Verbs, []string{"create", "patch"})
			case slices.Equal(r.Resources, []string{"events"}):
				events = slices.Equal(r.Verbs, []string{"create", "get", "update"})
			case slices.Equal(r.APIGroups, []string{""}) && slices.Equal(r.Resources, []string{"pods"}):
				pods = strings.Join(r.Verbs, ",")
			case slices.Equal(r.Resources, []string{"secrets"}):
				secrets = true
				if !slices.Equal(r.Verbs, []string{"get"}) || !slices.Equal(r.ResourceNames, []string{"regcred"}) {
					t.Errorf("%s: secrets rule is not get on exactly [regcred]: %s", ns, fmtRules([]rbacv1.PolicyRule{r}))
				}
			default:
				t.Errorf("%s: unexpected rule%s", ns, fmtRules([]rbacv1.PolicyRule{r}))
			}
		}
		for res := range byRes {
			slices.Sort(byRes[res])
		}
		if !reflect.DeepEqual(got, byRes) {
			t.Errorf("%s: get/patch by name %v, want exactly the config's workloads %v", ns, got, byRes)
		}
		if !slices.Equal(listWatch, md.wantResources) {
			t.Errorf("%s: list/watch on %v, want %v (controller mode only)", ns, listWatch, md.wantResources)
		}
		if !events {
			t.Errorf("%s: no events create/get/update rule%s", ns, fmtRules(rules))
		}
		if wantPods := map[bool]string{false: "list", true: "list,watch"}[md.controller]; pods != wantPods {
			t.Errorf("%s: pods %q, want %q (N1 reads what the pods run)", ns, pods, wantPods)
		}
		if seriesEvents != md.controller {
			t.Errorf("%s: events.k8s.io create/patch rule %v, want it in controller mode only%s", ns, seriesEvents, fmtRules(rules))
		}
		if !secrets {
			t.Errorf("%s: no secrets rule although registryAuth.pullSecretsEnabled", ns)
		}
		// The state copies beside the anchors (R25): by name where the
		// anchors are, create (and the controller's list, watch) there only.
		slices.Sort(copies[ns])
		if !slices.Equal(copyNames, copies[ns]) {
			t.Errorf("%s: configmaps get/update by name %v, want exactly the anchors' state copies %v", ns, copyNames, copies[ns])
		}
		wantCopyVerbs := map[bool]string{false: "create", true: "create,list,watch"}[md.controller]
		if len(copies[ns]) == 0 {
			wantCopyVerbs = ""
		}
		if copyVerbs != wantCopyVerbs {
			t.Errorf("%s: configmaps %q, want %q", ns, copyVerbs, wantCopyVerbs)
		}
	}
	lease := roles[releaseNS][fullname+"-leader-election"]
	if md.leaderElect != (lease != nil) {
		t.Errorf("leader election %v, but lease Role in %s: %s", md.leaderElect, releaseNS, fmtRules(lease))
	}
	if md.leaderElect {
		wantLease := []rbacv1.PolicyRule{
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{"image-refresh"}, Verbs: []string{"get", "update"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		}
		if !reflect.DeepEqual(lease, wantLease) {
			t.Errorf("lease Role rules:%s\nwant:%s", fmtRules(lease), fmtRules(wantLease))
		}
	}
	// The nodes' labels, cluster-wide (V3), and with the webhook its own
	// configuration.
	clusterRoles := all[*rbacv1.ClusterRole](m)
	wantClusterRoles := map[bool]int{false: 1, true: 2}[md.webhook]
	if len(clusterRoles) != wantClusterRoles {
		t.Errorf("webhook %v, but %d ClusterRoles, want %d", md.webhook, len(clusterRoles), wantClusterRoles)
	}
	for _, cr := range clusterRoles {
		want := []rbacv1.PolicyRule{{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingwebhookconfigurations"},
			ResourceNames: []string{fullname}, Verbs: []string{"get", "update"}}}
		if cr.Name == fullname+"-nodes" {
			want = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"},
				Verbs: map[bool][]string{false: {"list"}, true: {"list", "watch"}}[md.controller]}}
		}
		if !reflect.DeepEqual(cr.Rules, want) {
			t.Errorf("ClusterRole %s rules:%s\nwant:%s", cr.Name, fmtRules(cr.Rules), fmtRules(want))
		}
	}
	for _, r := range all[*rbacv1.Role](m) {
		for _, rule := range r.Rules {
			if slices.Contains(rule.Verbs, "*") || slices.Contains(rule.Resources, "*") || slices.Contains(rule.APIGroups, "*") {
				t.Errorf("Role %s/%s has a wildcard rule", r.Namespace, r.Name)
			}
		}
	}
	sa := one[*corev1.ServiceAccount](t, m)
	for _, b := range all[*rbacv1.RoleBinding](m) {
		if b.RoleRef.Kind != "Role" || b.RoleRef.Name != b.Name || len(b.Subjects) != 1 ||
			b.Subjects[0].Name != sa.Name || b.Subjects[0].Namespace != releaseNS {
			t.Errorf("RoleBinding %s/%s does not bind Role %s to ServiceAccount %s/%s", b.Namespace, b.Name, b.Name, releaseNS, sa.Name)
		}
	}
	// Every rule says why it is needed: a comment on the line before it.
	for i, raw := range m.raw {
		if _, ok := m.objects[i].(*rbacv1.Role); !ok {
			if _, ok := m.objects[i].(*rbacv1.ClusterRole); !ok {
				continue
			}
		}
		lines := strings.Split(raw, "\n")
		for j, l := range lines {
			if strings.HasPrefix(strings.TrimSpace(l), "- apiGroups:") && (j == 0 || !strings.HasPrefix(strings.TrimSpace(lines[j-1]), "#")) {
				t.Errorf("%s %s: rule without a comment saying why:\n%s", m.objects[i].GetObjectKind().GroupVersionKind().Kind, m.objects[i].GetName(), l)
			}
		}
	}
}

func checkCronJob(t *testing.T, m *manifest) corev1.PodSpec {
	t.Helper()
	cj := one[*batchv1.CronJob](t, m)
	if cj.Spec.Schedule != "*/15 * * * *" {
		t.Errorf("schedule %q, want the default */15 * * * *", cj.Spec.Schedule)
	}
	if cj.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
		t.Errorf("concurrencyPolicy %q, want Forbid", cj.Spec.ConcurrencyPolicy)
	}
	if l := cj.Spec.FailedJobsHistoryLimit; l == nil || *l != 3 {
		t.Errorf("failedJobsHistoryLimit %v, want 3", l)
	}
	job := cj.Spec.JobTemplate.Spec
	if job.BackoffLimit == nil || *job.BackoffLimit != 0 {
		t.Errorf("backoffLimit %v, want 0 (exit 1 is a finding, not a crash)", job.BackoffLimit)
	}
	if job.ActiveDeadlineSeconds == nil {
		t.Errorf("no activeDeadlineSeconds")
	}
	pod := job.Template.Spec
	if pod.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restartPolicy %q, want Never", pod.RestartPolicy)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	args := pod.Containers[0].Args
	checkArgs(t, args, "tick")
	checkConfigMounted(t, m, pod, args)
	return pod
}

func checkDeployment(t *testing.T, m *manifest, md mode) corev1.PodSpec {
	t.Helper()
	d := one[*appsv1.Deployment](t, m)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != md.wantReplicas {
		t.Errorf("replicas %v, want %d", d.Spec.Replicas, md.wantReplicas)
	}
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	checkArgs(t, c.Args, "run")
	checkConfigMounted(t, m, pod, c.Args)
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for flag, port := range map[string]string{"--metrics-addr": "metrics", "--health-addr": "health"} {
		v, _ := argValue(c.Args, flag)
		if ports[port] == 0 || v != fmt.Sprintf(":%d", ports[port]) {
			t.Errorf("%s %q does not serve container port %s (%d)", flag, v, port, ports[port])
		}
	}
	for probe, want := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if want == nil || want.HTTPGet == nil || want.HTTPGet.Path != probe || want.HTTPGet.Port.StrVal != "health" {
			t.Errorf("probe on %s at port health missing: %+v", probe, want)
		}
	}
	if elect := slices.Contains(c.Args, "--leader-elect"); elect != md.leaderElect {
		t.Errorf("--leader-elect passed %v, want %v", elect, md.leaderElect)
	}
	if ns, _ := argValue(c.Args, "--leader-election-namespace"); md.leaderElect && ns != releaseNS {
		t.Errorf("--leader-election-namespace %q, want the release namespace %s", ns, releaseNS)
	}
	if _, ok := argValue(c.Args, "--webhook-port"); ok != md.webhook {
		t.Errorf("--webhook-port passed %v, want %v", ok, md.webhook)
	}
	return pod
}

// checkConfigMounted: --config names config.yaml of the chart's ConfigMap.
func checkConfigMounted(t *testing.T, m *manifest, pod corev1.PodSpec, args []string) {
	t.Helper()
	path, _ := argValue(args, "--config")
	cm := configMap(t, m)
	for _, vm := range pod.Containers[0].VolumeMounts {
		if filepath.Join(vm.MountPath, "config.yaml") != path {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
				return
			}
		}
	}
	t.Errorf("--config %s is not config.yaml of ConfigMap %s mounted in the pod", path, cm.Name)
}

// checkHardened: non-root 65532, read-only root, no privilege escalation,
// no capabilities, seccomp RuntimeDefault, requests and limits, the token
// mounted, and no writable volume.
func checkHardened(t *testing.T, pod corev1.PodSpec) {
	t.Helper()
	ps := pod.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser != 65532 ||
		ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext not hardened: %+v", ps)
	}
	if pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
		t.Errorf("automountServiceAccountToken must be true: image-refresh talks to the API as its ServiceAccount")
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("container securityContext not hardened: %+v", sc)
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			t.Errorf("no %s request", r)
		}
		if _, ok := c.Resources.Limits[r]; !ok {
			t.Errorf("no %s limit", r)
		}
	}
	var writable []string
	for _, v := range pod.Volumes {
		if v.EmptyDir != nil {
			writable = append(writable, v.Name)
		}
	}
	if len(writable) > 0 {
		t.Errorf("writable volumes %v: nothing writes to disk (a self-signed webhook keeps its key in memory)", writable)
	}
	if !strings.HasPrefix(c.Image, "registry.example.com/ops/image-refresh:") {
		t.Errorf("image %q, want image.repository:tag", c.Image)
	}
}

func checkWebhook(t *testing.T, m *manifest, pod corev1.PodSpec) {
	t.Helper()
	mwc := one[*admissionregistrationv1.MutatingWebhookConfiguration](t, m)
	svc := one[*corev1.Service](t, m)
	if len(mwc.Webhooks) != 1 {
		t.Fatalf("%d webhooks, want 1", len(mwc.Webhooks))
	}
	w := mwc.Webhooks[0]
	if w.FailurePolicy == nil || *w.FailurePolicy != "Ignore" {
		t.Errorf("failurePolicy %v, want Ignore (fail open, B1)", w.FailurePolicy)
	}
	if w.SideEffects == nil || *w.SideEffects != "None" {
		t.Errorf("sideEffects %v, want None", w.SideEffects)
	}
	if w.TimeoutSeconds == nil || *w.TimeoutSeconds != 3 {
		t.Errorf("timeoutSeconds %v, want 3", w.TimeoutSeconds)
	}
	if w.ReinvocationPolicy == nil || *w.ReinvocationPolicy != "IfNeeded" {
		t.Errorf("reinvocationPolicy %v, want IfNeeded", w.ReinvocationPolicy)
	}
	if w.ObjectSelector == nil || w.ObjectSelector.MatchLabels["image-refresh.io/managed"] != "true" {
		t.Errorf("objectSelector %v, want image-refresh.io/managed=true", w.ObjectSelector)
	}
	if len(w.Rules) != 2 || !slices.Equal(w.Rules[0].APIGroups, []string{"apps"}) || !slices.Equal(w.Rules[0].Resources, []string{"daemonsets", "deployments", "statefulsets"}) ||
		!slices.Equal(w.Rules[1].APIGroups, []string{"batch"}) || !slices.Equal(w.Rules[1].Resources, []string{"cronjobs"}) ||
		len(w.Rules[0].Operations) != 2 || len(w.Rules[1].Operations) != 2 {
		t.Errorf("rules %+v, want CREATE and UPDATE of the kinds the config names (apps and batch)", w.Rules)
	}
	ref := w.ClientConfig.Service
	if ref == nil || ref.Name != svc.Name || ref.Namespace != releaseNS || ref.Port == nil || *ref.Port != svc.Spec.Ports[0].Port {
		t.Errorf("clientConfig.service %+v does not point at Service %s/%s", ref, releaseNS, svc.Name)
	}
	if ref != nil && (ref.Path == nil || *ref.Path != pinwebhook.Path) {
		t.Errorf("clientConfig.service.path %v, want the path the webhook serves, %s", ref.Path, pinwebhook.Path)
	}
	if len(w.ClientConfig.CABundle) != 0 {
		t.Errorf("the chart sets a caBundle; the self-signed webhook keeps its own")
	}
	c := pod.Containers[0]
	port, _ := argValue(c.Args, "--webhook-port")
	var named int32
	for _, p := range c.Ports {
		if p.Name == svc.Spec.Ports[0].TargetPort.StrVal {
			named = p.ContainerPort
		}
	}
	if named == 0 || fmt.Sprint(named) != port {
		t.Errorf("Service targetPort %v is container port %d, --webhook-port %s", svc.Spec.Ports[0].TargetPort, named, port)
	}
	for flag, want := range map[string]string{"--webhook-config-name": mwc.Name, "--webhook-service": svc.Name, "--webhook-namespace": releaseNS} {
		if got, _ := argValue(c.Args, flag); got != want {
			t.Errorf("%s %q, want %q (the chart's own object: the certificate and caBundle must match it)", flag, got, want)
		}
	}
}

// TestChart_WebhookWithCertSecret: a certificate of your own (cert-manager)
// is mounted read-only and served; the chart then grants nothing on the
// MutatingWebhookConfiguration.
func TestChart_WebhookWithCertSecret(t *testing.T) {
	h := newHelm(t)
	m := h.template(ciValues(t, "webhook"), valuesFile(t, map[string]any{"webhook": map[string]any{
		"certSecret": "webhook-tls", "annotations": map[string]any{"cert-manager.io/inject-ca-from": releaseNS + "/webhook-tls"}}}))
	for _, cr := range all[*rbacv1.ClusterRole](m) {
		if cr.Name != release+"-image-refresh-nodes" {
			t.Errorf("ClusterRole %s, want none but the nodes' (V3): the caBundle is cert-manager's", cr.Name)
		}
	}
	mwc := one[*admissionregistrationv1.MutatingWebhookConfiguration](t, m)
	if mwc.Annotations["cert-manager.io/inject-ca-from"] == "" {
		t.Errorf("webhook.annotations not on the MutatingWebhookConfiguration: %v", mwc.Annotations)
	}
	pod := one[*appsv1.Deployment](t, m).Spec.Template.Spec
	c := pod.Containers[0]
	checkArgs(t, c.Args, "run")
	if !slices.Contains(c.Args, "--webhook-self-signed=false") {
		t.Errorf("args %q lack --webhook-self-signed=false", c.Args)
	}
	dir, _ := argValue(c.Args, "--webhook-cert-dir")
	ok := false
	for _, vm := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			ok = ok || (vm.Name == v.Name && vm.MountPath == dir && vm.ReadOnly && v.Secret != nil && v.Secret.SecretName == "webhook-tls")
		}
	}
	if !ok {
		t.Errorf("--webhook-cert-dir %q is not Secret webhook-tls mounted read-only", dir)
	}
}

// TestChart_RBACFollowsConfig: a namespace that holds only an anchor gets
// no secrets rule, a namespace outside the config gets nothing, and secrets
// are granted only when pull-secret auth is on.
func TestChart_RBACFollowsConfig(t *testing.T) {
	h := newHelm(t)
	base := map[string]any{
		"mode":      "cronjob",
		"discovery": map[string]any{"enabled": false},
		"image":     map[string]any{"repository": "registry.example.com/ops/image-refresh"},
		"config": map[string]any{"groups": []any{map[string]any{
			"name":   "web",
			"anchor": map[string]any{"kind": "Deployment", "namespace": "state", "name": "holder"},
			"images": []any{map[string]any{"name": "api", "repository": "registry.example.com/acme/api", "tag": "prod",
				"targets": []any{
					map[string]any{"kind": "Deployment", "namespace": "apps", "name": "api", "container": "api"},
					map[string]any{"kind": "StatefulSet", "namespace": "apps", "name": "api", "container": "api"},
				}}},
		}}},
	}
	for _, enabled := range []bool{false, true} {
		auth := valuesFile(t, map[string]any{"registryAuth": map[string]any{"pullSecretsEnabled": enabled, "pullSecrets": []string{"b", "a", "b"}}})
		roles := rolesByNamespace(h.template(valuesFile(t, base), auth))
		if len(roles) != 2 || roles["state"] == nil || roles["apps"] == nil {
			t.Fatalf("Roles in %v, want exactly state and apps", roles)
		}
		for ns, wantSecrets := range map[string]bool{"state": false, "apps": enabled} {
			var got []string
			for _, r := range roles[ns][release+"-image-refresh"] {
				if slices.Equal(r.Resources, []string{"secrets"}) {
					got = r.ResourceNames
				}
			}
			if wantSecrets != (got != nil) || (got != nil && !slices.Equal(got, []string{"a", "b"})) {
				t.Errorf("pullSecretsEnabled=%v: secrets in %s by name %v, want %v", enabled, ns, got, wantSecrets)
			}
		}
		var apps []string
		for _, r := range roles["apps"][release+"-image-refresh"] {
			if slices.Contains(r.Verbs, "patch") {
				apps = append(apps, r.Resources[0]+"/"+strings.Join(r.ResourceNames, ","))
			}
		}
		if want := []string{"deployments/api", "statefulsets/api"}; !slices.Equal(apps, want) {
			t.Errorf("apps: get/patch on %v, want %v (one rule per kind: names do not leak across kinds)", apps, want)
		}
	}
}

// TestChart_D1_RBACLetsTheControllerWatchServiceAccountsWhereItReadsThem:
// with discovery on, the controller reads every image's pods'
// ServiceAccounts from an informer cache (R20, C6), which needs list and
// watch where it reads: the Role of each watched namespace (the
// ClusterRole when discovery is cluster-wide) and, with
// discovery.watchNamespaces, the Role of each configured namespace. A tick
// reads them with a get, in the discovery rules only; discovery off
// grants nothing on ServiceAccounts.
func TestChart_D1_RBACLetsTheControllerWatchServiceAccountsWhereItReadsThem(t *testing.T) {
	h := newHelm(t)
	config := map[string]any{"groups": []any{map[string]any{
		"name":   "web",
		"anchor": map[string]any{"kind": "Deployment", "namespace": "state", "name": "holder"},
		"images": []any{map[string]any{"name": "api", "repository": "registry.example.com/acme/api", "tag": "prod",
			"targets": []any{map[string]any{"kind": "Deployment", "namespace": "apps", "name": "api", "container": "api"}}}},
	}}}
	verbs := func(rules []rbacv1.PolicyRule) []string {
		for _, r := range rules {
			if slices.Equal(r.Resources, []string{"serviceaccounts"}) {
				return r.Verbs
			}
		}
		return nil
	}
	name := release + "-image-refresh"
	for _, tc := range []struct {
		mode      string
		discovery map[string]any
		// want: the serviceaccounts verbs of each Role, by namespace and
		// name ("" for none); cluster: those of the discovery ClusterRole.
		want    map[string]map[string]string
		cluster string
	}{
		{"controller", map[string]any{"watchNamespaces": []string{"shop"}},
			map[string]map[string]string{"shop": {name + "-discovery": "list,watch"}, "state": {name: "list,watch"}, "apps": {name: "list,watch"}}, ""},
		{"controller", map[string]any{"enabled": true},
			map[string]map[string]string{"state": {name: ""}, "apps": {name: ""}}, "list,watch"},
		{"cronjob", map[string]any{"watchNamespaces": []string{"shop"}},
			map[string]map[string]string{"shop": {name + "-discovery": "get"}, "state": {name: ""}, "apps": {name: ""}}, ""},
		{"controller", map[string]any{"enabled": false},
			map[string]map[string]string{"state": {name: ""}, "apps": {name: ""}}, ""},
	} {
		m := h.template(valuesFile(t, map[string]any{
			"mode": tc.mode, "discovery": tc.discovery, "config": config,
			"image": map[string]any{"repository": "registry.example.com/ops/image-refresh"},
		}))
		roles := rolesByNamespace(m)
		for ns, byName := range tc.want {
			for role, want := range byName {
				rules, ok := roles[ns][role]
				if !ok {
					t.Errorf("%s, discovery %v: no Role %s/%s", tc.mode, tc.discovery, ns, role)
					continue
				}
				if got := strings.Join(verbs(rules), ","); got != want {
					t.Errorf("%s, discovery %v: Role %s/%s grants %q on serviceaccounts, want %q", tc.mode, tc.discovery, ns, role, got, want)
				}
			}
		}
		got := ""
		for _, cr := range all[*rbacv1.ClusterRole](m) {
			if cr.Name == name+"-discovery" {
				got = strings.Join(verbs(cr.Rules), ",")
			}
		}
		if got != tc.cluster {
			t.Errorf("%s, discovery %v: the discovery ClusterRole grants %q on serviceaccounts, want %q", tc.mode, tc.discovery, got, tc.cluster)
		}
	}
}

func TestChart_SchemaRejectsBadValues(t *testing.T) {
	h := newHelm(t)
	group := func(field string, value any) map[string]any {
		g := map[string]any{
			"name":   "web",
			"anchor": map[string]any{"kind": "Deployment", "namespace": "tb", "name": "api"},
			"images": []any{map[string]any{"name": "api", "repository": "acme/api", "tag": "prod",
				"targets": []any{map[string]any{"kind": "Deployment", "namespace": "tb", "name": "api", "container": "api"}}}},
		}
		switch field {
		case "anchor.kind":
			g["anchor"].(map[string]any)["kind"] = value
		case "target.kind":
			g["images"].([]any)[0].(map[string]any)["targets"].([]any)[0].(map[string]any)["kind"] = value
		case "image.tag":
			g["images"].([]any)[0].(map[string]any)["tag"] = value
		case "image.extra":
			g["images"].([]any)[0].(map[string]any)["digest"] = value
		}
		return map[string]any{"config": map[string]any{"groups": []any{g}}}
	}
	for name, tc := range map[string]struct {
		values map[string]any
		want   []string // each must appear in helm's error
	}{
		"an unknown config key (the binary's decoder is strict)": {
			values: map[string]any{"config": map[string]any{"firstInstal": "pin-next-tick"}},
			want:   []string{"/config", "firstInstal"},
		},
		"a firstInstall that is not one of the two": {
			values: map[string]any{"config": map[string]any{"firstInstall": "pin-now"}},
			want:   []string{"/config/firstInstall", "pin-next-tick"},
		},
		"a pinFormat that is not one of the two": {
			values: map[string]any{"config": map[string]any{"pinFormat": "sha"}},
			want:   []string{"/config/pinFormat"},
		},
		"no image.repository (no default registry)": {
			values: map[string]any{"image": map[string]any{"repository": nil}},
			want:   []string{"/image", "repository"},
		},
		"an empty image.repository": {
			values: map[string]any{"image": map[string]any{"repository": ""}},
			want:   []string{"/image/repository"},
		},
		"a target kind image-refresh cannot pin": {
			values: group("target.kind", "Job"),
			want:   []string{"/config/groups/0/images/0/targets/0/kind", "Deployment"},
		},
		"an anchor kind image-refresh cannot pin": {
			values: group("anchor.kind", "Job"),
			want:   []string{"/config/groups/0/anchor/kind"},
		},
		"a tag with a digest (an operator pin goes in pinnedDigest)": {
			values: group("image.tag", "prod@sha256:abc"),
			want:   []string{"/config/groups/0/images/0/tag"},
		},
		"an unknown image key": {
			values: group("image.extra", "sha256:abc"),
			want:   []string{"/config/groups/0/images/0", "digest"},
		},
		"a duration the binary cannot parse": {
			values: map[string]any{"config": map[string]any{"rolloutTimeout": "ten minutes"}},
			want:   []string{"/config/rolloutTimeout"},
		},
		"an integer written as a string (the decoder wants a YAML integer)": {
			values: map[string]any{"config": map[string]any{"maxSkipTicks": "8"}},
			want:   []string{"/config/maxSkipTicks"},
		},
		"a watched namespace that is not a namespace name": {
			values: map[string]any{"discovery": map[string]any{"watchNamespaces": []any{"Not_A_Namespace"}}},
			want:   []string{"/discovery/watchNamespaces/0"},
		},
		"an unknown mode": {
			values: map[string]any{"mode": "daemon"},
			want:   []string{"/mode", "cronjob"},
		},
		"an unknown top-level value (a typo is not silently ignored)": {
			values: map[string]any{"webhok": map[string]any{"enabled": true}},
			want:   []string{"webhok"},
		},
		"the webhook in cronjob mode (it needs the long-running controller)": {
			values: map[string]any{"webhook": map[string]any{"enabled": true}},
			want:   []string{"webhook.enabled needs mode: controller"},
		},
		"push notifications in cronjob mode": {
			values: map[string]any{"notify": map[string]any{"enabled": true, "tokenSecret": "hooks"}},
			want:   []string{"notify.enabled needs mode: controller"},
		},
		"push notifications without the Secret of their shared secret": {
			values: map[string]any{"mode": "controller", "notify": map[string]any{"enabled": true}},
			want:   []string{"notify.enabled needs notify.tokenSecret"},
		},
		"an attestation without a predicate type (V5)": {
			values: map[string]any{"config": map[string]any{"verification": []any{map[string]any{
				"name": "release", "repositories": []any{"registry.example.com/acme/*"},
				"cosign":       map[string]any{"publicKeys": []any{"/keys/cosign.pub"}},
				"attestations": []any{map[string]any{"conditions": []any{"true"}}},
			}}}},
			want: []string{"/config/verification/0/attestations/0", "predicateType"},
		},
		"a notify port out of range": {
			values: map[string]any{"notify": map[string]any{"port": 70000}},
			want:   []string{"/notify/port"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := &helm{t: t, bin: h.bin, home: h.home, kubeconfig: h.kubeconfig}
			out, err := h.render(ciValues(t, "cronjob"), valuesFile(t, tc.values))
			if err == nil {
				t.Fatalf("helm template accepted the values:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("helm's error does not name %q:\n%s", w, out)
				}
			}
		})
	}
}

// TestChart_ConfigFileIsTheBinarysConfig: the ConfigMap's config.yaml
// passes the binary's own strict parser, the chart's defaults are the
// binary's defaults, and a full config goes through unchanged.
func TestChart_ConfigFileIsTheBinarysConfig(t *testing.T) {
	h := newHelm(t)
	for name := range modes {
		if _, err := config.Parse(configOf(t, h.template(ciValues(t, modes[name].values))), "config.yaml"); err != nil {
			t.Errorf("%s: rendered config.yaml: %v", modes[name].values, err)
		}
	}

	got, err := config.Parse(configOf(t, h.template(ciValues(t, "cronjob"))), "config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got.Groups, got.Registries = nil, nil
	if want := config.Defaults(); !reflect.DeepEqual(got, want) {
		t.Errorf("values.yaml config defaults differ from the binary's:\n got %+v\nwant %+v", got, want)
	}

	full, err := os.ReadFile(filepath.Join("testdata", "full-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := config.Parse(full, "full-config.yaml")
	if err != nil {
		t.Fatalf("testdata/full-config.yaml: %v", err)
	}
	var asValues map[string]any
	if err := yaml.Unmarshal(full, &asValues); err != nil {
		t.Fatal(err)
	}
	rendered := configOf(t, h.template(ciValues(t, "cronjob"), valuesFile(t, map[string]any{"config": map[string]any{"groups": nil}}),
		valuesFile(t, map[string]any{"config": asValues})))
	got, err = config.Parse(rendered, "config.yaml")
	if err != nil {
		t.Fatalf("rendered full config: %v\n%s", err, rendered)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the chart changed the config:\nrendered %+v\n    want %+v\n%s", got, want, rendered)
	}
}

// TestChart_R14_JobDeadlineOutlastsTheTick: the Job's activeDeadlineSeconds
// is derived from the config so that the tick's own deadline (R14,
// EffectiveTickTimeout) passes first and the tick reports why it stopped.
func TestChart_R14_JobDeadlineOutlastsTheTick(t *testing.T) {
	h := newHelm(t)
	for name, tc := range map[string]struct {
		values map[string]any
		want   func(*config.Config) time.Duration
	}{
		"derived from the workloads and rolloutTimeout": {
			values: map[string]any{},
			want:   func(c *config.Config) time.Duration { return c.EffectiveTickTimeout() + time.Minute },
		},
		"derived from a fractional rolloutTimeout": {
			values: map[string]any{"config": map[string]any{"rolloutTimeout": "1m30.5s"}},
			want:   func(c *config.Config) time.Duration { return c.EffectiveTickTimeout() + time.Minute },
		},
		"a group that rolls back is waited on twice (V2)": {
			values: map[string]any{"config": map[string]any{"groups": []any{map[string]any{
				"name": "web", "onFailedRollout": "rollback",
				"anchor": map[string]any{"kind": "Deployment", "namespace": "shop", "name": "api"},
				"images": []any{map[string]any{"name": "api", "repository": "registry.example.com/acme/api", "tag": "prod",
					"targets": []any{
						map[string]any{"kind": "Deployment", "namespace": "shop", "name": "api", "container": "api"},
						map[string]any{"kind": "Deployment", "namespace": "shop", "name": "worker", "container": "api"},
					}}},
			}}}},
			want: func(c *config.Config) time.Duration {
				if len(c.Groups) != 1 || c.Groups[0].OnFailedRollout != config.OnFailedRolloutRollback {
					t.Errorf("groups %+v: want the one rollback group", c.Groups)
				}
				return c.EffectiveTickTimeout() + time.Minute
			},
		},
		"from tickTimeout when set": {
			values: map[string]any{"config": map[string]any{"tickTimeout": "45m"}},
			want:   func(*config.Config) time.Duration { return 46 * time.Minute },
		},
		"cronjob.activeDeadlineSeconds overrides": {
			values: map[string]any{"cronjob": map[string]any{"activeDeadlineSeconds": 999}},
			want:   func(*config.Config) time.Duration { return 999 * time.Second },
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := &helm{t: t, bin: h.bin, home: h.home, kubeconfig: h.kubeconfig}
			m := h.template(ciValues(t, "cronjob"), valuesFile(t, tc.values))
			cfg, err := config.Parse(configOf(t, m), "config.yaml")
			if err != nil {
				t.Fatal(err)
			}
			got := time.Duration(*one[*batchv1.CronJob](t, m).Spec.JobTemplate.Spec.ActiveDeadlineSeconds) * time.Second
			want := time.Duration(math.Ceil(tc.want(cfg).Seconds())) * time.Second
			if got < want || got > want+time.Second {
				t.Errorf("activeDeadlineSeconds %s, want %s (tick deadline %s)", got, want, cfg.EffectiveTickTimeout())
			}
			if _, set := tc.values["cronjob"]; !set && got <= cfg.EffectiveTickTimeout() {
				t.Errorf("the Job (%s) would be killed before the tick's own deadline (%s)", got, cfg.EffectiveTickTimeout())
			}
		})
	}
}

// TestChart_DockerConfigAndDigest: registryAuth.dockerConfigSecret is
// mounted read-only as $DOCKER_CONFIG/config.json (tick.md's registry auth
// order), and image.digest pins image-refresh itself.
func TestChart_DockerConfigAndDigest(t *testing.T) {
	h := newHelm(t)
	digest := "sha256:" + strings.Repeat("ab", 32)
	m := h.template(ciValues(t, "cronjob"), valuesFile(t, map[string]any{
		"registryAuth": map[string]any{"dockerConfigSecret": "regcred"},
		"image":        map[string]any{"tag": "v1.2.3", "digest": digest},
	}))
	pod := one[*batchv1.CronJob](t, m).Spec.JobTemplate.Spec.Template.Spec
	c := pod.Containers[0]
	if want := "registry.example.com/ops/image-refresh:v1.2.3@" + digest; c.Image != want {
		t.Errorf("image %q, want %q", c.Image, want)
	}
	var dir string
	for _, e := range c.Env {
		if e.Name == "DOCKER_CONFIG" {
			dir = e.Value
		}
	}
	ok := false
	for _, vm := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			ok = ok || (vm.Name == v.Name && vm.MountPath == dir && vm.ReadOnly && v.Secret != nil && v.Secret.SecretName == "regcred" &&
				len(v.Secret.Items) == 1 && v.Secret.Items[0].Key == corev1.DockerConfigJsonKey && v.Secret.Items[0].Path == "config.json")
		}
	}
	if dir == "" || !ok {
		t.Errorf("DOCKER_CONFIG %q is not Secret regcred's %s mounted read-only as config.json", dir, corev1.DockerConfigJsonKey)
	}
	checkHardened(t, pod)
}

// workloadGroup reports whether a rule's API groups are those of workload
// kinds (internal/workload's table: apps, batch).
func workloadGroup(groups []string) bool {
	return slices.Equal(groups, []string{"apps"}) || slices.Equal(groups, []string{"batch"})
}

// TestChart_V1_VerificationKeysAreMountedWhereThePolicyNamesThem: each
// verificationKeys entry mounts its Secret or ConfigMap read-only at
// /var/run/image-refresh/verification/NAME, the directory a policy's
// publicKeys name, in both modes.
func TestChart_V1_VerificationKeysAreMountedWhereThePolicyNamesThem(t *testing.T) {
	h := newHelm(t)
	keys := valuesFile(t, map[string]any{"verificationKeys": []any{
		map[string]any{"name": "release", "secret": "cosign-keys"},
		map[string]any{"name": "lab", "configMap": "lab-keys"},
	}})
	for _, mode := range []string{"cronjob", "controller"} {
		m := h.template(ciValues(t, mode), keys)
		var pod corev1.PodSpec
		if mode == "cronjob" {
			pod = one[*batchv1.CronJob](t, m).Spec.JobTemplate.Spec.Template.Spec
		} else {
			pod = one[*appsv1.Deployment](t, m).Spec.Template.Spec
		}
		for _, want := range []struct{ name, secret, configMap string }{{"release", "cosign-keys", ""}, {"lab", "", "lab-keys"}} {
			ok := false
			for _, vm := range pod.Containers[0].VolumeMounts {
				for _, v := range pod.Volumes {
					if vm.Name != v.Name || vm.MountPath != "/var/run/image-refresh/verification/"+want.name || !vm.ReadOnly {
						continue
					}
					ok = ok || (want.secret != "" && v.Secret != nil && v.Secret.SecretName == want.secret) ||
						(want.configMap != "" && v.ConfigMap != nil && v.ConfigMap.Name == want.configMap)
				}
			}
			if !ok {
				t.Errorf("%s: verificationKeys %s is not mounted read-only at /var/run/image-refresh/verification/%s", mode, want.name, want.name)
			}
		}
	}
	if _, err := h.render(ciValues(t, "cronjob"), valuesFile(t, map[string]any{"verificationKeys": []any{map[string]any{"name": "release"}}})); err == nil {
		t.Errorf("a verificationKeys entry with neither secret nor configMap was accepted")
	}
}

// TestChart_P2_ThePromotionSigningKeyIsMountedReadOnly: promotionSigning.secret
// mounts its Secret read-only at /var/run/image-refresh/promotion, where
// config.promotionSigning.keyFile names the key, in both modes; without
// it nothing is mounted.
func TestChart_P2_ThePromotionSigningKeyIsMountedReadOnly(t *testing.T) {
	h := newHelm(t)
	signing := valuesFile(t, map[string]any{
		"promotionSigning": map[string]any{"secret": "staging-promotion-key"},
		"config": map[string]any{
			"installation":     "staging",
			"promotionSigning": map[string]any{"keyFile": "/var/run/image-refresh/promotion/cosign.key", "passwordFile": "/var/run/image-refresh/promotion/cosign.password"},
		},
	})
	podOf := func(mode string, files ...string) corev1.PodSpec {
		m := h.template(append([]string{ciValues(t, mode)}, files...)...)
		if mode == "cronjob" {
			return one[*batchv1.CronJob](t, m).Spec.JobTemplate.Spec.Template.Spec
		}
		return one[*appsv1.Deployment](t, m).Spec.Template.Spec
	}
	mounted := func(pod corev1.PodSpec) bool {
		for _, vm := range pod.Containers[0].VolumeMounts {
			for _, v := range pod.Volumes {
				if vm.Name == v.Name && vm.MountPath == "/var/run/image-refresh/promotion" && vm.ReadOnly &&
					v.Secret != nil && v.Secret.SecretName == "staging-promotion-key" {
					return true
				}
			}
		}
		return false
	}
	for _, mode := range []string{"cronjob", "controller"} {
		if !mounted(podOf(mode, signing)) {
			t.Errorf("%s: promotionSigning.secret is not mounted read-only at /var/run/image-refresh/promotion", mode)
		}
		for _, v := range podOf(mode).Volumes {
			if v.Name == "promotion-signing" {
				t.Errorf("%s: a promotion-signing volume without promotionSigning.secret", mode)
			}
		}
	}
	// The schema refuses a config the binary would refuse, and accepts
	// the same config without the fault.
	group := func(promotion map[string]any) map[string]any {
		return map[string]any{"groups": []any{map[string]any{
			"name": "prod", "promotion": promotion,
			"anchor": map[string]any{"kind": "Deployment", "namespace": "prod", "name": "api"},
			"images": []any{map[string]any{"name": "api", "repository": "registry.example.com/acme/api", "tag": "prod",
				"targets": []any{map[string]any{"kind": "Deployment", "namespace": "prod", "name": "api", "container": "api"}}}},
		}}}
	}
	attested := map[string]any{"name": "staging", "cosign": map[string]any{"publicKeys": []any{"/k.pub"}}}
	for _, tc := range []struct {
		name      string
		good, bad map[string]any
	}{
		{"an installation that is no label", map[string]any{"installation": "staging-eu"}, map[string]any{"installation": "Staging_EU"}},
		{"a signing key without a file",
			map[string]any{"installation": "staging", "promotionSigning": map[string]any{"keyFile": "/k", "passwordFile": "/p"}},
			map[string]any{"installation": "staging", "promotionSigning": map[string]any{"passwordFile": "/p"}}},
		{"after and attestedBy together", group(map[string]any{"attestedBy": attested, "soak": "10m"}),
			group(map[string]any{"after": "staging", "attestedBy": attested})},
	} {
		if _, err := h.render(ciValues(t, "cronjob"), valuesFile(t, map[string]any{"config": tc.good})); err != nil {
			t.Errorf("%s: the fixed config was refused too: %v", tc.name, err)
		}
		if _, err := h.render(ciValues(t, "cronjob"), valuesFile(t, map[string]any{"config": tc.bad})); err == nil {
			t.Errorf("%s: the chart's schema accepted it", tc.name)
		}
	}
}
