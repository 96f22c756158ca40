package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/internal/config"
)

// 6. D1: a workload no config names is adopted with `kubectl label` alone.
func (d *demo) stepAdopt() {
	d.step(6, nSteps, "Adopt a workload with a label alone")
	d.say("A Deployment no config names, on the floating tag: image-refresh leaves it alone…")
	image := d.repo(images[0]) + ":" + tag
	replicas := int32(1)
	labels := map[string]string{"app": "adopted"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "adopted", Namespace: namespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "app", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				}}},
			},
		},
	}
	_, err := d.kube.AppsV1().Deployments(namespace).Create(d.ctx, dep, metav1.CreateOptions{})
	d.must(err, "create Deployment adopted")
	ref := config.Workload{Kind: "Deployment", Namespace: namespace, Name: "adopted"}
	_, err = d.wl.WaitSettled(d.ctx, ref, 60*time.Second)
	d.must(err, "wait for Deployment adopted")
	d.tick(0)
	if got := d.liveOf(ref, "app"); got != image {
		d.failf("an unlabelled workload was touched: %s", got)
	}
	d.ok("unlabelled: still %s", image)

	d.say("…until it is labelled (docs/discovery.md). No config entry: the label is the whole change.")
	args := []string{"label", "deployment", "adopted", "-n", namespace, prefix + "/enabled=true"}
	d.command("kubectl " + strings.Join(args, " "))
	cmd := exec.CommandContext(d.ctx, filepath.Join(d.o.binDir, "kubectl"), args...)
	cmd.Env = os.Environ() // KUBECONFIG was exported in setup
	out, err := cmd.CombinedOutput()
	d.line("     ", strings.TrimSpace(string(out)))
	d.must(err, "kubectl label")
	for range 2 { // R5: the first tick records, the second pins (R7)
		d.tick(0)
		_, err = d.wl.WaitSettled(d.ctx, ref, 60*time.Second)
		d.must(err, "wait for Deployment adopted")
	}
	want := image + "@" + d.digests[images[0]]
	if got := d.liveOf(ref, "app"); got != want {
		d.failf("the labelled Deployment runs %s, want %s", got, want)
	}
	d.ok("adopted: %s (its own group %s/deployment/adopted; the tag is kept)", want, namespace)
}

func (d *demo) liveOf(ref config.Workload, container string) string {
	obj, err := d.wl.Get(d.ctx, ref)
	d.must(err, "read "+ref.String())
	c, ok := obj.Container(container)
	if !ok {
		d.failf("%s has no container %s", ref, container)
	}
	return c.Image
}
