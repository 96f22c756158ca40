package main

import (
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/image-refresh/image-refresh/test/support/localcluster"
)

// storefront is the real node's workload of step 7: an application that
// says which build it runs, adopted by its label (D1).
var storefront = target{"Deployment", "storefront", "app", "storefront"}

// 7. N1 on a real kubelet and containerd: the node's cached :prod is what
// the container itself runs, and says so; the pin ends it.
func (d *demo) stepRealNode() {
	d.step(7, nSteps, "The stale cache, seen from inside a real container")
	if d.cluster.Real == nil {
		d.say("skipped: `make demo REAL_NODES=0` started no real node.")
		return
	}
	node := d.cluster.RealNodeName()
	d.say("Step 1 showed node-2's stale cache as kwok plays it. %s is a real kubelet with containerd", node)
	d.say("and runc (docs/local-cluster.md); it reaches the demo's registry as %s.", d.nodeReg)
	d.say("Build A of an application that prints its build and serves it on :8080 is published under :%s:", tag)
	a := d.pushBuild(storefront.image, "A")
	image := d.nodeRepo(storefront.image) + ":" + tag

	d.say("Deployment storefront: 1 replica on %s, imagePullPolicy IfNotPresent, labelled %s/enabled=true;", node, prefix)
	d.say("its database migration runs first, as an init container from the same :%s (docs/images.md).", tag)
	d.createApp(storefront, image)
	first := d.appPod(storefront)
	d.showPod(first, "A", a)

	d.say("The registry moves :%s to build B. The node keeps build A under the tag.", tag)
	b := d.pushBuild(storefront.image, "B")
	d.say("The pod is replaced (an eviction, a crash, a drain): its ReplicaSet starts a new one on %s.", node)
	grace := int64(0)
	d.must(d.kube.CoreV1().Pods(namespace).Delete(d.ctx, first.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace}), "delete pod "+first.Name)
	stale := d.appPod(storefront, first.Name)
	d.showPod(stale, "A", a)
	d.ok("the new pod ran build A's migration and runs build A although :%s is build B: containerd's cache answered IfNotPresent", tag)

	d.say("image-refresh sees it: the first tick records B (R5) and names the pod and the node (N1).")
	logs := d.tick(0)
	if !strings.Contains(logs, "runs another build than "+b) || !strings.Contains(logs, "pod "+stale.Name+" on node "+node) {
		d.failf("the tick's log does not name pod %s on node %s running another build than %s", stale.Name, node, short(b))
	}
	d.ok("the tick's WARN names pod %s on node %s", stale.Name, node)
	code, out, _ := d.imageRefresh("status", "--config", d.config)
	if code != 0 {
		d.failf("status exited %d", code)
	}
	row := statusRow(out, "storefront/"+storefront.container)
	verdict := "pod " + stale.Name + " on node " + node + " runs " + a
	if !strings.Contains(row, "running-stale") || !strings.Contains(row, " 0/1") || !strings.Contains(strings.Join(strings.Fields(out), " "), verdict) {
		d.failf("status does not say storefront is running-stale, 0/1, %s:\n%s", verdict, out)
	}
	d.ok("status: storefront is off its pin and running-stale, 0/1 pods on the recorded digest: %s", strings.Replace(verdict, a, "build A", 1))
	if row := statusRow(out, "storefront/migrate"); !strings.Contains(row, " (init container) ") || !strings.Contains(row, "running-stale") {
		d.failf("status does not say storefront's migration (an init container) is running-stale:\n%s", out)
	}
	d.ok("status: its migration, an init container, is running-stale too: the old migration ran before the new app")

	d.say("The next tick pins the template to :%s@B; the new pod on the same node pulls B by digest.", tag)
	d.tick(0)
	pinned := d.appPod(storefront, first.Name, stale.Name)
	if got := pinned.Spec.Containers[0].Image; got != image+"@"+b {
		d.failf("the pinned pod asks for %s, want %s@%s", got, image, b)
	}
	d.showPod(pinned, "B", b)
}

// statusRow is the row of status's table whose TARGET is target, its
// fields joined by single spaces and framed by them ("" if none).
func statusRow(table, target string) string {
	for _, l := range strings.Split(table, "\n") {
		f := strings.Fields(l)
		if len(f) > 2 && f[2] == target {
			return " " + strings.Join(f, " ") + " "
		}
	}
	return ""
}

// pushBuild publishes build of the real node's application under :prod.
func (d *demo) pushBuild(img, build string) string {
	app, err := localcluster.AppImage(d.o.binDir, build)
	return d.pushApp(img, build, "", app, err)
}

// pushApp publishes app (made with err), build of img, under :prod; note
// says what is special about it.
func (d *demo) pushApp(img, build, note string, app v1.Image, err error) string {
	d.must(err, "build the application image")
	ref, err := name.NewTag(d.repo(img)+":"+tag, name.Insecure)
	d.must(err, "name the application image")
	d.must(remote.Write(ref, app, remote.WithContext(d.ctx)), "push build "+build)
	digest, err := app.Digest()
	d.must(err, "digest of build "+build)
	if old := d.digests[img]; old != "" {
		d.ok("pushed %s:%s  build %s%s  %s → %s", d.nodeRepo(img), tag, build, note, short(old), short(digest.String()))
	} else {
		d.ok("pushed %s:%s  build %s%s  %s", d.nodeRepo(img), tag, build, note, short(digest.String()))
	}
	d.digests[img] = digest.String()
	return digest.String()
}

// nodeRepo is img's repository as the real node names it.
func (d *demo) nodeRepo(img string) string { return d.nodeReg + "/acme/" + img }

// createApp creates Deployment t on the real node: one replica of image,
// Ready once it serves :8080. The storefront is labelled for discovery.
func (d *demo) createApp(t target, image string) {
	replicas := int32(1)
	grace := int64(1)
	labels := map[string]string{"app": t.name}
	var meta map[string]string
	var inits []corev1.Container
	if t == storefront {
		meta = map[string]string{prefix + "/enabled": "true"}
		// The migration: the same image, which says its build and exits 0.
		inits = []corev1.Container{{Name: "migrate", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
			Env: []corev1.EnvVar{{Name: "EXIT_CODE", Value: "0"}}}}
	}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: t.name, Namespace: namespace, Labels: meta},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{localcluster.RuntimeLabel: "containerd"},
					Tolerations:                   []corev1.Toleration{{Key: localcluster.RuntimeLabel, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
					TerminationGracePeriodSeconds: &grace,
					InitContainers:                inits,
					Containers: []corev1.Container{{
						Name: t.container, Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
						Ports:          []corev1.ContainerPort{{ContainerPort: 8080}},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
					}},
				},
			},
		},
	}
	_, err := d.kube.AppsV1().Deployments(namespace).Create(d.ctx, dep, metav1.CreateOptions{})
	d.must(err, "create Deployment "+t.name)
}

// appPod waits until t's one pod is a Ready pod of its current template,
// none of the pods named in not, and returns it.
func (d *demo) appPod(t target, not ...string) *corev1.Pod {
	_, err := d.wl.WaitSettled(d.ctx, t.ref(), 90*time.Second)
	d.must(err, "wait for Deployment "+t.name)
	deadline := time.Now().Add(60 * time.Second)
	last := "no pod"
	for time.Now().Before(deadline) && d.ctx.Err() == nil {
		list, err := d.kube.CoreV1().Pods(namespace).List(d.ctx, metav1.ListOptions{LabelSelector: "app=" + t.name})
		d.must(err, "list "+t.name+"'s pods")
		if len(list.Items) == 1 {
			p := &list.Items[0]
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil && !contains(not, p.Name) {
					return p
				}
			}
		}
		last = strings.Join(podStates(list.Items), ", ")
		time.Sleep(200 * time.Millisecond)
	}
	d.failf("Deployment %s: no single new Ready pod within 60 s (%s)", t.name, last)
	return nil
}

// showPod shows what pod p's container itself says: its log line through
// the kubelet, its HTTP answer from the host, and the imageID containerd
// reports; it fails unless all three are build (of digest).
func (d *demo) showPod(p *corev1.Pod, build, digest string) {
	if p.Spec.NodeName != d.cluster.RealNodeName() {
		d.failf("pod %s landed on %s, want the real node %s", p.Name, p.Spec.NodeName, d.cluster.RealNodeName())
	}
	d.say("pod %s on node %s, asking for %s:", p.Name, p.Spec.NodeName, strings.TrimPrefix(p.Spec.Containers[0].Image, d.nodeReg+"/"))
	logs := d.kubectl("-n", namespace, "logs", p.Name)
	if !strings.Contains(logs, "nodeapp: serving build "+build+"\n") {
		d.failf("pod %s says %q, want build %s", p.Name, strings.TrimSpace(logs), build)
	}
	if len(p.Spec.InitContainers) > 0 {
		logs := d.kubectl("-n", namespace, "logs", p.Name, "-c", p.Spec.InitContainers[0].Name)
		if !strings.Contains(logs, "nodeapp: build "+build+" exits 0") {
			d.failf("pod %s's migration says %q, want build %s", p.Name, strings.TrimSpace(logs), build)
		}
		d.ok("its migration (init container %s) ran build %s", p.Spec.InitContainers[0].Name, build)
	}
	url := "http://" + p.Status.PodIP + ":8080/"
	code, body := httpGet(url)
	d.say("GET %s from the host: %s", url, strings.TrimSpace(body))
	if code != 200 || strings.TrimSpace(body) != "build "+build {
		d.failf("pod %s at %s answers %d %q, want build %s", p.Name, url, code, strings.TrimSpace(body), build)
	}
	var id string
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == storefront.container {
			id = s.ImageID
		}
	}
	if !strings.HasSuffix(id, "@"+digest) {
		d.failf("pod %s's imageID is %q, want …@%s (build %s)", p.Name, id, digest, build)
	}
	d.ok("its container says build %s, serves build %s, and runs imageID …@%s", build, build, short(digest))
}

func podStates(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name+" "+string(p.Status.Phase))
	}
	return out
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
