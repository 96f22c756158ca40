#!/usr/bin/env bash
# Builds, once, the cosign CLI (github.com/sigstore/cosign/v3, cmd/cosign)
# into the local test cluster's cache directory (the one
# hack/build-cluster.sh fills):
#   $cache/cosign
# The tests of V1 and V5 run it against a registry on loopback to check that
# image-refresh and cosign agree (test/support/cosigncli finds it). The
# source is the released module from the Go module proxy, built with
# `go install pkg@version` (its go.mod has no replace directives) and
# GOTOOLCHAIN=go1.27.3 (COSIGN_GOTOOLCHAIN overrides it). The version is
# stamped into the binary as the release's Makefile does, so that
# `cosign version` says it.
# Cold build: 8 minutes of CPU (18 minutes on 2 cores shared with other
# builds); the binary is 133 MB.
# Idempotent: a stamp file records what was built; nothing is rebuilt when it
# matches. Prints the binary's path on stdout, progress on stderr.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
COSIGN_VERSION=${COSIGN_VERSION:-v3.1.3}
export GOTOOLCHAIN=${COSIGN_GOTOOLCHAIN:-go1.27.3}
module=github.com/sigstore/cosign/v3
cache=${IMAGE_REFRESH_CLUSTER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/image-refresh/cluster-${K8S_VERSION}}
bin="$cache/cosign"
stamp="$cache/.stamp-cosign"
want="cosign=${COSIGN_VERSION} toolchain=${GOTOOLCHAIN}"

log() { printf '[build-cosign %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v go >/dev/null || die "the go command is not on PATH; install Go 1.26 or newer"

built() {
  [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$bin" ]]
}
exit_if_built() {
  built || return 0
  echo "$bin"
  exit 0
}
# shellcheck source=hack/lib/build-once.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/build-once.sh"
build_once .lock-cosign

start=$SECONDS
gobin=$(mktemp -d "${TMPDIR:-/tmp}/cosign-bin.XXXXXX")
trap 'rm -rf "$gobin"' EXIT
pkg=sigs.k8s.io/release-utils/version
ldflags="-buildid= -X $pkg.gitVersion=${COSIGN_VERSION} -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
log "building ${module}/cmd/cosign@${COSIGN_VERSION} with ${GOTOOLCHAIN} (cold: about 8 minutes on 2 cores)"
# Outside any module, so that no go.mod around the caller's directory is read.
(cd / && CGO_ENABLED=0 GOBIN="$gobin" GOFLAGS=-mod=mod go install -trimpath -ldflags "$ldflags" "${module}/cmd/cosign@${COSIGN_VERSION}") \
  || die "building cosign failed (see the go output above)"
[[ -x "$gobin/cosign" ]] || die "go install left no cosign binary in $gobin"
mv "$gobin/cosign" "$bin.tmp"
mv "$bin.tmp" "$bin"
"$bin" version >/dev/null 2>&1 || die "$bin does not run (cosign version failed)"

echo "$want" > "$stamp"
log "cosign ${COSIGN_VERSION} built in $((SECONDS - start)) s ($(du -h "$bin" | cut -f1))"
echo "$bin"
