//! The documentation held against the repository: every relative link and
//! `#anchor` in README.md and the book (`docs/src/`) resolves, every
//! `cnilab` subcommand has a page, the README stays a front door, and no
//! tracked text names an issue number or tells the story of a working
//! session. Needs no root.

use clap::CommandFactory;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// The README's line budget.
const README_MAX_LINES: usize = 350;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the harness sits in the workspace")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// README.md and every markdown file of the book.
fn doc_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let root = repo();
    let mut files = vec![root.join("README.md")];
    walk(&root.join("docs/src"), &mut files);
    files.sort();
    files
}

/// The text outside fenced code blocks, line by line (fenced lines blank,
/// so line numbers stay right).
fn prose(text: &str) -> Vec<String> {
    let mut fenced = false;
    text.lines()
        .map(|l| {
            let fence = l.trim_start().starts_with("```");
            if fence {
                fenced = !fenced;
            }
            if fence || fenced {
                String::new()
            } else {
                l.to_string()
            }
        })
        .collect()
}

/// A heading's anchor as GitHub and mdBook make it: link targets and inline
/// code marks dropped, lowercase, only letters, digits, `-` and `_` kept,
/// spaces become `-`.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // `[text](url)` reads as `text`.
    while let Some(open) = rest.find("](") {
        text.push_str(&rest[..open]);
        rest = &rest[open + 2..];
        rest = match rest.find(')') {
            Some(close) => &rest[close + 1..],
            None => "",
        };
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor a markdown file offers (a repeated heading gets `-1`, `-2`, …).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    for line in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim());
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// Inline code spans blanked out (their characters replaced), so that a
/// `](` inside code is not taken for a link; link text that is code stays
/// a link.
fn without_code_spans(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_code = false;
    for c in text.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push('`');
        } else if in_code && c != '\n' {
            out.push('x');
        } else {
            out.push(c);
        }
    }
    out
}

/// `(line, target)` of every inline link `[text](target)` in a markdown file.
fn links(text: &str) -> Vec<(usize, String)> {
    let joined = without_code_spans(&prose(text).join("\n"));
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = joined[from..].find("](") {
        let start = from + at + 2;
        from = start;
        let Some(len) = joined[start..].find([')', ' ', '\n']) else {
            continue;
        };
        if !joined[start + len..].starts_with(')') || len == 0 {
            continue;
        }
        let line = joined[..start].matches('\n').count() + 1;
        out.push((line, joined[start..start + len].to_string()));
    }
    out
}

/// What is wrong with one link of `file`, if anything.
fn broken(file: &Path, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let dest = if path.is_empty() {
        file.to_path_buf()
    } else {
        file.parent().expect("a file's directory").join(path)
    };
    if !dest.exists() {
        return Some(format!("{} does not exist", dest.display()));
    }
    let anchor = anchor?;
    if dest.extension().is_none_or(|e| e != "md") {
        return Some(format!(
            "#{anchor} points into {}, which is no markdown",
            dest.display()
        ));
    }
    let offered = anchors(&read(&dest));
    (!offered.contains(anchor)).then(|| {
        format!(
            "{} has no heading #{anchor} (it has: {})",
            dest.display(),
            offered.into_iter().collect::<Vec<_>>().join(" ")
        )
    })
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut bad = Vec::new();
    let mut checked = 0;
    for file in doc_files() {
        for (line, target) in links(&read(&file)) {
            checked += 1;
            if let Some(why) = broken(&file, &target) {
                bad.push(format!("{}:{line}: ({target}): {why}", file.display()));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} links found: is the parser blind?"
    );
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

#[test]
fn every_subcommand_has_a_page() {
    let root = repo();
    let summary = read(&root.join("docs/src/SUMMARY.md"));
    let book: String = doc_files()
        .iter()
        .filter(|f| f.starts_with(root.join("docs")))
        .map(|f| read(f))
        .collect();
    let cli = cnilab_harness::cli::Cli::command();
    let mut missing = Vec::new();
    let mut seen = 0;
    for sub in cli.get_subcommands().filter(|s| !s.is_hide_set()) {
        seen += 1;
        let name = sub.get_name();
        let page = format!("cli/{name}.md");
        if !root.join("docs/src").join(&page).is_file() {
            missing.push(format!("no page docs/src/{page} for `cnilab {name}`"));
        }
        if !summary.contains(&format!("({page})")) {
            missing.push(format!("SUMMARY.md does not list {page}"));
        }
        for child in sub.get_subcommands().filter(|s| !s.is_hide_set()) {
            let words = format!("{name} {}", child.get_name());
            if !book.contains(&words) {
                missing.push(format!("no page of the book names `cnilab {words}`"));
            }
        }
    }
    assert!(seen >= 10, "only {seen} subcommands found in the CLI");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn the_readme_is_a_front_door() {
    let lines = read(&repo().join("README.md")).lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, over {README_MAX_LINES}: move the detail into docs/src/"
    );
}

fn is_word(c: Option<char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// `\bissues? #?[0-9]{1,3}\b`, case-insensitive.
fn names_an_issue(line: &str) -> bool {
    let lower = line.to_lowercase();
    lower.match_indices("issue").any(|(at, _)| {
        if is_word(lower[..at].chars().next_back()) {
            return false;
        }
        let mut rest = &lower[at + "issue".len()..];
        rest = rest.strip_prefix('s').unwrap_or(rest);
        let Some(rest) = rest.strip_prefix(' ') else {
            return false;
        };
        let rest = rest.strip_prefix('#').unwrap_or(rest);
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        (1..=3).contains(&digits) && !is_word(rest[digits..].chars().next())
    })
}

/// `\b(this|a later|an earlier|the previous|last|earlier) session\b`,
/// case-insensitive.
fn tells_a_session(line: &str) -> bool {
    const BEFORE: [&str; 6] = [
        "this",
        "a later",
        "an earlier",
        "the previous",
        "last",
        "earlier",
    ];
    let lower = line.to_lowercase();
    let word = "session";
    lower.match_indices(word).any(|(at, _)| {
        if is_word(lower[at + word.len()..].chars().next()) {
            return false;
        }
        let Some(head) = lower[..at].strip_suffix(' ') else {
            return false;
        };
        BEFORE.iter().any(|b| {
            head.strip_suffix(b)
                .is_some_and(|h| !is_word(h.chars().next_back()))
        })
    })
}

#[test]
fn the_word_detectors_find_what_they_look_for() {
    assert!(names_an_issue(&format!("as in {} 23, the store", "Issue")));
    assert!(names_an_issue(&format!("({} #7 and 8)", "issues")));
    assert!(!names_an_issue("containernetworking/cni/issues/540"));
    assert!(!names_an_issue("a tissue 5 mm thick"));
    assert!(!names_an_issue("issue 1234 is four digits"));
    assert!(tells_a_session(&format!(
        "measured in a later {}",
        "session"
    )));
    assert!(tells_a_session(&format!("{} Session.", "This")));
    assert!(!tells_a_session(&format!("a later {}s", "session")));
    assert!(!tells_a_session(
        "the session conform, soak and bench share"
    ));
}

/// A line that points at an upstream tracker may name its issue.
fn upstream(line: &str) -> bool {
    line.contains("github.com/") || line.contains("containernetworking#")
}

#[test]
fn no_tracked_text_names_an_issue_or_a_session() {
    let root = repo();
    // The root tests run as root in a checkout another user owns: name it
    // safe for this one command, or git refuses to read it.
    let safe = format!("safe.directory={}", root.display());
    let out = std::process::Command::new("git")
        .args(["-c", safe.as_str(), "ls-files", "--cached", "--others"])
        .args(["--exclude-standard", "-z"])
        .current_dir(&root)
        .output()
        .expect("git ls-files (the test reads the repository's files)");
    assert!(out.status.success(), "git ls-files failed: {out:?}");
    let mut found = Vec::new();
    let mut read_files = 0;
    for name in out.stdout.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = String::from_utf8_lossy(name);
        if name == "Cargo.lock" || name.ends_with("/Cargo.lock") {
            continue;
        }
        let Ok(bytes) = std::fs::read(root.join(&*name)) else {
            continue; // listed but deleted in the work tree
        };
        if bytes.contains(&0) {
            continue;
        }
        read_files += 1;
        for (n, line) in String::from_utf8_lossy(&bytes).lines().enumerate() {
            if (names_an_issue(line) || tells_a_session(line)) && !upstream(line) {
                found.push(format!("{name}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(read_files > 100, "only {read_files} files read");
    assert!(
        found.is_empty(),
        "issue numbers or session words (say what is true now instead):\n{}",
        found.join("\n")
    );
}
