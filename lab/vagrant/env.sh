#!/usr/bin/env bash
# The offline lab's private world: a network namespace of the run's own and
# a libvirt of its own inside it, so that libvirt's bridges, dnsmasq and
# iptables rules, the VMs and vagrant never touch the host's network.
#
#   env.sh up   NS            netns NS, virtlogd + libvirtd inside it
#   env.sh exec NS CMD [ARG]  CMD inside NS, seeing that libvirt
#   env.sh down NS            vagrant destroy, every process in NS killed,
#                             NS deleted, the run directory removed
#
# NS is cnilab-<pid>-vg (<pid>: the cnilab process that owns the run);
# `cnilab sweep` empties a killed run's namespace only when its pid is dead
# and its run directory below exists (root's, in a root-only run root).
# The run directory, $CNILAB_VAGRANT_RUN_ROOT/NS (default
# /var/tmp/cnilab-vagrant/NS), holds everything libvirt writes: each command
# runs in a private mount namespace where /etc/libvirt, /run/libvirt,
# /var/lib/libvirt (with the storage pool), /var/log/libvirt and
# /var/cache/libvirt are bind mounts of directories there; vagrant's own
# files (VAGRANT_HOME, .vagrant) live there too. `down` is safe to repeat
# and to run after a failure; a trap runs it when `up` fails half way.
set -euo pipefail

die() { echo "env.sh: $*" >&2; exit 2; }
usage() { die "usage: env.sh up|down NS | env.sh exec NS CMD [ARG...] (NS: cnilab-<pid>-vg or cnilab-vg-<name>)"; }

[ $# -ge 2 ] || usage
verb=$1 ns=$2
shift 2
[[ $ns =~ ^cnilab-([0-9]+-vg|vg-[a-z0-9]{1,8})$ ]] || usage
[ "$(id -u)" -eq 0 ] || die "run as root (network namespaces, libvirtd)"
run=${CNILAB_VAGRANT_RUN_ROOT:-/var/tmp/cnilab-vagrant}/$ns
readonly dirs=(etc:/etc/libvirt run:/run/libvirt lib:/var/lib/libvirt log:/var/log/libvirt cache:/var/cache/libvirt)

# CMD in NS with the run's libvirt directories mounted over the host's, and
# the run's /dev/kvm node (see kvm_node) over the host's when there is one.
inside() {
  # shellcheck disable=SC2016 # expanded by the inner shell
  ip netns exec "$ns" unshare --mount --propagation private -- \
    bash -c 'run=$1 dirs=$2; shift 2; for d in $dirs; do
               mkdir -p "${d#*:}" && mount --bind "$run/${d%%:*}" "${d#*:}" || exit 2
             done
             if [ -c "$run/kvm" ]; then mount --bind "$run/kvm" /dev/kvm || exit 2; fi
             exec "$@"' env.sh "$run" "${dirs[*]}" "$@"
}

# libvirt probes QEMU's capabilities as root, where /dev/kvm opens, but
# judges KVM usable by whether its qemu user may open it: with a /dev/kvm
# only root may open (no udev rule made it root:kvm 0660, as here), the two
# disagree, every capabilities lookup throws the cache away and probes QEMU
# again (a few seconds each, dozens per domain: 2 minutes to define and
# start one VM on 2 loaded cores). The run gets a node of its own for the
# same device, root:kvm 0660 as Debian's udev rule makes it, mounted over
# /dev/kvm only in its mount namespaces; the host's node is left as it is.
kvm_node() {
  [ -c /dev/kvm ] && getent group kvm >/dev/null || return 0
  case $(stat -c '%g %a' /dev/kvm) in
  *" 666" | "$(getent group kvm | cut -d: -f3) 660") return 0 ;;
  esac
  mknod -m 660 "$run/kvm" c "$((0x$(stat -c %t /dev/kvm)))" "$((0x$(stat -c %T /dev/kvm)))"
  chgrp kvm "$run/kvm"
}

vagrant_env() {
  export VAGRANT_HOME=$run/vagrant.d VAGRANT_DOTFILE_PATH=$run/dot-vagrant
  export VAGRANT_DEFAULT_PROVIDER=libvirt VAGRANT_CHECKPOINT_DISABLE=1 CNILAB_VAGRANT_RUN=$run
}

up() {
  for tool in ip unshare libvirtd virtlogd virsh vagrant; do
    command -v "$tool" >/dev/null || die "$tool not found: bash lab/install-deps.sh --vagrant (lab/vagrant/README.md, 'Offline mode')"
  done
  [ -d /etc/libvirt ] || die "/etc/libvirt missing: apt-get install libvirt-daemon-system"
  [ ! -e "/run/netns/$ns" ] || die "namespace $ns exists already (a run of the same pid?): env.sh down $ns"
  trap 'down >&2' ERR INT TERM
  mkdir -p "$run"
  for d in "${dirs[@]}"; do mkdir -p "$run/${d%%:*}"; done
  mkdir -p "$run/lib/images"
  # A copy of the host's libvirt configuration, without the autostarted
  # default NAT network, without cgroups (none here) or a security driver.
  cp -a /etc/libvirt/. "$run/etc/"
  rm -f "$run"/etc/qemu/networks/autostart/*.xml
  printf 'cgroup_controllers = [ ]\nsecurity_driver = "none"\n' >>"$run/etc/qemu.conf"
  kvm_node
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  inside virtlogd -d -p "$run/virtlogd.pid"
  inside libvirtd -d -p "$run/libvirtd.pid"
  for _ in $(seq 100); do
    inside virsh -q -c qemu:///system uri >/dev/null 2>&1 && break
    sleep 0.2
  done
  inside virsh -q -c qemu:///system uri >/dev/null || die "libvirtd in $ns does not answer (logs: $run/log)"
  trap - ERR INT TERM
  echo "env.sh: $ns up (libvirtd pid $(cat "$run/libvirtd.pid"), run dir $run)" >&2
}

# The pids whose network namespace is NS (what `ip netns pids` reads).
pids_in() { ip netns pids "$ns" 2>/dev/null || true; }

down() {
  if [ -e "/run/netns/$ns" ] && [ -S "$run/run/libvirt-sock" ] && [ -d "$run/dot-vagrant" ]; then
    (vagrant_env; inside timeout 120 vagrant destroy -f) >&2 || echo "env.sh: vagrant destroy failed; killing the VMs" >&2
  fi
  for f in libvirtd virtlogd; do
    if [ -s "$run/$f.pid" ]; then kill "$(cat "$run/$f.pid")" 2>/dev/null || true; fi
  done
  if [ -e "/run/netns/$ns" ]; then
    local left
    for _ in $(seq 50); do
      left=$(pids_in)
      [ -z "$left" ] && break
      # shellcheck disable=SC2086 # one pid per word
      kill $left 2>/dev/null || true
      sleep 0.2
    done
    left=$(pids_in)
    # shellcheck disable=SC2086
    [ -z "$left" ] || kill -KILL $left 2>/dev/null || true
    ip netns delete "$ns"
  fi
  rm -rf -- "$run"
  echo "env.sh: $ns down" >&2
}

case $verb in
up) up ;;
down) down ;;
exec)
  [ $# -ge 1 ] || usage
  [ -e "/run/netns/$ns" ] || die "no namespace $ns: env.sh up $ns first"
  vagrant_env
  inside "$@"
  ;;
*) usage ;;
esac
