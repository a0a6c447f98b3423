//! The harness's floors, held against the code: the README's floor table
//! (the one a reader sees) is parsed, every `crate::` path in
//! `harness/src` is resolved to the top-level module it names, and an
//! import from a floor below the importer's (or between two modules of a
//! floor marked `apart`) fails here, with the file and line. A module that
//! the table does not place, or a table entry with no module, fails too, so
//! the table cannot go stale.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One floor of the table: its name, its modules, and whether the modules
/// on it may import each other.
#[derive(Debug)]
struct Floor {
    name: String,
    modules: Vec<String>,
    apart: bool,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// The floor table of `readme`: the first table whose header row is
/// `| floor | modules | within | what |`, top floor first.
fn floors(readme: &str) -> Result<Vec<Floor>, String> {
    let mut lines = readme.lines().skip_while(|l| {
        let cells: Vec<&str> = l.split('|').map(str::trim).collect();
        cells.get(1..5) != Some(&["floor", "modules", "within", "what"][..])
    });
    lines
        .next()
        .ok_or("README.md has no `| floor | modules | within | what |` table")?;
    let mut out = Vec::new();
    for line in lines.skip(1).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, name, modules, within, ..] = cells[..] else {
            return Err(format!("a floor row with too few cells: {line}"));
        };
        let apart = match within {
            "apart" => true,
            "shared" => false,
            other => {
                return Err(format!(
                    "floor {name}: `within` is {other:?}, not apart or shared"
                ))
            }
        };
        let modules: Vec<String> = modules
            .split('`')
            .skip(1)
            .step_by(2)
            .map(|m| m.trim_end_matches('/').trim_end_matches(".rs").to_string())
            .collect();
        if modules.is_empty() {
            return Err(format!("floor {name} names no module"));
        }
        out.push(Floor {
            name: name.to_string(),
            modules,
            apart,
        });
    }
    Ok(out)
}

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read src").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The module path of a source file (`lab/cri/mod.rs` → `lab::cri`).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The code of a line: without a `//` comment (doc comments included) and
/// without string literals, which may mention `crate::` as text.
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut in_str = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_str => {
                chars.next();
            }
            '"' => in_str = !in_str,
            '/' if !in_str && chars.peek() == Some(&'/') => break,
            _ if !in_str => out.push(c),
            _ => {}
        }
    }
    out
}

/// The top-level modules a line of code names, through `crate::x` paths
/// (and `crate::{x, y}` groups) and through `super::` chains that climb
/// out of the file's own top-level module.
fn named_modules(code: &str, module: &[String]) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        // `cnilab_harness::` in main.rs does not start with `crate::`; an
        // identifier ending in `crate` (say `my_crate::`) is not a path root.
        if code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(ident(item.trim()));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 || c != '{' {
                    item.push(c);
                }
            }
            out.push(ident(item.trim()));
        } else {
            out.push(ident(rest));
        }
    }
    for (at, _) in code.match_indices("super::") {
        if code[..at].ends_with("super::") {
            continue;
        }
        let mut rest = &code[at..];
        let mut climbs = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            climbs += 1;
            rest = r;
        }
        // A file's own items are `self`; each `super` climbs one module.
        if climbs >= module.len() {
            out.push(ident(rest));
        }
    }
    out.retain(|m| !m.is_empty() && m != "self");
    out
}

#[test]
fn no_module_imports_from_a_floor_below_its_own() {
    let readme = std::fs::read_to_string(root().join("../README.md")).expect("README.md");
    let floors = floors(&readme).unwrap_or_else(|e| panic!("{e}"));
    let mut floor_of: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, f) in floors.iter().enumerate() {
        for m in &f.modules {
            assert!(
                floor_of.insert(m, i).is_none(),
                "{m} is on two floors of the README's table"
            );
        }
    }
    let src = root().join("src");
    let files = sources(&src);
    let mut seen = std::collections::BTreeSet::new();
    let mut wrong = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let module = module_path(rel);
        let top = module[0].as_str();
        let Some(&mine) = floor_of.get(top) else {
            wrong.push(format!(
                "{}: module {top} is on no floor of the README's table",
                rel.display()
            ));
            continue;
        };
        seen.insert(top.to_string());
        let text = std::fs::read_to_string(file).expect("read source");
        for (n, line) in text.lines().enumerate() {
            for named in named_modules(&code_of(line), &module) {
                if named == top {
                    continue;
                }
                let Some(&theirs) = floor_of.get(named.as_str()) else {
                    continue; // an item of lib.rs itself, not a module
                };
                if theirs > mine || (theirs == mine && floors[mine].apart) {
                    wrong.push(format!(
                        "{}:{}: {top} (floor {}) imports {named} (floor {})",
                        rel.display(),
                        n + 1,
                        floors[mine].name,
                        floors[theirs].name
                    ));
                }
            }
        }
    }
    for m in floor_of.keys() {
        if !seen.contains(*m) {
            wrong.push(format!(
                "the README's floor table names {m}, which is no module"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "the floors do not hold:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_table_is_read_as_written() {
    let table = "x\n| floor | modules | within | what |\n|---|---|---|---|\n\
                 | top | `a.rs` `b/` | shared | t |\n| low | `c/` | apart | l |\n\nafter\n";
    let f = floors(table).expect("parsed");
    assert_eq!(f.len(), 2);
    assert_eq!(f[0].modules, ["a", "b"]);
    assert!(!f[0].apart && f[1].apart);
    assert!(
        floors("| floor | modules | within | what |\n|-|-|-|-|\n| x | `a` | both | y |\n").is_err()
    );
}

#[test]
fn paths_are_resolved_to_their_top_level_module() {
    let m = |s: &str| module_path(Path::new(s));
    assert_eq!(
        named_modules("use crate::lab::x;", &m("trace/walk.rs")),
        ["lab"]
    );
    assert_eq!(
        named_modules("use crate::{model::Link, util};", &m("a.rs")),
        ["model", "util"]
    );
    // Climbing out of trace/walk.rs: super = trace, super::super = the root.
    assert_eq!(
        named_modules("use super::super::lab::X;", &m("trace/walk.rs")),
        ["lab"]
    );
    assert!(named_modules("use super::route;", &m("trace/walk.rs")).is_empty());
    assert!(named_modules(&code_of(r#"let s = "crate::lab"; // crate::x"#), &m("a.rs")).is_empty());
    assert!(named_modules("my_crate::lab", &m("a.rs")).is_empty());
}
