#!/usr/bin/env bash
# The vagrant tier of .ci/run and .github/workflows/e2e-vagrant.yml: the
# offline box (built or reused), two VMs, pods routed across them
# (`cnilab e2e vagrant`), everything torn down; then the root tests of the
# run's namespace (harness/tests/e2e_vagrant.rs, --ignored).
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

echo "==> vagrant tier: cnilab e2e vagrant (budget ${budget}s)"
reports=target/cnilab-reports/e2e-vagrant
mkdir -p "$reports"
started=$SECONDS
timeout --foreground -s INT "$budget" "$bin/cnilab" e2e vagrant --bin "$bin" \
  --junit "$reports/junit.xml" --json "$reports/report.json"
rc=$?
took=$((SECONDS - started))
case $rc in
0) echo "vagrant tier: PASS (${took} s: box, vagrant up, check, teardown)" ;;
124 | 130) fail "over the budget of ${budget}s (after ${took} s; torn down on SIGINT)" ;;
*) fail "cnilab e2e vagrant exited $rc after ${took} s (report: $reports)" ;;
esac
