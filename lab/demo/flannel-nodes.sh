#!/bin/bash
# Two nodes as flannel leaves them, in namespaces, to try `cnilab trace`
# on something that is not a cnilab lab: VXLAN flannel.1, pods on cni0 in
# cni-<uuid> namespaces (as containerd names them), iptables-nft with a
# FORWARD policy of DROP and flanneld's FLANNEL-FWD accepts, the nodes'
# eth0 joined by a bridge in a third namespace. Nothing outside these
# namespaces is touched.
#
#   bash lab/demo/flannel-nodes.sh up     # demo-node1, demo-node2, demo-sw
#   cnilab trace "$(bash lab/demo/flannel-nodes.sh pod 1 2)" 10.244.2.2 --netns demo-node1
#   bash lab/demo/flannel-nodes.sh down
#
# Needs root, iproute2, iptables (nft backend) and bridge.
set -euo pipefail

prefix=demo
state=/run/cnilab-demo-flannel

uuid() { cat /proc/sys/kernel/random/uuid; }

up() {
  mkdir -p "$state"
  local sw="$prefix-sw" i j n p mac peer
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for i in 1 2; do
    n="$prefix-node$i"
    ip netns add "$n"
    ip -n "$n" link set lo up
    ip -n "$n" link add eth0 type veth peer name "up$i" netns "$sw"
    ip -n "$sw" link set "up$i" master br0 up
    ip -n "$n" link set eth0 up
    ip -n "$n" addr add "192.168.56.1$i/24" dev eth0
    ip -n "$n" link add flannel.1 type vxlan id 1 local "192.168.56.1$i" dev eth0 dstport 8472 nolearning
    ip -n "$n" link set flannel.1 up
    ip -n "$n" addr add "10.244.$i.0/32" dev flannel.1
    ip -n "$n" link add cni0 type bridge
    ip -n "$n" link set cni0 up
    ip -n "$n" addr add "10.244.$i.1/24" dev cni0
    ip netns exec "$n" sysctl -qw net.ipv4.ip_forward=1
    for j in 2 3; do
      p="cni-$(uuid)"
      ip netns add "$p"
      echo "$p" >>"$state/pods$i"
      ip -n "$n" link add "veth$i$j" type veth peer name eth0 netns "$p"
      ip -n "$n" link set "veth$i$j" mtu 1450 master cni0 up
      ip -n "$p" link set lo up
      ip -n "$p" link set eth0 mtu 1450 up
      ip -n "$p" addr add "10.244.$i.$j/24" dev eth0
      ip -n "$p" route add default via "10.244.$i.1"
    done
    ip netns exec "$n" iptables-nft -P FORWARD DROP
    ip netns exec "$n" iptables-nft -N FLANNEL-FWD
    ip netns exec "$n" iptables-nft -A FORWARD -m comment --comment "flanneld forward" -j FLANNEL-FWD
    ip netns exec "$n" iptables-nft -A FLANNEL-FWD -s 10.244.0.0/16 -m comment --comment "flanneld forward" -j ACCEPT
    ip netns exec "$n" iptables-nft -A FLANNEL-FWD -d 10.244.0.0/16 -m comment --comment "flanneld forward" -j ACCEPT
  done
  # What flanneld writes for each peer it learns from the API server.
  for i in 1 2; do
    peer=$((3 - i))
    mac=$(ip -n "$prefix-node$peer" -br link show flannel.1 | awk '{print $3}')
    ip -n "$prefix-node$i" neigh add "10.244.$peer.0" lladdr "$mac" dev flannel.1 nud permanent
    ip -n "$prefix-node$i" route add "10.244.$peer.0/24" via "10.244.$peer.0" dev flannel.1 onlink
    bridge -n "$prefix-node$i" fdb append "$mac" dev flannel.1 dst "192.168.56.1$peer"
  done
  echo "up: nodes $prefix-node1 $prefix-node2; pods: $(cat "$state/pods1" "$state/pods2" | tr '\n' ' ')"
}

down() {
  local p
  cat "$state"/pods* 2>/dev/null | while read -r p; do
    ip netns del "$p" 2>/dev/null || true
  done
  for p in "$prefix-node1" "$prefix-node2" "$prefix-sw"; do
    ip netns del "$p" 2>/dev/null || true
  done
  rm -rf "$state"
}

# The namespace of pod J (2 or 3) of node I (1 or 2).
pod() {
  sed -n "$(($2 - 1))p" "$state/pods$1"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  pod) pod "${2:?node 1 or 2}" "${3:?pod 2 or 3}" ;;
  *)
    echo "usage: $0 up|down|pod NODE POD" >&2
    exit 2
    ;;
esac
