package pinwebhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/metrics"
	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// benchRate is the steady request rate of BenchmarkAdmission: one request
// every 1/benchRate seconds, sent whether or not the previous one returned
// (an open loop, as the API server calls the webhook).
const benchRate = 200

// BenchmarkAdmission_B1 measures admission latency on loopback: the webhook
// served as Setup serves it (controller-runtime's webhook server, the
// self-signed certificate, HTTP/1.1), the handler reading the recorded
// digest from a controller-runtime reader holding the anchor (as the
// manager's informer cache does), and recorded AdmissionReview bodies of
// the three kinds the API server sends: an UPDATE back to the tag (pinned),
// an UPDATE that leaves the image alone, and a CREATE of an unmanaged
// workload. The config points at a test registry that counts requests: B1
// answers from memory, so the count must stay 0.
//
//	go test -run '^$' -bench BenchmarkAdmission -benchtime 2000x ./internal/pinwebhook/
func BenchmarkAdmission_B1(b *testing.B) {
	reg := testregistry.Start(b)
	digest := reg.MustPushRandomImage(b, "acme/api", "prod")
	repo := reg.Host() + "/acme/api"
	reg.ResetRequests()

	cfg := config.Defaults()
	cfg.Registries = []config.Registry{{Host: reg.Host(), Insecure: true}}
	cfg.Groups = []config.Group{{
		Name:   "cp",
		Anchor: config.Workload{Kind: workload.KindDeployment, Namespace: "tb", Name: "jobs"},
		Images: []config.Image{{Name: "api", Repository: repo, Tag: "prod", Targets: []config.Target{
			{Kind: workload.KindDeployment, Namespace: "tb", Name: "jobs", Container: "api"},
			{Kind: workload.KindDeployment, Namespace: "tb", Name: "proxy", Container: "proxy"},
		}}},
	}}
	anchor := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{
		Namespace: "tb", Name: "jobs",
		Annotations: map[string]string{cfg.AnnotationPrefix + "/last-refreshed-api-digest": digest},
	}}
	cache := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(anchor).Build()
	m := metrics.New()
	h := NewHandler(cfg, CachedAnnotations(cache), func() bool { return true }, m, slog.New(slog.NewTextHandler(io.Discard, nil)))

	// Serve it as Setup does.
	certs, err := NewSelfSigned([]string{"image-refresh.tb.svc", "127.0.0.1"}, DefaultCertValidity, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	srv := webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, TLSOpts: []func(*tls.Config){func(c *tls.Config) {
		c.NextProtos = []string{"http/1.1"}
		c.GetCertificate = certs.GetCertificate
	}}})
	srv.Register(Path, &admission.Webhook{Handler: h})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	b.Cleanup(func() { cancel(); <-done })

	pool := x509.NewCertPool()
	pool.AddCert(certs.CA())
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: 64,
	}}
	url := "https://127.0.0.1:" + strconv.Itoa(port) + Path

	bodies := [][]byte{
		benchReview(b, admissionv1.Update, "jobs", "api", repo+":prod", repo+":prod@"+digest),
		benchReview(b, admissionv1.Update, "proxy", "proxy", repo+":prod@"+digest, repo+":prod@"+digest),
		benchReview(b, admissionv1.Create, "unmanaged", "app", repo+":prod", ""),
	}
	wantPatch := []bool{true, false, false}
	call := func(i int) (time.Duration, error) {
		start := time.Now()
		resp, err := client.Post(url, "application/json", bytes.NewReader(bodies[i%len(bodies)]))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(resp.Body).Decode(&review); err != nil {
			return 0, err
		}
		took := time.Since(start)
		if review.Response == nil || !review.Response.Allowed {
			return took, fmt.Errorf("body %d: not allowed: %+v", i%len(bodies), review.Response)
		}
		if patched := len(review.Response.Patch) > 0; patched != wantPatch[i%len(bodies)] {
			return took, fmt.Errorf("body %d: patched=%v, want %v: %s", i%len(bodies), patched, !patched, review.Response.Patch)
		}
		return took, nil
	}
	// Wait for the server, then warm the connection pool.
	serving(b, "127.0.0.1:"+strconv.Itoa(port), done)
	if _, err := call(0); err != nil {
		b.Fatalf("the webhook server did not answer: %v", err)
	}

	lat := make([]time.Duration, b.N)
	errs := make(chan error, b.N)
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / benchRate)
	defer tick.Stop()
	b.ResetTimer()
	for i := range b.N {
		<-tick.C
		wg.Add(1)
		go func() {
			defer wg.Done()
			took, err := call(i)
			lat[i] = took
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}

	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "max-µs")
	n := len(reg.Requests())
	b.ReportMetric(float64(n), "registry-requests")
	if n != 0 {
		b.Fatalf("%d registry requests during admission, want 0 (B1 answers from memory): %+v", n, reg.Requests())
	}
}

// benchReview is an AdmissionReview as the API server sends it for a
// Deployment with one container (old is "" for CREATE).
func benchReview(b *testing.B, op admissionv1.Operation, name, container, image, old string) []byte {
	b.Helper()
	obj := func(img string) runtime.RawExtension {
		d := appsv1.Deployment{
			TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "tb", Name: name, Labels: map[string]string{"app": name, "image-refresh.io/managed": "true"}},
		}
		d.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}}
		d.Spec.Template.Labels = map[string]string{"app": name}
		d.Spec.Template.Spec.Containers = append(d.Spec.Template.Spec.Containers, corev1.Container{Name: container, Image: img})
		raw, err := json.Marshal(d)
		if err != nil {
			b.Fatal(err)
		}
		return runtime.RawExtension{Raw: raw}
	}
	kind := "CreateOptions"
	if op == admissionv1.Update {
		kind = "PatchOptions"
	}
	options, _ := json.Marshal(map[string]string{"apiVersion": "meta.k8s.io/v1", "kind": kind, "fieldManager": "helm"})
	req := &admissionv1.AdmissionRequest{
		UID:       types.UID("bench-" + name),
		Kind:      metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"},
		Resource:  metav1.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"},
		Name:      name,
		Namespace: "tb",
		Operation: op,
		Object:    obj(image),
		Options:   runtime.RawExtension{Raw: options},
	}
	if old != "" {
		req.OldObject = obj(old)
	}
	raw, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  req,
	})
	if err != nil {
		b.Fatal(err)
	}
	return raw
}
