#!/usr/bin/env bash
# Builds, once, the binaries of the local test cluster into a cache directory
# outside the repository:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (k8s.io/kubernetes),
#   etcd (go.etcd.io/etcd/server/v3, the version kubernetes pins), kwok,
#   helm (helm.sh/helm/v4, for `make demo` and the chart tests),
#   helm3 (helm.sh/helm/v3 as pinned by clusterbin/helm3/go.mod, for the
#   tests that run each Helm major),
#   kubelet and kube-proxy (k8s.io/kubernetes as pinned by
#   clusterbin/node/go.mod, for the real node: docs/local-cluster.md).
# Idempotent: stamp files record what was built; nothing is rebuilt when they
# match. helm3 has a stamp of its own, so a cache built before it existed
# (or by a checkout without it) gets only helm3 added, not a full rebuild.
# Prints the cache directory on stdout, progress on stderr.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${IMAGE_REFRESH_CLUSTER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/image-refresh/cluster-${K8S_VERSION}}
stamp="$cache/.stamp"
want="k8s=${K8S_VERSION} kwok=${KWOK_VERSION} wrapper=$(cat "$here/clusterbin/go.mod" "$here/clusterbin/go.sum" "$here/clusterbin/etcd/main.go" | sha256sum | cut -c1-16)"
stamp3="$cache/.stamp-helm3"
want3="helm3=$(cat "$here/clusterbin/helm3/go.mod" "$here/clusterbin/helm3/go.sum" | sha256sum | cut -c1-16)"
stampn="$cache/.stamp-node"
wantn="node=${K8S_VERSION} $(cat "$here/clusterbin/node/go.mod" "$here/clusterbin/node/go.sum" | sha256sum | cut -c1-16)"

log() { printf '[build-cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v go >/dev/null || die "the go command is not on PATH; install Go 1.26 or newer"

# Prints the cache directory and exits when everything is built already.
cluster_built() {
  [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] || return 1
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl helm etcd kwok; do
    [[ -x "$cache/$b" ]] || die "stamp present but $cache/$b is missing; remove $stamp to rebuild"
  done
}
helm3_built() {
  [[ -f "$stamp3" && "$(cat "$stamp3")" == "$want3" && -x "$cache/helm3" ]]
}
node_built() {
  [[ -f "$stampn" && "$(cat "$stampn")" == "$wantn" && -x "$cache/kubelet" && -x "$cache/kube-proxy" ]]
}
exit_if_built() {
  cluster_built && helm3_built && node_built || return 0
  echo "$cache"
  exit 0
}
# shellcheck source=hack/lib/build-once.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/build-once.sh"
build_once .lock

total_start=$SECONDS
build_cluster() {
  log "building cluster binaries into $cache (cold: about 10 minutes on 2 cores; later runs reuse them)"

  ldflags=""
  maj=${K8S_VERSION#v}; maj=${maj%%.*}
  min=${K8S_VERSION#v*.}; min=${min%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=${K8S_VERSION} -X $pkg.gitMajor=${maj} -X $pkg.gitMinor=${min}"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done

  build() { # name package
    local name=$1 pkg=$2 start=$SECONDS
    log "  $name: building $pkg"
    (cd "$here/clusterbin" && go build -ldflags "$ldflags" -o "$cache/$name.tmp" "$pkg") \
      || die "building $name from $pkg failed (see the go output above)"
    mv "$cache/$name.tmp" "$cache/$name"
    log "  $name: done in $((SECONDS - start)) s"
  }
  build etcd ./etcd
  build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
  build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
  build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
  build kubectl k8s.io/kubernetes/cmd/kubectl
  build helm helm.sh/helm/v4/cmd/helm

  start=$SECONDS
  log "  kwok: installing sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"
  GOBIN="$cache" GOFLAGS=-mod=mod go install "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}" \
    || die "installing kwok ${KWOK_VERSION} failed (see the go output above)"
  log "  kwok: done in $((SECONDS - start)) s"

  # kwok's Stage documents ship inside its module; keep a copy next to the binary.
  kwokdir=$(GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kwok@${KWOK_VERSION}" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
  [[ -d "$kwokdir/kustomize/stage" ]] || die "kwok stage documents not found under $kwokdir/kustomize/stage"
  rm -rf "$cache/stage" && mkdir -p "$cache/stage"
  cp -r "$kwokdir/kustomize/stage/." "$cache/stage/" && chmod -R u+w "$cache/stage"

  echo "$want" > "$stamp"
}

# Helm 3, from its own module (it pins the k8s.io modules of its release, not
# the cluster's), with the version ldflags of Helm's Makefile: without them
# `helm3 version` says v3.21 with no patch, and the Kubernetes version it
# assumes when no cluster is asked (helm template, lint) is v1.20.
build_helm3() {
  local start=$SECONDS dir="$here/clusterbin/helm3" version client k8s_minor
  version=$(cd "$dir" && go list -m -f '{{.Version}}' helm.sh/helm/v3) || die "helm.sh/helm/v3 not found in $dir/go.mod"
  client=$(cd "$dir" && go list -m -f '{{.Version}}' k8s.io/client-go) || die "k8s.io/client-go not found in $dir/go.mod"
  k8s_minor=${client#v0.}; k8s_minor=${k8s_minor%%.*}
  log "  helm3: building helm.sh/helm/v3/cmd/helm ${version} (Kubernetes default v1.${k8s_minor})"
  local v3ldflags="-X helm.sh/helm/v3/internal/version.version=${version}"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    v3ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=${k8s_minor}"
  done
  (cd "$dir" && go build -ldflags "$v3ldflags" -o "$cache/helm3.tmp" helm.sh/helm/v3/cmd/helm) \
    || die "building helm3 failed (see the go output above)"
  mv "$cache/helm3.tmp" "$cache/helm3"
  echo "$want3" > "$stamp3"
  log "  helm3: done in $((SECONDS - start)) s"
}

# The real node's kubelet and kube-proxy, from a module of their own (their
# dependencies add go.sum lines the control plane does not need), with the
# control plane's version ldflags.
build_node() {
  local start=$SECONDS dir="$here/clusterbin/node" name ldflags=""
  local maj=${K8S_VERSION#v}; maj=${maj%%.*}
  local min=${K8S_VERSION#v*.}; min=${min%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=${K8S_VERSION} -X $pkg.gitMajor=${maj} -X $pkg.gitMinor=${min}"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  for name in kubelet kube-proxy; do
    log "  $name: building k8s.io/kubernetes/cmd/$name"
    (cd "$dir" && go build -ldflags "$ldflags" -o "$cache/$name.tmp" "k8s.io/kubernetes/cmd/$name") \
      || die "building $name failed (see the go output above)"
    mv "$cache/$name.tmp" "$cache/$name"
  done
  echo "$wantn" > "$stampn"
  log "  kubelet, kube-proxy: done in $((SECONDS - start)) s"
}

if ! cluster_built; then build_cluster; fi
if ! helm3_built; then build_helm3; fi
if ! node_built; then build_node; fi
log "all built in $((SECONDS - total_start)) s ($(du -sh "$cache" | cut -f1))"
echo "$cache"
