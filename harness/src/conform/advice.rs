//! What to fix: one line per rule ([`fix_for`]), and the root causes that
//! explain several failed rules at once ([`root_causes`]), so a report can
//! open with a short "fix first" list instead of twenty FAILs.

/// The one-line fix of rule `id`.
pub fn fix_for(id: &str) -> Option<&'static str> {
    super::rules::rule_of(id).map(|r| r.fix)
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
        for r in crate::conform::rules::RULES {
            assert!(
                fix_for(r.id).is_some_and(|f| !f.is_empty()),
                "{} has no fix line",
                r.id
            );
        }
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
