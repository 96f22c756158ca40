package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DockerConfigSecret creates a kubernetes.io/dockerconfigjson Secret with
// credentials for host.
func (e *Env) DockerConfigSecret(name, host, user, pass string, update bool) {
	e.T.Helper()
	auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	cfg := fmt.Sprintf(`{"auths":{%q:{"username":%q,"password":%q,"auth":%q}}}`, host, user, pass, auth)
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.NS},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: []byte(cfg)},
	}
	var err error
	if update {
		_, err = e.C.Client.CoreV1().Secrets(e.NS).Update(context.Background(), s, metav1.UpdateOptions{})
	} else {
		_, err = e.C.Client.CoreV1().Secrets(e.NS).Create(context.Background(), s, metav1.CreateOptions{})
	}
	if err != nil {
		e.T.Fatal(err)
	}
}

// AssertNoLeak fails when any of secrets appears in the logs, an Event
// message or an annotation value of the namespace's Deployments.
func (e *Env) AssertNoLeak(logs string, secrets ...string) {
	e.T.Helper()
	list, err := e.C.Client.AppsV1().Deployments(e.NS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		e.T.Fatal(err)
	}
	for _, s := range secrets {
		if strings.Contains(logs, s) {
			e.T.Errorf("R20: %q appears in the logs:\n%s", s, logs)
		}
		for _, m := range e.EventMessages() {
			if strings.Contains(m, s) {
				e.T.Errorf("R20: %q appears in an Event: %s", s, m)
			}
		}
		for _, d := range list.Items {
			for k, v := range d.Annotations {
				if strings.Contains(v, s) || strings.Contains(k, s) {
					e.T.Errorf("R20: %q appears in annotation %s=%s of %s", s, k, v, d.Name)
				}
			}
		}
	}
}
