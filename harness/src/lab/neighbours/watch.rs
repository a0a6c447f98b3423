//! The watch during a run: the kernel's counters that say a host limit,
//! not the plugin, may explain failures (the neighbour tables' `table_fulls`,
//! the input backlog's drops in `/proc/net/softnet_stat`, ENOBUFS from
//! probes). Failures then make the verdict INCONCLUSIVE, never FAIL.

use super::{family_name, read_stat, thresholds, Stat};
use crate::connectivity::ProbeOutcome;

/// Packets the kernel dropped because a CPU's input backlog was full: the
/// second column of `/proc/net/softnet_stat` (one row of hexadecimal
/// counters per CPU), summed. A veth hands every packet it sends to that
/// backlog (`net.core.netdev_max_backlog`, 1,000 by default, for every
/// namespace of the machine), so a broadcast a bridge floods to a hundred
/// ports while thousands of probes run can overflow it.
fn parse_backlog_drops(text: &str) -> Option<u64> {
    let mut sum = 0;
    let mut rows = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let dropped = line.split_whitespace().nth(1)?;
        sum += u64::from_str_radix(dropped, 16).ok()?;
        rows += 1;
    }
    (rows > 0).then_some(sum)
}

const SOFTNET_STAT: &str = "/proc/net/softnet_stat";
const MAX_BACKLOG: &str = "/proc/sys/net/core/netdev_max_backlog";

fn read_backlog_drops() -> Option<u64> {
    parse_backlog_drops(&std::fs::read_to_string(SOFTNET_STAT).ok()?)
}

/// The reason failures are not the plugin's when the input backlog
/// dropped packets between `before` and `after`.
fn backlog_reason(before: u64, after: u64, max_backlog: &str) -> Option<String> {
    (after > before).then(|| {
        format!(
            "the kernel's input backlog dropped {} packet(s) during the run ({SOFTNET_STAT}; net.core.netdev_max_backlog = {}, shared by every namespace): re-run on a quieter host, or raise net.core.netdev_max_backlog",
            after - before,
            max_backlog.trim()
        )
    })
}

/// The INCONCLUSIVE reason for host limits `why` the run hit.
fn simulator_limit(why: &str) -> String {
    format!("the failures may be the simulator's limit, not the plugin's: {why}")
}

/// The kernel's counters before the probes, to compare after.
pub struct Watch {
    before: [Option<Stat>; 2],
    backlog_drops: Option<u64>,
}

impl Watch {
    pub fn start() -> Watch {
        Watch {
            before: [read_stat(false).ok(), read_stat(true).ok()],
            backlog_drops: read_backlog_drops(),
        }
    }

    /// Whether the kernel's input backlog dropped packets since
    /// [`Watch::start`], as the reason failures may not be the plugin's.
    /// Read when the probes end; it weighs only failures no diagnosis
    /// explains (a named cause stands, drops or not): see
    /// `Report::inconclusive_unless_explained`.
    pub fn backlog(&self) -> Option<String> {
        let (before, after) = (self.backlog_drops?, read_backlog_drops()?);
        let max = std::fs::read_to_string(MAX_BACKLOG).unwrap_or_else(|_| "?".into());
        backlog_reason(before, after, &max).map(|why| simulator_limit(&why))
    }

    /// Why failures cannot be blamed on the plugin: the host's neighbour
    /// table overflowed during the run, or a probe got ENOBUFS. `None` when
    /// nothing failed or the simulator stayed within its limits.
    pub fn verdict(&self, outcomes: &[ProbeOutcome]) -> Option<String> {
        if outcomes.iter().all(|o| o.passed()) {
            return None;
        }
        let mut why = Vec::new();
        for (i, before) in self.before.iter().enumerate() {
            let v6 = i == 1;
            let (Some(before), Ok(after)) = (before, read_stat(v6)) else {
                continue;
            };
            if after.table_fulls > before.table_fulls {
                let t3 = thresholds(v6).map(|t| t[2].to_string()).unwrap_or_default();
                why.push(format!(
                    "the host's {} neighbour table overflowed {} time(s) during the run ({} table_fulls; gc_thresh3 = {t3}, {} entries now; other labs on this host share the table): re-run, or pass --tune-host",
                    family_name(v6),
                    after.table_fulls - before.table_fulls,
                    if v6 { "/proc/net/stat/ndisc_cache" } else { "/proc/net/stat/arp_cache" },
                    after.entries
                ));
            }
        }
        let nobufs = outcomes
            .iter()
            .filter(|o| {
                o.error
                    .as_deref()
                    .is_some_and(|e| e.contains("No buffer space") || e.contains("os error 105"))
            })
            .count();
        if nobufs > 0 {
            why.push(format!(
                "{nobufs} probe(s) got ENOBUFS (No buffer space available) from the kernel"
            ));
        }
        (!why.is_empty()).then(|| simulator_limit(&why.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backlog_drops_are_summed_over_cpus_and_name_the_limit() {
        let text = "00333b22 0000c4b8 0000001e 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000\n\
002e5bca 0000dbc6 0000001c 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000001 00000000 00000000\n";
        assert_eq!(parse_backlog_drops(text), Some(0xc4b8 + 0xdbc6));
        assert_eq!(parse_backlog_drops(""), None);
        assert_eq!(parse_backlog_drops("00000001 zz\n"), None);
        assert_eq!(backlog_reason(5, 5, "1000\n"), None);
        let why = backlog_reason(5, 47088, "1000\n").expect("drops are a reason");
        assert!(why.contains("dropped 47083 packet(s)"), "{why}");
        assert!(why.contains("netdev_max_backlog = 1000,"), "{why}");
    }
}
