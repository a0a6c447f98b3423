//! `CNILAB_PROFILE_ATTACH=1`: where a lab's pod attach goes. Each pod's
//! steps (its namespace made, `lo` up and sysctls, the plugin's process,
//! the rest of the runtime's ADD) are timed and summed over the pods; at
//! the end of the attach a table goes to stderr: each step's share of the
//! attach phase's wall time, in ms a pod; then the CPU a pod cost: the
//! plugin's calls (each call's cgroup: the plugin and everything it
//! started) and the whole machine's (busy time of every CPU in
//! `/proc/stat`, so the kernel's own work for the new interfaces, in
//! softirqs and kworkers, counts too; the time the hypervisor took away,
//! `steal`, is shown apart). Off (and silent) unless the variable is set:
//! normal output never carries timings.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The variable that turns the profile on.
pub const ENV: &str = "CNILAB_PROFILE_ATTACH";

/// Summed step times of one attach.
pub struct Profile {
    steps: Option<Mutex<Vec<(&'static str, Duration)>>>,
    started: Instant,
    /// The plugin calls' summed CPU time.
    plugin_cpu: Mutex<Duration>,
    /// The machine's CPU counters when the profile began.
    machine: Option<MachineCpu>,
}

/// The machine's CPU time from the first line of `/proc/stat`, in clock
/// ticks (USER_HZ, 100 a second on Linux).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MachineCpu {
    /// user, nice, system, irq, softirq (guest time is inside user).
    busy: u64,
    steal: u64,
}

fn parse_machine_cpu(stat: &str) -> Option<MachineCpu> {
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let at = |i: usize| fields.get(i).copied();
    Some(MachineCpu {
        busy: at(0)? + at(1)? + at(2)? + at(5)? + at(6)?,
        steal: at(7).unwrap_or(0),
    })
}

fn machine_cpu() -> Option<MachineCpu> {
    parse_machine_cpu(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// Whether [`ENV`] asks for the profile (anything but `0` or empty).
pub fn enabled() -> bool {
    std::env::var(ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

impl Profile {
    /// On when [`enabled`].
    pub fn from_env() -> Profile {
        if !enabled() {
            return Profile::off();
        }
        Profile {
            steps: Some(Mutex::new(Vec::new())),
            started: Instant::now(),
            plugin_cpu: Mutex::new(Duration::ZERO),
            machine: machine_cpu(),
        }
    }

    /// A profile that is off (nothing timed, no table).
    pub fn off() -> Profile {
        Profile {
            steps: None,
            started: Instant::now(),
            plugin_cpu: Mutex::new(Duration::ZERO),
            machine: None,
        }
    }

    /// Adds one plugin call's CPU time (from its cgroup).
    pub fn add_plugin_cpu(&self, cpu: Duration) {
        if self.steps.is_some() {
            *self.plugin_cpu.lock().unwrap_or_else(|e| e.into_inner()) += cpu;
        }
    }

    /// Runs `f` as step `step` (timed when the profile is on).
    pub fn time<R>(&self, step: &'static str, f: impl FnOnce() -> R) -> R {
        if self.steps.is_none() {
            return f();
        }
        let started = Instant::now();
        let out = f();
        self.add(step, started.elapsed());
        out
    }

    /// Adds `took` to step `step`.
    pub fn add(&self, step: &'static str, took: Duration) {
        let Some(steps) = &self.steps else { return };
        let mut steps = steps.lock().unwrap_or_else(|e| e.into_inner());
        match steps.iter_mut().find(|(s, _)| *s == step) {
            Some((_, sum)) => *sum += took,
            None => steps.push((step, took)),
        }
    }

    /// The table (None when off): each step's summed time, its share of
    /// the wall time since the profile began, both a pod.
    pub fn table(&self, pods: usize) -> Option<String> {
        let steps = self.steps.as_ref()?;
        let steps = steps.lock().unwrap_or_else(|e| e.into_inner());
        let wall = self.started.elapsed().as_secs_f64() * 1000.0;
        let pods = pods.max(1) as f64;
        let total: f64 = steps.iter().map(|(_, d)| d.as_secs_f64() * 1000.0).sum();
        let mut text = format!(
            "attach profile: {pods} pods, wall {wall:.0} ms = {:.2} ms a pod\n{:<24} {:>12} {:>14}\n",
            wall / pods,
            "step",
            "summed ms/pod",
            "share ms/pod"
        );
        for (step, sum) in steps.iter() {
            let ms = sum.as_secs_f64() * 1000.0;
            let share = if total > 0.0 { ms / total } else { 0.0 };
            text.push_str(&format!(
                "{step:<24} {:>12.2} {:>14.2}\n",
                ms / pods,
                share * wall / pods
            ));
        }
        let plugin_cpu = *self.plugin_cpu.lock().unwrap_or_else(|e| e.into_inner());
        if !plugin_cpu.is_zero() {
            text.push_str(&format!(
                "CPU a pod: plugin calls {:.2} ms (their cgroups)\n",
                plugin_cpu.as_secs_f64() * 1000.0 / pods
            ));
        }
        if let (Some(before), Some(after)) = (self.machine, machine_cpu()) {
            // Clock ticks are 10 ms each.
            let ms = |ticks: u64| ticks as f64 * 10.0 / pods;
            text.push_str(&format!(
                "CPU a pod: the machine {:.2} ms (every CPU's busy time, /proc/stat; steal {:.2} ms apart)\n",
                ms(after.busy.saturating_sub(before.busy)),
                ms(after.steal.saturating_sub(before.steal))
            ));
        }
        Some(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_times_nothing_and_prints_nothing() {
        let p = Profile::off();
        assert_eq!(p.time("x", || 7), 7);
        p.add_plugin_cpu(Duration::from_millis(3));
        assert!(p.table(1).is_none());
    }

    #[test]
    fn on_sums_steps_by_name_and_the_plugins_cpu() {
        let p = Profile {
            steps: Some(Mutex::new(Vec::new())),
            ..Profile::off()
        };
        p.add("netns", Duration::from_millis(4));
        p.add("netns", Duration::from_millis(6));
        p.add("plugin", Duration::from_millis(10));
        p.add_plugin_cpu(Duration::from_millis(3));
        p.add_plugin_cpu(Duration::from_millis(5));
        let table = p.table(2).expect("on");
        assert!(table.contains("2 pods"), "{table}");
        let netns = table
            .lines()
            .find(|l| l.starts_with("netns"))
            .expect("netns row");
        assert!(netns.contains("5.00"), "{netns}");
        assert!(table.contains("plugin calls 4.00 ms"), "{table}");
    }

    #[test]
    fn the_machines_cpu_is_its_busy_ticks_and_steal_apart() {
        let stat = "cpu  100 5 40 9000 7 2 3 11 0 0\ncpu0 50 2 20 4500 3 1 1 5 0 0\n";
        assert_eq!(
            parse_machine_cpu(stat),
            Some(MachineCpu {
                busy: 100 + 5 + 40 + 2 + 3,
                steal: 11
            })
        );
        assert_eq!(parse_machine_cpu("cpu0 1 2 3\n"), None);
        assert_eq!(parse_machine_cpu("cpu  1 x 3 4 5 6 7\n"), None);
    }
}
