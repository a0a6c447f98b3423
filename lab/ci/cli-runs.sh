#!/usr/bin/env bash
# The `cnilab` runs CI makes after `cargo test`, shared by .ci/run and
# .github/workflows/ci.yml so that the two cannot drift:
#   - conformance of the reference bridge + host-local and of cnilab-bridge;
#   - the default lab (direct, then through containerd's CRI), a 4x25 lab,
#     and every bug scenario in lab/scenarios.
# HTML and JUnit reports go to target/cnilab-reports/. Every run is made even
# when an earlier one failed; the exit code is 1 if any failed.
#
# Usage: lab/ci/cli-runs.sh [BIN_DIR]
#   BIN_DIR  where cnilab and cnilab-bridge are (default target/release,
#            built by `cargo build --release --workspace --locked`).
# Runs as root: every run works in network namespaces it creates.
set -euo pipefail

repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
bin=$(cd -- "${1:-target/release}" && pwd)
reports=target/cnilab-reports

if [ "$(id -u)" -ne 0 ]; then
  echo "lab/ci/cli-runs.sh must run as root: cnilab creates network namespaces" >&2
  exit 2
fi
for b in cnilab cnilab-bridge; do
  if [ ! -x "$bin/$b" ]; then
    echo "$bin/$b is missing: cargo build --release --workspace --locked" >&2
    exit 2
  fi
done
mkdir -p "$reports"

failed=()
step() {
  local name=$1
  shift
  printf '\n== %s\n$ %s\n' "$name" "$*"
  local start=$SECONDS
  if "$@"; then
    printf '== %s: ok (%d s)\n' "$name" $((SECONDS - start))
  else
    printf '== %s: FAILED, exit %d (%d s)\n' "$name" "$?" $((SECONDS - start))
    failed+=("$name")
  fi
}

step "conform: reference bridge + host-local" \
  "$bin/cnilab" conform --plugin-dir /usr/lib/cni \
  --config harness/examples/reference-bridge.conflist \
  --junit "$reports/conform-reference.xml"
step "conform: cnilab-bridge" \
  "$bin/cnilab" conform --plugin-dir "$bin" \
  --config harness/examples/cnilab-bridge.conflist \
  --junit "$reports/conform-cnilab-bridge.xml"
step "lab: default 2x2" \
  "$bin/cnilab" lab run \
  --report "$reports/lab.html" --junit "$reports/lab.xml"
step "lab: default 2x2, pods through containerd's CRI" \
  "$bin/cnilab" lab run --runtime containerd \
  --report "$reports/lab-containerd.html" --junit "$reports/lab-containerd.xml"
step "lab: 4 nodes x 25 pods" \
  "$bin/cnilab" lab run --nodes 4 --pods-per-node 25 \
  --report "$reports/lab-4x25.html" --junit "$reports/lab-4x25.xml"
step "lab: dual-stack" \
  "$bin/cnilab" lab run --topology lab/topologies/dual-stack.toml \
  --report "$reports/lab-dual-stack.html" --junit "$reports/lab-dual-stack.xml"
step "lab: IPv6 only" \
  "$bin/cnilab" lab run --topology lab/topologies/ipv6-only.toml \
  --junit "$reports/lab-ipv6-only.xml"
step "lab: bring your own plugin (reference ptp)" \
  "$bin/cnilab" lab run --plugin-dir /usr/lib/cni \
  --config lab/configs/lab-ptp.conflist.tmpl --junit "$reports/lab-ptp.xml"
step "lab: routed underlay (a subnet per node, one router)" \
  "$bin/cnilab" lab run --topology lab/topologies/routed.toml \
  --junit "$reports/lab-routed.xml"
step "lab: Vagrant-style NAT + host-only underlay" \
  "$bin/cnilab" lab run --topology lab/topologies/nat.toml \
  --junit "$reports/lab-nat.xml"
step "lab: 4 nodes x 25 pods over VXLAN with a ClusterIP Service" \
  "$bin/cnilab" lab run --nodes 4 --pods-per-node 25 --vxlan --service \
  --report "$reports/lab-vxlan.html" --junit "$reports/lab-vxlan.xml"
step "scenarios: lab/scenarios" \
  "$bin/cnilab" scenario run lab/scenarios \
  --junit "$reports/scenarios.xml"

if [ ${#failed[@]} -gt 0 ]; then
  printf '\nFAILED: %s\n' "${failed[@]}"
  exit 1
fi
printf '\nall cnilab runs passed; reports in %s\n' "$reports"
