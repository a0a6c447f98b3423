#!/usr/bin/env bash
# mmdebstrap --customize-hook of lab/vagrant/build-box.sh: runs on the host
# with the finished root tree as $1 and vagrant's public insecure key in
# CNILAB_BOX_PUBKEY. Makes what every vagrant box has (a vagrant user with
# password-less sudo and that key) and what the offline lab needs: DHCP on
# every NIC through systemd-networkd (vagrant configures the private network
# through it too), a serial console, an empty machine-id (each VM makes its
# own), and a one-shot unit that installs GRUB on the build's first boot and
# empties the machine-id that boot wrote (else every VM of the box shares it).
set -euo pipefail
root=${1:?usage: customize.sh ROOT}
: "${CNILAB_BOX_PUBKEY:?CNILAB_BOX_PUBKEY must hold the public key}"

chroot "$root" useradd -m -s /bin/bash -G sudo vagrant
echo "vagrant:vagrant" | chroot "$root" chpasswd
echo "vagrant ALL=(ALL) NOPASSWD:ALL" >"$root/etc/sudoers.d/vagrant"
chmod 440 "$root/etc/sudoers.d/vagrant"
install -d -m 700 "$root/home/vagrant/.ssh"
echo "$CNILAB_BOX_PUBKEY" >"$root/home/vagrant/.ssh/authorized_keys"
chmod 600 "$root/home/vagrant/.ssh/authorized_keys"
chroot "$root" chown -R vagrant:vagrant /home/vagrant/.ssh

# The lease is asked for by MAC: two VMs from this box must never share one
# (networkd's default client identifier comes from the machine-id).
printf '[Match]\nName=en* eth*\n\n[Network]\nDHCP=yes\n\n[DHCPv4]\nClientIdentifier=mac\n' \
  >"$root/etc/systemd/network/90-dhcp.network"
chroot "$root" systemctl enable systemd-networkd
echo cnilab-box >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 cnilab-box\n' >"$root/etc/hosts"
echo "LABEL=root / ext4 errors=remount-ro 0 1" >"$root/etc/fstab"
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
sed -i -e 's/^GRUB_TIMEOUT=.*/GRUB_TIMEOUT=0/' \
  -e 's/^GRUB_CMDLINE_LINUX=.*/GRUB_CMDLINE_LINUX="console=ttyS0,115200 console=tty0 no_timer_check"/' \
  "$root/etc/default/grub"
# GRUB on the serial line: the VMs have no video device, and GRUB's default
# (graphical) terminal waits for one.
printf 'GRUB_TERMINAL=serial\nGRUB_SERIAL_COMMAND="serial --speed=115200"\n' >>"$root/etc/default/grub"
rm -f "$root"/var/cache/apt/archives/*.deb

cat >"$root/etc/systemd/system/cnilab-grub-setup.service" <<'UNIT'
[Unit]
Description=cnilab box build: install GRUB on /dev/vda, then power off
After=local-fs.target
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'grub-install --target=i386-pc /dev/vda && update-grub && systemctl disable cnilab-grub-setup.service && : >/etc/machine-id && echo CNILAB-GRUB-DONE >/dev/ttyS0'
ExecStartPost=/bin/systemctl --no-block poweroff
[Install]
WantedBy=multi-user.target
UNIT
chroot "$root" systemctl enable cnilab-grub-setup.service
