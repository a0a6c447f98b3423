//! `cnilab lab causes [CAUSE]`: the registry of causes
//! ([`crate::connectivity::causes`]) as a table, one cause in full, or
//! JSON (`CauseList`).

use super::{CliResult, Format};
use crate::connectivity::causes::{self, Cause};
use crate::report;
use std::process::ExitCode;

#[derive(serde::Serialize)]
struct CauseList {
    causes: Vec<&'static Cause>,
}

/// Prints every cause, or the one `id` names (an unknown id is a usage
/// error naming how to list them).
pub fn run(id: Option<&str>, format: Format) -> CliResult {
    let list: Vec<&'static Cause> = match id {
        Some(id) => vec![causes::find(id).ok_or_else(|| {
            format!("no cause {id:?}: `cnilab lab causes` lists every cause by its id")
        })?],
        None => causes::CAUSES.iter().collect(),
    };
    match format {
        Format::Json => println!("{}", report::json("CauseList", &CauseList { causes: list })),
        _ if id.is_some() => print!("{}", in_full(&list)),
        _ => print!("{}", table(&list)),
    }
    Ok(ExitCode::SUCCESS)
}

/// One line a cause: id, who names it, what it means.
fn table(list: &[&Cause]) -> String {
    let w = list.iter().map(|c| c.id.len()).max().unwrap_or(5).max(5);
    let mut out = format!("{:<w$}  {:<13}  WHAT IT MEANS\n", "CAUSE", "NAMED BY");
    for c in list {
        out.push_str(&format!(
            "{:<w$}  {:<13}  {}\n",
            c.id,
            causes::finders(c),
            c.means
        ));
    }
    out.push_str("`cnilab lab causes CAUSE` shows one in full: the evidence and the fix\n");
    out
}

/// Each cause with its evidence, its fix and the tests that prove the fix.
fn in_full(list: &[&Cause]) -> String {
    let mut out = String::new();
    for c in list {
        out.push_str(&format!(
            "{} (named by {})\n  means:    {}\n  evidence: {}\n  fix:      {}\n",
            c.id,
            causes::finders(c),
            c.means,
            c.evidence,
            c.fix
        ));
        let proofs = causes::proofs(c);
        if proofs.is_empty() {
            out.push_str("  proven:   no test applies this fix yet\n");
        }
        for (i, p) in proofs.iter().enumerate() {
            let label = if i == 0 { "proven:" } else { "" };
            out.push_str(&format!("  {label:<9} {p}\n"));
        }
    }
    out
}
