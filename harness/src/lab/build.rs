//! Building and tearing down a lab. There is one builder: [`Lab::up`]
//! compiles the topology into its model (`model::compile`: the underlay
//! switch, routers and NAT boxes, the external host, the nodes with their
//! links, addresses, routes, nftables tables and sysctls) and makes the
//! lab's infrastructure of it with `model::apply`; then come the steps only
//! a runtime does: the agents started (`routing = "agent"`: the routes are
//! theirs), each node's containerd, the pods attached by the plugin through
//! the harness `Runtime` (or the CRI) with the node as the host namespace,
//! and the Services: the compiled model's tables bound to the pods'
//! addresses. What the builder needs besides the topology (plugin
//! directory, template, pod MTU, containerd) comes found and checked in a
//! [`super::recipe::Recipe`]; the topology is compiled once.
//!
//! A node that joins or leaves a running lab ([`Lab::add_node`],
//! [`Lab::remove_node`], scenarios) goes through the same builder: the
//! topology compiled with and without the node, and the difference of the
//! two models applied to the standing namespaces (`apply::apply_diff`);
//! then the same runtime steps as `up` (agent, containerd, pods, Services).
//! Nothing of the lab's infrastructure is made anywhere else.
//!
//! The top of the builder's floors: it calls the floors below it (the model,
//! the underlay shapes, the overlay, the Services, the runtimes) and none of
//! them calls back into it. What they share lives below: [`super::base`]
//! (errors, options, namespace/netlink/nft helpers), [`super::built`]
//! (`Lab`, `Node`, `Pod`), [`super::template`] (config templates) and
//! [`super::routes`] (addresses, static routes, the masquerade ruleset, the
//! agents' node list).

use super::base::setup;
use super::base::{ensure_fd_limit, fds_needed};
use super::base::{make_ns_from, make_ns_setup, veths_of, wait_oper_up};
use super::base::{resolve_program, LabError, UpOptions, AGENT_PIDFILE};
use super::built::{Lab, Node, Pod};
use super::compile;
use super::profile::Profile;
use super::recipe::Recipe;
use super::routes::nodes_file;
use super::template::{render_template, template_of};
use super::topology::{NodeSpec, Routing, Topology};
use crate::model::placeholder::pod_bound_tables;
use crate::model::{apply, LabModel, Namespace};
use crate::netns::Netns;
use crate::runtime::{NetworkConfig, Runtime, RuntimeConf};
use cnilab_net::netns as plugin_netns;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A node's IPAM store, in its run dir: the template's `{{data_dir}}`, and
/// the store the agent's conflist names under containerd.
fn ipam_dir(node_dir: &Path) -> PathBuf {
    node_dir.join("ipam")
}

impl Lab {
    /// Builds the whole lab of `topo`: [`Recipe::new`] finds and checks what
    /// it needs, then [`Lab::build`].
    pub fn up(topo: Topology, opts: UpOptions) -> Result<Lab, LabError> {
        let recipe = Recipe::new(topo, opts.plugin_dir.as_deref(), opts.runtime)?;
        Lab::build(recipe, opts)
    }

    /// Builds the whole lab of a recipe: its infrastructure by the one
    /// builder (`apply_infrastructure`), then what only a runtime does: the
    /// agents started (`routing = "agent"`), each containerd, the pods
    /// attached by the plugin, the Services bound to their addresses. On
    /// error, everything made so far is removed (the namespaces are
    /// dropped).
    pub fn build(recipe: Recipe, opts: UpOptions) -> Result<Lab, LabError> {
        let started = Instant::now();
        let Recipe {
            topo,
            plugin_dir,
            template,
            pod_mtu,
            containerd,
            bundled: _,
        } = recipe;
        let pods = topo.nodes.len() * topo.pods_per_node;
        ensure_fd_limit(fds_needed(pods + topo.nodes.len() + 8, topo.nodes.len()))?;
        super::base::make_run_dir(&opts.run_dir)?;
        // Compiled once: the infrastructure is applied from it, the
        // Services installed from it once the pods have their addresses.
        let compiled = compile::compile(&topo)?;
        let applied = apply_infrastructure(&compiled, &topo, &opts)?;
        let mut lab = Lab {
            topo,
            opts,
            plugin_dir,
            switch: applied.switch,
            external: applied.external,
            nodes: Vec::new(),
            phases: Vec::new(),
            extra: applied.extra,
            containerd,
        };
        for (spec, ns) in lab.topo.nodes.clone().into_iter().zip(applied.nodes) {
            let node = lab.node(spec, ns, &template, pod_mtu)?;
            lab.nodes.push(node);
        }
        if lab.topo.routing == Routing::Agent {
            lab.start_agents()?;
        }
        lab.phases.push(("up".into(), started.elapsed()));

        let started = Instant::now();
        lab.start_all_containerd()?;
        lab.attach_pods()?;
        lab.settle_pod_links();
        lab.install_services(&compiled)?;
        lab.phases.push(("attach".into(), started.elapsed()));
        Ok(lab)
    }

    /// Publishes the node list and starts every node's agent; waits for
    /// the routes they install.
    fn start_agents(&mut self) -> Result<(), LabError> {
        let specs = self.topo.nodes.clone();
        self.write_nodes_file(&specs)?;
        for i in 0..self.nodes.len() {
            self.start_agent(i)?;
        }
        self.wait_for_agent_routes(Duration::from_secs(15))
    }

    /// The node's run directory, its plugin config and its runtime, around
    /// its namespace.
    fn node(
        &self,
        spec: NodeSpec,
        ns: Netns,
        template: &str,
        pod_mtu: u32,
    ) -> Result<Node, LabError> {
        let node_dir = self.opts.run_dir.join(&spec.name);
        std::fs::create_dir_all(&node_dir)
            .map_err(|e| setup(format!("{}: {e}", node_dir.display())))?;
        let conf_text = render_template(template, &self.topo, &spec, &ipam_dir(&node_dir), pod_mtu);
        let conf_path = node_dir.join("net.conflist");
        std::fs::write(&conf_path, &conf_text)
            .map_err(|e| setup(format!("{}: {e}", conf_path.display())))?;
        let net = NetworkConfig::parse(&conf_text, &conf_path)?;
        let mut runtime = Runtime::new(&self.plugin_dir)
            .in_netns(&ns)?
            .with_cache_dir(&node_dir.join("results"));
        if super::profile::enabled() {
            runtime = runtime.with_cpu_accounting();
        }
        Ok(Node {
            spec,
            ns,
            runtime,
            net,
            pods: Vec::new(),
            agent: None,
            cri: None,
        })
    }

    /// Publishes the node list to the agents (atomically: `util::write_replacing`).
    pub fn write_nodes_file(&self, specs: &[NodeSpec]) -> Result<(), LabError> {
        let path = self.nodes_file_path();
        crate::util::write_replacing(&path, nodes_file(specs).as_bytes())
            .map_err(|e| setup(format!("nodes file {}: {e}", path.display())))
    }

    /// Starts the agent command inside node `i`'s namespace.
    pub fn start_agent(&mut self, i: usize) -> Result<(), LabError> {
        let agent = self
            .topo
            .agent
            .clone()
            .ok_or_else(|| setup("routing = \"agent\" needs an [agent] command"))?;
        let node = &self.nodes[i];
        let node_dir = self.opts.run_dir.join(&node.spec.name);
        let cluster: Vec<String> = self
            .topo
            .cluster_cidr
            .iter()
            .map(|c| c.to_string())
            .collect();
        let fill = |word: &str| {
            word.replace("{{node}}", &node.spec.name)
                .replace(
                    "{{nodes_file}}",
                    &self.nodes_file_path().display().to_string(),
                )
                .replace("{{cluster_cidr}}", &cluster.join(","))
                .replace(
                    "{{conf_dir}}",
                    &node_dir.join("net.d").display().to_string(),
                )
                .replace("{{bin_dir}}", &node_dir.join("bin").display().to_string())
                .replace("{{run_dir}}", &node_dir.display().to_string())
        };
        let mut words: Vec<String> = agent.command.iter().map(|w| fill(w)).collect();
        let program = resolve_program(&words[0]);
        words.extend(super::cri::attach::agent_flags(
            &program,
            self.containerd.as_ref(),
            &ipam_dir(&node_dir),
        ));
        let log_path = node_dir.join("agent.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| setup(format!("{}: {e}", log_path.display())))?;
        let log2 = log.try_clone().map_err(|e| setup(e.to_string()))?;
        let mut command = node.ns.command(&program);
        // What proves the agent ours to `lab down` and `cnilab sweep`.
        command.env(super::pidfile::RUN_DIR_ENV, &node_dir);
        // The lab blocks SIGINT/SIGTERM for its Ctrl-C watcher; the agent must
        // get them (a blocked mask survives exec).
        // A throwaway lab's agents die with the lab process, however it dies
        // (SIGKILL included): the kernel sends them SIGKILL. A standing lab's
        // agents outlive `lab up` and are found again through their pidfiles.
        let die_with_parent = self.opts.persistent.is_none();
        let parent = std::process::id() as nix::libc::pid_t;
        // The agent writes its own pidfile (pid + start time) before exec,
        // so it is provably ours from its first instant, whenever the lab
        // process dies; `cnilab sweep` and `lab down` check it before they
        // signal.
        let pidfile_path = node_dir.join(AGENT_PIDFILE);
        let pidfile = super::pidfile::prepare(&pidfile_path)
            .map_err(|e| setup(format!("{}: {e}", pidfile_path.display())))?;
        let pidfile_fd = std::os::fd::AsRawFd::as_raw_fd(&pidfile);
        // SAFETY: only sigprocmask(2), prctl(2), getppid(2) and the
        // open/read/write/close of `write_own_identity`, which are
        // async-signal-safe; nothing is allocated.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(move || {
                super::pidfile::write_own_identity(pidfile_fd)?;
                let mut set = nix::sys::signal::SigSet::empty();
                set.add(nix::sys::signal::Signal::SIGINT);
                set.add(nix::sys::signal::Signal::SIGTERM);
                set.thread_unblock().map_err(std::io::Error::from)?;
                if die_with_parent {
                    if nix::libc::prctl(nix::libc::PR_SET_PDEATHSIG, nix::libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // The parent died before prctl: nobody will send the signal.
                    if nix::libc::getppid() != parent {
                        return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
                    }
                }
                Ok(())
            });
        }
        if self.opts.persistent.is_some() {
            // A standing lab's agents must survive the terminal's Ctrl-C.
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
        }
        let child = command
            .args(&words[1..])
            .env("NODE_NAME", &node.spec.name)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| {
                setup(format!(
                    "start agent {} on {}: {e}",
                    program.display(),
                    node.spec.name
                ))
            })?;
        drop(pidfile);
        crate::interrupt::register_child(child.id());
        self.nodes[i].agent = Some(child);
        Ok(())
    }

    /// Stops node `i`'s agent (SIGTERM, then SIGKILL).
    pub fn stop_agent(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].agent.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits until every node has a route to every other node's pod CIDR.
    pub fn wait_for_agent_routes(&self, limit: Duration) -> Result<(), LabError> {
        let deadline = Instant::now() + limit;
        loop {
            let mut missing = Vec::new();
            for node in &self.nodes {
                let routes = node.ns.routes().map_err(|e| setup(e.to_string()))?;
                for other in self.nodes.iter().filter(|o| o.spec.name != node.spec.name) {
                    // Each pod CIDR via the peer's address of its family
                    // (a family the peer has no address of is not routed).
                    for cidr in &other.spec.pod_cidr {
                        let Some(via) = other.spec.address_of(cidr.addr().is_ipv6()) else {
                            continue;
                        };
                        if !routes
                            .iter()
                            .any(|r| r.dst == cidr.trunc() && r.gateway == Some(via))
                        {
                            missing.push(format!("{}: {} via {via}", node.spec.name, cidr));
                        }
                    }
                }
            }
            if missing.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(setup(format!(
                    "the agents did not install these routes within {limit:?} (logs in {}): {}",
                    self.opts.run_dir.display(),
                    missing.join("; ")
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits ([`wait_oper_up`]: at most 5 s) until every veth the plugin
    /// made (each pod's, and the node's ends that are up) has its carrier.
    /// A runtime does not wait, but a lab's first check would race the
    /// kernel's link watcher, which gives a new veth its carrier up to a
    /// second later (more on a loaded machine): until then a bridge port
    /// forwards nothing, and every probe of a check right after `lab up`
    /// timed out. Never an error: a link that never comes up is left for the
    /// check to find.
    fn settle_pod_links(&self) {
        let veths: Vec<(&crate::netns::Netns, String)> = self
            .nodes
            .iter()
            .flat_map(|n| std::iter::once(&n.ns).chain(n.pods.iter().map(|p| &p.ns)))
            .flat_map(|ns| {
                let links = ns.links().unwrap_or_default().into_iter();
                links
                    .filter(|l| l.up && l.kind.as_deref() == Some("veth"))
                    .map(move |l| (ns, l.name))
            })
            .collect();
        let named: Vec<(&crate::netns::Netns, &str)> =
            veths.iter().map(|(ns, l)| (*ns, l.as_str())).collect();
        let _ = wait_oper_up(&named, "the plugin's veths");
    }

    /// Creates and ADDs the pods of every node: all nodes at once, on a
    /// bounded pool of threads (see [`Lab::add_pods_to`]).
    fn attach_pods(&mut self) -> Result<(), LabError> {
        let per_node = self.topo.pods_per_node;
        let counts: Vec<(usize, usize)> = (0..self.nodes.len()).map(|i| (i, per_node)).collect();
        let profile = Profile::from_env();
        let bar = crate::report::progress::Progress::stderr();
        let attached = self.add_pods_to(&counts, &profile, &bar);
        bar.clear();
        if let Some(table) = profile.table(self.nodes.len() * per_node) {
            eprint!("{table}");
        }
        attached
    }

    /// Adds `count` pods to node `i`.
    pub fn add_pods(&mut self, i: usize, count: usize) -> Result<(), LabError> {
        let quiet = crate::report::progress::Progress::quiet();
        self.add_pods_to(&[(i, count)], &Profile::off(), &quiet)
    }

    /// Adds pods to nodes, `(node, count)` each: the nodes' pods
    /// interleaved on at most [`PLUGIN_ATTACH_WORKERS`] threads (or
    /// [`ATTACH_WORKERS`] when a node's pods go through a CRI), each node's
    /// pods kept in their order. Each pod's steps are timed into
    /// `profile`; `bar` shows how many are done.
    fn add_pods_to(
        &mut self,
        counts: &[(usize, usize)],
        profile: &Profile,
        bar: &crate::report::progress::Progress,
    ) -> Result<(), LabError> {
        let longest = counts.iter().map(|(_, c)| *c).max().unwrap_or(0);
        let had: Vec<usize> = self.nodes.iter().map(|n| n.pods.len()).collect();
        let had = &had;
        // Round-robin: the k-th new pod of every node, then the (k+1)-th.
        let jobs: Vec<(usize, usize)> = (0..longest)
            .flat_map(|k| {
                counts
                    .iter()
                    .filter(move |(_, c)| k < *c)
                    .map(move |(i, _)| (*i, had[*i] + k))
            })
            .collect();
        let total = jobs.len();
        let done = std::sync::atomic::AtomicUsize::new(0);
        let workers = if counts.iter().any(|(i, _)| self.nodes[*i].cri.is_some()) {
            ATTACH_WORKERS
        } else {
            PLUGIN_ATTACH_WORKERS
        };
        let made = crate::util::parallel_map(
            jobs.iter().copied(),
            workers,
            |(i, k)| {
                let pod = self.make_pod(i, k, profile);
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if n.is_multiple_of(25) {
                    bar.status(&format!("⌛ attaching pods {n}/{total}"));
                }
                pod
            },
            || Err(setup("pod thread panicked")),
        );
        let mut first_error = None;
        for ((i, _), pod) in jobs.into_iter().zip(made) {
            match pod {
                Ok(p) => self.nodes[i].pods.push(p),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Pod `k` of node `i`: its namespace, attached by the plugin through
    /// the runtime (or the CRI).
    fn make_pod(&self, i: usize, k: usize, profile: &Profile) -> Result<Pod, LabError> {
        let opts = &self.opts;
        let node = &self.nodes[i];
        let name = format!("{}-pod{k}", node.spec.name);
        if let Some(d) = &node.cri {
            let named = |from: &Path| Ok(make_ns_from(opts, &name, Some(from))?);
            return super::cri::attach::add_pod(d, &name, &named);
        }
        // The pod's namespace, with `lo` up and ping sockets allowed by the
        // thread that made it (one thread a pod, no `setns`).
        let inside = || {
            plugin_netns::lo_up_here()?;
            crate::lab::probe::allow_ping_sockets_here()
        };
        let ns = profile.time("netns, lo up, sysctl", || {
            make_ns_setup(opts, &name, &inside)
        })?;
        let container_id = format!("cnilab-{name}");
        let rc = RuntimeConf::new(&container_id, Some(ns.path()), "eth0");
        let add_started = Instant::now();
        let added = node.runtime.add(&node.net, &rc);
        let add_took = add_started.elapsed();
        let res = match added {
            Ok(res) => res,
            Err(e) => {
                // Like a runtime: a failed ADD is followed by DEL.
                let _ = node.runtime.del(&node.net, &rc);
                return Err(setup(format!("ADD of {name} on {}: {e}", node.spec.name)));
            }
        };
        let plugin: Duration = res.executions.iter().map(|e| e.duration).sum();
        profile.add("plugin process", plugin);
        profile.add_plugin_cpu(res.executions.iter().filter_map(|e| e.cpu).sum());
        profile.add("runtime (spawn, cache)", add_took.saturating_sub(plugin));
        let ips = res.result.ips.iter().map(|ip| ip.address).collect();
        Ok(Pod {
            name,
            container_id,
            ns,
            ips,
        })
    }

    /// DELs the pod and deletes its namespace.
    pub fn remove_pod(&mut self, i: usize, k: usize) -> Result<(), LabError> {
        let pod = self.nodes[i].pods.remove(k);
        let node = &self.nodes[i];
        if let Some(d) = &node.cri {
            d.cri.remove_pod(&pod.container_id).map_err(setup)?;
            drop(pod);
            return Ok(());
        }
        let rc = RuntimeConf::new(&pod.container_id, Some(pod.ns.path()), "eth0");
        node.runtime.del(&node.net, &rc)?;
        drop(pod);
        Ok(())
    }

    /// Adds a node to a running lab: the topology compiled with the node
    /// and without it, the difference applied to the standing namespaces
    /// (`apply::apply_diff`: the node's namespace and uplink, its NAT box,
    /// a router leg, the others' routes or VXLAN entries for it); then the
    /// runtime steps `up` takes (agent, containerd, pods, Services).
    pub fn add_node(&mut self, spec: NodeSpec, pods: usize) -> Result<(), LabError> {
        let template = template_of(&self.topo)?;
        let mut topo = self.topo.clone();
        topo.nodes.push(spec.clone());
        let changed = self.apply_topology(&topo)?;
        let mut made = changed.made;
        let ns = made
            .nodes
            .iter()
            .position(|n| n.name == spec.name)
            .map(|k| made.nodes.remove(k).ns)
            .ok_or_else(|| setup(format!("node {}: not applied", spec.name)))?;
        self.take_underlay(made.underlay);
        // A node that joins (or is re-created) may take an address that the
        // other namespaces still map to a previous node's MAC. Its
        // gratuitous ARP (arp_notify) is sent the moment eth0 goes up, and is
        // lost when the switch has not enabled the port yet (the kernel's
        // link watcher runs later, on a busy machine noticeably later); the
        // stale entry then sends the first packets to the old MAC. So: once
        // both ends of the uplink are operationally up (`apply_topology`
        // waits for every veth it made), make the others forget the address,
        // so that their next packet resolves it (a broadcast ARP the new
        // node answers).
        for other in self
            .nodes
            .iter()
            .map(|n| &n.ns)
            .chain(self.external.as_ref())
        {
            for address in spec.addresses() {
                other
                    .forget_neighbour(address)
                    .map_err(|e| setup(format!("forget {address} in {}: {e}", other.name())))?;
            }
        }
        self.topo = topo;
        let pod_mtu = self.topo.pod_mtu();
        let node = self.node(spec, ns, &template, pod_mtu)?;
        self.nodes.push(node);
        let i = self.nodes.len() - 1;
        if self.topo.routing == Routing::Agent {
            let specs: Vec<NodeSpec> = self.topo.nodes.clone();
            self.write_nodes_file(&specs)?;
            self.start_agent(i)?;
        }
        self.start_containerd(i)?;
        self.add_pods(i, pods)?;
        self.install_services(&compile::compile(&self.topo)?)
    }

    /// The Services: the compiled model's tables bound to pod addresses,
    /// their placeholders filled with the addresses the plugin's IPAM gave
    /// the pods, loaded on their nodes.
    fn install_services(&self, compiled: &LabModel) -> Result<(), LabError> {
        let addresses: BTreeMap<String, IpAddr> = self
            .nodes
            .iter()
            .flat_map(|n| n.pods.iter())
            .filter_map(|p| {
                let ip = p.ips.iter().find(|ip| ip.addr().is_ipv4())?.addr();
                Some((p.name.clone(), ip))
            })
            .collect();
        let tables = pod_bound_tables(compiled, &addresses)
            .map_err(|e| setup(format!("lab {}: Services: {e}", self.topo.name)))?;
        for (role, table) in tables {
            let node = self
                .nodes
                .iter()
                .find(|n| n.spec.name == role)
                .ok_or_else(|| setup(format!("Services: no node {role}")))?;
            super::base::nft(&node.ns, &table.text)?;
        }
        Ok(())
    }

    /// Removes a node: its agent, its pods, its containerd, then the
    /// topology without it applied as a difference (its uplink, NAT box and
    /// the others' routes and VXLAN entries for it go; its namespace is
    /// dropped); the agents are told through the node list.
    pub fn remove_node(&mut self, name: &str) -> Result<(), LabError> {
        let i = self.node_index(name)?;
        self.stop_agent(i);
        while !self.nodes[i].pods.is_empty() {
            let _ = self.remove_pod(i, 0);
        }
        if let Some(d) = self.nodes[i].cri.take() {
            d.stop();
        }
        let mut topo = self.topo.clone();
        topo.nodes.retain(|n| n.name != name);
        let changed = self.apply_topology(&topo)?;
        // The node's NAT box goes with it (the node's namespace below).
        let gone: Vec<String> = super::layout::underlay_of(self)
            .into_iter()
            .filter(|(role, _)| changed.gone.contains(role))
            .map(|(_, ns)| ns.name().to_string())
            .collect();
        self.extra.retain(|ns| !gone.iter().any(|g| g == ns.name()));
        self.nodes.remove(i);
        self.topo = topo;
        if self.topo.routing == Routing::Agent {
            let specs = self.topo.nodes.clone();
            self.write_nodes_file(&specs)?;
        }
        Ok(())
    }

    /// Turns the lab's infrastructure, built from `self.topo`, into that of
    /// `topo` by the one builder (`apply::apply_diff` of the two compiled
    /// models) and waits for the veths it made; the caller takes the
    /// namespaces made and drops those gone.
    fn apply_topology(&self, topo: &Topology) -> Result<apply::Changed, LabError> {
        let old = compile::infrastructure(compile::compile(&self.topo)?);
        let new = compile::infrastructure(compile::compile(topo)?);
        let underlay = super::layout::underlay_of(self);
        let standing: BTreeMap<&str, &Netns> = underlay
            .iter()
            .map(|(role, ns)| (role.as_str(), *ns))
            .chain(self.nodes.iter().map(|n| (n.spec.name.as_str(), &n.ns)))
            .collect();
        let make = super::base::ns_maker(&self.opts);
        let changed = apply::apply_diff(
            &old,
            &new,
            &standing,
            &apply::Options {
                make_ns: Some(&make),
            },
        )
        .map_err(|e| setup(format!("lab {}: {e}", topo.name)))?;
        refuse_not_made(&topo.name, &changed.made.not_made)?;
        let made: Vec<&Namespace> = changed
            .diff
            .made
            .iter()
            .map(|(_, ns)| ns)
            .chain(&changed.diff.added)
            .collect();
        let veths = veths_of(made.into_iter(), |role| {
            standing
                .get(role)
                .copied()
                .or_else(|| changed.made.namespace(role))
        });
        wait_oper_up(&veths, &format!("lab {}", topo.name))?;
        Ok(changed)
    }

    /// Takes underlay namespaces `apply_topology` made (a router, a NAT box).
    fn take_underlay(&mut self, made: Vec<(String, Netns)>) {
        for (role, ns) in made {
            match role.as_str() {
                compile::EXTERNAL => self.external = Some(ns),
                _ => self.extra.push(ns),
            }
        }
    }

    /// Tears everything down: agents, pods (DEL through the runtime), then
    /// every namespace. Returns how long it took.
    pub fn down(mut self) -> Duration {
        let started = Instant::now();
        for i in 0..self.nodes.len() {
            self.stop_agent(i);
        }
        // A large lab DELs a sample (the first pod of each node) through the
        // plugin; the other pods go with their namespaces, which the kernel
        // tears down in batches (a DEL per pod serialises on the kernel's
        // veth deletion: seconds for a thousand pods). Nothing is judged on
        // DEL here (`cnilab conform` and `soak` check it).
        let pods: usize = self.nodes.iter().map(|n| n.pods.len()).sum();
        let sample_only = pods > DEL_EVERY_POD_UP_TO;
        std::thread::scope(|s| {
            for node in &self.nodes {
                let del = if sample_only { 1 } else { node.pods.len() };
                for pod in node.pods.iter().take(del) {
                    s.spawn(move || {
                        if let Some(d) = &node.cri {
                            let _ = d.cri.remove_pod(&pod.container_id);
                            return;
                        }
                        let rc = RuntimeConf::new(&pod.container_id, Some(pod.ns.path()), "eth0");
                        let _ = node.runtime.del(&node.net, &rc);
                    });
                }
            }
        });
        // Then each containerd (and its shims) stops, in parallel.
        std::thread::scope(|s| {
            for node in &mut self.nodes {
                if let Some(d) = node.cri.take() {
                    s.spawn(move || d.stop());
                }
            }
        });
        drop(self.nodes);
        drop(self.extra);
        drop(self.external);
        drop(self.switch);
        started.elapsed()
    }
}

/// How many pods are attached at once through a CRI (threads waiting for
/// containerd, which runs the plugin).
const ATTACH_WORKERS: usize = 64;

/// How many pods are attached at once when the lab runs the plugin itself.
/// A pod's namespace setup and its plugin's links, addresses and routes all
/// take the kernel's one RTNL mutex (global, whatever the namespace), so
/// more ADDs in flight only queue there: with 64, sampled plugin threads
/// were blocked in rtnetlink handlers (state D) 77% of the time, in the
/// IPAM flock 0.2%, and each plugin process lived 1 to 1.5 s summed a pod
/// against 0.1 to 0.15 s with 8, for an attach as fast or faster.
const PLUGIN_ATTACH_WORKERS: usize = 8;

/// Labs up to this many pods DEL every pod on the way down; larger ones
/// DEL the first pod of each node (see [`Lab::down`]).
pub const DEL_EVERY_POD_UP_TO: usize = 200;

/// The namespaces of a lab's infrastructure, by their place in [`Lab`].
struct Infrastructure {
    switch: Netns,
    external: Option<Netns>,
    /// Routers and NAT boxes.
    extra: Vec<Netns>,
    /// The nodes' namespaces, in the topology's order.
    nodes: Vec<Netns>,
}

/// The lab's infrastructure made by the one builder: the topology
/// compiled into its model (`model::compile`), without what the steps
/// after it make ([`compile::infrastructure`]), made into namespaces by
/// `model::apply`. Something the model holds and this machine cannot make
/// is an error: the lab would not be the one compiled.
fn apply_infrastructure(
    compiled: &LabModel,
    topo: &Topology,
    opts: &UpOptions,
) -> Result<Infrastructure, LabError> {
    let model = compile::infrastructure(compiled.clone());
    let make = super::base::ns_maker(opts);
    let applied = apply::apply(
        &model,
        &apply::Options {
            make_ns: Some(&make),
        },
    )
    .map_err(|e| setup(format!("lab {}: {e}", topo.name)))?;
    refuse_not_made(&topo.name, &applied.not_made)?;
    let veths = veths_of(model.namespaces(), |role| applied.namespace(role));
    wait_oper_up(&veths, &format!("lab {}", topo.name))?;
    let mut switch = None;
    let mut external = None;
    let mut extra = Vec::new();
    for (role, ns) in applied.underlay {
        match role.as_str() {
            compile::SWITCH => switch = Some(ns),
            compile::EXTERNAL => external = Some(ns),
            _ => extra.push(ns),
        }
    }
    let mut by_name: BTreeMap<String, Netns> =
        applied.nodes.into_iter().map(|n| (n.name, n.ns)).collect();
    let nodes = topo
        .nodes
        .iter()
        .map(|spec| {
            by_name
                .remove(&spec.name)
                .ok_or_else(|| setup(format!("lab {}: node {} not applied", topo.name, spec.name)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Infrastructure {
        switch: switch.ok_or_else(|| setup(format!("lab {}: no switch applied", topo.name)))?,
        external,
        extra,
        nodes,
    })
}

/// Something the model holds and this machine cannot make is an error:
/// the lab would not be the one compiled.
fn refuse_not_made(lab: &str, not_made: &[apply::NotMade]) -> Result<(), LabError> {
    if not_made.is_empty() {
        return Ok(());
    }
    let not_made: Vec<String> = not_made.iter().map(|n| n.to_string()).collect();
    Err(setup(format!(
        "lab {lab}: this machine cannot make {}",
        not_made.join("; ")
    )))
}
