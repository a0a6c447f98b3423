//! The conformance rules, one record each: its ID, its name in the report,
//! the checks that report it, and the one-line fix a report gives when it
//! fails. The IDs are those of the checklist the harness implements
//! (`cni-conformance`); a group of checks (`checks/`) reports the rules that
//! name it here, so a rule and its group cannot drift apart.

/// What reports a rule: one of the check groups, or what the suite does
/// besides them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// VERSION, asked before the groups run.
    Versions,
    /// The whole lifecycle in every supported version.
    Lifecycle,
    Environment,
    Config,
    Interfaces,
    Chaining,
    Delegation,
    FailedAdd,
    Parallel,
    DelVariants,
    CheckRules,
    Status,
    Gc,
    /// The hostile-input corpus.
    Corpus,
    /// The namespace conform runs in, compared before and after.
    OwnNamespace,
}

/// One rule of the checklist.
#[derive(Debug)]
pub struct Rule {
    pub id: &'static str,
    /// One line, as the report names it.
    pub name: &'static str,
    /// What reports it (a rule may be reported by two groups).
    pub checks: &'static [Check],
    /// How a conforming plugin does it, in one line.
    pub fix: &'static str,
}

const fn rule(
    id: &'static str,
    name: &'static str,
    checks: &'static [Check],
    fix: &'static str,
) -> Rule {
    Rule {
        id,
        name,
        checks,
        fix,
    }
}

use Check::*;

/// Every rule, in report order.
pub const RULES: &[Rule] = &[
    rule(
        "E1",
        "unknown CNI_COMMAND -> code 4",
        &[Environment],
        "refuse an unknown CNI_COMMAND with error code 4 (JSON on stdout, non-zero exit)",
    ),
    rule(
        "E2",
        "missing CNI_* variable -> code 4 naming it",
        &[Environment],
        "check every CNI_* variable the command needs first; refuse a missing one with code 4 naming it",
    ),
    rule(
        "E3",
        "invalid container ID -> code 4/3, no change",
        &[Environment],
        "validate CNI_CONTAINERID (alphanumerics first, then alphanumerics, '_', '.', '-') before touching disk or kernel; code 4",
    ),
    rule(
        "E4",
        "invalid interface name -> error, nothing changed",
        &[Environment],
        "validate CNI_IFNAME (1-15 bytes, no '/', ':', whitespace, not '.' or '..') before acting; refuse with an error",
    ),
    rule(
        "E5",
        "CNI_ARGS with IgnoreUnknown=1 accepted",
        &[Environment],
        "parse CNI_ARGS as K=V;K=V and ignore unknown keys when IgnoreUnknown=1 is set",
    ),
    rule(
        "C1",
        "malformed JSON config -> code 6",
        &[Config],
        "when stdin is not JSON, answer code 6 (decode) as JSON on stdout",
    ),
    rule(
        "C2",
        "missing network name -> code 7",
        &[Config],
        "refuse a config without \"name\" with code 7",
    ),
    rule(
        "C3",
        "unsupported cniVersion -> code 1",
        &[Config],
        "refuse a cniVersion you do not support with code 1",
    ),
    rule(
        "C4",
        "unknown field tolerated or code 2 naming it",
        &[Config],
        "ignore config keys you do not know (or refuse with code 2 naming the key)",
    ),
    rule(
        "C5",
        "runtime-injected keys tolerated",
        &[Config],
        "accept runtimeConfig, args, capabilities and prevResult in the config",
    ),
    rule(
        "V1",
        "VERSION prints cniVersion + supportedVersions",
        &[Versions],
        "for CNI_COMMAND=VERSION print {\"cniVersion\",\"supportedVersions\"} and exit 0",
    ),
    rule(
        "V2",
        "VERSION echoes the input cniVersion",
        &[Versions],
        "echo the config's cniVersion in the VERSION answer",
    ),
    rule(
        "V3",
        "ADD works in every supported version's format",
        &[Lifecycle],
        "print ADD results in the format of each version you list in supportedVersions",
    ),
    rule(
        "A1",
        "ADD exits 0 with one result on stdout",
        &[Lifecycle],
        "on success print exactly one JSON result on stdout (logs go to stderr) and exit 0",
    ),
    rule(
        "A2",
        "result cniVersion equals the config's",
        &[Lifecycle],
        "answer in the config's cniVersion",
    ),
    rule(
        "A3",
        "interfaces named, sandbox = CNI_NETNS",
        &[Lifecycle],
        "list the interfaces you made, with \"sandbox\" = CNI_NETNS for the pod's",
    ),
    rule(
        "A4",
        "ips are CIDR with valid interface index",
        &[Lifecycle],
        "give every IP as CIDR with an \"interface\" index into \"interfaces\"",
    ),
    rule(
        "A5",
        "kernel state matches the result",
        &[Lifecycle],
        "report what you set: the pod interface's MAC, addresses and routes must match the result",
    ),
    rule(
        "A6",
        "existing ifname -> ADD fails, original intact",
        &[Interfaces],
        "refuse ADD when CNI_IFNAME exists in the namespace, and leave that interface alone",
    ),
    rule(
        "A7",
        "same container, other ifname -> distinct address",
        &[Interfaces],
        "give a second interface of one container its own address",
    ),
    rule(
        "A8",
        "chained plugin outputs prevResult plus changes",
        &[Chaining],
        "as a chained plugin, start from prevResult and add your changes",
    ),
    rule(
        "A9",
        "IPAM delegated with same env and whole config",
        &[Delegation],
        "run the IPAM plugin named in ipam.type with the same CNI_* and the whole config",
    ),
    rule(
        "A10",
        "failed ADD releases its IPAM allocation",
        &[FailedAdd],
        "when ADD fails after IPAM allocated, call IPAM DEL before returning the error",
    ),
    rule(
        "A11",
        "DEL after a failed ADD leaves nothing behind",
        &[FailedAdd],
        "make a DEL after a failed ADD succeed and remove whatever the ADD left",
    ),
    rule(
        "A12",
        "parallel ADDs succeed with unique addresses",
        &[Parallel],
        "lock the IPAM store around allocation, so parallel ADDs get distinct addresses",
    ),
    rule(
        "D1",
        "DEL exits 0 with no output",
        &[Lifecycle],
        "DEL prints nothing on success and exits 0",
    ),
    rule(
        "D2",
        "second DEL succeeds",
        &[Lifecycle],
        "make DEL idempotent: a second DEL succeeds",
    ),
    rule(
        "D3",
        "DEL of a never-added container succeeds",
        &[DelVariants],
        "DEL of a container never added succeeds",
    ),
    rule(
        "D4",
        "DEL without CNI_NETNS succeeds and releases",
        &[Lifecycle],
        "DEL without CNI_NETNS still releases the address and removes the host side",
    ),
    rule(
        "D5",
        "DEL after netns is gone succeeds, releases",
        &[Lifecycle],
        "DEL after the namespace is gone succeeds and releases everything",
    ),
    rule(
        "D6",
        "DEL succeeds with and without prevResult",
        &[DelVariants],
        "DEL must work with and without prevResult (find what to release in your own store)",
    ),
    rule(
        "D7",
        "DEL removes host veth, reservation, rules",
        &[Lifecycle, Parallel],
        "DEL removes the host veth, the IPAM reservation and every rule ADD added",
    ),
    rule(
        "D8",
        "DEL releases only the given ifname",
        &[Interfaces],
        "DEL releases only CNI_IFNAME's attachment, not the container's others",
    ),
    rule(
        "K1",
        "CHECK below 0.4.0 -> code 1",
        &[CheckRules],
        "refuse CHECK for configs below 0.4.0 with code 1",
    ),
    rule(
        "K2",
        "CHECK success prints nothing",
        &[Lifecycle],
        "CHECK prints nothing on success",
    ),
    rule(
        "K3",
        "CHECK without prevResult fails",
        &[CheckRules],
        "refuse CHECK without prevResult",
    ),
    rule(
        "K4",
        "CHECK detects flushed address / lost route",
        &[Lifecycle],
        "CHECK compares prevResult with the kernel and fails on a missing address or route",
    ),
    rule(
        "K5",
        "CHECK passes right after ADD",
        &[Lifecycle],
        "CHECK right after ADD succeeds",
    ),
    rule(
        "K6",
        "CHECK delegated to IPAM, errors propagate",
        &[Delegation],
        "delegate CHECK to the IPAM plugin and pass its error on",
    ),
    rule(
        "S1",
        "STATUS below 1.1.0 -> code 1",
        &[Status],
        "refuse STATUS for configs below 1.1.0 with code 1",
    ),
    rule(
        "S2",
        "STATUS ready -> exit 0, no output",
        &[Status],
        "STATUS prints nothing and exits 0 when ready",
    ),
    rule(
        "S3",
        "STATUS delegated to IPAM",
        &[Delegation],
        "delegate STATUS to the IPAM plugin",
    ),
    rule(
        "S4",
        "ADD works without STATUS",
        &[Lifecycle],
        "do not require STATUS before ADD",
    ),
    rule(
        "G1",
        "GC env; both attachment keys accepted",
        &[Gc],
        "accept GC with cni.dev/valid-attachments (and cni.dev/attachments)",
    ),
    rule(
        "G2",
        "GC removes stale, keeps listed",
        &[Gc],
        "GC removes attachments not listed and keeps the listed ones",
    ),
    rule(
        "G3",
        "GC forwarded to IPAM",
        &[Delegation],
        "forward GC to the IPAM plugin",
    ),
    rule(
        "G4",
        "GC continues on partial failure, reports it",
        &[Delegation],
        "GC goes on past one failure and reports it",
    ),
    rule(
        "G5",
        "GC below 1.1.0 -> code 1",
        &[Gc],
        "refuse GC for configs below 1.1.0 with code 1",
    ),
    rule(
        "X1",
        "generic hostile-input corpus refused cleanly",
        &[Corpus],
        "validate all input before acting; every refusal is CNI error JSON on stdout, never a crash or a hang",
    ),
    rule(
        "H1",
        "the namespace conform runs in is unchanged",
        &[OwnNamespace],
        "change only the namespace you were started in and CNI_NETNS; never enter or change another (your parent's included)",
    ),
];

/// The rule `id`.
pub fn rule_of(id: &str) -> Option<&'static Rule> {
    RULES.iter().find(|r| r.id == id)
}

/// The IDs of the rules `check` reports, in report order.
pub fn ids_of(check: Check) -> Vec<&'static str> {
    RULES
        .iter()
        .filter(|r| r.checks.contains(&check))
        .map(|r| r.id)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_every_rule_is_reported_and_has_a_fix() {
        for (k, r) in RULES.iter().enumerate() {
            assert!(RULES[..k].iter().all(|o| o.id != r.id), "{} twice", r.id);
            assert!(!r.checks.is_empty(), "{} is reported by nothing", r.id);
            assert!(!r.fix.is_empty() && !r.name.is_empty(), "{}", r.id);
        }
    }

    #[test]
    fn a_group_reports_the_rules_that_name_it() {
        assert_eq!(ids_of(Chaining), ["A8"]);
        assert_eq!(ids_of(Parallel), ["A12", "D7"]);
        assert!(ids_of(Lifecycle).contains(&"D7"));
        assert_eq!(rule_of("X1").map(|r| r.checks), Some(&[Corpus][..]));
    }
}
