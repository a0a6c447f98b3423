#!/usr/bin/env bash
# The recipe of the offline box, run by lab/vagrant/build-box.sh (which
# checks the tools, caches by a hash of this directory, and links the result):
#
#   box/build.sh WORK OUT      (root; CNILAB_BOX_PUBKEY, CNILAB_BOX_MIRROR)
#
# mmdebstrap makes the root tree from Debian's archive (the host's apt
# sources, or CNILAB_BOX_MIRROR); mke2fs -d writes it into an ext4 partition
# of a raw disk image (no loop device, partition table or nbd needed); a
# one-off boot of that disk under QEMU (direct kernel boot, TCG: it needs no
# KVM) runs grub-install inside the guest and powers off; the disk is
# compressed to qcow2 and packed with metadata.json and box/Vagrantfile as a
# vagrant-libvirt box at OUT. Any change here changes the box's hash.
set -euo pipefail

readonly SUITE=bookworm
readonly PACKAGES=(
  linux-image-amd64 initramfs-tools systemd-sysv udev dbus openssh-server
  sudo iproute2 iputils-ping procps kmod grub-pc nftables
  containerd runc containernetworking-plugins
)
readonly DISK_MIB=4096
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
work=${1:?usage: build.sh WORK OUT}
box=${2:?usage: build.sh WORK OUT}
mirror=${CNILAB_BOX_MIRROR:-}
: "${CNILAB_BOX_PUBKEY:?the public key vagrant logs in with}"
die() { echo "build-box.sh: $*" >&2; exit 1; }

started=$SECONDS
root=$work/rootfs
echo "build-box.sh: mmdebstrap $SUITE (${#PACKAGES[@]} packages) into $root" >&2

# The guest's own setup (users, network, GRUB's first-boot unit) is
# box/customize.sh, run by mmdebstrap on the finished tree.
mirror_args=()
[ -n "$mirror" ] && mirror_args=("$mirror")
nice -n 10 mmdebstrap --variant=apt --mode=root --quiet \
  --include="$(IFS=,; echo "${PACKAGES[*]}")" \
  --customize-hook="$here/customize.sh" \
  "$SUITE" "$root" "${mirror_args[@]}"

kernel=$(find "$root/boot" -maxdepth 1 -name 'vmlinuz-*' | sort | tail -n1)
initrd=$(find "$root/boot" -maxdepth 1 -name 'initrd.img-*' | sort | tail -n1)
{ [ -n "$kernel" ] && [ -n "$initrd" ]; } || die "no kernel or initrd in the tree (linux-image-amd64 not installed?)"
cp "$kernel" "$work/vmlinuz"
cp "$initrd" "$work/initrd"

# One partition from 1 MiB to the end: mke2fs writes the tree at that offset
# of a sparse raw disk, then an MBR with that one (bootable, Linux) entry.
disk=$work/disk.raw
truncate -s "${DISK_MIB}M" "$disk"
nice -n 10 mke2fs -q -t ext4 -L root -d "$root" -E offset=1048576 "$disk" "$((DISK_MIB - 1))M"
rm -rf -- "$root"
sectors=$(((DISK_MIB - 1) * 2048))
le32() { printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 & 255)) $((($1 >> 8) & 255)) $((($1 >> 16) & 255)) $((($1 >> 24) & 255)); }
# shellcheck disable=SC2059 # the format is the escaped bytes
printf "\\x80\\xfe\\xff\\xff\\x83\\xfe\\xff\\xff$(le32 2048)$(le32 "$sectors")" \
  | dd of="$disk" bs=1 seek=446 conv=notrunc status=none
printf '\x55\xaa' | dd of="$disk" bs=1 seek=510 conv=notrunc status=none

echo "build-box.sh: first boot (TCG) to install GRUB" >&2
log=$work/first-boot.log
timeout 1200 nice -n 10 qemu-system-x86_64 -accel tcg -cpu qemu64 -m 1024 -smp 1 \
  -nographic -no-reboot -nic none \
  -drive "file=$disk,format=raw,if=virtio" \
  -kernel "$work/vmlinuz" -initrd "$work/initrd" \
  -append "root=/dev/vda1 rw console=ttyS0,115200 no_timer_check panic=-1" \
  </dev/null >"$log" 2>&1 || true
grep -q CNILAB-GRUB-DONE "$log" \
  || { tail -n 30 "$log" >&2; die "the first boot did not install GRUB (serial log above)"; }

echo "build-box.sh: qcow2 and box" >&2
nice -n 10 qemu-img convert -c -O qcow2 "$disk" "$work/box.img"
rm -f -- "$disk"
printf '{"provider":"libvirt","format":"qcow2","virtual_size":%d}\n' "$((DISK_MIB / 1024))" >"$work/metadata.json"
cp "$here/Vagrantfile" "$work/Vagrantfile"
tar -C "$work" -cf "$box.partial" metadata.json Vagrantfile box.img
mv -f -- "$box.partial" "$box"
echo "build-box.sh: built $box in $((SECONDS - started)) s ($(du -h "$box" | cut -f1))" >&2
