#!/bin/sh
# Runs `image-refresh render` as a Helm post-renderer (docs/post-renderer.md): the
# rendered manifests come in on stdin, go out on stdout with the managed
# images pinned to their recorded digests. Arguments are passed on
# (Helm 4: --post-renderer-args; Helm 3: this script as --post-renderer).
#
#   IMAGE_REFRESH_BIN         the image-refresh binary (default: image-refresh on PATH)
#   IMAGE_REFRESH_CONFIG      config file, when no --config argument is given
#   IMAGE_REFRESH_RENDER_LOG  append the notes (stderr) to this file: Helm 4
#                             discards a post-renderer plugin's stderr
set -eu
bin=${IMAGE_REFRESH_BIN:-image-refresh}
if [ -n "${IMAGE_REFRESH_CONFIG:-}" ]; then
  # First, so that a --config argument wins.
  set -- --config "$IMAGE_REFRESH_CONFIG" "$@"
fi
if [ -n "${IMAGE_REFRESH_RENDER_LOG:-}" ]; then
  exec "$bin" render "$@" 2>>"$IMAGE_REFRESH_RENDER_LOG"
fi
exec "$bin" render "$@"
