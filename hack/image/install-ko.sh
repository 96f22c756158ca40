#!/usr/bin/env bash
# Installs ko into a cache directory once and prints the path of the binary.
# Idempotent and safe to run concurrently: `go install` writes into a private
# temporary GOBIN and the binary is moved into place atomically.
#   KO_VERSION  the ko release (default below; the Go module proxy serves it)
#   TOOLS_DIR   default ${XDG_CACHE_HOME:-$HOME/.cache}/image-refresh/tools
set -euo pipefail

KO_VERSION=${KO_VERSION:-v0.19.1}
TOOLS_DIR=${TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/image-refresh/tools}
GO=${GO:-go}
dest="$TOOLS_DIR/ko-$KO_VERSION/ko"

if [[ ! -x "$dest" ]]; then
	mkdir -p "$TOOLS_DIR/ko-$KO_VERSION"
	tmp=$(mktemp -d "$TOOLS_DIR/ko-$KO_VERSION/.install.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	echo "installing ko $KO_VERSION into $TOOLS_DIR (once; a few minutes)" >&2
	# Outside any module, so the repo's go.mod plays no part.
	(cd "$tmp" && GOBIN="$tmp" GOFLAGS=-mod=mod "$GO" install "github.com/google/ko@$KO_VERSION")
	mv -f "$tmp/ko" "$dest"
fi
echo "$dest"
