#!/usr/bin/env bash
# Installs the CNCF Distribution registry (Debian's docker-registry package,
# binary /usr/bin/docker-registry) that the second-registry tests start on
# loopback (test/support/distribution, test/e2e/run/distribution_test.go).
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

# The package's service is kept from starting while it installs.
"$(dirname "${BASH_SOURCE[0]}")/apt-install.sh" docker-registry

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
