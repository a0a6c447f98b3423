//! What to fix: one line per rule ([`fix_for`]), and the root causes that
//! explain several failed rules at once ([`root_causes`]), so a report can
//! open with a short "fix first" list instead of twenty FAILs.

/// How to fix each rule, in one line (what a conforming plugin does).
pub const FIXES: &[(&str, &str)] = &[
    ("E1", "refuse an unknown CNI_COMMAND with error code 4 (JSON on stdout, non-zero exit)"),
    ("E2", "check every CNI_* variable the command needs first; refuse a missing one with code 4 naming it"),
    ("E3", "validate CNI_CONTAINERID (alphanumerics first, then alphanumerics, '_', '.', '-') before touching disk or kernel; code 4"),
    ("E4", "validate CNI_IFNAME (1-15 bytes, no '/', ':', whitespace, not '.' or '..') before acting; refuse with an error"),
    ("E5", "parse CNI_ARGS as K=V;K=V and ignore unknown keys when IgnoreUnknown=1 is set"),
    ("C1", "when stdin is not JSON, answer code 6 (decode) as JSON on stdout"),
    ("C2", "refuse a config without \"name\" with code 7"),
    ("C3", "refuse a cniVersion you do not support with code 1"),
    ("C4", "ignore config keys you do not know (or refuse with code 2 naming the key)"),
    ("C5", "accept runtimeConfig, args, capabilities and prevResult in the config"),
    ("V1", "for CNI_COMMAND=VERSION print {\"cniVersion\",\"supportedVersions\"} and exit 0"),
    ("V2", "echo the config's cniVersion in the VERSION answer"),
    ("V3", "print ADD results in the format of each version you list in supportedVersions"),
    ("A1", "on success print exactly one JSON result on stdout (logs go to stderr) and exit 0"),
    ("A2", "answer in the config's cniVersion"),
    ("A3", "list the interfaces you made, with \"sandbox\" = CNI_NETNS for the pod's"),
    ("A4", "give every IP as CIDR with an \"interface\" index into \"interfaces\""),
    ("A5", "report what you set: the pod interface's MAC, addresses and routes must match the result"),
    ("A6", "refuse ADD when CNI_IFNAME exists in the namespace, and leave that interface alone"),
    ("A7", "give a second interface of one container its own address"),
    ("A8", "as a chained plugin, start from prevResult and add your changes"),
    ("A9", "run the IPAM plugin named in ipam.type with the same CNI_* and the whole config"),
    ("A10", "when ADD fails after IPAM allocated, call IPAM DEL before returning the error"),
    ("A11", "make a DEL after a failed ADD succeed and remove whatever the ADD left"),
    ("A12", "lock the IPAM store around allocation, so parallel ADDs get distinct addresses"),
    ("D1", "DEL prints nothing on success and exits 0"),
    ("D2", "make DEL idempotent: a second DEL succeeds"),
    ("D3", "DEL of a container never added succeeds"),
    ("D4", "DEL without CNI_NETNS still releases the address and removes the host side"),
    ("D5", "DEL after the namespace is gone succeeds and releases everything"),
    ("D6", "DEL must work with and without prevResult (find what to release in your own store)"),
    ("D7", "DEL removes the host veth, the IPAM reservation and every rule ADD added"),
    ("D8", "DEL releases only CNI_IFNAME's attachment, not the container's others"),
    ("K1", "refuse CHECK for configs below 0.4.0 with code 1"),
    ("K2", "CHECK prints nothing on success"),
    ("K3", "refuse CHECK without prevResult"),
    ("K4", "CHECK compares prevResult with the kernel and fails on a missing address or route"),
    ("K5", "CHECK right after ADD succeeds"),
    ("K6", "delegate CHECK to the IPAM plugin and pass its error on"),
    ("S1", "refuse STATUS for configs below 1.1.0 with code 1"),
    ("S2", "STATUS prints nothing and exits 0 when ready"),
    ("S3", "delegate STATUS to the IPAM plugin"),
    ("S4", "do not require STATUS before ADD"),
    ("G1", "accept GC with cni.dev/valid-attachments (and cni.dev/attachments)"),
    ("G2", "GC removes attachments not listed and keeps the listed ones"),
    ("G3", "forward GC to the IPAM plugin"),
    ("G4", "GC goes on past one failure and reports it"),
    ("G5", "refuse GC for configs below 1.1.0 with code 1"),
    ("X1", "validate all input before acting; every refusal is CNI error JSON on stdout, never a crash or a hang"),
    ("H1", "change only the namespace you were started in and CNI_NETNS; never enter or change another (your parent's included)"),
];

/// The one-line fix of rule `id`.
pub fn fix_for(id: &str) -> Option<&'static str> {
    FIXES.iter().find(|(i, _)| *i == id).map(|(_, f)| *f)
}

/// A cause that explains several failed rules: how to recognise it in a
/// rule's details, what it is, and how to fix it.
struct Cause {
    marks: &'static [&'static str],
    what: &'static str,
    fix: &'static str,
}

const CAUSES: &[Cause] = &[
    Cause {
        marks: &[
            "expected a JSON error body",
            "without a CNI error body on stdout",
            "not a CNI error",
        ],
        what: "the plugin prints no CNI error JSON on stdout when it fails",
        fix: "on every failure print {\"cniVersion\":…,\"code\":N,\"msg\":…} on stdout (not stderr) and exit non-zero",
    },
    Cause {
        marks: &["expected a non-zero exit with a CNI error, saw exit 0"],
        what: "the plugin accepts input it must refuse",
        fix: "validate CNI_* and the config before acting, and refuse bad input with an error",
    },
    Cause {
        marks: &["timed out"],
        what: "the plugin hangs",
        fix: "bound every wait (locks, stdin, child processes); read stdin to its end once",
    },
    Cause {
        marks: &["host changed:", "left behind", "still exists", "still on the bridge"],
        what: "a call leaves things on the host",
        fix: "undo what a failed ADD did, and make DEL remove the veth, the address and the rules",
    },
];

/// One root cause and the failed rules it explains.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RootCause {
    pub cause: String,
    pub ids: Vec<String>,
    pub fix: String,
}

/// The root causes of the failed rules, given as (rule id, details), those
/// explaining most first; a rule counts for the first cause its details
/// show. Causes explaining fewer than two rules are left to the rule's own
/// fix.
pub fn root_causes<'a>(
    failed: impl IntoIterator<Item = (&'a str, &'a [String])>,
) -> Vec<RootCause> {
    let mut out: Vec<RootCause> = Vec::new();
    for (id, details) in failed {
        let text = details.join("\n");
        let Some(cause) = CAUSES
            .iter()
            .find(|k| k.marks.iter().any(|m| text.contains(m)))
        else {
            continue;
        };
        match out.iter_mut().find(|r| r.cause == cause.what) {
            Some(r) => r.ids.push(id.to_string()),
            None => out.push(RootCause {
                cause: cause.what.into(),
                ids: vec![id.to_string()],
                fix: cause.fix.into(),
            }),
        }
    }
    out.retain(|r| r.ids.len() >= 2);
    out.sort_by_key(|r| std::cmp::Reverse(r.ids.len()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conform::report::CheckReport;
    use crate::verdict::Verdict;

    #[test]
    fn every_rule_has_a_fix() {
        for (id, _) in super::super::CATALOG {
            assert!(fix_for(id).is_some(), "{id} has no fix line");
        }
        assert_eq!(FIXES.len(), super::super::CATALOG.len());
    }

    fn check(id: &str, verdict: Verdict, detail: &str) -> CheckReport {
        CheckReport {
            id: id.into(),
            name: String::new(),
            verdict,
            details: vec![format!("{verdict}: {detail}")],
            evidence: Vec::new(),
            fix: None,
        }
    }

    #[test]
    fn one_cause_explaining_several_rules_is_listed_once_with_them() {
        let no_json = "expected a JSON error body {code,msg} on stdout, saw \"\"";
        let checks = [
            check("E1", Verdict::Fail, no_json),
            check("C1", Verdict::Fail, no_json),
            check("K1", Verdict::Fail, no_json),
            check("A5", Verdict::Fail, "MAC differs"),
            check("E2", Verdict::Warn, no_json),
            check("D7", Verdict::Fail, "host changed: veth x"),
        ];
        let causes = root_causes(
            checks
                .iter()
                .filter(|c| c.verdict == Verdict::Fail)
                .map(|c| (c.id.as_str(), c.details.as_slice())),
        );
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(causes[0].ids, ["E1", "C1", "K1"]);
        assert!(causes[0].cause.contains("no CNI error JSON"));
    }
}
