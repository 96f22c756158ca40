package workload_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

const (
	appTag   = "registry.test/acme/app:prod"
	proxyTag = "registry.test/acme/proxy:prod"
)

// helmSetsImage re-renders one container's image the way a helm upgrade
// does, under Helm's field manager.
func helmSetsImage(t *testing.T, client kubernetes.Interface, ns, name, container, image string) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"spec":{"template":{"spec":{"containers":[{"name":%q,"image":%q}]}}}}`, container, image)
	_, err := client.AppsV1().Deployments(ns).Patch(context.Background(), name, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: "helm"})
	if err != nil {
		t.Fatal(err)
	}
}

func getDeployment(t *testing.T, client kubernetes.Interface, ns, name string) *appsv1.Deployment {
	t.Helper()
	d, err := client.AppsV1().Deployments(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func toJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestImageManager_R17_FollowsTheLastWriterOfEachImage(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithContainer("app", appTag), testenv.WithContainer("proxy", proxyTag))
	ref := config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"}
	manager := func(obj *workload.Object, name string) string {
		ctr, _ := obj.Container(name)
		return ctr.ImageManager
	}

	creator := manager(mustGet(t, wc, ref), "app")
	if creator == "" || creator == "helm" || creator == workload.FieldManager {
		t.Fatalf("creator's manager is %q", creator)
	}
	helmSetsImage(t, c.Client, ns, "api", "app", "registry.test/acme/app:v2")
	obj := mustGet(t, wc, ref)
	if got := manager(obj, "app"); got != "helm" {
		t.Errorf("after helm re-rendered app: manager %q, want helm", got)
	}
	if got := manager(obj, "proxy"); got != creator {
		t.Errorf("proxy's manager %q, want %q (helm did not touch it)", got, creator)
	}
	if _, err := wc.SetImages(context.Background(), obj, []workload.ImageChange{
		{Container: "app", From: "registry.test/acme/app:v2", To: "registry.test/acme/app@" + digestA},
	}); err != nil {
		t.Fatal(err)
	}
	obj = mustGet(t, wc, ref)
	if got := manager(obj, "app"); got != workload.FieldManager {
		t.Errorf("after SetImages: manager %q, want %q", got, workload.FieldManager)
	}
	if got := manager(obj, "proxy"); got != creator {
		t.Errorf("after SetImages: proxy's manager %q, want %q", got, creator)
	}
}

func TestSetImages_R9_R16_OnePatchForTwoContainers(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithContainer("app", appTag), testenv.WithContainer("proxy", proxyTag))
	ref := config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"}
	settle(t, c, ref)
	before := getDeployment(t, c.Client, ns, "api")

	written, err := wc.SetImages(context.Background(), mustGet(t, wc, ref), []workload.ImageChange{
		{Container: "app", From: appTag, To: "registry.test/acme/app@" + digestA},
		{Container: "proxy", From: proxyTag, To: "registry.test/acme/proxy@" + digestB},
	})
	if err != nil || !written {
		t.Fatalf("SetImages = %v, %v; want a write", written, err)
	}
	after := getDeployment(t, c.Client, ns, "api")
	if after.Generation != before.Generation+1 {
		t.Errorf("generation %d → %d, want exactly one write", before.Generation, after.Generation)
	}
	// R16: the spec is the old one with new images; nothing else moved.
	want := before.Spec.DeepCopy()
	want.Template.Spec.Containers[0].Image = "registry.test/acme/app@" + digestA
	want.Template.Spec.Containers[1].Image = "registry.test/acme/proxy@" + digestB
	if w, g := toJSON(t, want), toJSON(t, after.Spec); w != g {
		t.Errorf("spec changed beyond the images:\nwant %s\ngot  %s", w, g)
	}
	// The Deployment controller answers any template change by bumping its
	// own revision annotation, sometimes before the read above: that one is
	// its, not the patch's.
	withoutRevision := func(a map[string]string) map[string]string {
		out := maps.Clone(a)
		delete(out, "deployment.kubernetes.io/revision")
		return out
	}
	if w, g := toJSON(t, []any{before.Labels, withoutRevision(before.Annotations)}), toJSON(t, []any{after.Labels, withoutRevision(after.Annotations)}); w != g {
		t.Errorf("metadata changed: %s → %s", w, g)
	}

	settle(t, c, ref)
	rss, err := c.Client.AppsV1().ReplicaSets(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=api"})
	if err != nil {
		t.Fatal(err)
	}
	pinned := 0
	for _, rs := range rss.Items {
		ctrs := rs.Spec.Template.Spec.Containers
		if ctrs[0].Image == "registry.test/acme/app@"+digestA && ctrs[1].Image == "registry.test/acme/proxy@"+digestB {
			pinned++
		}
	}
	if len(rss.Items) != 2 || pinned != 1 {
		t.Errorf("%d ReplicaSets, %d with both pins; want the original and one new (one rollout)", len(rss.Items), pinned)
	}
}

func TestSetImages_R9_NoWriteWhenAlreadyOnWantedImage(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	pinned := "registry.test/acme/app@" + digestA
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithContainer("app", pinned), testenv.WithContainer("proxy", proxyTag))
	ref := config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"}
	settle(t, c, ref)
	obj := mustGet(t, wc, ref)

	written, err := wc.SetImages(context.Background(), obj, []workload.ImageChange{{Container: "app", From: appTag, To: pinned}})
	if err != nil || written {
		t.Fatalf("SetImages = %v, %v; want no write", written, err)
	}
	d := getDeployment(t, c.Client, ns, "api")
	if d.ResourceVersion != obj.ResourceVersion || d.Generation != obj.Generation {
		t.Errorf("resourceVersion %s → %s, generation %d → %d: something was written", obj.ResourceVersion, d.ResourceVersion, obj.Generation, d.Generation)
	}
	for _, mf := range d.ManagedFields {
		if mf.Manager == workload.FieldManager {
			t.Errorf("managedFields has an %s entry: %v", workload.FieldManager, mf)
		}
	}
}

func TestSetImages_R19_MissingContainerIsAConfigurationError(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithContainer("app", appTag))
	obj := mustGet(t, wc, config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"})
	_, err := wc.SetImages(context.Background(), obj, []workload.ImageChange{{Container: "worker", From: appTag, To: "registry.test/acme/app@" + digestA}})
	if !errors.Is(err, workload.ErrContainerNotFound) {
		t.Errorf("error %v, want ErrContainerNotFound", err)
	}
}

func TestSetImages_ErrChangedWhenTheWorkloadChangedAfterTheRead(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		change   func(t *testing.T, client kubernetes.Interface, ns string)
		wantLive string // app's image after the failed SetImages
	}{
		{"helm re-rendered the image after the read", func(t *testing.T, client kubernetes.Interface, ns string) {
			helmSetsImage(t, client, ns, "api", "app", "registry.test/acme/app:v2")
		}, "registry.test/acme/app:v2"},
		{"another writer inserted a container in front of it", func(t *testing.T, client kubernetes.Interface, ns string) {
			patch := fmt.Appendf(nil, `[{"op":"add","path":"/spec/template/spec/containers/0","value":{"name":"init-proxy","image":%q}}]`, proxyTag)
			if _, err := client.AppsV1().Deployments(ns).Patch(context.Background(), "api", types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}, appTag},
		{"the workload was deleted and created again", func(t *testing.T, client kubernetes.Interface, ns string) {
			if err := client.AppsV1().Deployments(ns).Delete(context.Background(), "api", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			testenv.Deployment(t, client, ns, "api", testenv.WithContainer("app", appTag))
		}, appTag},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, wc, ns := setup(t)
			testenv.Deployment(t, c.Client, ns, "api", testenv.WithContainer("app", appTag))
			ref := config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"}
			obj := mustGet(t, wc, ref)
			tc.change(t, c.Client, ns)

			written, err := wc.SetImages(context.Background(), obj, []workload.ImageChange{{Container: "app", From: appTag, To: "registry.test/acme/app@" + digestA}})
			if written || !errors.Is(err, workload.ErrChanged) {
				t.Fatalf("SetImages = %v, %v; want ErrChanged", written, err)
			}
			if ctr, _ := mustGet(t, wc, ref).Container("app"); ctr.Image != tc.wantLive {
				t.Errorf("app runs %s, want the other writer's %s kept", ctr.Image, tc.wantLive)
			}
		})
	}
}

// A 422 is also what an admission policy's denial looks like. Reporting it
// as ErrChanged would make the caller re-read and retry a write that can
// never succeed.
func TestSetImages_APolicyDenialIsNotReportedAsARace(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	testenv.Deployment(t, c.Client, ns, "api", testenv.WithContainer("app", appTag))
	denyDigests(t, c.Client, ns, "api")
	obj := mustGet(t, wc, config.Workload{Kind: "Deployment", Namespace: ns, Name: "api"})
	_, err := wc.SetImages(context.Background(), obj, []workload.ImageChange{{Container: "app", From: appTag, To: "registry.test/acme/app@" + digestA}})
	if err == nil || errors.Is(err, workload.ErrChanged) || !apierrors.IsInvalid(err) {
		t.Errorf("error %v: want the policy's Invalid error, not ErrChanged", err)
	}
}

// denyDigests installs a ValidatingAdmissionPolicy that rejects digest
// references in the Deployments of ns, and waits until a dry-run of the
// write is denied (policies load asynchronously).
func denyDigests(t *testing.T, client kubernetes.Interface, ns, deployment string) {
	t.Helper()
	ctx := context.Background()
	arv1 := client.AdmissionregistrationV1()
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: new(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{"apps"}, APIVersions: []string{"v1"}, Resources: []string{"deployments"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "object.spec.template.spec.containers.all(c, !c.image.contains('@'))",
				Message:    "digest references are not allowed here",
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        ns,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns},
			}},
		},
	}
	if _, err := arv1.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = arv1.ValidatingAdmissionPolicies().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	if _, err := arv1.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = arv1.ValidatingAdmissionPolicyBindings().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})

	probe := fmt.Appendf(nil, `[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":"registry.test/probe@%s"}]`, digestA)
	// No signal says the API server enforces the policy: its admission
	// plugin loads policies from an informer of its own and announces
	// nothing. So probe with dry runs; the timeout bounds a hang.
	var err error
	testwait.Eventually(t, 30*time.Second, "the policy enforced (a dry-run patch rejected as invalid)", func() bool {
		_, err = client.AppsV1().Deployments(ns).Patch(ctx, deployment, types.JSONPatchType, probe, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && !apierrors.IsInvalid(err) {
			t.Logf("dry-run probe: %v", err)
		}
		return apierrors.IsInvalid(err)
	})
}

// A CronJob is one entry of the kind table: its pod template lives under
// spec.jobTemplate, it is read and patched like the others, and with no
// rollout it is settled as soon as the write is stored (R4).
func TestSetImages_R4_R9_R16_CronJobIsPatchedUnderItsJobTemplateAndSettledOnceStored(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	testenv.CronJob(t, c.Client, ns, "nightly", testenv.WithContainer("app", appTag), testenv.WithContainer("proxy", proxyTag))
	ref := config.Workload{Kind: workload.KindCronJob, Namespace: ns, Name: "nightly"}
	before, err := c.Client.BatchV1().CronJobs(ns).Get(context.Background(), "nightly", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	obj := mustGet(t, wc, ref)
	if !obj.Settled.Settled {
		t.Fatalf("a CronJob as created is not settled: %s", obj.Settled.Reason)
	}
	written, err := wc.SetImages(context.Background(), obj, []workload.ImageChange{
		{Container: "proxy", From: proxyTag, To: "registry.test/acme/proxy@" + digestB},
	})
	if err != nil || !written {
		t.Fatalf("SetImages = %v, %v; want a write", written, err)
	}
	after, err := c.Client.BatchV1().CronJobs(ns).Get(context.Background(), "nightly", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := before.Spec.DeepCopy()
	want.JobTemplate.Spec.Template.Spec.Containers[1].Image = "registry.test/acme/proxy@" + digestB
	if w, g := toJSON(t, want), toJSON(t, after.Spec); w != g {
		t.Errorf("spec changed beyond the image:\nwant %s\ngot  %s", w, g)
	}
	if got := workload.ImageManagers(after)["proxy"]; got != workload.FieldManager {
		t.Errorf("the image's field manager is %q, want %q (R17)", got, workload.FieldManager)
	}
	obj = mustGet(t, wc, ref)
	if ctr, _ := obj.Container("proxy"); ctr.Image != "registry.test/acme/proxy@"+digestB || !obj.Settled.Settled {
		t.Errorf("read back %q, settled %v (%s); want the pin, settled at once", ctr.Image, obj.Settled.Settled, obj.Settled.Reason)
	}
	if _, err := wc.WaitSettled(context.Background(), ref, 5*time.Second); err != nil {
		t.Errorf("WaitSettled on a CronJob: %v", err)
	}
}
