#!/bin/sh
# cnilab node capture: a node's network, and every other network namespace
# on it, as one plain-text file that `cnilab lab up --capture FILE` and
# `cnilab capture --from-script FILE` read. Printed by `cnilab capture --script`.
#
# Run as root on the node (or in `chroot /host` of a privileged debug pod):
#   sh -s < node.sh > node1.capture          (the file on stdout)
#   sh node.sh node1.capture                 (or into the file given)
# CNILAB_NETNS=PATH takes the namespace at PATH (/run/netns/NAME,
# /proc/PID/ns/net) as the node instead of the script's own.
# CNILAB_CNI_CACHE=DIR and CNILAB_CNI_CONF=DIR read the CNI cache and
# configuration there (default /var/lib/cni/results and /etc/cni/net.d when
# the node is the machine itself, none with CNILAB_NETNS: the machine's own
# files are not another namespace's).
#
# Needs sh, coreutils or busybox (stat, od, tr, sort, cat, head, grep, mktemp),
# nsenter, iproute2's ip (JSON: -j), bridge and tc; nft, iptables-*-save and
# crictl where present. It only reads: nothing on the node is changed.
#
# The file: a header (format, boundary, hostname, kernel, time), then one
# section per command, each opened by a line
#   --BOUNDARY <namespace number or -> <what> - [<argument>]
# and its output, then a newline, then a line
#   --BOUNDARY <namespace number or -> <what>.status <exit status> [<argument>]
# and `--BOUNDARY--` ends the file.
set -u

if [ "$#" -gt 0 ]; then
  exec >"$1" || exit 2
fi
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
trap 'exit 2' HUP INT TERM

boundary=cnilab-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
node=${CNILAB_NETNS:-/proc/$$/ns/net}
case $node in
*/*) ;;
*) node=/run/netns/$node ;;
esac
if [ -n "${CNILAB_NETNS:-}" ]; then
  cache=${CNILAB_CNI_CACHE:-}
  conf=${CNILAB_CNI_CONF:-}
else
  cache=${CNILAB_CNI_CACHE:-/var/lib/cni/results}
  conf=${CNILAB_CNI_CONF:-/etc/cni/net.d}
fi

# The sysctls the capture reads (filled in by cnilab from its reader's list).
global_keys='@GLOBAL_KEYS@'
conf4_keys='@CONF4_KEYS@'
conf6_keys='@CONF6_KEYS@'
link4_keys='@LINK4_KEYS@'
link6_keys='@LINK6_KEYS@'

# section NS WHAT ARG CMD...: one section with CMD's output, streamed (no
# copy through a file), then its status as a section WHAT.status; its
# error output, when any, as a section WHAT.stderr.
section() {
  s_ns=$1
  s_what=$2
  s_arg=$3
  shift 3
  printf -- '--%s %s %s - %s\n' "$boundary" "$s_ns" "$s_what" "$s_arg"
  # Never the script's stdin: `sh -s` reads the script from it.
  "$@" </dev/null 2>"$tmp/err"
  s_rc=$?
  printf '\n--%s %s %s.status %s %s\n' "$boundary" "$s_ns" "$s_what" "$s_rc" "$s_arg"
  if [ -s "$tmp/err" ]; then
    printf -- '--%s %s %s.stderr 0 %s\n' "$boundary" "$s_ns" "$s_what" "$s_arg"
    head -c 65536 "$tmp/err"
    printf '\n'
  fi
}

# A tool that is missing: a section saying so (status 127), as a shell would.
missing() {
  printf '%s: not found\n' "$1" >&2
  return 127
}

have() {
  command -v "$1" >/dev/null 2>&1
}

# Every sysctl of the lists that this namespace has, KEY:VALUE (run by an
# inner sh inside the namespace: its $1..$5 are the lists above). One grep
# reads them all: a shell's `read` takes a byte at a time, and a sysctl
# file gives nothing past its first read.
# shellcheck disable=SC2016
sysctls='
cd /proc/sys || exit 1
keys=$1
for d in net/ipv4/conf/*; do
  c=${d##*/}
  case $c in all | default) k4=$2 k6=$3 ;; *) k4=$4 k6=$5 ;; esac
  for k in $k4; do keys="$keys net/ipv4/conf/$c/$k"; done
  for k in $k6; do keys="$keys net/ipv6/conf/$c/$k"; done
done
grep -Hs . $keys
exit 0
'

# CMD... inside the namespace being read.
inns() {
  nsenter --net="$ns_path" "$@"
}

# TOOL ARGS... (ip, bridge, tc) inside the namespace: by the tool's own -n
# where the namespace is named under /run/netns (one process, not two),
# else through nsenter.
inn() {
  i_tool=$1
  shift
  case $ns_path in
  /run/netns/*) "$i_tool" -n "${ns_path#/run/netns/}" "$@" ;;
  *) nsenter --net="$ns_path" "$i_tool" "$@" ;;
  esac
}

# OUT ERR [STATUS]: what a command printed before, again as a section's
# command.
again() {
  cat "$1"
  cat "$2" >&2
  return "${3:-0}"
}

# One namespace: NUMBER PATH.
namespace() {
  n=$1
  ns_path=$2
  inn ip -N -d -j link show >"$tmp/link" 2>"$tmp/link.err" </dev/null
  section "$n" link "" again "$tmp/link" "$tmp/link.err" "$?"
  # A namespace with no link into another is no pod and no peer: its
  # links are enough to say so (the node's is read whole).
  if [ "$n" != 0 ] && ! grep -q '"link_netnsid"' "$tmp/link"; then
    return 0
  fi
  section "$n" addr "" inn ip -j addr show
  section "$n" route4 "" inn ip -N -d -j -4 route show table all
  section "$n" route6 "" inn ip -N -d -j -6 route show table all
  section "$n" rule4 "" inn ip -N -d -j -4 rule show
  section "$n" rule6 "" inn ip -N -d -j -6 rule show
  section "$n" neigh "" inn ip -j neigh show nud permanent
  section "$n" nsid "" inn ip -j netns list-id
  if have bridge; then
    section "$n" fdb "" inn bridge -j fdb show
  else
    section "$n" fdb "" missing bridge
  fi
  if have tc; then
    section "$n" qdisc "" inn tc -j qdisc show
  else
    section "$n" qdisc "" missing tc
  fi
  section "$n" sysctl "" inns sh -c "$sysctls" sysctl "$global_keys" "$conf4_keys" "$conf6_keys" "$link4_keys" "$link6_keys"
  if have nft; then
    inns nft -s list ruleset >"$tmp/nft" 2>"$tmp/nft.err" </dev/null
    nft_rc=$?
    section "$n" nft "" again "$tmp/nft" "$tmp/nft.err" "$nft_rc"
  else
    : >"$tmp/nft"
    section "$n" nft "" missing nft
  fi
  for v in "" 6; do
    # Legacy tables where the kernel lists some; iptables-nft's where nft
    # lists a table of theirs.
    inns cat "/proc/net/ip${v}_tables_names" >"$tmp/names" 2>/dev/null </dev/null
    if [ -s "$tmp/names" ]; then
      section "$n" "ip${v}_tables_names" "" cat "$tmp/names"
      if have "ip${v}tables-legacy-save"; then
        section "$n" "ip${v}tables-legacy-save" "" inns "ip${v}tables-legacy-save"
      else
        section "$n" "ip${v}tables-legacy-save" "" missing "ip${v}tables-legacy-save"
      fi
    fi
    fam=ip$v
    if grep -Eq "^table $fam (filter|nat|mangle|raw|security) " "$tmp/nft"; then
      if have "ip${v}tables-nft-save"; then
        section "$n" "ip${v}tables-nft-save" "" inns "ip${v}tables-nft-save"
      else
        section "$n" "ip${v}tables-nft-save" "" missing "ip${v}tables-nft-save"
      fi
    fi
  done
}

# The header.
printf 'cnilab-node-capture 1\n'
printf 'boundary %s\n' "$boundary"
printf 'hostname %s\n' "$(cat /proc/sys/kernel/hostname)"
printf 'kernel %s\n' "$(uname -r)"
printf 'kernelVersion %s\n' "$(uname -v)"
printf 'arch %s\n' "$(uname -m)"
printf 'cniCache %s\n' "$cache"
printf 'cniConf %s\n' "$conf"
printf 'time %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
if [ -n "${CNILAB_NETNS:-}" ]; then
  printf 'source %s\n' "$node"
else
  printf 'source host\n'
fi

# Every namespace, by inode: named ones (/run/netns), then the ones only
# processes hold, lowest pid first. The node's, pid 1's and the script's own
# are not others.
for f in /run/netns/*; do
  if [ -e "$f" ]; then
    stat -L -c '%d:%i %n' "$f" 2>/dev/null
  fi
done >"$tmp/named"
# A process whose namespace is not readable is counted (its error kept).
for f in /proc/[0-9]*/ns/net; do
  stat -L -c '%d:%i %n' "$f" 2>>"$tmp/procs.err"
done | sort -t/ -k3,3n >"$tmp/procs"
section - named "" cat "$tmp/named"
section - procs "" again "$tmp/procs" "$tmp/procs.err"
node_ino=$(stat -L -c '%d:%i' "$node") || exit 2
section - own "" stat -L -c '%d:%i %n' "$node" /proc/1/ns/net "/proc/$$/ns/net"
seen=" $node_ino "
for own in /proc/1/ns/net "/proc/$$/ns/net"; do
  if ino=$(stat -L -c '%d:%i' "$own" 2>/dev/null); then
    seen="$seen$ino "
  fi
done

namespace 0 "$node"
k=0
cat "$tmp/named" "$tmp/procs" >"$tmp/all"
while read -r ino path; do
  case $seen in
  *" $ino "*) continue ;;
  esac
  seen="$seen$ino "
  k=$((k + 1))
  section "$k" namespace "$path" printf '%s\n' "$ino"
  namespace "$k" "$path" </dev/null
done <"$tmp/all"

# The CNI cache (its ADD results say which namespaces are pods) and the
# node's CNI configuration.
for what in cni-cache cni-conf; do
  case $what in
  cni-cache) dir=$cache ;;
  *) dir=$conf ;;
  esac
  [ -n "$dir" ] || continue
  for f in "$dir"/*; do
    if [ -f "$f" ] && [ ! -L "$f" ]; then
      section - "$what" "${f##*/}" head -c 1048577 "$f"
    fi
  done
done

# The CRI's sandboxes (their names), where crictl is.
if have crictl; then
  section - crictl-pods "" crictl pods -o json
  for id in $(crictl pods -q --state ready 2>/dev/null); do
    section - crictl-inspectp "$id" crictl inspectp -o json "$id"
  done
fi

printf -- '--%s--\n' "$boundary"
