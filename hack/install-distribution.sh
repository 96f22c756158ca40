#!/usr/bin/env bash
# Installs the CNCF Distribution registry (Debian's docker-registry package,
# binary /usr/bin/docker-registry) that the second-registry tests start on
# loopback (internal/distribution, internal/cli/distribution_test.go).
#
# Idempotent: does nothing when the binary is there. Otherwise it installs the
# package with apt-get, and makes sure the package leaves no system service
# running: the Debian package ships a service that would listen on :5000 on
# every interface. The tests start their own registry process on 127.0.0.1
# with a config of their own; the system one is stopped and disabled.
#
# DISTRIBUTION_BIN overrides the binary path (a registry built elsewhere).
set -euo pipefail

bin=${DISTRIBUTION_BIN:-/usr/bin/docker-registry}
log() { printf '[install-distribution %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if [[ -x "$bin" ]]; then
  exit 0
fi
[[ -z "${DISTRIBUTION_BIN:-}" ]] || die "DISTRIBUTION_BIN=$bin is not an executable file"
command -v apt-get >/dev/null || die "$bin is missing and apt-get is not available: install the CNCF Distribution registry (Debian/Ubuntu package docker-registry) by hand"

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || die "$bin is missing; run this script as root (apt-get install docker-registry)"
  sudo=(sudo)
fi

# Keep maintainer scripts from starting the service while installing
# (invoke-rc.d honours policy-rc.d; exit 101 = action forbidden). An existing
# policy-rc.d is put back afterwards.
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

log "installing docker-registry (CNCF Distribution) with apt-get"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq >&2
"${sudo[@]}" apt-get install -y -qq --no-install-recommends docker-registry >&2

# Belt and braces: if a service manager started it anyway, stop and disable it.
if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
  "${sudo[@]}" systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
fi
if [[ -x /etc/init.d/docker-registry ]]; then
  "${sudo[@]}" /etc/init.d/docker-registry stop >/dev/null 2>&1 || true
  if command -v update-rc.d >/dev/null; then
    "${sudo[@]}" update-rc.d docker-registry disable >/dev/null 2>&1 || true
  fi
fi

[[ -x "$bin" ]] || die "apt-get installed docker-registry but $bin is missing"
log "installed $("$bin" --version 2>/dev/null || echo "$bin")"
