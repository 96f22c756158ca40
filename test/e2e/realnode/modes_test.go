package realnode

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/image-refresh/image-refresh/test/support/localcluster"
	"github.com/image-refresh/image-refresh/test/support/testenv"
	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// runCronJob starts a Job from the release's CronJob, as `kubectl create
// job --from=cronjob/…` does, and waits until it completed; it returns the
// Job's pod.
func (w *world) runCronJob(releaseNS, job string) *corev1.Pod {
	w.t.Helper()
	ctx := context.Background()
	cj, err := w.c.Client.BatchV1().CronJobs(releaseNS).Get(ctx, "ir-image-refresh", metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: job, Namespace: releaseNS, Labels: cj.Spec.JobTemplate.Labels}, Spec: cj.Spec.JobTemplate.Spec}
	if _, err := w.c.Client.BatchV1().Jobs(releaseNS).Create(ctx, j, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	got := &batchv1.Job{}
	werr := until(wctx, byName(w.c.Client.BatchV1().RESTClient(), "jobs", releaseNS, job), &batchv1.Job{}, func(o runtime.Object) (bool, error) {
		got = o.(*batchv1.Job)
		return got.Status.Succeeded == 1 || got.Status.Failed > 0, nil
	})
	pods, err := w.c.Client.CoreV1().Pods(releaseNS).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + job})
	if err != nil || len(pods.Items) == 0 {
		w.t.Fatalf("Job %s: succeeded %d, failed %d (%v); its pods: %v", job, got.Status.Succeeded, got.Status.Failed, werr, err)
	}
	p := &pods.Items[0]
	if got.Status.Succeeded != 1 {
		w.t.Fatalf("Job %s did not complete (succeeded %d, failed %d, %v):\n%s", job, got.Status.Succeeded, got.Status.Failed, werr, w.logs(p))
	}
	return p
}

// TestProduct_S1_CronJobModeTicksToCompletionAndPins installs the chart in
// cronjob mode on the real node: each Job of its CronJob runs `tick` in a
// pod to completion (exit 0); the first records the labelled workload's
// digest (R5), the second pins it.
func TestProduct_S1_CronJobModeTicksToCompletionAndPins(t *testing.T) {
	w := newWorld(t)
	a := w.pushBuild("acme/api", "prod", "A")
	tag := w.host + "/acme/api:prod"
	w.installApp("helm3", tag)
	w.readyPod("api")
	releaseNS := w.installProduct(map[string]any{"mode": "cronjob"})

	for i, want := range []string{"first observation", "pinned"} {
		p := w.runCronJob(releaseNS, fmt.Sprintf("tick-%d", i+1))
		if p.Spec.NodeName != w.c.RealNodeName() {
			t.Errorf("Job pod %s ran on %s, want the real node", p.Name, p.Spec.NodeName)
		}
		st := p.Status.ContainerStatuses
		if len(st) != 1 || st[0].State.Terminated == nil || st[0].State.Terminated.ExitCode != 0 {
			t.Errorf("Job pod %s: container status %+v, want terminated with exit 0", p.Name, st)
		}
		if logs := w.logs(p); !strings.Contains(logs, want) {
			t.Errorf("tick %d's log does not say %q:\n%s", i+1, want, logs)
		}
	}
	w.waitImage("api", tag+"@"+a, time.Minute)
	if got := w.logs(w.readyPod("api")); !strings.Contains(got, "serving build A") {
		t.Errorf("the pinned pod says %q, want build A", got)
	}
}

// TestProduct_S1_R1_AnHTTPSRegistryWithAPrivateCAIsPolledFromThePod serves
// the workload's registry over TLS under a private CA and hands the CA to
// the chart the way docs/chart.md says (a ConfigMap in extraVolumes,
// registries[].caFile): the controller pod polls it and pins.
func TestProduct_S1_R1_AnHTTPSRegistryWithAPrivateCAIsPolledFromThePod(t *testing.T) {
	w := newWorld(t)
	reg := testregistry.New()
	caPEM, err := reg.StartTLSFor("127.0.0.1:0", net.ParseIP(w.c.Real.NodeIP))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(reg.Host())
	var p int
	fmt.Sscan(port, &p)
	host, err := w.c.ExposeTLS(p, caFile)
	if err != nil {
		t.Fatal(err)
	}
	img, err := localcluster.AppImage(w.c.BinDir, "A")
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewTag(host + "/acme/api:prod")
	if err != nil {
		t.Fatal(err)
	}
	// Pushed over TLS from the host through the node's address: the CA
	// is needed here too.
	if err := remote.Write(ref, img, remote.WithTransport(tlsTransport(t, caPEM))); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	a, _ := img.Digest()

	releaseNS := testenv.Namespace(t, w.c.Client)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "registry-ca"}, Data: map[string]string{"ca.pem": string(caPEM)}}
	if _, err := w.c.Client.CoreV1().ConfigMaps(releaseNS).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	repository, _ := productImage(t, w.c)
	w.installProductIn(releaseNS, map[string]any{
		"config": map[string]any{"registries": []any{
			map[string]any{"host": host, "caFile": "/etc/image-refresh/ca/ca.pem"},
			map[string]any{"host": strings.SplitN(repository, "/", 2)[0], "insecure": true},
		}},
		"extraVolumes":      []any{map[string]any{"name": "registry-ca", "configMap": map[string]any{"name": "registry-ca"}}},
		"extraVolumeMounts": []any{map[string]any{"name": "registry-ca", "mountPath": "/etc/image-refresh/ca", "readOnly": true}},
	})

	tag := host + "/acme/api:prod"
	w.installApp("helm3", tag)
	w.waitImage("api", tag+"@"+a.String(), 3*time.Minute)
	if got := w.logs(w.readyPod("api")); !strings.Contains(got, "serving build A") {
		t.Errorf("the pinned pod says %q, want build A", got)
	}
	if logs := w.productLogs(releaseNS); strings.Contains(logs, "x509") || strings.Contains(logs, "certificate") {
		t.Errorf("the controller logged a TLS problem:\n%s", logs)
	}
}

func tlsTransport(t *testing.T, caPEM []byte) *http.Transport {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("the registry's CA is no PEM certificate")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return tr
}
