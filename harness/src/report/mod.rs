//! One output convention for every `cnilab` command (docs: "CLI
//! conventions"):
//! - [`Format`]: `-o, --output table|json|junit`, and [`emit`], which
//!   prints a [`Rendered`] report in it and writes its `--junit` and
//!   `--report` files;
//! - [`json`]: the JSON envelope (`schemaVersion`, `kind`, then the report's
//!   own fields, objects rather than tuple arrays);
//! - [`schema`]: the JSON Schema of each report kind (`cnilab schema`) and
//!   the validator tests check reports with;
//! - [`junit`]: the one JUnit writer and the one XML escaper;
//! - [`quote`]: the one shell quoter (command lines shown to the user);
//! - [`human`]: the one control-character escaper of every human report
//!   (tables, HTML, error lines): text from plugins and pods never reaches a
//!   terminal raw; only JSON strings keep it as it was;
//! - [`progress`]: progress on a TTY, quiet when piped;
//! - [`exit`]: the exit codes, the same for every command.

pub mod junit;
pub mod progress;
pub mod schema;

pub use junit::escape;

/// What a `cnilab` command returns: its exit code, or a failure that the CLI
/// prints as `cnilab: <message>` with exit code 2.
pub type CliResult = Result<std::process::ExitCode, Box<dyn std::error::Error>>;

use std::path::Path;
use std::process::ExitCode;

/// Version of every JSON document `-o json` prints. Bump it when a field is
/// renamed or removed (adding a field keeps it).
pub const SCHEMA_VERSION: u32 = 2;

/// What a command prints on stdout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// A table for people.
    #[default]
    Table,
    /// One JSON document with `schemaVersion`.
    Json,
    /// JUnit XML (commands whose result is a list of checks).
    Junit,
}

#[derive(serde::Serialize)]
struct Envelope<'a, T: serde::Serialize> {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    kind: &'a str,
    #[serde(flatten)]
    body: &'a T,
}

/// `value` as pretty JSON with `schemaVersion` and `kind` ahead of its own
/// fields (`value` must serialize as an object).
pub fn json<T: serde::Serialize>(kind: &str, value: &T) -> String {
    let envelope = Envelope {
        schema_version: SCHEMA_VERSION,
        kind,
        body: value,
    };
    serde_json::to_string_pretty(&envelope).unwrap_or_else(|e| {
        format!(
            "{{\"schemaVersion\":{SCHEMA_VERSION},\"kind\":\"{}\",\"error\":\"{}\"}}",
            kind,
            e.to_string().replace('"', "'")
        )
    })
}

/// Serializes `[(name, value), …]` as `[{"name": name, <field>: value}, …]`
/// (objects, not tuple arrays). Use with `#[serde(serialize_with)]` through
/// a small wrapper that names the field.
pub fn pairs_as_objects<S, A, B>(
    pairs: &[(A, B)],
    first: &'static str,
    second: &'static str,
    s: S,
) -> Result<S::Ok, S::Error>
where
    S: serde::Serializer,
    A: serde::Serialize,
    B: serde::Serialize,
{
    use serde::ser::{SerializeMap, SerializeSeq};
    struct Pair<'a, A, B>(&'a A, &'a B, &'static str, &'static str);
    impl<A: serde::Serialize, B: serde::Serialize> serde::Serialize for Pair<'_, A, B> {
        fn serialize<S2: serde::Serializer>(&self, s: S2) -> Result<S2::Ok, S2::Error> {
            let mut m = s.serialize_map(Some(2))?;
            m.serialize_entry(self.2, self.0)?;
            m.serialize_entry(self.3, self.1)?;
            m.end()
        }
    }
    let mut seq = s.serialize_seq(Some(pairs.len()))?;
    for (a, b) in pairs {
        seq.serialize_element(&Pair(a, b, first, second))?;
    }
    seq.end()
}

/// A report in every form a command prints or writes: the table for
/// people, the JSON document, the JUnit XML, and the self-contained HTML
/// page where the report has one (`--report FILE`).
pub trait Rendered {
    fn table(&self) -> String;
    fn json(&self) -> String;
    fn junit(&self) -> String;
    fn html(&self) -> Option<String> {
        None
    }
}

/// Prints `report` on stdout in `format` (a table through [`human`]), then
/// writes its JUnit XML to `junit` and its HTML page to `html`, where
/// asked (see [`write_file`]).
pub fn emit(
    report: &dyn Rendered,
    format: Format,
    junit: Option<&Path>,
    html: Option<&Path>,
) -> Result<(), String> {
    match format {
        Format::Table => print_human(&report.table()),
        Format::Json => println!("{}", report.json()),
        Format::Junit => print!("{}", report.junit()),
    }
    if let Some(path) = junit {
        write_file(path, &report.junit())?;
    }
    if let (Some(path), Some(page)) = (html, report.html()) {
        write_file(path, &page)?;
        eprintln!("cnilab: HTML report written to {}", path.display());
    }
    Ok(())
}

/// Writes a report file, creating its directory; the file itself is made
/// as root may make one in a shared directory (`crate::util::write_replacing`:
/// no symlink or planted file there is ever written through).
pub fn write_file(path: &Path, text: &str) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    crate::util::write_replacing(path, text.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Whether `c` could steer a terminal or reorder text: C0 and C1 controls,
/// DEL, and the bidirectional overrides and isolates.
fn is_steering(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` for a human report: every control character except the newline
/// becomes visible (`\u{1b}`, `\r`, `\t`), so outside text can neither
/// erase nor rewrite what is printed around it.
pub fn human(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c != '\n' && is_steering(c)) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if c != '\n' && is_steering(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Prints a human report on stdout through [`human`].
pub fn print_human(text: &str) {
    print!("{}", human(text));
}

/// Quotes a word for a shell command line shown to the user, only when a
/// shell would need it.
pub fn quote(word: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The exit codes of every `cnilab` command.
pub mod exit {
    /// Everything judged passed.
    pub const PASS: u8 = 0;
    /// A check failed (a plugin or lab defect was seen).
    pub const FAIL: u8 = 1;
    /// Usage or environment error: bad flags or input, not root, a missing
    /// kernel feature or binary. Nothing was judged. (clap's usage errors
    /// exit 2 as well.)
    pub const USAGE: u8 = 2;
    /// Inconclusive: the run finished but could not tell (every check was
    /// skipped).
    pub const INCONCLUSIVE: u8 = 3;
}

/// The exit-code paragraph of every `--help` (and of docs/src/cli/conventions.md).
#[macro_export]
macro_rules! exit_codes_help {
    () => {
        "Exit codes: 0 pass, 1 a check failed, 2 usage or environment error, 3 inconclusive"
    };
}

/// Exit code of a verdict: 0 when `passed`, else 1.
pub fn verdict(passed: bool) -> ExitCode {
    ExitCode::from(if passed { exit::PASS } else { exit::FAIL })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_schema_version_and_kind_first() {
        #[derive(serde::Serialize)]
        struct R {
            a: u32,
        }
        let text = json("Thing", &R { a: 7 });
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["schemaVersion"], SCHEMA_VERSION);
        assert_eq!(v["kind"], "Thing");
        assert_eq!(v["a"], 7);
        assert!(text.find("schemaVersion") < text.find("\"a\""), "{text}");
    }

    #[test]
    fn pairs_become_objects() {
        #[derive(serde::Serialize)]
        struct R {
            #[serde(serialize_with = "phases")]
            p: Vec<(String, f64)>,
        }
        fn phases<S: serde::Serializer>(p: &[(String, f64)], s: S) -> Result<S::Ok, S::Error> {
            pairs_as_objects(p, "phase", "ms", s)
        }
        let text = serde_json::to_string(&R {
            p: vec![("up".into(), 1.5)],
        })
        .expect("json");
        assert_eq!(text, r#"{"p":[{"phase":"up","ms":1.5}]}"#);
    }

    #[test]
    fn quote_only_when_needed() {
        assert_eq!(quote("/usr/lib/cni"), "/usr/lib/cni");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}

#[cfg(test)]
mod human_tests {
    use super::human;

    #[test]
    fn controls_become_visible_and_newlines_stay() {
        assert_eq!(human("ok\nline"), "ok\nline");
        assert_eq!(
            human("a\u{1b}[2K\rPASS\u{9b}1A\u{202e}x"),
            "a\\u{1b}[2K\\rPASS\\u{9b}1A\\u{202e}x"
        );
    }
}
