#!/usr/bin/env bash
# Prints the path of a promtool binary (Prometheus' rule and config checker),
# building it once from the github.com/prometheus/prometheus Go module with
# `go install pkg@version` outside this module (prometheus is not a
# dependency of image-refresh), cached by version:
#   $TOOLS_DIR/promtool-$PROMTOOL_VERSION-nosd/promtool
#   PROMTOOL_VERSION  the github.com/prometheus/prometheus module version
#                     (v0.316.0 is Prometheus 3.16.0)
#   TOOLS_DIR         default ${XDG_CACHE_HOME:-$HOME/.cache}/image-refresh/tools
#   GO                the go command (default go)
# The chart's alert-rule tests (test/e2e/chart, TestAlerts_*) call this
# script; `hack/promtool.sh` alone just builds the binary. Progress goes to
# stderr, the path to stdout. It is built with -tags remove_all_sd: promtool
# then leaves out Prometheus' service-discovery plugins (cloud SDKs), which
# rule checks and rule unit tests never use, and builds in a fraction of the
# time.
set -euo pipefail

PROMTOOL_VERSION=${PROMTOOL_VERSION:-v0.316.0}
TOOLS_DIR=${TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/image-refresh/tools}
GO=${GO:-go}

log() { printf '[promtool %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v "$GO" >/dev/null || die "the go command ($GO) is not on PATH"
export GOWORK=off
bin="$TOOLS_DIR/promtool-$PROMTOOL_VERSION-nosd/promtool"
if [[ ! -x "$bin" ]]; then
	mkdir -p "$TOOLS_DIR"
	t=$(mktemp -d "$TOOLS_DIR/.promtool.XXXXXX")
	trap 'rm -rf "$t"' EXIT
	log "installing promtool from github.com/prometheus/prometheus@$PROMTOOL_VERSION into $TOOLS_DIR (once, a few minutes)"
	# Outside any module, into a private GOBIN; moved into place whole so a
	# concurrent run never sees half a binary.
	(cd "$t" && GOBIN="$t" GOFLAGS=-mod=mod "$GO" install -tags remove_all_sd "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION") \
		|| die "go install github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION failed"
	mkdir -p "$(dirname "$bin")"
	mv -f "$t/promtool" "$bin"
fi
"$bin" --version >/dev/null 2>&1 || die "$bin does not run"
echo "$bin"
