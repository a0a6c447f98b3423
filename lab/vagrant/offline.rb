# CNILAB_VAGRANT_MODE=offline (loaded by the Vagrantfile): two Debian VMs,
# node1 and node2, from the box lab/vagrant/build-box.sh builds, on the
# libvirt provider, without Kubernetes and without the internet. Each VM gets
# the host's build of cnilab-bridge, cnilab-agent and cnilab; the agent runs
# in nodes-file mode with both VMs listed and writes the conflist that the
# VM's containerd uses. `cnilab e2e vagrant` drives it (lab/vagrant/README.md,
# "Offline mode").
#
# Settings (environment): CNILAB_VAGRANT_BIN (the directory with the three
# binaries; default target/release when it has them, else target/debug),
# CNILAB_VAGRANT_DRIVER (kvm or qemu; default: kvm only when /dev/kvm can run
# a stock kernel), and from the common settings network_prefix and pod_cidr.

module CnilabOffline
  BOX = "cnilab/bookworm-offline".freeze
  NODES = %w[node1 node2].freeze
  BINARIES = %w[cnilab-bridge cnilab-agent cnilab].freeze
  MEMORY = 768
  # bookworm's containerd is 1.6, which refuses CNI 1.1.0 results.
  CNI_VERSION = "1.0.0".freeze

  # KVM serves a stock kernel only through kvm_intel or kvm_amd: a /dev/kvm
  # of another kind (PVM, for one) cannot boot Debian's kernel, and QEMU's
  # TCG (driver "qemu", CPU model qemu64) is used instead.
  def self.driver
    forced = ENV.fetch("CNILAB_VAGRANT_DRIVER", "")
    unless forced.empty?
      raise "CNILAB_VAGRANT_DRIVER=#{forced.inspect} must be kvm or qemu" unless %w[kvm qemu].include?(forced)

      return forced
    end
    stock_kvm = %w[kvm_intel kvm_amd].any? { |m| File.directory?("/sys/module/#{m}") }
    File.writable?("/dev/kvm") && stock_kvm ? "kvm" : "qemu"
  end

  def self.bin_dir(root)
    dir = ENV.fetch("CNILAB_VAGRANT_BIN", "")
    return dir unless dir.empty?

    release = File.join(root, "target", "release")
    BINARIES.all? { |b| File.executable?(File.join(release, b)) } ? release : File.join(root, "target", "debug")
  end

  # node1 and node2: .11 and .12 of network_prefix, the first two /24s
  # after the cluster's network address as their pod CIDRs.
  def self.nodes(settings)
    cluster = IPAddr.new(settings["pod_cidr"])
    raise "pod_cidr=#{settings['pod_cidr']} must be IPv4 and at most /22 in offline mode" unless cluster.ipv4? && cluster.prefix <= 22

    NODES.each_with_index.map do |name, i|
      { "name" => name, "internalIP" => "#{settings['network_prefix']}.#{11 + i}",
        "podCIDRs" => ["#{IPAddr.new(cluster.to_i + ((i + 1) << 8), Socket::AF_INET)}/24"] }
    end
  end

  def self.configure(root, settings)
    bin = bin_dir(root)
    if ARGV.include?("up") || ARGV.include?("provision")
      missing = BINARIES.reject { |b| File.executable?(File.join(bin, b)) }
      raise "#{bin}: no #{missing.join(', ')}; cargo build --release first, or set CNILAB_VAGRANT_BIN" unless missing.empty?
    end
    nodes = nodes(settings)
    driver = self.driver
    Vagrant.configure("2") do |config|
      config.vm.box = BOX
      config.vm.box_check_update = false
      config.vm.synced_folder ".", "/vagrant", disabled: true
      config.vm.boot_timeout = 900
      config.vm.provider :libvirt do |lv|
        lv.driver = driver
        if driver == "qemu"
          lv.cpu_mode = "custom"
          lv.cpu_model = "qemu64"
        end
        lv.cpus = 1
        lv.memory = MEMORY
        # The VMs are thrown away after each run: no flush reaches the
        # host's disk (shared with the builds around it).
        lv.disk_driver cache: "unsafe"
        lv.graphics_type = "none"
        lv.video_type = "none"
        lv.management_network_name = "cnilab-mgmt"
        lv.management_network_address = "192.168.121.0/24"
        lv.management_network_mode = "none"
      end
      nodes.each do |node|
        config.vm.define node["name"] do |machine|
          machine.vm.hostname = node["name"]
          machine.vm.network :private_network, ip: node["internalIP"],
                                               libvirt__network_name: "cnilab-nodes",
                                               libvirt__forward_mode: "none",
                                               libvirt__dhcp_enabled: false
          BINARIES.each do |b|
            machine.vm.provision "file", source: File.join(bin, b), destination: "/tmp/cnilab/#{b}"
          end
          machine.vm.provision "offline-node", type: "shell", path: File.join(root, "lab", "vagrant", "offline-node.sh"),
                                               env: { "CNILAB_NODE_NAME" => node["name"],
                                                      "CNILAB_NODE_IP" => node["internalIP"],
                                                      "CNILAB_NODES_JSON" => JSON.generate(nodes),
                                                      "CNILAB_CLUSTER_CIDR" => settings["pod_cidr"],
                                                      "CNILAB_CNI_VERSION" => CNI_VERSION }
        end
      end
    end
  end
end
