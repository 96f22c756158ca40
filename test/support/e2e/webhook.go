package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/image-refresh/image-refresh/internal/pinwebhook"
	"github.com/image-refresh/image-refresh/test/support/freeport"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

// ManagedLabel is the objectSelector label of docs/webhook.md.
const ManagedLabel = "image-refresh.io/managed"

// WhLabel adds the objectSelector label to Deployments, as the operator does.
func (e *Env) WhLabel(names ...string) {
	e.T.Helper()
	patch := []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, ManagedLabel))
	for _, n := range names {
		if _, err := e.C.Client.AppsV1().Deployments(e.NS).Patch(context.Background(), n, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			e.T.Fatal(err)
		}
	}
}

// WhStartProbed installs the MutatingWebhookConfiguration of docs/webhook.md
// for this namespace, pointing at https://127.0.0.1:PORT/mutate-workloads
// and without a caBundle, then starts `run --webhook-port PORT`, which fills
// the caBundle in (self-signed). It returns once the API server calls the
// webhook: a dry-run re-render of probe's containers to the given images
// comes back pinned.
func (e *Env) WhStartProbed(cfg, probe string, images map[string]string, extra ...string) *RunningController {
	e.T.Helper()
	_, port, _ := net.SplitHostPort(freeport.MustAddr(e.T))
	name := "image-refresh-" + e.NS
	url := "https://127.0.0.1:" + port + pinwebhook.Path
	none, ignore, ifNeeded := admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.Ignore, admissionregistrationv1.IfNeededReinvocationPolicy
	timeout := int32(3)
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:         "workloads.image-refresh.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url},
			Rules: append([]admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{"apps"}, APIVersions: []string{"v1"}, Resources: []string{"deployments", "daemonsets", "statefulsets"}},
			}}, e.WhRules...),
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{ManagedLabel: "true"}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": e.NS}},
			FailurePolicy:           &ignore,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			ReinvocationPolicy:      &ifNeeded,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	mwcs := e.C.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := mwcs.Create(context.Background(), mwc, metav1.CreateOptions{}); err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(func() { _ = mwcs.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	ctl := e.StartRun(cfg, append([]string{"--webhook-port", port, "--webhook-host", "127.0.0.1", "--webhook-config-name", name}, extra...)...)
	e.UntilWatched(30*time.Second, "run put its CA in the caBundle", func(ctx context.Context) (watch.Interface, error) {
		return mwcs.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	}, func() bool {
		got, err := mwcs.Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && strings.Contains(string(got.Webhooks[0].ClientConfig.CABundle), "BEGIN CERTIFICATE")
	})
	// The API server loads the configuration asynchronously and announces
	// nothing: probe with dry runs.
	testwait.Eventually(e.T, 30*time.Second, "the API server calls the webhook", func() bool {
		d, err := e.WhTry("helm", probe, images, true)
		if err != nil {
			return false
		}
		got := WhImages(d)
		for c := range images {
			if !strings.Contains(got[c], "@") {
				return false
			}
		}
		return true
	})
	return ctl
}

// WhWrite re-renders containers' images the way another writer (field
// manager) does and returns the object as the API server stored it.
func (e *Env) WhWrite(manager, deploy string, images map[string]string) *appsv1.Deployment {
	e.T.Helper()
	d, err := e.WhTry(manager, deploy, images, false)
	if err != nil {
		e.T.Fatalf("%s writing %s: %v", manager, deploy, err)
	}
	return d
}

// WhTry writes deploy's containers' images as manager (a dry run if
// dryRun) through the API server and its webhooks, and returns what the
// API server stored or would store.
func (e *Env) WhTry(manager, deploy string, images map[string]string, dryRun bool) (*appsv1.Deployment, error) {
	var cs []map[string]string
	for n, img := range images {
		cs = append(cs, map[string]string{"name": n, "image": img})
	}
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"containers": cs}}}})
	opts := metav1.PatchOptions{FieldManager: manager}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return e.C.Client.AppsV1().Deployments(e.NS).Patch(context.Background(), deploy, types.StrategicMergePatchType, patch, opts)
}

// WhImages maps container name → image of a stored Deployment.
func WhImages(d *appsv1.Deployment) map[string]string {
	out := map[string]string{}
	for _, c := range d.Spec.Template.Spec.Containers {
		out[c.Name] = c.Image
	}
	return out
}
