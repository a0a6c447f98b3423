#!/usr/bin/env bash
# Builds the offline libvirt box of the Vagrantfile's offline mode
# (CNILAB_VAGRANT_MODE=offline): Debian bookworm from the Debian archive,
# nothing downloaded from anywhere else. The recipe is box/build.sh.
#
#   bash lab/vagrant/build-box.sh              # build, or reuse the cached box
#   bash lab/vagrant/build-box.sh --link PATH  # also symlink PATH to the box
#   bash lab/vagrant/build-box.sh --print      # the box's path; builds nothing
#
# Prints the box file's path as the last line. Cached by a hash of its inputs
# (every file in box/, the mirror and vagrant's public insecure key): a second
# run with the same inputs builds nothing. Cache: $CNILAB_BOX_CACHE, default
# ${XDG_CACHE_HOME:-~/.cache}/cnilab/vagrant-box. A missing tool: one line,
# exit 2.
set -euo pipefail

die() { echo "build-box.sh: $*" >&2; exit 2; }
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
link='' print=''
while [ $# -gt 0 ]; do
  case $1 in
  --link) [ $# -ge 2 ] || die "--link needs a path"; link=$2; shift 2 ;;
  --print) print=1; shift ;;
  *) die "unknown argument $1 (usage: build-box.sh [--link PATH] [--print])" ;;
  esac
done

# Vagrant's public insecure key: what every box ships so that the first
# `vagrant up` can log in and replace it by a key of its own.
command -v ruby >/dev/null || die "ruby not found: apt-get install vagrant"
gem_dir=$(ruby -e 'print Gem::Specification.find_by_name("vagrant").gem_dir' 2>/dev/null) \
  || die "vagrant's ruby gem not found: apt-get install vagrant"
insecure_key=$gem_dir/keys/vagrant.pub
[ -r "$insecure_key" ] || die "$insecure_key not found: reinstall vagrant"

cache=${CNILAB_BOX_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/cnilab/vagrant-box}
hash=$( {
  for f in "$here"/box/*; do printf '%s\n' "${f##*/}"; cat "$f"; done
  printf 'mirror=%s\n' "${CNILAB_BOX_MIRROR:-}"
  cat "$insecure_key"
} | sha256sum | cut -c1-16)
box=$cache/cnilab-bookworm-$hash.box

if [ -z "$print" ] && [ ! -s "$box" ]; then
  [ "$(id -u)" -eq 0 ] || die "run as root (mmdebstrap --mode=root)"
  for tool in mmdebstrap:mmdebstrap mke2fs:e2fsprogs qemu-system-x86_64:qemu-system-x86 \
    qemu-img:qemu-utils tar:tar sha256sum:coreutils timeout:coreutils; do
    command -v "${tool%%:*}" >/dev/null \
      || die "${tool%%:*} not found: apt-get install ${tool#*:} (or bash lab/install-deps.sh --vagrant)"
  done
  mkdir -p "$cache"
  work=$(mktemp -d "$cache/build.XXXXXX")
  trap 'rm -rf -- "$work"' EXIT
  CNILAB_BOX_PUBKEY=$(cat "$insecure_key") bash "$here/box/build.sh" "$work" "$box.partial"
  mv -f -- "$box.partial" "$box"
elif [ -z "$print" ]; then
  echo "build-box.sh: reusing $box (inputs unchanged)" >&2
fi
if [ -n "$link" ]; then
  mkdir -p "$(dirname -- "$link")"
  ln -sfn "$box" "$link"
fi
echo "$box"
