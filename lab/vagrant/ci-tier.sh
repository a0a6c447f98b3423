#!/usr/bin/env bash
# The vagrant tier of .ci/run and .github/workflows/e2e-vagrant.yml: the
# root tests of the run's namespace (harness/tests/e2e_vagrant.rs,
# --ignored), then the offline box (built or reused), two VMs booted once,
# pods routed across them and both VMs captured and replayed here with the
# same verdict (`cnilab e2e vagrant check --capture`), the fault test on
# the same VMs, everything torn down.
#
#   bash lab/vagrant/ci-tier.sh BIN_DIR     (root; BIN_DIR: cnilab,
#                                            cnilab-agent, cnilab-bridge)
#
# Its last line is its verdict: `vagrant tier: PASS (… s)`, `vagrant tier:
# FAIL: <what>` (exit 1) or, where this host cannot run QEMU or libvirt,
# `SKIP: vagrant tier: <reason>` (exit 0: a host limit is not a failure).
# The budget is CNILAB_VAGRANT_BUDGET seconds (default 720, 12 minutes) for
# the box and the run together.
set -uo pipefail
repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
bin=$(cd -- "${1:?usage: ci-tier.sh BIN_DIR}" && pwd) || exit 2
budget=${CNILAB_VAGRANT_BUDGET:-720}
cd "$repo" || exit 2

skip() { echo "SKIP: vagrant tier: $*"; exit 0; }
fail() { echo "vagrant tier: FAIL: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || skip "not root (network namespaces, libvirtd)"
for b in cnilab cnilab-agent cnilab-bridge; do
  [ -x "$bin/$b" ] || fail "$bin/$b missing: cargo build --release first"
done
for tool in vagrant libvirtd virtlogd virsh qemu-system-x86_64 mmdebstrap unshare; do
  command -v "$tool" >/dev/null || skip "$tool not installed (bash lab/install-deps.sh --vagrant)"
done
vagrant plugin list 2>/dev/null | grep -q '^vagrant-libvirt ' \
  || skip "the vagrant-libvirt plugin is not installed (bash lab/install-deps.sh --vagrant)"
# QEMU must start a machine here (TCG needs no KVM, but some sandboxes
# forbid what QEMU maps).
timeout 60 qemu-system-x86_64 -accel tcg -machine q35 -nographic -nodefaults \
  -display none -S -monitor none -serial none </dev/null >/dev/null 2>&1 &
qemu=$!
sleep 2
if ! kill -0 "$qemu" 2>/dev/null; then
  wait "$qemu"
  skip "qemu-system-x86_64 -accel tcg exits at once on this host"
fi
kill "$qemu" 2>/dev/null
wait "$qemu" 2>/dev/null
ip netns add cnilab-0-vgprobe 2>/dev/null || skip "cannot create network namespaces here"
ip netns delete cnilab-0-vgprobe
free_kib=$(df -Pk "${XDG_CACHE_HOME:-${HOME:-/root}/.cache}" /var/tmp 2>/dev/null | awk 'NR>1 {print $4}' | sort -n | head -n1)
[ "${free_kib:-0}" -ge $((5 * 1024 * 1024)) ] || skip "less than 5 GiB free for the box and the VMs' disks"

echo "==> vagrant tier: root tests of the run's namespace"
cargo test -p cnilab-harness --test e2e_vagrant --locked -- --ignored --skip a_fault_in_one_vm \
  || fail "harness/tests/e2e_vagrant.rs (--ignored)"

# One pair of VMs for everything: up, the healthy check with both VMs
# captured and replayed here (the same verdict as the VMs), the fault test
# on the same VMs (a route deleted in node2: FAIL naming node2, and its
# replay fails the same groups), then down (also on a failure or Ctrl-C).
echo "==> vagrant tier: cnilab e2e vagrant (budget ${budget}s)"
reports=target/cnilab-reports/e2e-vagrant
mkdir -p "$reports"
run=t$$
started=$SECONDS
down() { "$bin/cnilab" e2e vagrant down --name "$run" --bin "$bin" >/dev/null 2>&1; }
trap down EXIT
trap 'down; exit 130' INT TERM
# A step within what is left of the budget; 124 or 130: over it.
step() {
  local left=$((budget - (SECONDS - started)))
  [ "$left" -gt 0 ] || return 124
  timeout --foreground -s INT "$left" "$@"
}
verdict() {
  local rc=$1 what=$2
  case $rc in
  0) return 0 ;;
  124 | 130) fail "over the budget of ${budget}s in $what (after $((SECONDS - started)) s; torn down)" ;;
  *) fail "$what exited $rc after $((SECONDS - started)) s (report: $reports)" ;;
  esac
}
step "$bin/cnilab" e2e vagrant up --name "$run" --bin "$bin"
verdict $? "cnilab e2e vagrant up"
step "$bin/cnilab" e2e vagrant check --name "$run" --bin "$bin" --capture "$reports/captures" \
  --junit "$reports/junit.xml" --json "$reports/report.json"
verdict $? "cnilab e2e vagrant check --capture"
step env CNILAB_VAGRANT_RUN="$run" CNILAB_VAGRANT_BIN="$bin" cargo test -p cnilab-harness \
  --test e2e_vagrant --locked a_fault_in_one_vm_fails_the_check_and_names_the_vm -- --ignored --exact
verdict $? "the fault test (a_fault_in_one_vm_fails_the_check_and_names_the_vm)"
step "$bin/cnilab" e2e vagrant down --name "$run" --bin "$bin"
verdict $? "cnilab e2e vagrant down"
trap - EXIT INT TERM
echo "vagrant tier: PASS ($((SECONDS - started)) s: box, vagrant up, check, captures replayed with the VMs' verdict, a fault in node2 named, teardown)"
