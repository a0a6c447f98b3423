//! The capture script's file split into its header and sections (see
//! `node.sh`): every line that starts with `--<boundary>` opens a section
//! (`--<boundary> <namespace number or -> <what> <status> [<argument>]`)
//! or, as `--<boundary>--`, ends the file; the newline before a boundary
//! line belongs to it, not to the section. A section streamed before its
//! command ended has status `-` and is followed by a section
//! `<what>.status` whose status is its own. Anything else is refused,
//! naming the line: a file cut short, a boundary other than the header's,
//! a section of a namespace never declared.

use std::collections::BTreeMap;

/// The first line of a capture script's file.
pub const MAGIC: &str = "cnilab-node-capture";
/// The format this reader knows.
pub const FORMAT: u32 = 1;

/// One section: the output of one command.
#[derive(Debug)]
pub struct Section {
    /// The namespace's number (`None`: the node as a machine, `-`).
    pub ns: Option<usize>,
    pub what: String,
    pub status: i32,
    pub arg: String,
    pub body: String,
}

impl Section {
    /// How an error names it.
    pub fn label(&self) -> String {
        let ns = self.ns.map_or("-".to_string(), |n| n.to_string());
        let arg = if self.arg.is_empty() {
            String::new()
        } else {
            format!(" {}", self.arg)
        };
        format!("section `{ns} {}{arg}`", self.what)
    }
}

/// The file: header fields and sections in order.
#[derive(Debug)]
pub struct Archive {
    pub header: BTreeMap<String, String>,
    pub sections: Vec<Section>,
}

impl Archive {
    /// The sections of namespace `ns` (`None`: the machine's).
    pub fn of(&self, ns: Option<usize>) -> impl Iterator<Item = &Section> {
        self.sections.iter().filter(move |s| s.ns == ns)
    }

    /// Section `what` of namespace `ns`.
    pub fn get(&self, ns: Option<usize>, what: &str) -> Option<&Section> {
        self.of(ns).find(|s| s.what == what)
    }

    /// A header field, or an error naming it.
    pub fn field(&self, key: &str) -> Result<&str, String> {
        self.header
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| format!("header: no `{key}` line"))
    }
}

/// Splits `text`.
pub fn parse(text: &str) -> Result<Archive, String> {
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or_default().trim_end();
    let version = first
        .strip_prefix(MAGIC)
        .map(str::trim)
        .ok_or_else(|| format!("line 1: {first:?} is not `{MAGIC} {FORMAT}`"))?;
    if version != FORMAT.to_string() {
        return Err(format!(
            "line 1: format {version:?}; this cnilab reads format {FORMAT} (print the script again with `cnilab capture --script`)"
        ));
    }
    let mut header = BTreeMap::new();
    let mut at = first.len() + 1;
    let mut line_no = 1;
    for line in lines.by_ref() {
        line_no += 1;
        if line.starts_with("--") {
            break;
        }
        at += line.len();
        let line = line.trim_end_matches('\n');
        let (k, v) = line.split_once(' ').unwrap_or((line, ""));
        header.insert(k.to_string(), v.to_string());
    }
    let boundary = header
        .get("boundary")
        .filter(|b| b.len() >= 16 && b.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
        .ok_or("header: no `boundary` line of at least 16 letters, digits or dashes")?
        .clone();
    let sections = split(&text[at.min(text.len())..], &boundary, line_no)?;
    Ok(Archive { header, sections })
}

/// The sections of `rest` (from the first boundary line on).
fn split(rest: &str, boundary: &str, first_line: usize) -> Result<Vec<Section>, String> {
    let open = format!("--{boundary} ");
    let close = format!("--{boundary}--");
    let mut sections: Vec<Section> = Vec::new();
    let mut body: Option<String> = None;
    let mut line_no = first_line - 1;
    let mut closed = false;
    for line in rest.split_inclusive('\n') {
        line_no += 1;
        if closed {
            if line.trim().is_empty() {
                continue;
            }
            return Err(format!("line {line_no}: text after the closing boundary"));
        }
        let bare = line.trim_end_matches('\n');
        let boundary_line = bare == close || bare.starts_with(&open);
        if !boundary_line {
            if line.starts_with("--") && body.is_none() {
                return Err(format!(
                    "line {line_no}: {:?} is no section of boundary {boundary}",
                    shorten(bare)
                ));
            }
            match body.as_mut() {
                Some(b) => b.push_str(line),
                None => {
                    return Err(format!(
                        "line {line_no}: {:?} is no section of boundary {boundary}",
                        shorten(bare)
                    ))
                }
            }
            continue;
        }
        if let (Some(mut b), Some(last)) = (body.take(), sections.last_mut()) {
            // The newline before a boundary is the boundary's.
            if b.ends_with('\n') {
                b.pop();
            }
            last.body = b;
        }
        if bare == close {
            closed = true;
            continue;
        }
        sections.push(section_header(&bare[open.len()..], line_no, &sections)?);
        body = Some(String::new());
    }
    if !closed {
        let last = sections
            .last()
            .map_or("the header".to_string(), Section::label);
        return Err(format!(
            "cut short: no closing boundary `--{boundary}--` (the last whole part is {last}); run the script again and copy the whole file"
        ));
    }
    statuses(sections)
}

/// `<ns> <what> <status> [<arg>]`; a namespace's number must be declared
/// by its `namespace` section first (0, the node, needs none).
fn section_header(text: &str, line_no: usize, before: &[Section]) -> Result<Section, String> {
    let mut parts = text.splitn(4, ' ');
    let ns = parts.next().unwrap_or_default();
    let what = parts.next().unwrap_or_default().to_string();
    let status = parts.next().unwrap_or_default();
    let arg = parts.next().unwrap_or_default().to_string();
    let bad = |why: &str| format!("line {line_no}: section `{}`: {why}", shorten(text));
    let ns = match ns {
        "-" => None,
        n => Some(n.parse::<usize>().map_err(|_| bad("no namespace number"))?),
    };
    let plain = |c: char| c.is_ascii_alphanumeric() || "_.-".contains(c);
    if what.is_empty() || !what.chars().all(plain) {
        return Err(bad("no section name"));
    }
    // `-`: told by the `<what>.status` section after it.
    let status = match status {
        "-" => None,
        s => Some(s.parse::<i32>().map_err(|_| bad("no exit status"))?),
    };
    if let Some(n) = ns {
        let declared = n == 0
            || before
                .iter()
                .any(|s| s.ns == Some(n) && s.what == "namespace")
            || what == "namespace";
        if !declared {
            return Err(bad(&format!(
                "namespace {n} was never declared (no `{n} namespace` section before it)"
            )));
        }
        if what == "namespace" && before.iter().any(|s| s.ns == Some(n)) {
            return Err(bad(&format!("namespace {n} is declared twice")));
        }
    }
    Ok(Section {
        ns,
        what,
        status: status.unwrap_or(PENDING),
        arg,
        body: String::new(),
    })
}

/// The status of a section whose `.status` section is still to come.
const PENDING: i32 = i32::MIN;

/// Each `<what>.status` section's status onto its section, which must
/// be the one before it; every section then has one.
fn statuses(sections: Vec<Section>) -> Result<Vec<Section>, String> {
    let mut out: Vec<Section> = Vec::with_capacity(sections.len());
    for s in sections {
        let Some(of) = s.what.strip_suffix(".status") else {
            if let Some(last) = out.last().filter(|l| l.status == PENDING) {
                return Err(format!("{}: no exit status after it", last.label()));
            }
            out.push(s);
            continue;
        };
        match out.last_mut() {
            Some(last) if last.what == of && last.ns == s.ns && last.status == PENDING => {
                last.status = s.status;
            }
            _ => return Err(format!("{}: the status of no section before it", s.label())),
        }
    }
    match out.last().filter(|l| l.status == PENDING) {
        Some(last) => Err(format!("{}: no exit status after it", last.label())),
        None => Ok(out),
    }
}

/// At most 80 characters of `s`, for an error.
fn shorten(s: &str) -> String {
    let mut out: String = s.chars().take(80).collect();
    if s.chars().count() > 80 {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: &str = "cnilab-0123456789abcdef";

    fn file(sections: &str) -> String {
        format!("{MAGIC} 1\nboundary {B}\nhostname n1\n{sections}")
    }

    #[test]
    fn sections_keep_their_text_but_the_boundary_newline() {
        let text = file(&format!(
            "--{B} 0 link - \n[1]\n\n--{B} 0 link.status 0 \n--{B} 1 namespace 0 /run/netns/a\n4:5\n--{B} 1 nft 127 \n\n--{B}--\n"
        ));
        let a = parse(&text).expect("parses");
        assert_eq!(a.field("hostname"), Ok("n1"));
        let bodies: Vec<(&str, &str, &str)> = a
            .sections
            .iter()
            .map(|s| (s.what.as_str(), s.arg.as_str(), s.body.as_str()))
            .collect();
        assert_eq!(
            bodies,
            [
                ("link", "", "[1]\n"),
                ("namespace", "/run/netns/a", "4:5"),
                ("nft", "", "")
            ]
        );
        assert_eq!(a.get(Some(1), "nft").map(|s| s.status), Some(127));
        assert_eq!(a.get(Some(0), "link").map(|s| s.status), Some(0));
        let lost = file(&format!(
            "--{B} 0 link - \n[1]\n--{B} 0 addr 0 \n[]\n--{B}--\n"
        ));
        let e = parse(&lost).expect_err("no status");
        assert!(e.contains("section `0 link`: no exit status"), "{e}");
    }

    #[test]
    fn a_cut_a_foreign_boundary_or_an_undeclared_namespace_is_refused() {
        let cut = file(&format!("--{B} 0 link 0 \n[1]\n"));
        let e = parse(&cut).expect_err("cut");
        assert!(
            e.contains("cut short") && e.contains("section `0 link`"),
            "{e}"
        );
        let other = file(&format!(
            "--{B} 0 link 0 \n[]\n--cnilab-ffffffffffffffff 0 addr 0 \n[]\n--{B}--\n"
        ));
        // Inside a section, another boundary is the section's text; the
        // file is refused for what it lacks, or where a section is due.
        assert!(parse(&other).is_ok());
        let stray = format!("{MAGIC} 1\nboundary {B}\n--cnilab-ffffffffffffffff 0 addr 0 \n");
        let e = parse(&stray).expect_err("stray");
        assert!(e.contains("is no section of boundary"), "{e}");
        let ghost = file(&format!("--{B} 7 link 0 \n[]\n--{B}--\n"));
        let e = parse(&ghost).expect_err("ghost");
        assert!(e.contains("namespace 7 was never declared"), "{e}");
        let e = parse("{\"schemaVersion\": 1}").expect_err("json");
        assert!(e.contains("line 1"), "{e}");
        let e = parse(&format!("{MAGIC} 9\n")).expect_err("newer");
        assert!(e.contains("format \"9\""), "{e}");
    }
}
