#!/usr/bin/env bash
# Installs the system packages cnilab's lab and tests use (Debian/Ubuntu, as
# root): iproute2, nftables, iptables, ping, the reference CNI plugins (for
# comparisons), python3 (a test plugin) and util-linux (setpriv). Safe to
# run again.
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
if [ "${#need[@]}" -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
