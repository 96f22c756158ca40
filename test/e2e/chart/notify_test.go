package chart

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// TestChart_NotifyServesAPortBehindAServiceAndReadsItsSecretFromASecret:
// with notify.enabled the controller gets --notify-port, the shared secret
// arrives as $IMAGE_REFRESH_NOTIFY_TOKEN from notify.tokenSecret (never an
// argument, R20), a Service routes to the port, and the optional Ingress
// routes to the Service.
func TestChart_NotifyServesAPortBehindAServiceAndReadsItsSecretFromASecret(t *testing.T) {
	h := newHelm(t)
	m := h.template(ciValues(t, "notify"))
	c := one[*appsv1.Deployment](t, m).Spec.Template.Spec.Containers[0]
	if port, ok := argValue(c.Args, "--notify-port"); !ok || port != "8090" {
		t.Errorf("--notify-port %q, want 8090; args %q", port, c.Args)
	}
	if slices.ContainsFunc(c.Args, func(a string) bool { return a == "image-refresh-notify" }) {
		t.Errorf("the Secret's name is an argument: %q", c.Args)
	}
	env := false
	for _, e := range c.Env {
		if e.Name == "IMAGE_REFRESH_NOTIFY_TOKEN" {
			ref := e.ValueFrom.SecretKeyRef
			env = e.Value == "" && ref != nil && ref.Name == "image-refresh-notify" && ref.Key == "token"
		}
	}
	if !env {
		t.Errorf("no IMAGE_REFRESH_NOTIFY_TOKEN from Secret image-refresh-notify key token: %v", c.Env)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "notify" && p.ContainerPort == 8090 }) {
		t.Errorf("no container port notify 8090: %v", c.Ports)
	}
	var svc *corev1.Service
	for _, s := range all[*corev1.Service](m) {
		if s.Name == "rel-image-refresh-notify" {
			svc = s
		}
	}
	if svc == nil || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.StrVal != "notify" || svc.Spec.Selector["app.kubernetes.io/component"] != "controller" {
		t.Fatalf("no Service rel-image-refresh-notify to the controller's notify port: %+v", svc)
	}
	ing := one[*networkingv1.Ingress](t, m)
	rule := ing.Spec.Rules[0]
	backend := rule.HTTP.Paths[0].Backend.Service
	if rule.Host != "hooks.example.com" || backend.Name != svc.Name || backend.Port.Name != "notify" || len(ing.Spec.TLS) != 1 {
		t.Errorf("the Ingress does not route hooks.example.com (TLS) to the Service: %+v", ing.Spec)
	}

	// Off by default: no port, no Service, no Ingress, no secret.
	m = h.template(ciValues(t, "controller"))
	c = one[*appsv1.Deployment](t, m).Spec.Template.Spec.Containers[0]
	if _, ok := argValue(c.Args, "--notify-port"); ok || len(all[*networkingv1.Ingress](m)) != 0 {
		t.Errorf("notifications are on by default: args %q", c.Args)
	}
}
