//! `cnilab schema`: the JSON Schema of a report kind (see
//! [`crate::report::schema`]).

use super::CliResult;

/// Print the JSON Schema of a report kind (`-o json` output), or of a
/// capture file (`capture`) or a trace (`trace`)
#[derive(clap::Args)]
#[command(after_help = concat!("Examples:\n  \
    cnilab schema               # the report kinds\n  \
    cnilab schema LabReport > lab-report.schema.json\n  \
    cnilab schema capture       # the file cnilab capture writes\n\n",
    crate::exit_codes_help!()))]
pub struct Schema {
    /// The report kind (the `kind` field of a JSON report), `capture` or
    /// `trace`; without it, all are listed.
    pub kind: Option<String>,
}

impl Schema {
    pub fn run(self) -> CliResult {
        let kinds: Vec<&str> = crate::report::schema::KINDS
            .iter()
            .chain(crate::report::schema::DOCUMENTS)
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
                    "no report kind {k:?}: use one of {} (the `kind` field of a JSON report, or capture/trace for those files)",
                    kinds.join(", ")
                )
                .into()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    /// A document's schema pins the `schemaVersion` its writer writes, so
    /// bumping one without the other fails here.
    #[test]
    fn every_document_schema_pins_its_writers_version() {
        let writers = [
            ("capture", crate::capture::SCHEMA_VERSION),
            ("trace", crate::trace::SCHEMA_VERSION),
        ];
        assert_eq!(writers.len(), crate::report::schema::DOCUMENTS.len());
        for (name, version) in writers {
            let s: Value =
                serde_json::from_str(crate::report::schema::schema(name).expect("a schema"))
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(s["properties"]["schemaVersion"]["const"], version, "{name}");
            assert!(s["properties"].get("kind").is_none(), "{name} is no report");
        }
    }
}
