# shellcheck shell=bash
# Helpers shared by the provisioning scripts (sourced, never run). Every step
# in those scripts checks the state it wants before changing anything, so
# `vagrant provision` can run any number of times.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
export KUBECONFIG=/etc/kubernetes/admin.conf

# The checkout, as the VMs see it, and the directory the VMs use to hand
# files to each other (join command, kubeconfig, image archive).
readonly REPO=/vagrant
# shellcheck disable=SC2034 # used by the scripts that source this file
readonly RUN_DIR=$REPO/lab/vagrant/run
# What this VM has done, so that re-provisioning can skip it.
readonly STATE_DIR=/var/lib/cnilab-lab

log() { printf '[%s %(%H:%M:%S)T] %s\n' "$(hostname -s)" -1 "$*"; }
die() {
  log "ERROR: $*" >&2
  exit 1
}

require_env() {
  local name
  for name in "$@"; do
    if [[ -z ${!name:-} ]]; then
      die "$name is not set: run this script through 'vagrant provision'"
    fi
  done
}

# The interface carrying an address. Found by address because its name
# depends on the provider and the box (eth1, enp0s8, ens6, ...).
interface_with_address() {
  ip -o addr show | awk -v want="$1" '{ split($4, a, "/"); if (a[1] == want) { print $2; exit } }'
}

deb_arch() { dpkg --print-architecture; }

# apt-get that waits for the dpkg lock: on a first boot, cloud-init and
# unattended-upgrades often hold it for minutes.
apt_get() { apt-get -o DPkg::Lock::Timeout=900 "$@"; }

apt_install() {
  local -a missing=()
  local pkg
  for pkg in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep 'install ok installed' >/dev/null; then
      missing+=("$pkg")
    fi
  done
  if ((${#missing[@]} > 0)); then
    log "apt: installing ${missing[*]}"
    apt_get update -qq
    apt_get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# download URL DEST SHA256: fetch URL to DEST and check its digest.
download() {
  local url=$1 dest=$2 sha=$3
  curl -fsSL --retry 5 --retry-delay 2 -o "$dest.part" "$url"
  if ! printf '%s  %s\n' "$sha" "$dest.part" | sha256sum --check --status; then
    rm -f "$dest.part"
    die "checksum mismatch for $url"
  fi
  mv "$dest.part" "$dest"
}

# sha256_from URL [NAME]: the digest published next to a release asset,
# either a bare digest or a "digest  name" list (then pick NAME's line).
sha256_from() {
  local url=$1 name=${2:-}
  local body
  body=$(curl -fsSL --retry 5 --retry-delay 2 "$url")
  if [[ -n $name ]]; then
    body=$(awk -v n="$name" '{ f = $2; sub(/^\*/, "", f); if (f == n) print $1 }' <<<"$body")
  fi
  body=${body%%[[:space:]]*}
  [[ $body =~ ^[0-9a-f]{64}$ ]] || die "no sha256 for ${name:-$url} in $url"
  printf '%s\n' "$body"
}

# install_if_changed MODE DEST: install stdin as DEST when it differs.
# Returns 0 when DEST changed, 1 when it was already up to date.
install_if_changed() {
  local mode=$1 dest=$2 tmp
  tmp=$(mktemp)
  cat >"$tmp"
  if [[ -f $dest ]] && cmp -s "$tmp" "$dest"; then
    rm -f "$tmp"
    return 1
  fi
  install -D -m "$mode" "$tmp" "$dest"
  rm -f "$tmp"
  return 0
}

# wait_for_file PATH SECONDS WHAT HINT: poll for a file written by another VM.
wait_for_file() {
  local path=$1 timeout=$2 what=$3 hint=$4 waited=0
  while [[ ! -s $path ]]; do
    if ((waited >= timeout)); then
      die "no $what at $path after ${timeout}s. $hint"
    fi
    if ((waited % 60 == 0)); then
      log "waiting for $what ($path), ${waited}s so far"
    fi
    sleep 10
    waited=$((waited + 10))
  done
}

mark_done() { mkdir -p "$STATE_DIR" && printf '%s\n' "${2:-done}" >"$STATE_DIR/$1"; }
marked() { [[ -f $STATE_DIR/$1 && $(<"$STATE_DIR/$1") == "${2:-done}" ]]; }
