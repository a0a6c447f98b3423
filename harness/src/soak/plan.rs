//! What one soak step does, drawn from its own PRNG stream: whether its ADD
//! is killed and when, how many CHECKs follow, how the pod is deleted, how
//! often DEL is repeated, and whether a GC runs while the pod is alive.

use crate::rng::SplitMix64;
use std::fmt;

/// How the first DEL of a pod is made (kubelet does all three).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum DelVariant {
    /// `CNI_NETNS` set to the pod's live namespace.
    Normal,
    /// The namespace is deleted first; `CNI_NETNS` names a path that is gone.
    NetnsGone,
    /// `CNI_NETNS` unset (allowed for DEL), the namespace still exists.
    NoNetns,
}

impl DelVariant {
    pub fn label(self) -> &'static str {
        match self {
            DelVariant::Normal => "DEL",
            DelVariant::NetnsGone => "DEL (netns gone)",
            DelVariant::NoNetns => "DEL (no CNI_NETNS)",
        }
    }
}

impl fmt::Display for DelVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Knobs that shape the plans (part of what a replay must repeat).
#[derive(Clone, Copy, Debug)]
pub struct PlanKnobs {
    pub seed: u64,
    pub kill_rate: f64,
    /// Probability that the runtime loses a pod whose ADD was killed (it
    /// never sends the DEL; only GC can reclaim what the ADD left).
    pub lose_rate: f64,
    /// A GC runs on steps `k * gc_every + gc_every / 2`; 0 disables GC.
    pub gc_every: u64,
}

/// One step: one pod's life from ADD to its last DEL.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CyclePlan {
    pub step: u64,
    /// Kill the ADD after this fraction of the kill window, if at all.
    pub kill_at: Option<f64>,
    /// CHECKs after a successful ADD (when the network allows CHECK).
    pub checks: u8,
    pub del: DelVariant,
    /// DELs repeated after the first successful one.
    pub repeat_dels: u8,
    /// Run a GC (with every live attachment) right after this step's ADD.
    pub gc: bool,
    /// If the ADD is killed, the runtime forgets the pod: no DEL ever.
    pub lost: bool,
}

impl CyclePlan {
    pub fn new(knobs: &PlanKnobs, step: u64) -> CyclePlan {
        let mut r = SplitMix64::for_step(knobs.seed, step);
        // Draw every value unconditionally, in a fixed order, so that
        // changing one knob does not shift the others.
        let kill = r.chance(knobs.kill_rate);
        let kill_fraction = r.next_f64();
        let checks = r.below(3) as u8;
        let del = match r.below(4) {
            0 | 1 => DelVariant::Normal,
            2 => DelVariant::NetnsGone,
            _ => DelVariant::NoNetns,
        };
        let repeat_dels = match r.below(10) {
            0..=5 => 0,
            6..=8 => 1,
            _ => 2,
        };
        let gc = knobs.gc_every > 0 && step % knobs.gc_every == knobs.gc_every / 2;
        let lost = kill && r.chance(knobs.lose_rate);
        CyclePlan {
            step,
            kill_at: kill.then_some(kill_fraction),
            checks,
            del,
            repeat_dels,
            gc,
            lost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knobs(kill_rate: f64) -> PlanKnobs {
        PlanKnobs {
            seed: 99,
            kill_rate,
            lose_rate: 0.5,
            gc_every: 50,
        }
    }

    #[test]
    fn plans_are_reproducible_per_step() {
        let k = knobs(0.3);
        assert_eq!(CyclePlan::new(&k, 17), CyclePlan::new(&k, 17));
        let differ = (0..20).any(|s| CyclePlan::new(&k, s) != CyclePlan::new(&k, s + 1));
        assert!(differ);
    }

    #[test]
    fn kill_rate_is_honoured_and_zero_means_never() {
        let killed = (0..10_000)
            .filter(|s| CyclePlan::new(&knobs(0.1), *s).kill_at.is_some())
            .count();
        assert!((800..1200).contains(&killed), "{killed}");
        assert!((0..1000).all(|s| CyclePlan::new(&knobs(0.0), s).kill_at.is_none()));
        assert!((0..1000).all(|s| CyclePlan::new(&knobs(1.0), s).kill_at.is_some()));
    }

    #[test]
    fn every_variant_occurs_and_gc_is_periodic() {
        let plans: Vec<CyclePlan> = (0..400).map(|s| CyclePlan::new(&knobs(0.1), s)).collect();
        for v in [
            DelVariant::Normal,
            DelVariant::NetnsGone,
            DelVariant::NoNetns,
        ] {
            assert!(plans.iter().any(|p| p.del == v), "{v:?} never drawn");
        }
        assert!(plans.iter().any(|p| p.repeat_dels == 2));
        let gcs: Vec<u64> = plans.iter().filter(|p| p.gc).map(|p| p.step).collect();
        assert_eq!(gcs, vec![25, 75, 125, 175, 225, 275, 325, 375]);
        let none = PlanKnobs {
            gc_every: 0,
            ..knobs(0.1)
        };
        assert!((0..400).all(|s| !CyclePlan::new(&none, s).gc));
    }

    #[test]
    fn only_killed_adds_are_lost() {
        let plans: Vec<CyclePlan> = (0..2000).map(|s| CyclePlan::new(&knobs(0.2), s)).collect();
        assert!(plans.iter().all(|p| !p.lost || p.kill_at.is_some()));
        let lost = plans.iter().filter(|p| p.lost).count();
        assert!((120..280).contains(&lost), "{lost}");
        let keep = PlanKnobs {
            lose_rate: 0.0,
            ..knobs(0.2)
        };
        assert!((0..2000).all(|s| !CyclePlan::new(&keep, s).lost));
    }

    #[test]
    fn other_knobs_do_not_shift_the_del_plan() {
        let a = CyclePlan::new(&knobs(0.0), 5);
        let b = CyclePlan::new(&knobs(0.9), 5);
        assert_eq!(
            (a.checks, a.del, a.repeat_dels),
            (b.checks, b.del, b.repeat_dels)
        );
    }
}
