package e2e

import (
	"github.com/image-refresh/image-refresh/test/support/testenv"
)

// SeedShape is the seed's control plane: jobs-manager (anchor, container
// api) and requests-proxy (container proxy) on one image.
var SeedShape = Groups(GroupOf("control-plane", "Deployment", "jobs-manager",
	ImageOf("api", "api", "prod", Target("Deployment", "jobs-manager", "api"), Target("Deployment", "requests-proxy", "proxy"))))

// Seed creates the seed's two Deployments on repo:prod and returns the
// registry's digest for it.
func (e *Env) Seed() string {
	e.T.Helper()
	digest := e.Push("api", "prod")
	tag := e.Repo("api") + ":prod"
	testenv.Deployment(e.T, e.C.Client, e.NS, "jobs-manager", testenv.WithContainer("api", tag), testenv.WithRecreate())
	testenv.Deployment(e.T, e.C.Client, e.NS, "requests-proxy", testenv.WithContainer("proxy", tag))
	e.Settle("Deployment", "jobs-manager")
	e.Settle("Deployment", "requests-proxy")
	return digest
}

// SeedManifests is what `helm template` renders for the seed's shape:
// comments, an anchor and alias, both quoting styles, a Deployment without
// metadata.namespace, a container that is not a target, a Service, a CRD,
// and a last document without a final newline.
func (e *Env) SeedManifests() string {
	tag := e.Repo("api") + ":prod"
	return `---
# Source: acme/templates/jobs-manager.yaml
apiVersion: apps/v1
kind: Deployment
metadata:
  name: jobs-manager
  labels: &labels {app: jobs-manager}   # selector labels
spec:
  selector: {matchLabels: *labels}
  template:
    metadata: {labels: *labels}
    spec:
      containers:
        - name: api
          image: ` + tag + `
          imagePullPolicy: IfNotPresent
        - name: metrics   # not a target
          image: "` + tag + `"
---
# Source: acme/templates/requests-proxy.yaml
apiVersion: apps/v1
kind: Deployment
metadata: {name: requests-proxy, namespace: ` + e.NS + `}
spec:
  template:
    spec:
      containers: [{name: proxy, image: '` + tag + `'}]
---
apiVersion: v1
kind: Service
metadata:
  name: api
spec:
  ports: [{port: 80}]
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.acme.example.com}
spec:
  group: acme.example.com
  names: {kind: Widget, plural: widgets}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          description: |
            image: ` + tag + `
---
apiVersion: v1
kind: ConfigMap
metadata: {name: values}
data: {image: "` + tag + `"}`
}
