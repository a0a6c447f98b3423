//! `cnilab matrix --kernels …`: one cnilab command on each kernel (each in
//! a microVM, `host` on this machine's own), its JSON report read into one
//! table of check by kernel. A check whose verdict differs between kernels
//! is marked; a kernel whose VM could not run the command is INCONCLUSIVE
//! with the reason, never a failure of the plugin.

use crate::report::junit;
use serde::Serialize;
use serde_json::Value;

/// One kernel's column.
#[derive(Debug, Serialize)]
pub struct Column {
    /// As asked for (`6.1`, `host`, a path).
    pub kernel: String,
    /// `uname -r` of the kernel that ran it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accel: Option<super::Accel>,
    /// The command's exit code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_ms: Option<f64>,
    /// Why the command did not run there (its column is inconclusive).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The command's stdout (its JSON report), when it ran.
    #[serde(skip)]
    pub output: Option<Vec<u8>>,
}

impl Column {
    pub fn named(kernel: &str) -> Column {
        Column {
            kernel: kernel.into(),
            release: None,
            accel: None,
            code: None,
            boot_ms: None,
            total_ms: None,
            error: None,
            output: None,
        }
    }
}

/// One check across the kernels.
#[derive(Debug, Serialize)]
pub struct Row {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The verdict on each kernel, in the columns' order (`-`: no such
    /// check there).
    pub verdicts: Vec<String>,
    /// Whether the kernels disagree.
    pub differs: bool,
}

/// What each kernel said of one drop (a scenario's trace step): its drop
/// reason and the function that freed the packet. Words, not verdicts:
/// kernels may name one drop differently while the verdict stays.
#[derive(Debug, Serialize)]
pub struct WordRow {
    /// `<scenario> step <n>`.
    pub id: String,
    /// `REASON (function)` on each kernel, in the columns' order (`-`: no
    /// drop there).
    pub words: Vec<String>,
    pub differs: bool,
}

#[derive(Debug, Serialize)]
pub struct MatrixReport {
    pub command: Vec<String>,
    pub columns: Vec<Column>,
    pub rows: Vec<Row>,
    /// The kernel's own words for the drops the command's report names.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kernel_drops: Vec<WordRow>,
    /// pass, fail (a check failed on some kernel) or inconclusive (a kernel
    /// could not run the command).
    pub verdict: String,
}

/// `argv` with its output switched to JSON (`-o json` replaces any
/// `-o`/`--output`/`--format` value, or is added).
pub fn with_json(argv: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len() + 2);
    let mut i = 0;
    let mut set = false;
    while i < argv.len() {
        let a = &argv[i];
        if a == "--" {
            break;
        }
        if ["-o", "--output", "--format"].contains(&a.as_str()) {
            out.extend(["-o".to_string(), "json".to_string()]);
            set = true;
            i += 2;
            continue;
        }
        if a.starts_with("--output=")
            || a.starts_with("--format=")
            || (a.starts_with("-o") && a.len() > 2 && !a.starts_with("--"))
        {
            out.extend(["-o".to_string(), "json".to_string()]);
            set = true;
            i += 1;
            continue;
        }
        out.push(a.clone());
        i += 1;
    }
    if !set {
        out.extend(["-o".to_string(), "json".to_string()]);
    }
    out.extend(argv[i..].iter().cloned());
    out
}

/// The checks of a report: `(id, name, verdict)` of the first list among
/// its fields whose items carry a verdict (`checks` of conform, `groups`
/// of a lab, …); none when the output is no such report.
pub fn checks_of(report: &Value) -> Vec<(String, Option<String>, String)> {
    let Some(fields) = report.as_object() else {
        return Vec::new();
    };
    let word =
        |v: &Value, keys: &[&str]| keys.iter().find_map(|k| v[*k].as_str().map(str::to_string));
    for (_, list) in fields {
        let Some(items) = list.as_array() else {
            continue;
        };
        let rows: Vec<_> = items
            .iter()
            .filter_map(|item| {
                let verdict =
                    word(item, &["verdict", "status", "outcome"]).or_else(|| counted(item))?;
                let id = word(item, &["id", "name", "group"])?;
                let name = word(item, &["name"]).filter(|n| *n != id);
                Some((id, name, verdict.to_lowercase()))
            })
            .collect();
        if !rows.is_empty() && rows.len() == items.len() {
            return rows;
        }
    }
    Vec::new()
}

/// The kernel's words for the drops of a report: each step with a
/// `kernelDrop` (a scenario's trace step) of each item of its first list,
/// as `(<item> step <n>, REASON (function))`.
pub fn drops_of(report: &Value) -> Vec<(String, String)> {
    let Some(fields) = report.as_object() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for item in fields.values().filter_map(Value::as_array).flatten() {
        let name = item["name"].as_str().unwrap_or("?");
        for step in item["steps"].as_array().into_iter().flatten() {
            let drop = &step["kernelDrop"];
            if let (Some(reason), Some(function)) =
                (drop["reason"].as_str(), drop["function"].as_str())
            {
                let n = step["step"].as_u64().unwrap_or(0);
                out.push((format!("{name} step {n}"), format!("{reason} ({function})")));
            }
        }
    }
    out
}

/// The verdict of an item that counts instead of saying: `passed` true
/// or false, or `passed` of `probes` (a lab's check group).
fn counted(item: &Value) -> Option<String> {
    if let Some(b) = item["passed"].as_bool() {
        return Some(if b { "pass" } else { "fail" }.into());
    }
    let (passed, probes) = (item["passed"].as_u64()?, item["probes"].as_u64()?);
    Some(if passed == probes { "pass" } else { "fail" }.into())
}

/// The exit code's word, for a command whose report has no checks.
fn code_word(code: i32) -> &'static str {
    use crate::report::exit;
    match u8::try_from(code) {
        Ok(exit::PASS) => "pass",
        Ok(exit::FAIL) => "fail",
        Ok(exit::INCONCLUSIVE) => "inconclusive",
        _ => "error",
    }
}

/// Puts the columns' outputs (none: it did not run there) into rows.
pub fn assemble(command: Vec<String>, columns: Vec<Column>) -> MatrixReport {
    let mut rows: Vec<Row> = Vec::new();
    let n = columns.len();
    for (c, col) in columns.iter().enumerate() {
        let Some(out) = &col.output else { continue };
        let parsed: Option<Value> = serde_json::from_slice(out).ok();
        let mut checks = parsed.as_ref().map(checks_of).unwrap_or_default();
        if checks.is_empty() {
            let code = col.code.unwrap_or(2);
            checks.push((
                "exit".into(),
                Some("the command's exit code".into()),
                code_word(code).into(),
            ));
        }
        for (id, name, verdict) in checks {
            let at = slot(
                &mut rows,
                &id,
                |r| &r.id,
                || Row {
                    id: id.clone(),
                    name,
                    verdicts: vec!["-".into(); n],
                    differs: false,
                },
            );
            rows[at].verdicts[c] = verdict;
        }
    }
    let ran: Vec<usize> = (0..n).filter(|c| columns[*c].output.is_some()).collect();
    for r in &mut rows {
        r.differs = differs(&r.verdicts, &ran);
    }
    let kernel_drops = words(&columns, &ran);
    let failed = rows
        .iter()
        .any(|r| r.verdicts.iter().any(|v| v == "fail" || v == "error"));
    let verdict = if failed {
        "fail"
    } else if ran.len() < n
        || rows
            .iter()
            .any(|r| r.verdicts.iter().any(|v| v == "inconclusive"))
    {
        "inconclusive"
    } else {
        "pass"
    };
    MatrixReport {
        command,
        columns,
        rows,
        kernel_drops,
        verdict: verdict.into(),
    }
}

/// The rows of the kernel's words ([`drops_of`] of each column's report);
/// one differs when two kernels that ran name its drop differently.
fn words(columns: &[Column], ran: &[usize]) -> Vec<WordRow> {
    let n = columns.len();
    let mut rows: Vec<WordRow> = Vec::new();
    for (c, col) in columns.iter().enumerate() {
        let parsed: Option<Value> = col
            .output
            .as_ref()
            .and_then(|o| serde_json::from_slice(o).ok());
        for (id, word) in parsed.as_ref().map(drops_of).unwrap_or_default() {
            let at = slot(
                &mut rows,
                &id,
                |r| &r.id,
                || WordRow {
                    id: id.clone(),
                    words: vec!["-".into(); n],
                    differs: false,
                },
            );
            rows[at].words[c] = word;
        }
    }
    for r in &mut rows {
        r.differs = differs(&r.words, ran);
    }
    rows
}

/// The index of the row `id` names, made with `new` when there is none.
fn slot<R>(
    rows: &mut Vec<R>,
    id: &str,
    id_of: fn(&R) -> &String,
    new: impl FnOnce() -> R,
) -> usize {
    match rows.iter().position(|r| id_of(r) == id) {
        Some(at) => at,
        None => {
            rows.push(new());
            rows.len() - 1
        }
    }
}

/// Whether the kernels that ran (`ran`, column indexes) disagree on a
/// row's cells.
fn differs(cells: &[String], ran: &[usize]) -> bool {
    let first = ran.first().map(|c| &cells[*c]);
    ran.iter().any(|c| Some(&cells[*c]) != first)
}

/// The kernels of `--kernels`, each resolved before anything boots.
pub fn parse_kernels(list: &str) -> Result<Vec<String>, String> {
    let kernels: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .collect();
    if kernels.is_empty() {
        return Err("--kernels needs at least one kernel (6.1,6.12,host)".into());
    }
    for k in &kernels {
        if k != "host" && k.contains('/') && !std::path::Path::new(k).is_file() {
            return Err(format!("--kernels: {k}: no such file"));
        }
    }
    Ok(kernels)
}

impl MatrixReport {
    pub fn table(&self) -> String {
        let heads: Vec<String> = self
            .columns
            .iter()
            .map(|c| c.release.clone().unwrap_or_else(|| c.kernel.clone()))
            .collect();
        let id_w = self
            .rows
            .iter()
            .map(|r| r.id.len())
            .chain(self.kernel_drops.iter().map(|r| r.id.len()))
            .max()
            .unwrap_or(5)
            .max(5);
        let w: Vec<usize> = heads
            .iter()
            .enumerate()
            .map(|(c, h)| {
                let word = self.kernel_drops.iter().map(|r| r.words[c].len()).max();
                h.len().max(12).max(word.unwrap_or(0))
            })
            .collect();
        let mut out = format!("{:<id_w$}  ", "check");
        for (h, w) in heads.iter().zip(&w) {
            out.push_str(&format!("{h:<w$}  "));
        }
        out.push('\n');
        for r in &self.rows {
            out.push_str(&format!("{:<id_w$}  ", r.id));
            for (v, w) in r.verdicts.iter().zip(&w) {
                out.push_str(&format!("{:<w$}  ", v.to_uppercase()));
            }
            if r.differs {
                out.push_str("<- differs between kernels");
            }
            out.push('\n');
        }
        if !self.kernel_drops.is_empty() {
            out.push_str("the kernel's drop reasons (its words; the verdicts are above):\n");
            for r in &self.kernel_drops {
                out.push_str(&format!("{:<id_w$}  ", r.id));
                for (word, w) in r.words.iter().zip(&w) {
                    out.push_str(&format!("{word:<w$}  "));
                }
                if r.differs {
                    out.push_str("<- the kernels' words differ");
                }
                out.push('\n');
            }
        }
        for c in &self.columns {
            let k = c.release.as_deref().unwrap_or(&c.kernel);
            match (&c.error, c.boot_ms, c.total_ms) {
                (Some(e), _, _) => out.push_str(&format!("{k}: INCONCLUSIVE: {e}\n")),
                (None, Some(b), Some(t)) => out.push_str(&format!(
                    "{k}: {} boot to command {:.1} s, all {:.1} s, exit {}\n",
                    c.accel
                        .map(|a| format!("{a:?}"))
                        .unwrap_or_default()
                        .to_uppercase(),
                    b / 1000.0,
                    t / 1000.0,
                    c.code.unwrap_or(-1)
                )),
                _ => out.push_str(&format!("{k}: exit {}\n", c.code.unwrap_or(-1))),
            }
        }
        for r in &self.rows {
            for (v, h) in r.verdicts.iter().zip(&heads) {
                if v == "fail" || v == "error" {
                    out.push_str(&format!("FAIL {} on {h}\n", r.id));
                }
            }
        }
        out.push_str(&format!("matrix: {}\n", self.verdict.to_uppercase()));
        out
    }

    /// JUnit: one case per check and kernel, the kernel in its name.
    pub fn junit(&self) -> junit::Report {
        let mut report = junit::Report::new("cnilab matrix");
        for (c, col) in self.columns.iter().enumerate() {
            let k = col.release.clone().unwrap_or_else(|| col.kernel.clone());
            let mut suite = junit::Suite::new(format!("kernel {k}"));
            if let Some(e) = &col.error {
                suite.cases.push(junit::Case::new(
                    format!("{k}: run"),
                    junit::Outcome::Skipped { message: e.clone() },
                ));
            }
            for r in &self.rows {
                let v = &r.verdicts[c];
                let name = format!("{} [{k}]", r.id);
                let case = match v.as_str() {
                    "fail" | "error" => {
                        junit::Case::failure(name, format!("{} {v} on {k}", r.id), String::new())
                    }
                    "pass" | "warn" => junit::Case::pass(name),
                    _ if col.error.is_some() => continue,
                    other => junit::Case::new(
                        name,
                        junit::Outcome::Skipped {
                            message: other.to_string(),
                        },
                    ),
                };
                suite.cases.push(case.classname(format!("kernel {k}")));
            }
            report.suites.push(suite);
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn the_output_is_switched_to_json_whatever_was_asked() {
        assert_eq!(
            with_json(&s(&["conform", "--only", "A1"])),
            s(&["conform", "--only", "A1", "-o", "json"])
        );
        assert_eq!(
            with_json(&s(&["conform", "-o", "table", "--only", "A1"])),
            s(&["conform", "-o", "json", "--only", "A1"])
        );
        assert_eq!(
            with_json(&s(&["lab", "run", "--output=junit"])),
            s(&["lab", "run", "-o", "json"])
        );
        assert_eq!(
            with_json(&s(&["lab", "run", "-ojunit"])),
            s(&["lab", "run", "-o", "json"])
        );
    }

    fn column(kernel: &str, code: Option<i32>, output: Option<&[u8]>) -> Column {
        let mut c = Column::named(kernel);
        c.code = code;
        c.output = output.map(<[u8]>::to_vec);
        if output.is_none() {
            c.error = Some("no kernel 6.12 in the archive".into());
        }
        c
    }

    #[test]
    fn a_check_that_differs_between_kernels_stands_out_and_fails_the_matrix() {
        let a = br#"{"kind":"ConformReport","checks":[{"id":"A1","name":"add","verdict":"pass"},{"id":"D7","name":"mtu","verdict":"pass"}]}"#;
        let b = br#"{"kind":"ConformReport","checks":[{"id":"A1","name":"add","verdict":"pass"},{"id":"D7","name":"mtu","verdict":"fail"}]}"#;
        let m = assemble(
            s(&["conform"]),
            vec![
                column("6.1", Some(0), Some(a)),
                column("host", Some(1), Some(b)),
            ],
        );
        assert_eq!(m.verdict, "fail");
        let d7 = m.rows.iter().find(|r| r.id == "D7").expect("D7");
        assert!(d7.differs);
        assert_eq!(d7.verdicts, s(&["pass", "fail"]));
        assert!(!m.rows.iter().find(|r| r.id == "A1").expect("A1").differs);
        let table = m.table();
        assert!(table.contains("FAIL D7 on host"), "{table}");
        assert!(table.contains("differs"), "{table}");
        let xml = m.junit().to_xml();
        assert!(
            xml.contains("D7 [host]") && xml.contains("D7 [6.1]"),
            "{xml}"
        );
    }

    /// A scenario that passes on both kernels, whose trace step's drop the
    /// two kernels name differently: the verdict row agrees, the words'
    /// row is marked, and the matrix passes.
    #[test]
    fn the_kernels_words_for_a_drop_are_shown_apart_from_the_verdicts() {
        let report = |reason: &str| {
            format!(
                r#"{{"kind":"ScenarioReport","scenarios":[{{"name":"vx","outcome":"pass","steps":[{{"step":1,"what":"check","ok":true,"detail":""}},{{"step":2,"what":"trace","ok":true,"detail":"","kernelDrop":{{"namespace":"node1","device":"vxlan0","reason":"{reason}","function":"vxlan_xmit"}}}}]}}]}}"#
            )
        };
        let (old, new) = (report("NOT_SPECIFIED"), report("NO_TX_TARGET"));
        let m = assemble(
            s(&["scenario"]),
            vec![
                column("6.1", Some(0), Some(old.as_bytes())),
                column("host", Some(0), Some(new.as_bytes())),
            ],
        );
        assert_eq!(m.verdict, "pass");
        assert!(!m.rows.iter().any(|r| r.differs), "{:?}", m.rows);
        assert_eq!(m.kernel_drops.len(), 1);
        let row = &m.kernel_drops[0];
        assert_eq!(row.id, "vx step 2");
        assert_eq!(
            row.words,
            s(&["NOT_SPECIFIED (vxlan_xmit)", "NO_TX_TARGET (vxlan_xmit)"])
        );
        assert!(row.differs);
        let table = m.table();
        assert!(table.contains("the kernels' words differ"), "{table}");
        assert!(!table.contains("differs between kernels"), "{table}");
    }

    #[test]
    fn a_kernel_that_could_not_run_is_inconclusive_not_a_failure() {
        let a = br#"{"checks":[{"id":"A1","verdict":"pass"}]}"#;
        let m = assemble(
            s(&["conform"]),
            vec![column("6.1", Some(0), Some(a)), column("6.12", None, None)],
        );
        assert_eq!(m.verdict, "inconclusive");
        assert!(
            !m.rows[0].differs,
            "a column that did not run is no difference"
        );
        assert!(
            m.table().contains("INCONCLUSIVE: no kernel 6.12"),
            "{}",
            m.table()
        );
    }

    #[test]
    fn a_lab_reports_groups_are_its_checks() {
        let lab = br#"{"kind":"LabReport","groups":[{"name":"pod-to-pod/same-node","probes":12,"passed":12},{"name":"mtu/df-cross-node","probes":4,"passed":2}]}"#;
        let m = assemble(s(&["lab", "run"]), vec![column("6.1", Some(1), Some(lab))]);
        let verdicts: Vec<(&str, &str)> = m
            .rows
            .iter()
            .map(|r| (r.id.as_str(), r.verdicts[0].as_str()))
            .collect();
        assert_eq!(
            verdicts,
            [
                ("pod-to-pod/same-node", "pass"),
                ("mtu/df-cross-node", "fail")
            ]
        );
    }

    #[test]
    fn a_report_without_checks_is_judged_by_its_exit_code() {
        let m = assemble(
            s(&["lab", "run"]),
            vec![
                column("6.1", Some(0), Some(b"{}")),
                column("host", Some(1), Some(b"not json")),
            ],
        );
        assert_eq!(m.rows.len(), 1);
        assert_eq!(m.rows[0].verdicts, s(&["pass", "fail"]));
        assert_eq!(m.verdict, "fail");
    }
}
