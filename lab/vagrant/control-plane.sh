#!/usr/bin/env bash
# The control plane: kubeadm init on the private address, the join command
# and kubeconfig handed out through the synced folder, cnilab and its image
# built from this checkout, the image imported into containerd and the
# manifests from lab/manifests applied with the lab's image tag.
# Run by `vagrant provision` as root after node.sh; safe to run again.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

require_env CNILAB_NODE_IP CNILAB_POD_CIDR CNILAB_SERVICE_CIDR CNILAB_K8S_VERSION \
  CNILAB_IMAGE CNILAB_IMAGE_SOURCE

mkdir -p "$RUN_DIR" "$STATE_DIR"

# --- kubeadm init -------------------------------------------------------------
if [[ ! -f /etc/kubernetes/admin.conf ]]; then
  log "kubeadm init (advertise $CNILAB_NODE_IP, pods $CNILAB_POD_CIDR, services $CNILAB_SERVICE_CIDR)"
  # A half-done earlier attempt would fail the preflight checks.
  if [[ -d /etc/kubernetes/manifests && -n $(ls -A /etc/kubernetes/manifests) ]]; then
    kubeadm reset --force >/dev/null
  fi
  kubeadm init \
    --apiserver-advertise-address="$CNILAB_NODE_IP" \
    --pod-network-cidr="$CNILAB_POD_CIDR" \
    --service-cidr="$CNILAB_SERVICE_CIDR" \
    --kubernetes-version="v$CNILAB_K8S_VERSION" \
    --node-name="$(hostname -s)"
else
  log "kubeadm init already done"
  # Settings changed after init cannot be applied in place.
  cluster_config=$(kubectl -n kube-system get configmap kubeadm-config \
    -o jsonpath='{.data.ClusterConfiguration}')
  if ! grep -Eq "podSubnet: \"?$CNILAB_POD_CIDR\"?$" <<<"$cluster_config"; then
    log "WARNING: the cluster was initialised with another pod CIDR than $CNILAB_POD_CIDR;"
    log "WARNING: run 'vagrant destroy -f && vagrant up' to apply it"
  fi
  if ! grep -q "kubernetesVersion: v$CNILAB_K8S_VERSION\$" <<<"$cluster_config"; then
    log "WARNING: the control plane runs another version than k8s_version=$CNILAB_K8S_VERSION;"
    log "WARNING: kubeadm upgrades are not automated here: 'vagrant destroy -f && vagrant up'"
  fi
fi

# Let the vagrant user use the cluster, including with the documented
# `vagrant ssh cp -c 'cnilab e2e check --kubeconfig /etc/kubernetes/admin.conf'`.
# (A lab VM: the admin credentials are not a secret here.)
chgrp "$(id -gn vagrant)" /etc/kubernetes/admin.conf
chmod 0640 /etc/kubernetes/admin.conf
install -D -o vagrant -g "$(id -gn vagrant)" -m 0600 /etc/kubernetes/admin.conf ~vagrant/.kube/config
# The API server listens on the private address, so this kubeconfig also
# works from the host: kubectl --kubeconfig lab/vagrant/run/admin.conf ...
install -m 0600 /etc/kubernetes/admin.conf "$RUN_DIR/admin.conf.tmp"
mv -f "$RUN_DIR/admin.conf.tmp" "$RUN_DIR/admin.conf"

# --- The join command ---------------------------------------------------------
# A fresh token on every provision (2h TTL); written atomically so that a
# worker polling the folder never reads half a file.
join=$(kubeadm token create --ttl 2h --print-join-command)
printf '%s\n' "$join" >"$RUN_DIR/join.sh.tmp"
mv -f "$RUN_DIR/join.sh.tmp" "$RUN_DIR/join.sh"
log "join command written to lab/vagrant/run/join.sh"

# --- cnilab and its image -----------------------------------------------------
bash "$REPO/lab/vagrant/build.sh"

# --- Import the image into containerd ----------------------------------------
image_sha=$(<"$RUN_DIR/cnilab-image.tar.sha256")
image_changed=0
if ! marked image "$image_sha" ||
  ! ctr -n k8s.io images ls -q | grep -Fx "$CNILAB_IMAGE" >/dev/null; then
  log "importing $CNILAB_IMAGE into containerd"
  ctr -n k8s.io images import "$RUN_DIR/cnilab-image.tar" >/dev/null
  ctr -n k8s.io images ls -q | grep -Fx "$CNILAB_IMAGE" >/dev/null ||
    die "the archive does not contain $CNILAB_IMAGE (ctr -n k8s.io images ls)"
  mark_done image "$image_sha"
  image_changed=1
fi

# --- Deploy -------------------------------------------------------------------
# The manifests name the placeholder image; the lab imported its own tag.
rendered="$STATE_DIR/manifests"
rm -rf "$rendered"
mkdir -p "$rendered"
shopt -s nullglob
manifests=()
for manifest in "$REPO"/lab/manifests/*.yaml; do
  # kustomization.yaml is kustomize's input, not an object to apply.
  [[ $(basename -- "$manifest") == kustomization.yaml ]] || manifests+=("$manifest")
done
shopt -u nullglob
((${#manifests[@]} > 0)) || die "no manifests in lab/manifests"
# The agent must know the cluster's pod CIDR (forwarded, never masqueraded):
# the value under CNILAB_CLUSTER_CIDR becomes the lab's pod_cidr.
for manifest in "${manifests[@]}"; do
  sed -e "s#ghcr\.io/cnilab/cnilab:dev#$CNILAB_IMAGE#g" \
    -e "/name: CNILAB_CLUSTER_CIDR\$/{n;s#value: .*#value: \"$CNILAB_POD_CIDR\"#}" \
    "$manifest" >"$rendered/$(basename -- "$manifest")"
done
grep -rqF "image: $CNILAB_IMAGE" "$rendered" ||
  die "no manifest in lab/manifests uses ghcr.io/cnilab/cnilab:dev; cannot set the lab image"
grep -rqF "value: \"$CNILAB_POD_CIDR\"" "$rendered" ||
  die "no CNILAB_CLUSTER_CIDR value in lab/manifests; cannot give the agent pod_cidr"
log "applying lab/manifests with image $CNILAB_IMAGE"
kubectl apply -f "$rendered"

mapfile -t daemonsets < <(kubectl get -f "$rendered" \
  -o jsonpath='{range .items[?(@.kind=="DaemonSet")]}{.metadata.namespace}{" "}{.metadata.name}{"\n"}{end}')
for ds in "${daemonsets[@]}"; do
  read -r ns name <<<"$ds"
  # Same tag, new content: pods only pick it up when they are recreated.
  if ((image_changed)); then
    kubectl -n "$ns" rollout restart "daemonset/$name" >/dev/null
  fi
done

# --- Wait for this node -------------------------------------------------------
# cp turns Ready once the agent has written the CNI config on it.
log "waiting for node $(hostname -s) to be Ready"
if ! kubectl wait --for=condition=Ready "node/$(hostname -s)" --timeout=300s; then
  kubectl get pods -A -o wide || true
  die "node $(hostname -s) is not Ready; see the pods above and 'kubectl describe node $(hostname -s)'"
fi
log "control plane ready; workers join with lab/vagrant/run/join.sh"
log "when every node is up: vagrant ssh cp -c 'cnilab e2e check --kubeconfig /etc/kubernetes/admin.conf'"
