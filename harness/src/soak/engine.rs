//! The churn engine: the shared state of a running soak, and each
//! operation (ADD, CHECK, DEL, GC) recorded, judged and logged.

use super::*;

/// A pod the runtime considers attached (ADD succeeded, no DEL succeeded yet).
#[derive(Clone, Debug)]
pub(super) struct LivePod {
    pub(super) conf: RuntimeConf,
    pub(super) ips: Vec<IpNet>,
    /// Its teardown has begun (its namespace may be gone): still listed to
    /// GC, but not CHECKed any more.
    pub(super) tearing_down: bool,
}

#[derive(Default)]
pub(super) struct Live {
    pub(super) pods: BTreeMap<String, LivePod>,
    pub(super) by_ip: HashMap<IpAddr, String>,
}

/// Who did an operation: the label used in the log and in findings.
#[derive(Clone, Copy, Debug)]
pub(super) enum Actor {
    Warmup(usize),
    Resident(usize),
    Step(u64),
    Cleanup,
}

impl Actor {
    pub(super) fn label(self) -> String {
        match self {
            Actor::Warmup(i) => format!("warm-up {i}"),
            Actor::Resident(i) => format!("resident {i}"),
            Actor::Step(s) => format!("step {s}"),
            Actor::Cleanup => "final cleanup".into(),
        }
    }

    pub(super) fn step(self) -> Option<u64> {
        match self {
            Actor::Step(s) => Some(s),
            _ => None,
        }
    }
}

/// Shared state of a running soak.
pub(super) struct Soak<'a> {
    pub(super) opts: &'a SoakOptions,
    pub(super) runtime: &'a Runtime,
    pub(super) net: &'a NetworkConfig,
    pub(super) started: Instant,
    /// The same moment on the wall clock (file times are compared to it).
    pub(super) started_wall: std::time::SystemTime,
    /// A typical ADD's duration under the current load (an exponentially
    /// weighted mean of successful ADDs, in µs): kills land uniformly in
    /// it. Starts from the warm-up's median.
    pub(super) kill_window_us: AtomicU64,
    pub(super) check_supported: bool,
    pub(super) gc_supported: bool,
    /// Container operations hold it shared, GC exclusively: GC never runs
    /// while an operation is in flight, and sees every pod whose ADD
    /// returned (the registration happens under the same guard).
    pub(super) gate: RwLock<()>,
    pub(super) live: Mutex<Live>,
    pub(super) log: Mutex<Vec<OpRecord>>,
    pub(super) findings: Mutex<Vec<Finding>>,
    /// Attachments whose DEL kept failing: the final cleanup retries them.
    pub(super) undeleted: Mutex<Vec<RuntimeConf>>,
    /// Pod namespaces with interfaces left after a DEL without CNI_NETNS
    /// (allowed: the runtime deletes the namespace next).
    pub(super) left_without_netns: AtomicU64,
    pub(super) kills_landed: AtomicU64,
    /// Pods the runtime lost after a killed ADD (never DELeted).
    pub(super) lost: Mutex<BTreeSet<String>>,
    pub(super) kills_missed: AtomicU64,
    pub(super) gc_runs: AtomicU64,
    pub(super) next_step: AtomicU64,
    pub(super) steps_done: AtomicU64,
    /// Addresses the config's range holds, when it says.
    pub(super) capacity: Option<u128>,
}

pub(super) fn ips_of<T: AddOutput>(r: &Result<T, RuntimeError>) -> Vec<IpNet> {
    r.as_ref().map(|a| a.ips()).unwrap_or_default()
}

/// What an operation's result contributes to the log.
pub(super) trait AddOutput {
    fn ips(&self) -> Vec<IpNet>;
}

impl AddOutput for crate::runtime::AddResult {
    fn ips(&self) -> Vec<IpNet> {
        self.result.ips.iter().map(|i| i.address).collect()
    }
}

impl AddOutput for Vec<crate::runtime::Execution> {
    fn ips(&self) -> Vec<IpNet> {
        Vec::new()
    }
}

pub(super) fn outcome_of<T>(r: &Result<T, RuntimeError>, kill_planned: bool) -> OpOutcome {
    match r {
        Ok(_) => OpOutcome::Ok,
        Err(e) => OpOutcome::of_error(e, kill_planned),
    }
}

pub(super) fn call_of<T>(r: &Result<T, RuntimeError>) -> Option<String> {
    r.as_ref()
        .err()
        .and_then(|e| e.execution())
        .map(|x| x.shell_line())
}

impl Soak<'_> {
    /// Warm-up: a few plain ADD/DELs, one at a time. They create what the
    /// plugin keeps between pods (bridge, firewall tables), which is then
    /// the baseline, and they time an ADD for the kill window. Returns
    /// whether host-local's store layout applies to `store_dir`.
    pub(super) fn warm_up(&mut self, store_dir: Option<&Path>) -> Result<bool, SoakError> {
        let mut warm = Vec::new();
        let mut layout = false;
        for i in 0..3 {
            let pod = Netns::with_label("soak-warm")?;
            let id = format!("soak-warmup-{i}");
            let conf = RuntimeConf::new(&id, Some(pod.path()), &self.opts.ifname);
            let t = Instant::now();
            let added = self.runtime.add(self.net, &conf);
            let took = t.elapsed();
            self.record(
                Actor::Warmup(i),
                "ADD",
                &id,
                t,
                outcome_of(&added, false),
                ips_of(&added),
                call_of(&added),
            );
            let added = match added {
                Ok(a) => a,
                Err(e) => {
                    let _ = self.runtime.del(self.net, &conf);
                    return Err(SoakError::Warmup {
                        op: "ADD",
                        pod: id,
                        source: Box::new(e),
                    });
                }
            };
            let ips: Vec<IpAddr> = added.result.ips.iter().map(|i| i.address.addr()).collect();
            layout |= accounting::layout_applies(store_dir, &id, &ips);
            warm.push(took);
            let t = Instant::now();
            let deleted = self.runtime.del(self.net, &conf);
            self.record(
                Actor::Warmup(i),
                "DEL",
                &id,
                t,
                outcome_of(&deleted, false),
                Vec::new(),
                call_of(&deleted),
            );
            if let Err(e) = deleted {
                return Err(SoakError::Warmup {
                    op: "DEL",
                    pod: id,
                    source: Box::new(e),
                });
            }
        }
        warm.sort();
        let warm_median = warm.get(warm.len() / 2).copied().unwrap_or_default();
        self.kill_window_us = AtomicU64::new(warm_median.as_micros().max(1000) as u64);
        Ok(layout)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn record(
        &self,
        who: Actor,
        op: &str,
        container_id: &str,
        started: Instant,
        outcome: OpOutcome,
        ips: Vec<IpNet>,
        call: Option<String>,
    ) {
        let rec = OpRecord {
            who: who.label(),
            step: who.step(),
            op: op.to_string(),
            container_id: container_id.to_string(),
            at_ms: started.duration_since(self.started).as_secs_f64() * 1000.0,
            duration_ms: started.elapsed().as_secs_f64() * 1000.0,
            outcome,
            ips,
            call,
        };
        if let Ok(mut log) = self.log.lock() {
            log.push(rec);
        }
    }

    pub(super) fn kill_window(&self) -> Duration {
        Duration::from_micros(self.kill_window_us.load(Ordering::Relaxed))
    }

    /// Folds a successful ADD's duration into the kill window (weight 1/8).
    pub(super) fn observe_add(&self, took: Duration) {
        let sample = took.as_micros() as u64;
        let _ = self
            .kill_window_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                Some(w - w / 8 + sample / 8)
            });
    }

    pub(super) fn finding(&self, kind: FindingKind, detail: String, container_ids: Vec<String>) {
        if let Ok(mut f) = self.findings.lock() {
            f.push(Finding::new(kind, detail, container_ids));
        }
    }

    /// ADD, optionally killed after `kill_at` × the kill window. Returns
    /// whether the pod is now attached (and registered as live).
    pub(super) fn add(&self, who: Actor, conf: &RuntimeConf, kill_at: Option<f64>) -> bool {
        let _shared = self.gate.read().unwrap_or_else(|e| e.into_inner());
        let t = Instant::now();
        let (result, op) = match kill_at {
            Some(f) => {
                let after = self.kill_window().mul_f64(f);
                (
                    self.runtime.add_killed_after(self.net, conf, after),
                    format!("ADD (kill at {:.1} ms)", after.as_secs_f64() * 1000.0),
                )
            }
            None => (self.runtime.add(self.net, conf), "ADD".to_string()),
        };
        let outcome = outcome_of(&result, kill_at.is_some());
        if kill_at.is_some() {
            let counter = if outcome == OpOutcome::Killed {
                &self.kills_landed
            } else {
                &self.kills_missed
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        let ips = ips_of(&result);
        let call = call_of(&result);
        let ok = result.is_ok();
        if ok {
            self.register(conf, &ips);
            // Also an ADD whose kill came too late: a full ADD's duration.
            self.observe_add(t.elapsed());
        }
        let failed = match &result {
            Err(e) if !matches!(outcome, OpOutcome::Killed | OpOutcome::Harness { .. }) => {
                Some(accounting::error_text(e))
            }
            _ => None,
        };
        self.record(who, &op, &conf.container_id, t, outcome, ips, call);
        if let Some(msg) = failed {
            self.add_failed(who, &conf.container_id, &msg);
        }
        ok
    }

    /// A failed ADD is a finding. One that ran out of addresses while
    /// fewer pods were live than the range holds is a leak: the live pods
    /// cannot explain it.
    pub(super) fn add_failed(&self, who: Actor, container_id: &str, msg: &str) {
        // Pods the runtime lost keep their addresses until a GC: they explain
        // an exhaustion as much as live ones.
        let live = self.live.lock().map(|l| l.pods.len()).unwrap_or(0)
            + self.lost.lock().map(|l| l.len()).unwrap_or(0);
        if accounting::looks_exhausted(msg) {
            let (kind, why) = match self.capacity {
                Some(cap) if (live as u128) < cap => (
                    FindingKind::LeakedAddress,
                    format!(
                        "the range ran out while only {live} pods were live and the config's range holds {cap}: {} addresses were not released",
                        cap - live as u128
                    ),
                ),
                Some(cap) => (
                    FindingKind::AddFailed,
                    format!("the range ran out with {live} live pods (it holds {cap}): use a bigger range or fewer --pods/--parallel"),
                ),
                None => (
                    FindingKind::LeakedAddress,
                    format!(
                        "the range ran out while {live} pods were live (its size is not in the config, but a churn of at most {} pods at once should not exhaust it)",
                        self.opts.pods + self.opts.parallel
                    ),
                ),
            };
            self.finding(
                kind,
                format!(
                    "ADD of {container_id} ({}) failed: {msg}; {why}",
                    who.label()
                ),
                vec![container_id.to_string()],
            );
        } else {
            self.finding(
                FindingKind::AddFailed,
                format!("ADD of {container_id} ({}) failed: {msg}", who.label()),
                vec![container_id.to_string()],
            );
        }
    }

    /// Marks a pod attached; two live pods with one address is a finding.
    pub(super) fn register(&self, conf: &RuntimeConf, ips: &[IpNet]) {
        let Ok(mut live) = self.live.lock() else {
            return;
        };
        for ip in ips {
            if let Some(other) = live.by_ip.get(&ip.addr()) {
                if *other != conf.container_id {
                    let detail = format!(
                        "{} was handed to {} while {} still held it",
                        ip.addr(),
                        conf.container_id,
                        other
                    );
                    let ids = vec![other.clone(), conf.container_id.clone()];
                    drop(live);
                    self.finding(FindingKind::DuplicateAddress, detail, ids);
                    live = match self.live.lock() {
                        Ok(l) => l,
                        Err(_) => return,
                    };
                }
            }
            live.by_ip.insert(ip.addr(), conf.container_id.clone());
        }
        live.pods.insert(
            conf.container_id.clone(),
            LivePod {
                conf: conf.clone(),
                ips: ips.to_vec(),
                tearing_down: false,
            },
        );
    }

    pub(super) fn unregister(&self, container_id: &str) {
        if let Ok(mut live) = self.live.lock() {
            if let Some(pod) = live.pods.remove(container_id) {
                for ip in pod.ips {
                    if live
                        .by_ip
                        .get(&ip.addr())
                        .is_some_and(|o| o == container_id)
                    {
                        live.by_ip.remove(&ip.addr());
                    }
                }
            }
        }
    }

    pub(super) fn begin_teardown(&self, container_id: &str) {
        if let Ok(mut live) = self.live.lock() {
            if let Some(pod) = live.pods.get_mut(container_id) {
                pod.tearing_down = true;
            }
        }
    }

    pub(super) fn check(&self, who: Actor, conf: &RuntimeConf, op: &str) -> bool {
        let t = Instant::now();
        let result = self.runtime.check(self.net, conf);
        let ok = result.is_ok();
        self.record(
            who,
            op,
            &conf.container_id,
            t,
            outcome_of(&result, false),
            Vec::new(),
            call_of(&result),
        );
        ok
    }

    /// DEL, retried twice on failure like kubelet; the pod stops being live
    /// on the first success.
    pub(super) fn del_with_retries(&self, who: Actor, conf: &RuntimeConf, op: &str) -> bool {
        for attempt in 0..3 {
            let _shared = self.gate.read().unwrap_or_else(|e| e.into_inner());
            let t = Instant::now();
            let result = self.runtime.del(self.net, conf);
            let ok = result.is_ok();
            if ok {
                self.unregister(&conf.container_id);
            }
            let label = if attempt == 0 {
                op.to_string()
            } else {
                format!("{op} (retry {attempt})")
            };
            self.record(
                who,
                &label,
                &conf.container_id,
                t,
                outcome_of(&result, false),
                Vec::new(),
                call_of(&result),
            );
            if ok {
                return true;
            }
        }
        false
    }

    /// GC with every live attachment, exclusive of all other operations;
    /// then every live pod not being torn down must still pass CHECK.
    pub(super) fn gc(&self, who: Actor) {
        let _exclusive = self.gate.write().unwrap_or_else(|e| e.into_inner());
        let pods: Vec<LivePod> = self
            .live
            .lock()
            .map(|l| l.pods.values().cloned().collect())
            .unwrap_or_default();
        let keep: Vec<Attachment> = pods
            .iter()
            .map(|p| Attachment {
                container_id: p.conf.container_id.clone(),
                ifname: p.conf.ifname.clone(),
            })
            .collect();
        let t = Instant::now();
        let result = self.runtime.gc(self.net, &keep, GcKey::Both);
        self.gc_runs.fetch_add(1, Ordering::Relaxed);
        self.record(
            who,
            &format!("GC (keeping {})", keep.len()),
            "",
            t,
            outcome_of(&result, false),
            Vec::new(),
            call_of(&result),
        );
        if !self.check_supported {
            return;
        }
        for pod in pods.iter().filter(|p| !p.tearing_down) {
            if !self.check(who, &pod.conf, "CHECK (after GC)") {
                self.finding(
                    FindingKind::LiveAttachmentBroken,
                    format!(
                        "{} was in the GC's list of live attachments but fails CHECK after the GC of {}",
                        pod.conf.container_id,
                        who.label()
                    ),
                    vec![pod.conf.container_id.clone()],
                );
            }
        }
    }

    /// One step: a pod from ADD to its last DEL.
    pub(super) fn cycle(&self, plan: &CyclePlan) {
        let who = Actor::Step(plan.step);
        let id = step_container_id(plan.step);
        let t = Instant::now();
        let pod = match Netns::with_label("soak") {
            Ok(p) => p,
            Err(e) => {
                self.record(
                    who,
                    "create pod netns",
                    &id,
                    t,
                    OpOutcome::Harness { msg: e.to_string() },
                    Vec::new(),
                    None,
                );
                return;
            }
        };
        let pod_path = pod.path().to_path_buf();
        let mut conf = RuntimeConf::new(&id, Some(&pod_path), &self.opts.ifname);
        let attached = self.add(who, &conf, plan.kill_at);
        if plan.lost && !attached && self.last_add_was_killed(&id) {
            // The runtime died with the ADD and forgot the pod: its sandbox
            // goes away, no DEL is ever sent.
            let t = Instant::now();
            if let Ok(mut l) = self.lost.lock() {
                l.insert(id.clone());
            }
            let outcome = match pod.delete() {
                Ok(()) => OpOutcome::Ok,
                Err(e) => OpOutcome::Harness { msg: e.to_string() },
            };
            self.record(who, "pod lost (no DEL)", &id, t, outcome, Vec::new(), None);
            if plan.gc && self.gc_supported {
                self.gc(who);
            }
            return;
        }
        if plan.gc && self.gc_supported {
            self.gc(who);
        }
        if attached && self.check_supported {
            for _ in 0..plan.checks {
                let _shared = self.gate.read().unwrap_or_else(|e| e.into_inner());
                self.check(who, &conf, "CHECK");
            }
        }
        let mut pod = Some(pod);
        {
            // Under the shared gate: a GC (exclusive) never sees a pod it
            // is about to CHECK lose its namespace halfway.
            let _shared = self.gate.read().unwrap_or_else(|e| e.into_inner());
            self.begin_teardown(&id);
            match plan.del {
                DelVariant::Normal => {}
                DelVariant::NoNetns => conf.netns = None,
                DelVariant::NetnsGone => {
                    if let Some(p) = pod.take() {
                        if let Err(e) = p.delete() {
                            self.record(
                                who,
                                "delete pod netns",
                                &id,
                                Instant::now(),
                                OpOutcome::Harness { msg: e.to_string() },
                                Vec::new(),
                                None,
                            );
                        }
                    }
                }
            }
        }
        let deleted = self.del_with_retries(who, &conf, plan.del.label());
        if let Some(p) = &pod {
            self.inspect_pod_after_del(who, &id, p, plan.del, deleted);
        }
        drop(pod);
        for i in 0..plan.repeat_dels {
            let (netns, label) = if i % 2 == 0 {
                (Some(pod_path.clone()), "DEL (repeat, netns gone)")
            } else {
                (None, "DEL (repeat, no CNI_NETNS)")
            };
            let repeat = RuntimeConf {
                netns,
                ..conf.clone()
            };
            let _shared = self.gate.read().unwrap_or_else(|e| e.into_inner());
            let t = Instant::now();
            let result = self.runtime.del(self.net, &repeat);
            self.record(
                who,
                label,
                &id,
                t,
                outcome_of(&result, false),
                Vec::new(),
                call_of(&result),
            );
        }
        if !deleted {
            if let Ok(mut u) = self.undeleted.lock() {
                u.push(conf);
            }
        }
    }

    /// After a DEL with the namespace still there: nothing of the plugin
    /// may be left in it (with CNI_NETNS set).
    pub(super) fn inspect_pod_after_del(
        &self,
        who: Actor,
        id: &str,
        pod: &Netns,
        del: DelVariant,
        deleted: bool,
    ) {
        let t = Instant::now();
        let links = match pod.links() {
            Ok(l) => l,
            Err(e) => {
                self.record(
                    who,
                    "inspect pod netns",
                    id,
                    t,
                    OpOutcome::Harness { msg: e.to_string() },
                    Vec::new(),
                    None,
                );
                return;
            }
        };
        let left: Vec<String> = links
            .iter()
            .filter(|l| l.name != "lo")
            .map(|l| format!("{} ({})", l.name, l.kind.as_deref().unwrap_or("?")))
            .collect();
        if left.is_empty() || !deleted {
            return;
        }
        match del {
            DelVariant::Normal => self.finding(
                FindingKind::LeftInPodNetns,
                format!(
                    "after a successful DEL with CNI_NETNS={}, the pod namespace still has {}",
                    pod.path().display(),
                    left.join(", ")
                ),
                vec![id.to_string()],
            ),
            DelVariant::NoNetns => {
                self.left_without_netns.fetch_add(1, Ordering::Relaxed);
            }
            DelVariant::NetnsGone => {}
        }
    }

    /// Whether the last ADD of `container_id` was killed as planned.
    pub(super) fn last_add_was_killed(&self, container_id: &str) -> bool {
        self.log.lock().is_ok_and(|log| {
            log.iter()
                .rev()
                .find(|r| r.container_id == container_id && r.op.starts_with("ADD"))
                .is_some_and(|r| r.outcome == OpOutcome::Killed)
        })
    }

    /// Containers whose killed ADD was running when `path` was last
    /// modified (with 5 ms of slack on both sides).
    pub(super) fn killed_adds_around(&self, path: &Path) -> Vec<String> {
        let Some(at_ms) = std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(self.started_wall).ok())
            .map(|d| d.as_secs_f64() * 1000.0)
        else {
            return Vec::new();
        };
        let Ok(log) = self.log.lock() else {
            return Vec::new();
        };
        let mut out: Vec<String> = log
            .iter()
            .filter(|r| r.outcome == OpOutcome::Killed)
            .filter(|r| r.at_ms - 5.0 <= at_ms && at_ms <= r.at_ms + r.duration_ms + 5.0)
            .map(|r| r.container_id.clone())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// The run's phases after the warm-up, in order: residents, churn, teardown.
impl Soak<'_> {
    /// Adds the resident pods, in parallel. A resident whose ADD failed is
    /// deleted again (it must not count as live).
    pub(super) fn add_residents(&self) -> Result<Vec<Netns>, SoakError> {
        let opts = self.opts;
        let residents: Vec<Netns> = (0..opts.pods)
            .map(|_| Netns::with_label("soak-res"))
            .collect::<Result<_, _>>()?;
        let next = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..opts.parallel.min(opts.pods) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(ns) = residents.get(i) else { break };
                    let conf =
                        RuntimeConf::new(&resident_container_id(i), Some(ns.path()), &opts.ifname);
                    if !self.add(Actor::Resident(i), &conf, None) {
                        self.del_with_retries(Actor::Resident(i), &conf, "DEL");
                    }
                });
            }
        });
        Ok(residents)
    }

    /// The churn: every step's plan, on `parallel` workers (one for a
    /// replay), until the budget is spent. Returns how long it took.
    pub(super) fn churn(&self) -> Duration {
        let opts = self.opts;
        let churn_started = Instant::now();
        let steps: Option<Vec<u64>> = opts.replay.map(|s| vec![s]);
        let workers = if steps.is_some() { 1 } else { opts.parallel };
        let bar = if opts.progress {
            crate::report::progress::Progress::stderr()
        } else {
            crate::report::progress::Progress::quiet()
        };
        let of = match opts.budget {
            Budget::Cycles(c) => format!("/{c}"),
            Budget::Duration(d) => format!(" in {}s", d.as_secs()),
        };
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| loop {
                    let n = self.next_step.fetch_add(1, Ordering::Relaxed);
                    let step = match (&steps, opts.budget) {
                        (Some(list), _) => match list.get(n as usize) {
                            Some(step) => *step,
                            None => break,
                        },
                        (None, Budget::Cycles(c)) if n < c => n,
                        (None, Budget::Duration(d)) if churn_started.elapsed() < d => n,
                        _ => break,
                    };
                    self.cycle(&CyclePlan::new(&opts.knobs(), step));
                    let done = self.steps_done.fetch_add(1, Ordering::Relaxed) + 1;
                    if done.is_multiple_of(10) {
                        bar.status(&format!("⌛ soak: {done}{of} steps"));
                    }
                });
            }
        });
        bar.clear();
        churn_started.elapsed()
    }

    /// The final cleanup, as a runtime tearing everything down: a last GC
    /// with the live pods when the runtime lost some (it relies on GC), then
    /// DEL every live pod, then retry the DELs that failed without
    /// `CNI_NETNS`.
    pub(super) fn tear_down(&self) {
        if self.opts.lose_rate > 0.0 && self.gc_supported {
            self.gc(Actor::Cleanup);
        }
        let live: Vec<LivePod> = self
            .live
            .lock()
            .map(|l| l.pods.values().cloned().collect())
            .unwrap_or_default();
        for pod in &live {
            self.del_with_retries(Actor::Cleanup, &pod.conf, "DEL");
        }
        let undeleted: Vec<RuntimeConf> =
            self.undeleted.lock().map(|u| u.clone()).unwrap_or_default();
        for mut conf in undeleted {
            conf.netns = None;
            self.del_with_retries(Actor::Cleanup, &conf, "DEL (no CNI_NETNS)");
        }
    }
}
