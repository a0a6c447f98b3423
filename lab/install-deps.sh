#!/usr/bin/env bash
# Installs the system packages cnilab's lab and tests use (Debian/Ubuntu, as
# root): iproute2, nftables, iptables, ping, the reference CNI plugins (for
# comparisons), python3 (a test plugin), util-linux (setpriv), strace
# (a test counts the netlink requests of one ADD), dash, busybox and shellcheck
# (the capture script's tests run it under both shells and lint it); for
# `lab --runtime containerd`, containerd and runc (kept as they are when
# already installed, e.g. Docker's containerd.io on GitHub's runners), and
# protobuf-compiler, whose protoc the CRI client crate (k8s-cri) needs at
# build time; QEMU, xz-utils and zstd for `cnilab vm` and `cnilab matrix`
# (microVMs on Debian's kernels: the kernels' modules are compressed). One
# way for QEMU on Debian 12: bookworm-backports (10.0.2, the source is added
# when missing; it also serves the 6.12 kernels), so that a backports
# qemu-utils some images ship is never replaced by bookworm's 7.2 (mixing
# them makes apt remove one); elsewhere (Ubuntu) the distribution's QEMU.
# Safe to run again.
#
# --vagrant adds what `cnilab e2e vagrant` and lab/vagrant/build-box.sh need:
# vagrant with vagrant-libvirt, libvirt (daemons and virsh), dnsmasq,
# mmdebstrap.
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
  echo "lab/install-deps.sh: run as root (sudo bash lab/install-deps.sh)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
need=()
for pkg in iproute2 nftables iptables iputils-ping containernetworking-plugins procps kmod python3 util-linux strace busybox shellcheck dash xz-utils zstd; do
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

qemu_target=()
if grep -q '^VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
  sources=/etc/apt/sources.list.d/bookworm-backports.sources
  if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' >"$sources"
    apt-get update -qq
  fi
  qemu_target=(-t bookworm-backports)
fi
if ! command -v qemu-system-x86_64 >/dev/null || ! command -v qemu-img >/dev/null; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${qemu_target[@]}" qemu-system-x86 qemu-utils >/dev/null
fi

if [ "${1:-}" = "--vagrant" ]; then
  vagrant_pkgs=(vagrant vagrant-libvirt libvirt-daemon-system libvirt-clients dnsmasq-base mmdebstrap e2fsprogs debian-archive-keyring)
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${vagrant_pkgs[@]}" >/dev/null
fi
