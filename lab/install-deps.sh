#!/usr/bin/env bash
# Installs the system packages cnilab's lab and tests use (Debian/Ubuntu, as
# root): iproute2, nftables, iptables, ping, the reference CNI plugins (for
# comparisons), python3 (a test plugin) and util-linux (setpriv); for
# `lab --runtime containerd`, containerd and runc (kept as they are when
# already installed, e.g. Docker's containerd.io on GitHub's runners), and
# protobuf-compiler, whose protoc the CRI client crate (k8s-cri) needs at
# build time. Safe to run again.
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
  echo "lab/install-deps.sh: run as root (sudo bash lab/install-deps.sh)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
need=()
for pkg in iproute2 nftables iptables iputils-ping containernetworking-plugins procps kmod python3 util-linux; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
command -v protoc >/dev/null || need+=(protobuf-compiler)
# containerd's package also brings ctr and containerd-shim-runc-v2.
command -v containerd >/dev/null && command -v ctr >/dev/null \
  && command -v containerd-shim-runc-v2 >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
if [ "${#need[@]}" -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
