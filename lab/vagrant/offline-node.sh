#!/usr/bin/env bash
# Provisioning of a VM in the Vagrantfile's offline mode (lab/vagrant/offline.rb),
# as root inside the VM: the host's cnilab binaries (uploaded to /tmp/cnilab),
# the agent as a systemd service in nodes-file mode, containerd with the
# lab's sandbox image and the CNI config the agent writes. Safe to run again.
set -euo pipefail
: "${CNILAB_NODE_NAME:?}" "${CNILAB_NODE_IP:?}" "${CNILAB_NODES_JSON:?}"
: "${CNILAB_CLUSTER_CIDR:?}" "${CNILAB_CNI_VERSION:?}"

install -D -m 755 /tmp/cnilab/cnilab-bridge /usr/local/libexec/cnilab/cnilab-bridge
install -m 755 /tmp/cnilab/cnilab-agent /tmp/cnilab/cnilab /usr/local/bin/
rm -rf /tmp/cnilab

# The private network carries the node address; the agent's routes to the
# other node's pods go through it.
ip -o -4 addr show | grep -q " ${CNILAB_NODE_IP}/" \
  || { echo "offline-node.sh: no interface has $CNILAB_NODE_IP" >&2; exit 1; }
printf 'net.ipv4.ip_forward = 1\n' >/etc/sysctl.d/90-cnilab.conf
sysctl -q -p /etc/sysctl.d/90-cnilab.conf

install -d /etc/cnilab /opt/cni/bin /etc/cni/net.d
printf '%s\n' "$CNILAB_NODES_JSON" >/etc/cnilab/nodes.json
# loopback (containerd sets up every pod's lo with it) from Debian's package.
ln -sf /usr/lib/cni/loopback /opt/cni/bin/loopback

cat >/etc/systemd/system/cnilab-agent.service <<UNIT
[Unit]
Description=cnilab agent (nodes-file mode)
After=network-online.target
[Service]
ExecStart=/usr/local/bin/cnilab-agent --node-name $CNILAB_NODE_NAME --nodes-file /etc/cnilab/nodes.json --cluster-cidr $CNILAB_CLUSTER_CIDR --plugin-binary /usr/local/libexec/cnilab/cnilab-bridge --cni-version $CNILAB_CNI_VERSION
Restart=on-failure
[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable cnilab-agent.service
systemctl restart cnilab-agent.service
for _ in $(seq 60); do
  [ -s /etc/cni/net.d/10-cnilab.conflist ] && break
  sleep 1
done
[ -s /etc/cni/net.d/10-cnilab.conflist ] \
  || { journalctl -u cnilab-agent --no-pager | tail -n 20 >&2; echo "offline-node.sh: the agent wrote no conflist" >&2; exit 1; }

# containerd: the lab's sandbox image (containerd never pulls here).
install -d /etc/containerd
cat >/etc/containerd/config.toml <<'TOML'
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "cnilab.local/pause:1"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
TOML
systemctl restart containerd
cnilab e2e vagrant-node pause-image >/root/pause-oci.tar
ctr --namespace k8s.io images import /root/pause-oci.tar >/dev/null
echo "offline-node.sh: $CNILAB_NODE_NAME ready ($(cnilab --version 2>/dev/null || echo cnilab))"
