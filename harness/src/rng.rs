//! A tiny seeded PRNG (SplitMix64) and per-step streams: the soak workload
//! draws from them, and conform's container IDs come from them. Every step
//! gets its own stream derived from `(seed, step)`, so a step's plan does
//! not depend on how the parallel workers happened to interleave:
//! `--seed X --replay N` rebuilds it.

/// SplitMix64 (Steele, Lea, Flood 2014): 64 bits of state, passes BigCrush,
/// good enough to drive a workload and small enough to own.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The stream of step `step` of a run seeded with `seed`.
    pub fn for_step(seed: u64, step: u64) -> SplitMix64 {
        SplitMix64::new(mix(seed ^ mix(step.wrapping_add(1).wrapping_mul(GAMMA))))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix(self.state)
    }

    /// Uniform in `[0, 1)` with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p` (clamped to `[0, 1]`).
    pub fn chance(&mut self, p: f64) -> bool {
        self.next_f64() < p.clamp(0.0, 1.0)
    }

    /// Uniform in `0..n` (`0` when `n == 0`), without modulo bias worth
    /// caring about for the small `n` used here.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// Container ID number `n` of a run seeded with `seed`, like a runtime's:
/// 64 lowercase hex characters.
pub fn container_id(seed: u64, n: u64) -> String {
    let mut r = SplitMix64::for_step(seed, n);
    (0..4).map(|_| format!("{:016x}", r.next_u64())).collect()
}

/// A seed from the clock, for runs without `--seed` (it is printed, so the
/// run can still be replayed).
pub fn seed_from_clock() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    mix(nanos ^ u64::from(std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_other_seed_other_stream() {
        let a: Vec<u64> = {
            let mut r = SplitMix64::new(42);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = SplitMix64::new(42);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let c: Vec<u64> = {
            let mut r = SplitMix64::new(43);
            (0..8).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn container_ids_look_like_a_runtimes_and_share_no_prefix() {
        let ids: Vec<String> = (0..64).map(|n| container_id(9, n)).collect();
        for id in &ids {
            assert_eq!(id.len(), 64, "{id}");
            assert!(
                id.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
                "{id}"
            );
        }
        let mut prefixes: Vec<&str> = ids.iter().map(|i| &i[..8]).collect();
        prefixes.sort();
        prefixes.dedup();
        assert_eq!(prefixes.len(), ids.len(), "8-character prefixes collide");
        assert_eq!(container_id(9, 3), ids[3], "same seed, same ID");
        assert_ne!(container_id(10, 3), ids[3], "another seed, another ID");
    }

    #[test]
    fn step_streams_are_independent_of_order() {
        let first = SplitMix64::for_step(7, 12).next_u64();
        let _ = SplitMix64::for_step(7, 3).next_u64();
        assert_eq!(SplitMix64::for_step(7, 12).next_u64(), first);
        assert_ne!(SplitMix64::for_step(7, 13).next_u64(), first);
        assert_ne!(SplitMix64::for_step(8, 12).next_u64(), first);
    }

    #[test]
    fn floats_and_ranges_stay_in_bounds_and_spread() {
        let mut r = SplitMix64::new(1);
        let mut hits = [0u32; 4];
        let mut yes = 0;
        for _ in 0..40_000 {
            let f = r.next_f64();
            assert!((0.0..1.0).contains(&f));
            let k = r.below(4);
            hits[k as usize] += 1;
            if r.chance(0.25) {
                yes += 1;
            }
        }
        for h in hits {
            assert!((9_000..11_000).contains(&h), "{hits:?}");
        }
        assert!((9_000..11_000).contains(&yes), "{yes}");
        assert_eq!(r.below(0), 0);
        assert!(!r.chance(0.0));
        assert!(r.chance(1.0));
    }
}
