#!/usr/bin/env bash
# apt-install.sh PACKAGE...: installs Debian packages with apt-get (as root,
# or through sudo) without letting their maintainer scripts start a system
# service: invoke-rc.d honours /usr/sbin/policy-rc.d (exit 101 = action
# forbidden) while the packages install; an existing policy-rc.d is put
# back afterwards. The scripts that install what tests run call it
# (install-distribution.sh, install-real-node.sh): those tests start their
# own processes, with configs of their own, on loopback.
set -euo pipefail

log() { printf '[apt-install %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ $# -gt 0 ]] || die "usage: apt-install.sh PACKAGE..."
command -v apt-get >/dev/null || die "apt-get is not available: install $* by hand"
sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || die "run this as root (apt-get install $*)"
  sudo=(sudo)
fi

policy=/usr/sbin/policy-rc.d
saved=""
if [[ -e "$policy" ]]; then
  saved=$(mktemp)
  "${sudo[@]}" cp -p "$policy" "$saved"
fi
restore_policy() {
  if [[ -n "$saved" ]]; then
    "${sudo[@]}" cp -p "$saved" "$policy"
    rm -f "$saved"
  else
    "${sudo[@]}" rm -f "$policy"
  fi
}
trap restore_policy EXIT
printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
"${sudo[@]}" chmod 755 "$policy"

log "installing $* with apt-get"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq >&2
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@" >&2
