#!/usr/bin/env bash
# Installs what the local cluster's real node runs (docs/local-cluster.md):
# Debian's containerd (with ctr and the runc v2 shim), runc, the CNI plugins
# (bridge, host-local, loopback in /usr/lib/cni), iptables (kube-proxy's
# rules, in the node's own network namespace), iproute2 and util-linux
# (ip, nsenter). The kubelet and kube-proxy are built by build-cluster.sh.
#
# Idempotent: does nothing when every program is there. The containerd
# package's system service is kept from starting: the real node runs a
# containerd of its own, with its own socket, state and root.
set -euo pipefail

log() { printf '[install-real-node %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

need=()
for p in containerd:containerd ctr:containerd containerd-shim-runc-v2:containerd runc:runc \
         iptables:iptables ip:iproute2 nsenter:util-linux; do
  command -v "${p%%:*}" >/dev/null || need+=("${p#*:}")
done
for plugin in bridge host-local loopback; do
  [[ -x /usr/lib/cni/$plugin ]] || need+=(containernetworking-plugins)
done
[[ ${#need[@]} -eq 0 ]] && exit 0
mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || die "missing ${need[*]}; run this script as root"
  sudo=(sudo)
fi
"$(dirname "${BASH_SOURCE[0]}")/apt-install.sh" "${need[@]}"
if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
  "${sudo[@]}" systemctl disable --now containerd.service >/dev/null 2>&1 || true
fi
log "installed: $(containerd --version 2>/dev/null | cut -d' ' -f3), runc $(runc --version 2>/dev/null | sed -n 's/^runc version //p')"
