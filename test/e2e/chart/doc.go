// Package chart holds the tests of the Helm chart charts/image-refresh: lint
// and render with the real Helm 4 CLI, the values schema, the config file the
// chart renders, and installs on the local cluster that prove its RBAC is
// enough for `tick` and `run` and no more. It has no code of its own.
package chart
