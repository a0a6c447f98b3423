//! `CNILAB_PROFILE_ATTACH=1`: where a lab's pod attach goes. Each pod's
//! steps (its namespace made, `lo` up and sysctls, the plugin's process,
//! the rest of the runtime's ADD) are timed and summed over the pods; at
//! the end of the attach a table goes to stderr: each step's share of the
//! attach phase's wall time, in ms a pod. Off (and silent) unless the
//! variable is set: normal output never carries timings.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The variable that turns the profile on.
pub const ENV: &str = "CNILAB_PROFILE_ATTACH";

/// Summed step times of one attach.
pub struct Profile {
    steps: Option<Mutex<Vec<(&'static str, Duration)>>>,
    started: Instant,
}

impl Profile {
    /// On when [`ENV`] is set to anything but `0` or empty.
    pub fn from_env() -> Profile {
        let on = std::env::var(ENV).is_ok_and(|v| !v.is_empty() && v != "0");
        Profile {
            steps: on.then(|| Mutex::new(Vec::new())),
            started: Instant::now(),
        }
    }

    /// A profile that is off (nothing timed, no table).
    pub fn off() -> Profile {
        Profile {
            steps: None,
            started: Instant::now(),
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
        Some(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_times_nothing_and_prints_nothing() {
        let p = Profile {
            steps: None,
            started: Instant::now(),
        };
        assert_eq!(p.time("x", || 7), 7);
        assert!(p.table(1).is_none());
    }

    #[test]
    fn on_sums_steps_by_name() {
        let p = Profile {
            steps: Some(Mutex::new(Vec::new())),
            started: Instant::now(),
        };
        p.add("netns", Duration::from_millis(4));
        p.add("netns", Duration::from_millis(6));
        p.add("plugin", Duration::from_millis(10));
        let table = p.table(2).expect("on");
        assert!(table.contains("2 pods"), "{table}");
        let netns = table
            .lines()
            .find(|l| l.starts_with("netns"))
            .expect("netns row");
        assert!(netns.contains("5.00"), "{netns}");
    }
}
