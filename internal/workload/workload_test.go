package workload_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/workload"
	"github.com/image-refresh/image-refresh/test/support/localcluster"
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

const (
	apiTimeout = 10 * time.Second
	digestA    = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	digestB    = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

func setup(t *testing.T) (*localcluster.Cluster, *workload.Client, string) {
	t.Helper()
	c := testenv.Cluster(t)
	return c, workload.New(c.Client, apiTimeout), testenv.Namespace(t, c.Client)
}

func settle(t *testing.T, c *localcluster.Cluster, ref config.Workload) {
	t.Helper()
	if err := testenv.WaitSettled(context.Background(), c.Client, ref.Kind, ref.Namespace, ref.Name, 90*time.Second); err != nil {
		t.Fatal(err)
	}
}

func mustGet(t *testing.T, wc *workload.Client, ref config.Workload) *workload.Object {
	t.Helper()
	obj, err := wc.Get(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

func ptr(s string) *string { return &s }

func TestGet_ReadsEachKind(t *testing.T) {
	t.Parallel()
	c, wc, ns := setup(t)
	opts := []testenv.Option{
		testenv.WithContainer("app", "registry.test/acme/app:prod"),
		testenv.WithContainer("proxy", "registry.test/acme/proxy@"+digestA),
		testenv.WithAnnotations(map[string]string{"tracebloc.io/refresh-attempt": "1"}),
		testenv.WithPullSecrets("regcred", "mirror"),
		testenv.WithTolerateAll(),
	}
	testenv.Deployment(t, c.Client, ns, "api", opts...)
	testenv.DaemonSet(t, c.Client, ns, "agent", opts...)
	testenv.StatefulSet(t, c.Client, ns, "db", opts...)
	testenv.CronJob(t, c.Client, ns, "nightly", opts...)
	for _, ref := range []config.Workload{
		{Kind: "Deployment", Namespace: ns, Name: "api"},
		{Kind: "DaemonSet", Namespace: ns, Name: "agent"},
		{Kind: "StatefulSet", Namespace: ns, Name: "db"},
		{Kind: "CronJob", Namespace: ns, Name: "nightly"},
	} {
		t.Run(ref.Kind, func(t *testing.T) {
			settle(t, c, ref)
			obj := mustGet(t, wc, ref)
			if obj.Ref != ref || obj.UID == "" || obj.ResourceVersion == "" || obj.Generation < 1 {
				t.Errorf("identity: ref %v uid %q rv %q generation %d", obj.Ref, obj.UID, obj.ResourceVersion, obj.Generation)
			}
			var got []string
			for _, ctr := range obj.Containers {
				got = append(got, ctr.Name+"="+ctr.Image)
			}
			want := []string{"app=registry.test/acme/app:prod", "proxy=registry.test/acme/proxy@" + digestA}
			if !slices.Equal(got, want) {
				t.Errorf("containers %v, want %v in order", got, want)
			}
			if ctr, ok := obj.Container("proxy"); !ok || ctr.Image != "registry.test/acme/proxy@"+digestA {
				t.Errorf("Container(proxy) = %v, %v", ctr, ok)
			}
			if _, ok := obj.Container("missing"); ok {
				t.Error("Container(missing) found a container")
			}
			if obj.Annotations["tracebloc.io/refresh-attempt"] != "1" {
				t.Errorf("annotations %v", obj.Annotations)
			}
			if !slices.Equal(obj.PullSecrets, []string{"regcred", "mirror"}) {
				t.Errorf("pull secrets %v", obj.PullSecrets)
			}
			if obj.ServiceAccount != "" {
				t.Errorf("service account %q, want none set", obj.ServiceAccount)
			}
			if !obj.Settled.Settled {
				t.Errorf("not settled after its rollout: %s", obj.Settled.Reason)
			}
		})
	}
}

func TestGet_R4_MissingWorkloadIsNotFoundAndNamed(t *testing.T) {
	t.Parallel()
	_, wc, ns := setup(t)
	ref := config.Workload{Kind: "Deployment", Namespace: ns, Name: "missing"}
	_, err := wc.Get(context.Background(), ref)
	if !apierrors.IsNotFound(err) {
		t.Fatalf("error %v is not NotFound", err)
	}
	if !strings.Contains(err.Error(), "Deployment "+ns+"/missing") {
		t.Errorf("error %q does not name the ref", err)
	}
}

func TestGet_R19_UnsupportedKindIsNamed(t *testing.T) {
	t.Parallel()
	_, wc, ns := setup(t)
	_, err := wc.Get(context.Background(), config.Workload{Kind: "ReplicaSet", Namespace: ns, Name: "nightly"})
	if !errors.Is(err, workload.ErrUnsupportedKind) || !strings.Contains(err.Error(), `"ReplicaSet"`) || !strings.Contains(err.Error(), "CronJob") {
		t.Errorf("error %v: want ErrUnsupportedKind naming ReplicaSet and listing the supported kinds", err)
	}
}

func TestRef_String(t *testing.T) {
	if got := (config.Workload{Kind: "Deployment", Namespace: "tb", Name: "api"}).String(); got != "Deployment tb/api" {
		t.Errorf("String() = %q", got)
	}
}
