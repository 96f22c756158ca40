package testenv

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/testcert"
	"github.com/image-refresh/image-refresh/test/support/testwait"
)

// PatchOp is one JSON patch operation a test webhook answers with.
type PatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// Mutate decides a test webhook's patch for one admitted object (raw JSON).
type Mutate func(object []byte) []PatchOp

// MutatingWebhook serves a real mutating admission webhook on 127.0.0.1
// with a self-signed certificate and registers it with the API server
// (MutatingWebhookConfiguration with the CA bundle) for apps/v1
// Deployments, DaemonSets and StatefulSets in namespace ns. It returns a
// counter of the requests it answered. Everything is removed at cleanup.
func MutatingWebhook(t testing.TB, client kubernetes.Interface, ns string, mutate Mutate) *atomic.Int64 {
	t.Helper()
	cert, caPEM := selfSigned(t)
	var calls atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/mutate", func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		var review admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
			http.Error(w, "bad review", http.StatusBadRequest)
			return
		}
		resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
		if ops := mutate(review.Request.Object.Raw); len(ops) > 0 {
			patch, _ := json.Marshal(ops)
			pt := admissionv1.PatchTypeJSONPatch
			resp.Patch, resp.PatchType = patch, &pt
		}
		review.Response, review.Request = resp, nil
		_ = json.NewEncoder(w).Encode(review)
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	url := "https://" + l.Addr().String() + "/mutate"
	none := admissionregistrationv1.SideEffectClassNone
	fail := admissionregistrationv1.Ignore
	timeout := int32(5)
	name := "test-" + ns
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "test.image-refresh.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			Rules:                   webhookRules(),
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
			SideEffects:             &none,
			FailurePolicy:           &fail,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	if _, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(context.Background(), cfg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = srv.Close()
	})
	// The API server picks a new configuration up asynchronously: probe with
	// dry-run creates until the webhook answers, so the caller's next write
	// goes through it.
	probe := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "webhook-probe", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "probe"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "probe"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "probe", Image: "probe.invalid/probe:v1"}}},
			},
		},
	}
	testwait.Eventually(t, 20*time.Second, "the API server calls the test webhook", func() bool {
		_, _ = client.AppsV1().Deployments(ns).Create(context.Background(), probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return calls.Load() > 0
	})
	calls.Store(0)
	return &calls
}

func selfSigned(t testing.TB) (tls.Certificate, []byte) {
	t.Helper()
	p, err := testcert.Loopback("test-webhook")
	if err != nil {
		t.Fatal(err)
	}
	return p.TLS, p.CertPEM
}

// webhookRules are CREATE and UPDATE of every kind of the kind table, one
// rule per API group.
func webhookRules() []admissionregistrationv1.RuleWithOperations {
	var rules []admissionregistrationv1.RuleWithOperations
	at := map[string]int{}
	for _, k := range workload.Kinds() {
		i, ok := at[k.Group]
		if !ok {
			i = len(rules)
			at[k.Group] = i
			rules = append(rules, admissionregistrationv1.RuleWithOperations{
				Operations: []admissionregistrationv1.OperationType{"CREATE", "UPDATE"},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{k.Group}, APIVersions: []string{k.Version}},
			})
		}
		rules[i].Resources = append(rules[i].Resources, k.Resource)
	}
	return rules
}
