#!/usr/bin/env bash
# Builds, once, the Argo Rollouts controller (github.com/argoproj/argo-rollouts,
# cmd/rollouts-controller) into the local test cluster's cache directory (the
# one hack/build-cluster.sh fills), and copies the CRDs its informers need
# from the same module next to it:
#   $cache/rollouts-controller
#   $cache/argo-rollouts-crds/rollout-crd.yaml (and the analysis-run,
#     analysis-template, cluster-analysis-template and experiment CRDs: the
#     controller waits for the caches of all five kinds before it reconciles)
# The source is the released module from the Go module proxy; its go.mod
# pins the k8s.io modules with replace directives, so it is built as its own
# main module in a temporary copy (`go install pkg@version` refuses replace
# directives). v1.10.x's go.mod needs Go 1.26.10 or newer: the build runs
# with GOTOOLCHAIN=go1.27.3 (ARGO_ROLLOUTS_GOTOOLCHAIN overrides it).
# Cold build: about 10 minutes on 2 cores; the binary is about 170 MB.
# Against the local cluster (make cluster-up):
#   kubectl apply --server-side -f "$cache/argo-rollouts-crds/"
#     (client-side apply fails: rollout-crd.yaml is over the 256 KiB limit of
#     the last-applied annotation)
#   rollouts-controller --kubeconfig="$KUBECONFIG" --leader-elect=false \
#     --healthzPort=PORT --metricsPort=PORT
#     (the release's servers listen on 0.0.0.0; this build patches them to
#     127.0.0.1, as every server of the tests listens on loopback only; pass
#     free ports, the defaults are 8080 and 8090)
# Idempotent: a stamp file records what was built; nothing is rebuilt when it
# matches. Prints the controller's path on stdout, progress on stderr.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ARGO_ROLLOUTS_VERSION=${ARGO_ROLLOUTS_VERSION:-v1.10.2}
export GOTOOLCHAIN=${ARGO_ROLLOUTS_GOTOOLCHAIN:-go1.27.3}
module=github.com/argoproj/argo-rollouts
cache=${IMAGE_REFRESH_CLUSTER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/image-refresh/cluster-${K8S_VERSION}}
bin="$cache/rollouts-controller"
crds="$cache/argo-rollouts-crds"
stamp="$cache/.stamp-argo-rollouts"
want="argo-rollouts=${ARGO_ROLLOUTS_VERSION} toolchain=${GOTOOLCHAIN} listen=loopback"

log() { printf '[build-argo-rollouts %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v go >/dev/null || die "the go command is not on PATH; install Go 1.26 or newer"

built() {
  [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$bin" && -f "$crds/rollout-crd.yaml" ]]
}
exit_if_built() {
  built || return 0
  echo "$bin"
  exit 0
}
# shellcheck source=hack/lib/build-once.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/build-once.sh"
build_once .lock-argo-rollouts

start=$SECONDS
log "downloading ${module}@${ARGO_ROLLOUTS_VERSION}"
# Outside any module, so that no go.mod around the caller's directory is read.
dir=$(cd / && GOFLAGS=-mod=mod go mod download -json "${module}@${ARGO_ROLLOUTS_VERSION}" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
[[ -n "$dir" && -f "$dir/go.mod" ]] || die "downloading ${module}@${ARGO_ROLLOUTS_VERSION} failed (see the go output above)"
[[ -f "$dir/manifests/crds/rollout-crd.yaml" ]] || die "no manifests/crds/rollout-crd.yaml under $dir"

src=$(mktemp -d "${TMPDIR:-/tmp}/argo-rollouts-src.XXXXXX")
trap 'rm -rf "$src"' EXIT
cp -r "$dir/." "$src/" && chmod -R u+w "$src"

# The metrics and health servers listen on 0.0.0.0 and no flag sets the
# address; the tests' servers listen on loopback only.
sed -i 's|listenAddr *= "0.0.0.0:%d"|listenAddr = "127.0.0.1:%d"|' "$src/controller/controller.go"
grep -q 'listenAddr = "127.0.0.1:%d"' "$src/controller/controller.go" \
  || die "could not set the listen address of controller/controller.go to loopback (has the source changed?)"

# The release's Makefile sets these; its VERSION file is not kept current, so
# the version comes from the module version (the binary says vX.Y.Z+unknown:
# the module carries no commit).
pkg=$module/utils/version
ldflags="-X $pkg.version=${ARGO_ROLLOUTS_VERSION#v} -X $pkg.buildDate=1970-01-01T00:00:00Z -X $pkg.gitTreeState=clean"
log "building ${module}/cmd/rollouts-controller ${ARGO_ROLLOUTS_VERSION} with ${GOTOOLCHAIN} (cold: about 10 minutes on 2 cores)"
(cd "$src" && go build -ldflags "$ldflags" -o "$bin.tmp" ./cmd/rollouts-controller) \
  || die "building rollouts-controller failed (see the go output above)"
mv "$bin.tmp" "$bin"

rm -rf "$crds" && mkdir -p "$crds"
cp "$src"/manifests/crds/*-crd.yaml "$crds/"

echo "$want" > "$stamp"
log "rollouts-controller ${ARGO_ROLLOUTS_VERSION} built in $((SECONDS - start)) s ($(du -h "$bin" | cut -f1)); CRDs in $crds"
echo "$bin"
