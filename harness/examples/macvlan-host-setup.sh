#!/bin/sh
# --host-setup for debian-macvlan.conflist: cnilab conform runs this with
# `sh` inside each fresh, empty host namespace it makes (never the
# machine's own), before every group. macvlan needs its "master" link: a
# veth pair works on any kernel (a dummy link needs the dummy module).
set -e
ip link add eth0 type veth peer name eth0-peer
ip link set eth0-peer up
ip link set eth0 up
