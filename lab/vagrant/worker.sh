#!/usr/bin/env bash
# A worker: imports the image the control plane built, then joins with the
# command the control plane left in the synced folder. Run by
# `vagrant provision` as root after node.sh; safe to run again.
#
# The workers may be provisioned while cp still builds (libvirt brings VMs
# up in parallel), so each hand-off is polled with a timeout.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

require_env CNILAB_NODE_IP CNILAB_IMAGE

readonly ARCHIVE=$RUN_DIR/cnilab-image.tar
readonly SHARE_HINT="Is cp provisioned (vagrant provision cp)? The /vagrant share must be two-way:
set synced_folder_type to nfs, virtiofs or 9p if the provider fell back to rsync."
mkdir -p "$STATE_DIR"

# --- The image ----------------------------------------------------------------
# Before the join, so that the agent's pod never starts on a node without it.
wait_for_file "$ARCHIVE.sha256" 3600 "image archive from cp" "$SHARE_HINT"
image_sha=$(<"$ARCHIVE.sha256")
if ! marked image "$image_sha" ||
  ! ctr -n k8s.io images ls -q | grep -Fx "$CNILAB_IMAGE" >/dev/null; then
  actual=$(sha256sum "$ARCHIVE" | cut -c1-64)
  [[ $actual == "$image_sha" ]] ||
    die "lab/vagrant/run/cnilab-image.tar does not match its .sha256 (cp is rewriting it? provision again)"
  log "importing $CNILAB_IMAGE into containerd"
  ctr -n k8s.io images import "$ARCHIVE" >/dev/null
  ctr -n k8s.io images ls -q | grep -Fx "$CNILAB_IMAGE" >/dev/null ||
    die "the archive does not contain $CNILAB_IMAGE (ctr -n k8s.io images ls)"
  mark_done image "$image_sha"
  # A running agent pod keeps the old content until it is recreated; cp's
  # provisioning restarts the DaemonSet when the image changes.
fi

# --- Join -----------------------------------------------------------------------
if [[ -f /etc/kubernetes/kubelet.conf ]]; then
  log "already joined"
else
  # join.sh may be left over from a destroyed cluster (its CA hash no longer
  # matches): reset and re-read it until a join succeeds or time runs out.
  deadline=$((SECONDS + 1800))
  while :; do
    wait_for_file "$RUN_DIR/join.sh" 1800 "join command from cp" "$SHARE_HINT"
    read -r -a join <"$RUN_DIR/join.sh"
    [[ ${join[0]:-} == kubeadm && ${join[1]:-} == join ]] ||
      die "lab/vagrant/run/join.sh is not a kubeadm join command"
    log "kubeadm join ${join[2]:-}"
    if "${join[@]}" --node-name="$(hostname -s)"; then
      break
    fi
    kubeadm reset --force >/dev/null 2>&1 || true
    if ((SECONDS >= deadline)); then
      die "kubeadm join kept failing; provision cp again to refresh lab/vagrant/run/join.sh"
    fi
    log "join failed; retrying in 30s with a fresh read of join.sh"
    sleep 30
  done
fi

# --- Wait for this node ---------------------------------------------------------
node=$(hostname -s)
log "waiting for node $node to be Ready"
if ! kubectl --kubeconfig "$RUN_DIR/admin.conf" wait --for=condition=Ready "node/$node" --timeout=300s; then
  kubectl --kubeconfig "$RUN_DIR/admin.conf" get pods -A -o wide --field-selector "spec.nodeName=$node" || true
  die "node $node is not Ready; see its pods above"
fi
log "worker ready; check the cluster with:"
log "  vagrant ssh cp -c 'cnilab e2e check --kubeconfig /etc/kubernetes/admin.conf'"
