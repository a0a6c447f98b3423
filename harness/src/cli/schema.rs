//! `cnilab schema`: the JSON Schema of a report kind (see
//! [`crate::report::schema`]).

use super::CliResult;

/// Print the JSON Schema of a report kind (`-o json` output)
#[derive(clap::Args)]
#[command(after_help = concat!("Examples:\n  \
    cnilab schema               # the report kinds\n  \
    cnilab schema LabReport > lab-report.schema.json\n\n",
    crate::exit_codes_help!()))]
pub struct Schema {
    /// The report kind (the `kind` field of a JSON report); without it, the kinds are listed.
    pub kind: Option<String>,
}

impl Schema {
    pub fn run(self) -> CliResult {
        let kinds: Vec<&str> = crate::report::schema::KINDS
            .iter()
            .map(|(k, _)| *k)
            .collect();
        match self.kind.as_deref() {
            None => {
                for k in kinds {
                    println!("{k}");
                }
                Ok(crate::report::verdict(true))
            }
            Some(k) => match crate::report::schema::schema(k) {
                Some(text) => {
                    print!("{text}");
                    Ok(crate::report::verdict(true))
                }
                None => Err(format!(
                    "no report kind {k:?}: use one of {} (the `kind` field of a JSON report)",
                    kinds.join(", ")
                )
                .into()),
            },
        }
    }
}
