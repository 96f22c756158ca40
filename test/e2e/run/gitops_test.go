package run

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/image-refresh/image-refresh/test/support/e2e"
	"github.com/image-refresh/image-refresh/test/support/running"
)

// gitOpsCase is one GitOps controller that syncs the bare tag back over the
// pin, written as that tool writes it (O2).
type gitOpsCase struct {
	deploy string
	writer e2e.GitOpsWriter
	// names is how the Events and status name the tool and its application;
	// setting is a word of that tool's own setting that ends the fight.
	names, setting string
}

// gitOpsCases are the tools of docs/gitops.md on Deployments of namespace
// ns, each with the tracking metadata its sync puts on what it applies.
func gitOpsCases(ns string) []gitOpsCase {
	helm := func(patch types.PatchType) e2e.GitOpsWriter {
		return e2e.GitOpsWriter{Manager: "helm-controller", Patch: patch,
			Labels:      map[string]string{"helm.toolkit.fluxcd.io/name": "api", "helm.toolkit.fluxcd.io/namespace": "shop", "app.kubernetes.io/managed-by": "Helm"},
			Annotations: map[string]string{"meta.helm.sh/release-name": "api", "meta.helm.sh/release-namespace": ns}}
	}
	return []gitOpsCase{
		{deploy: "argo", names: "Argo CD (Application shop)", setting: "RespectIgnoreDifferences=true",
			// Argo CD's annotation tracking (its default since 3.0):
			// <app>:<group>/<kind>:<namespace>/<name>.
			writer: e2e.GitOpsWriter{Manager: "argocd-controller", Annotations: map[string]string{"argocd.argoproj.io/tracking-id": "shop:apps/Deployment:" + ns + "/argo"}}},
		{deploy: "argo-csa", names: "Argo CD (Application shop)", setting: "IncludeMutationWebhook=true",
			// Argo CD's client-side apply (no ServerSideApply=true) with
			// label tracking.
			writer: e2e.GitOpsWriter{Manager: "argocd-controller", Patch: types.StrategicMergePatchType, Labels: map[string]string{"app.kubernetes.io/instance": "shop"}}},
		{deploy: "kustomized", names: "Flux kustomize-controller (Kustomization flux-system/apps)", setting: "server-side dry run",
			writer: e2e.GitOpsWriter{Manager: "kustomize-controller", Labels: map[string]string{"kustomize.toolkit.fluxcd.io/name": "apps", "kustomize.toolkit.fluxcd.io/namespace": "flux-system"}}},
		{deploy: "released", names: "Flux helm-controller (HelmRelease shop/api)", setting: "driftDetection.ignore", writer: helm("")},
		{deploy: "corrected", names: "Flux helm-controller (HelmRelease shop/api)", setting: "driftDetection.ignore", writer: helm(types.JSONPatchType)},
	}
}

// TestRun_O2_C5_GitOpsRevertsNameTheToolAndTheFightEndsWithItsOwnSetting:
// each tool applies its workload, image-refresh pins it, and the tool syncs
// the bare tag back after every re-pin. Every re-pin's Event names the tool
// and its application; after C5's bound the fight finding names them and
// the tool's own setting, its metric the tool's field manager; and
// `status -o wide` then names the tool beside the bare tag it left.
func TestRun_O2_C5_GitOpsRevertsNameTheToolAndTheFightEndsWithItsOwnSetting(t *testing.T) {
	e := newEnv(t)
	e.Push("api", "prod")
	tag := e.Repo("api") + ":prod"
	cases := gitOpsCases(e.NS)
	groups := "groups:\n"
	for _, c := range cases {
		if _, err := e.GitOpsApply(c.writer, c.deploy, [][2]string{{"app", tag}}, false); err != nil {
			t.Fatalf("%s applying %s: %v", c.writer.Manager, c.deploy, err)
		}
		groups += e2e.OneGroup("o2-"+c.deploy, "api", c.deploy, "app")
	}
	cfg := e.Config(groups)
	e.Tick(cfg) // first observation: recorded
	e.Tick(cfg) // pinned
	pinned := ""
	for _, c := range cases {
		img := e.Image(c.deploy, "app")
		if !strings.HasPrefix(img, tag+"@sha256:") {
			t.Fatalf("setup: %s not pinned: %s", c.deploy, img)
		}
		pinned = img
	}

	ctl := e.StartRun(cfg, "--poll-interval", "2s", "--poll-jitter", "0", "--fight-max-repins", "3", "--fight-window", "10m")
	ctl.WaitReady(t)
	for _, c := range cases {
		ctl.WaitPasses(t, "o2-"+c.deploy, 0, 1)
	}

	// Each tool syncs its Deployment back to Git's bare tag whenever it
	// sees it pinned, as Argo CD's self-heal and Flux's reconcile do.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var syncs atomic.Int64
	done := make(chan struct{}, len(cases))
	for _, c := range cases {
		go func() {
			defer func() { done <- struct{}{} }()
			for ctx.Err() == nil {
				w, err := e.C.Client.AppsV1().Deployments(e.NS).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + c.deploy})
				if err != nil {
					continue
				}
				for ev := range w.ResultChan() {
					d, ok := ev.Object.(*appsv1.Deployment)
					if ok && d.Spec.Template.Spec.Containers[0].Image == pinned && e.GitOpsRevert(c.writer, c.deploy, 0, "app", tag) == nil {
						syncs.Add(1)
					}
				}
				w.Stop()
			}
		}()
	}
	for _, c := range cases {
		ctl.UntilWatched(t, 90*time.Second, c.deploy+": the fight is reported", e.WatchEvents(), func() bool {
			return e2e.HasEvent(e.Events(c.deploy), "ImageRewriteFight", c.writer.Manager)
		})
	}
	stop()
	for range cases {
		<-done
	}
	// The pass that reports a fight may still have the last re-pin's
	// attempt in flight (R10): the tool's revert rolls out under it, and
	// the pass that sees it settled clears the counter. Stopping before
	// that leaves refresh-attempt at the bound, which status rightly reads
	// as locked-out; so wait until every group confirmed its last attempt.
	ctl.UntilWatched(t, 90*time.Second, "every group's last attempt confirmed", e.WatchDeployments(), func() bool {
		for _, c := range cases {
			if _, inFlight := e.Annotations(c.deploy)[e.Key("refresh-attempt")]; inFlight {
				return false
			}
		}
		return true
	})

	_, body := running.Get("http://" + ctl.Metrics + "/metrics")
	for _, c := range cases {
		t.Run(c.deploy, func(t *testing.T) {
			ev := e.Events(c.deploy)
			if !e2e.HasEvent(ev, "Repinned", "image last written by "+c.names+", field manager "+c.writer.Manager) {
				t.Errorf("no Repinned Event naming %s; events: %q", c.names, ev)
			}
			if !e2e.HasEvent(ev, "ImageRewriteFight", c.writer.Manager) {
				t.Fatalf("no ImageRewriteFight Event; events: %q", ev)
			}
			for _, want := range []string{"syncs the bare tag back: " + c.names, "Remediation: ", c.setting} {
				if !e2e.HasEvent(ev, "ImageRewriteFight", want) {
					t.Errorf("the ImageRewriteFight Event lacks %q; events: %q", want, ev)
				}
			}
			if v, ok := running.MetricValue(body, "image_refresh_rewrite_fights_total", map[string]string{"group": "o2-" + c.deploy, "writer": c.writer.Manager}); !ok || v == "0" {
				t.Errorf("image_refresh_rewrite_fights_total{writer=%s} = %q (present %v), want > 0", c.writer.Manager, v, ok)
			}
			// C5's bound holds against each tool.
			if n := strings.Count(ctl.Logs(), "/"+c.deploy+" container app is not on the pinned digest"); n < 3 || n > 4 {
				t.Errorf("%d re-pins of %s against %s, want the bound (3)", n, c.deploy, c.writer.Manager)
			}
		})
	}
	t.Logf("%d syncs by the tools", syncs.Load())

	// The controller left the targets on the tools' bare tag; status, read
	// from the cluster alone, names the tool that wrote it and its fix.
	ctl.Stop(t)
	code, out, errOut := e.Run("status", "--config", cfg, "--kubeconfig", e.Kubeconfig, "-o", "wide")
	if code != 0 {
		t.Fatalf("status exit %d:\n%s\n%s", code, out, errOut)
	}
	t.Logf("status -o wide:\n%s", out)
	flat := strings.Join(strings.Fields(out), " ")
	for _, c := range cases {
		if got := e.Image(c.deploy, "app"); got != tag {
			t.Errorf("%s runs %s after the fight, want the tool's %s", c.deploy, got, tag)
		}
		for _, want := range []string{"o2-" + c.deploy + "/api drifted", c.names + ", field manager " + c.writer.Manager, c.setting} {
			if !strings.Contains(flat, want) {
				t.Errorf("status -o wide lacks %q:\n%s", want, out)
			}
		}
	}
}
