#!/usr/bin/env bash
# Kubernetes prerequisites on every lab VM: swap off, kernel modules and
# sysctls, containerd + runc, the reference CNI plugins (loopback), pinned
# kubeadm/kubelet/kubectl, and kubelet's --node-ip pinned to the private
# address. Run by `vagrant provision` as root; safe to run again.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

require_env CNILAB_NODE_IP CNILAB_HOSTS CNILAB_K8S_VERSION CNILAB_CONTAINERD_VERSION \
  CNILAB_RUNC_VERSION CNILAB_CNI_PLUGINS_VERSION

arch=$(deb_arch)
case $arch in
  amd64 | arm64) ;;
  *) die "unsupported architecture $arch (amd64 and arm64 only)" ;;
esac

# --- The private address ----------------------------------------------------
# Every VM also has a NAT interface with the same address (10.0.2.15 on
# VirtualBox) and the default route; routes to pods must never use it.
private_if=$(interface_with_address "$CNILAB_NODE_IP")
if [[ -z $private_if ]]; then
  ip -brief addr >&2 || true
  die "no interface has $CNILAB_NODE_IP: the private_network did not come up"
fi
log "private address $CNILAB_NODE_IP is on $private_if"

# Names of the lab's nodes resolve to their private addresses, and this
# VM's own name no longer resolves to a loopback address.
hosts_block=$(
  echo "# BEGIN cnilab lab nodes (managed by lab/vagrant/node.sh)"
  tr ',' '\n' <<<"$CNILAB_HOSTS" | awk -F= '{ print $2 " " $1 }'
  echo "# END cnilab lab nodes"
)
{
  sed -e '/^# BEGIN cnilab lab nodes/,/^# END cnilab lab nodes/d' \
    -e "/^127\.0\.[12]\.1[[:space:]].*\b$(hostname -s)\b/d" /etc/hosts
  printf '%s\n' "$hosts_block"
} | install_if_changed 0644 /etc/hosts && log "updated /etc/hosts"

# --- Swap, modules, sysctls ---------------------------------------------------
if [[ -n $(swapon --show --noheadings) ]]; then
  log "turning swap off"
  swapoff -a
fi
if grep -Eq '^[^#].*[[:space:]]swap[[:space:]]' /etc/fstab; then
  sed -i -E 's/^([^#].*[[:space:]]swap[[:space:]].*)$/# \1  # disabled for kubelet/' /etc/fstab
fi

printf '%s\n' overlay br_netfilter |
  install_if_changed 0644 /etc/modules-load.d/cnilab-k8s.conf || true
modprobe overlay
modprobe br_netfilter

cat <<'EOF' | install_if_changed 0644 /etc/sysctl.d/90-cnilab-k8s.conf || true
# Kubernetes node prerequisites (lab/vagrant/node.sh).
net.ipv4.ip_forward = 1
net.ipv6.conf.all.forwarding = 1
net.bridge.bridge-nf-call-iptables = 1
net.bridge.bridge-nf-call-ip6tables = 1
fs.inotify.max_user_watches = 524288
fs.inotify.max_user_instances = 512
EOF
sysctl --quiet --system

apt_install ca-certificates curl gpg conntrack socat iptables nftables iproute2 ethtool jq rsync

# --- runc and containerd, pinned ---------------------------------------------
# From the upstream releases: Kubernetes >= 1.36 needs containerd 2.x, newer
# than the distributions' packages.
if [[ $(runc --version 2>/dev/null | awk 'NR == 1 { print $3 }') != "$CNILAB_RUNC_VERSION" ]]; then
  log "installing runc $CNILAB_RUNC_VERSION"
  base="https://github.com/opencontainers/runc/releases/download/v$CNILAB_RUNC_VERSION"
  sha=$(sha256_from "$base/runc.sha256sum" "runc.$arch")
  download "$base/runc.$arch" /tmp/runc "$sha"
  install -m 0755 /tmp/runc /usr/local/sbin/runc
  rm -f /tmp/runc
fi

if ! /usr/local/bin/containerd --version 2>/dev/null | grep " v$CNILAB_CONTAINERD_VERSION " >/dev/null; then
  log "installing containerd $CNILAB_CONTAINERD_VERSION"
  asset="containerd-$CNILAB_CONTAINERD_VERSION-linux-$arch.tar.gz"
  base="https://github.com/containerd/containerd/releases/download/v$CNILAB_CONTAINERD_VERSION"
  sha=$(sha256_from "$base/$asset.sha256sum" "$asset")
  download "$base/$asset" "/tmp/$asset" "$sha"
  tar -C /usr/local -xzf "/tmp/$asset"
  rm -f "/tmp/$asset"
  restart_containerd=1
fi

unit_changed=0
cat <<'EOF' | install_if_changed 0644 /etc/systemd/system/containerd.service && unit_changed=1
[Unit]
Description=containerd container runtime (installed by lab/vagrant/node.sh)
After=network.target local-fs.target

[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/local/bin/containerd
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999

[Install]
WantedBy=multi-user.target
EOF

# kubelet uses the systemd cgroup driver (kubeadm's default), so runc must too.
config=$(/usr/local/bin/containerd config default | sed -E 's/^([[:space:]]*SystemdCgroup = )false/\1true/')
grep -q 'SystemdCgroup = true' <<<"$config" ||
  die "could not set SystemdCgroup = true in containerd's default config"
printf '%s\n' "$config" | install_if_changed 0644 /etc/containerd/config.toml && restart_containerd=1

if ((unit_changed)); then
  systemctl daemon-reload
fi
systemctl enable --quiet containerd
if [[ ${restart_containerd:-0} == 1 ]] || ! systemctl is-active --quiet containerd; then
  log "restarting containerd"
  systemctl restart containerd
fi

printf '%s\n' "runtime-endpoint: unix:///run/containerd/containerd.sock" \
  "image-endpoint: unix:///run/containerd/containerd.sock" |
  install_if_changed 0644 /etc/crictl.yaml || true

# --- Reference CNI plugins ----------------------------------------------------
# containerd needs `loopback` for every pod; cnilab-bridge itself is installed
# by the agent's initContainer.
if ! marked cni-plugins "$CNILAB_CNI_PLUGINS_VERSION"; then
  log "installing the reference CNI plugins $CNILAB_CNI_PLUGINS_VERSION"
  asset="cni-plugins-linux-$arch-v$CNILAB_CNI_PLUGINS_VERSION.tgz"
  base="https://github.com/containernetworking/plugins/releases/download/v$CNILAB_CNI_PLUGINS_VERSION"
  sha=$(sha256_from "$base/$asset.sha256" "$asset")
  download "$base/$asset" "/tmp/$asset" "$sha"
  mkdir -p /opt/cni/bin
  tar -C /opt/cni/bin -xzf "/tmp/$asset"
  rm -f "/tmp/$asset"
  mark_done cni-plugins "$CNILAB_CNI_PLUGINS_VERSION"
fi

# --- kubeadm, kubelet, kubectl from pkgs.k8s.io, pinned -----------------------
minor=${CNILAB_K8S_VERSION%.*}
repo_line="deb [signed-by=/etc/apt/keyrings/kubernetes-apt-keyring.gpg] https://pkgs.k8s.io/core:/stable:/v$minor/deb/ /"
if [[ ! -f /etc/apt/sources.list.d/kubernetes.list ]] ||
  [[ $(</etc/apt/sources.list.d/kubernetes.list) != "$repo_line" ]]; then
  log "adding the Kubernetes v$minor package repository"
  install -d -m 0755 /etc/apt/keyrings
  curl -fsSL --retry 5 "https://pkgs.k8s.io/core:/stable:/v$minor/deb/Release.key" |
    gpg --dearmor --yes -o /etc/apt/keyrings/kubernetes-apt-keyring.gpg
  printf '%s\n' "$repo_line" >/etc/apt/sources.list.d/kubernetes.list
  apt_get update -qq
fi

installed=$(dpkg-query -W -f='${Version}' kubeadm 2>/dev/null || true)
if [[ $installed != "$CNILAB_K8S_VERSION"-* ]]; then
  pkg_version=$(apt-cache madison kubeadm | awk -v v="$CNILAB_K8S_VERSION" '$3 ~ "^" v "-" { print $3; exit }')
  if [[ -z $pkg_version ]]; then
    apt_get update -qq
    pkg_version=$(apt-cache madison kubeadm | awk -v v="$CNILAB_K8S_VERSION" '$3 ~ "^" v "-" { print $3; exit }')
  fi
  [[ -n $pkg_version ]] || die "kubeadm $CNILAB_K8S_VERSION is not in the v$minor repository"
  log "installing kubeadm, kubelet and kubectl $pkg_version"
  apt_get install -y -qq --no-install-recommends --allow-change-held-packages \
    "kubeadm=$pkg_version" "kubelet=$pkg_version" "kubectl=$pkg_version" >/dev/null
  apt-mark hold kubeadm kubelet kubectl >/dev/null
fi

# kubelet reports --node-ip as the node's InternalIP; without it, it picks
# the NAT address that every VM shares.
if printf 'KUBELET_EXTRA_ARGS=--node-ip=%s\n' "$CNILAB_NODE_IP" |
  install_if_changed 0644 /etc/default/kubelet; then
  log "kubelet --node-ip=$CNILAB_NODE_IP"
  if systemctl is-active --quiet kubelet; then
    systemctl restart kubelet
  fi
fi
systemctl enable --quiet kubelet

log "node prerequisites in place"
