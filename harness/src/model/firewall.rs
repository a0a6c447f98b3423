//! The firewall of a namespace as the model holds it: the nftables
//! ruleset (which includes iptables-nft) one entry per table, and
//! `iptables-save` text of legacy x_tables where the namespace has any
//! (`/proc/net/ip_tables_names` lists them: read first, so a namespace
//! without legacy tables runs no tool and loads no module) and of the
//! iptables-nft tables (their comments and untranslatable matches). A
//! namespace without any nftables table (one netlink dump says so) runs
//! no `nft`.

use super::{Backend, IptablesSave, LabModel, NftTable};
use cnilab_net::snapshot;
use std::fs::File;

/// `nft -s list ruleset` inside the namespace, one entry per table.
pub(crate) fn read_nft(file: &File) -> Result<Vec<NftTable>, String> {
    use cnilab_net::nft::NftError;
    let args = ["-s", "list", "ruleset"];
    let out = cnilab_net::nft::run(std::path::Path::new("nft"), Some(file), &args, None).map_err(
        |e| match e {
            NftError::Spawn { source, .. } => format!("nft: {source} (is nftables installed?)"),
            NftError::Failed { stderr, .. } => format!("nft list ruleset: {stderr}"),
            other => format!("nft list ruleset: {other}"),
        },
    )?;
    Ok(tables_of(&out))
}

/// `nft -s list ruleset` text, one entry per table.
pub(crate) fn tables_of(ruleset: &str) -> Vec<NftTable> {
    snapshot::nft_tables(ruleset)
        .into_iter()
        .map(|(family, name, text)| NftTable { family, name, text })
        .collect()
}

/// Replaces each nftables table's text in `model` by what nft itself
/// prints after loading it into a throwaway namespace (how the kernel will
/// hold it), so a compiled table compares with a read one.
pub(crate) fn canonical_nft(model: &mut LabModel) -> Result<(), String> {
    for ns in model.namespaces_mut() {
        for table in &mut ns.nftables {
            let scratch = crate::netns::Netns::with_label("nftcanon").map_err(|e| e.to_string())?;
            cnilab_net::nft::load(
                std::path::Path::new("nft"),
                Some(scratch.file()),
                &table.text,
            )
            .map_err(|e| format!("table {} {} of {}: {e}", table.family, table.name, ns.name))?;
            let listed = read_nft(scratch.file())?;
            let mine = listed
                .into_iter()
                .find(|t| t.family == table.family && t.name == table.name)
                .ok_or_else(|| format!("table {} {} not listed", table.family, table.name))?;
            table.text = mine.text;
        }
    }
    Ok(())
}

/// The legacy tables of the calling thread's namespace, per family
/// (`ipv4`, `ipv6`): the names under `/proc/net/ip{,6}_tables_names`.
pub(crate) fn legacy_table_names() -> Vec<(String, Vec<String>)> {
    [("ipv4", "ip_tables_names"), ("ipv6", "ip6_tables_names")]
        .into_iter()
        .filter_map(|(family, file)| {
            // `/proc/net` is the process's namespace; `thread-self` this thread's.
            let text = std::fs::read_to_string(format!("/proc/thread-self/net/{file}")).ok()?;
            legacy_names_of(family, &text)
        })
        .collect()
}

/// The table names of one family's `ip{,6}_tables_names` text (`None`:
/// none).
pub(crate) fn legacy_names_of(family: &str, text: &str) -> Option<(String, Vec<String>)> {
    let names: Vec<String> = text.split_whitespace().map(str::to_string).collect();
    (!names.is_empty()).then(|| (family.to_string(), names))
}

/// The tables iptables-nft makes (`ip filter`, `ip6 nat`, …) among `nft`'s,
/// per family.
pub(crate) fn iptables_nft_names(tables: &[NftTable]) -> Vec<(String, Vec<String>)> {
    const XT: &[&str] = &["filter", "nat", "mangle", "raw", "security"];
    [("ipv4", "ip"), ("ipv6", "ip6")]
        .into_iter()
        .filter_map(|(family, nft_family)| {
            let names: Vec<String> = tables
                .iter()
                .filter(|t| t.family == nft_family && XT.contains(&t.name.as_str()))
                .map(|t| t.name.clone())
                .collect();
            (!names.is_empty()).then(|| (family.to_string(), names))
        })
        .collect()
}

/// `ip[6]tables-{legacy,nft}-save` inside the namespace for each backend
/// and family that has tables (legacy: `legacy`, from
/// [`legacy_table_names`]; nft: the iptables-nft tables among `nft`); a
/// tool that is missing or fails is a warning naming the tables it left
/// unread.
pub(crate) fn read_iptables(
    file: &File,
    legacy: &[(String, Vec<String>)],
    nft: &[NftTable],
) -> (Vec<IptablesSave>, Vec<String>) {
    iptables_with(legacy, nft, |tool| {
        cnilab_net::nft::run(std::path::Path::new(tool), Some(file), &[], None).map_err(|e| match e
        {
            cnilab_net::nft::NftError::Failed { stderr, .. } => stderr,
            other => other.to_string(),
        })
    })
}

/// [`read_iptables`] with `save` running a tool (`iptables-legacy-save`…)
/// in the namespace: its output, or why it failed. The capture script's
/// reader gives what the script's run of the tool printed.
pub(crate) fn iptables_with(
    legacy: &[(String, Vec<String>)],
    nft: &[NftTable],
    mut save: impl FnMut(&str) -> Result<String, String>,
) -> (Vec<IptablesSave>, Vec<String>) {
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    let nft = iptables_nft_names(nft);
    let all = legacy
        .iter()
        .map(|t| (Backend::Legacy, t))
        .chain(nft.iter().map(|t| (Backend::Nft, t)));
    for (backend, (family, tables)) in all {
        let v6 = if family == "ipv6" { "6" } else { "" };
        let tool = format!("ip{v6}tables-{backend}-save");
        match save(&tool) {
            Ok(text) => out.push(IptablesSave {
                backend,
                family: family.clone(),
                text: snapshot::firewall_lines(&text).join("\n"),
            }),
            Err(e) => warnings.push(format!(
                "{backend} {family} iptables tables {} not read as iptables-save text: {tool}: {e}",
                tables.join(",")
            )),
        }
    }
    (out, warnings)
}

/// The families `nft` knows a table by.
pub(crate) const NFT_FAMILIES: &[&str] = &["ip", "ip6", "inet", "arp", "bridge", "netdev"];

/// Why `text` is not a plain nftables table `family name` (`None`: it is).
///
/// A model's table goes to `nft -f -` as root, and a capture is a
/// stranger's file: `nft` reads files for `include`, runs until killed for
/// `monitor`, and changes more than the table for any command beside it
/// (`flush ruleset`). So the text must be exactly one `table <family>
/// <name> { … }` block (the one the entry names), its braces balanced
/// outside strings and comments, and hold no `include`, `define` or `$`
/// variable anywhere: what `nft -s list table` prints, nothing more.
pub(crate) fn nft_table_problem(family: &str, name: &str, text: &str) -> Option<String> {
    if !NFT_FAMILIES.contains(&family) {
        return Some(format!(
            "family {:?} is not one of {}",
            family,
            NFT_FAMILIES.join(", ")
        ));
    }
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-.".contains(c);
    if name.is_empty() || name.len() > 64 || !name.chars().all(plain) {
        return Some(format!("name {:?}: use 1-64 of [A-Za-z0-9_.-]", name));
    }
    let words = match nft_words(text) {
        Ok(w) => w,
        Err(e) => return Some(e),
    };
    let mut depth = 0usize;
    let mut tables = 0usize;
    let mut at = 0;
    while at < words.len() {
        let w = words[at].as_str();
        if matches!(w, "include" | "define" | "redefine" | "undefine") || w.starts_with('$') {
            return Some(format!("holds `{w}`: only a table's own rules are taken"));
        }
        match w {
            "{" => depth += 1,
            "}" if depth == 0 => return Some("a `}` closes nothing".into()),
            "}" => depth -= 1,
            ";" | "\n" => {}
            _ if depth > 0 => {}
            "table" => {
                let header = [words.get(at + 1), words.get(at + 2), words.get(at + 3)];
                let expected = [family, name, "{"];
                let same = header
                    .iter()
                    .zip(expected)
                    .all(|(got, want)| got.is_some_and(|g| g == want));
                if !same || tables > 0 {
                    return Some(format!(
                        "must be the one block `table {family} {name} {{ … }}`"
                    ));
                }
                tables += 1;
                at += 3;
                continue;
            }
            other => {
                return Some(format!(
                    "{:?} outside the table: only `table {family} {name} {{ … }}` is taken",
                    other
                ))
            }
        }
        at += 1;
    }
    match (depth, tables) {
        (0, 1) => None,
        (0, _) => Some(format!("holds no `table {family} {name} {{ … }}`")),
        _ => Some("a `{` is never closed".into()),
    }
}

/// `text` as nft's words: braces, `;` and newlines on their own, quoted
/// strings as one word (quotes kept), `#` comments dropped.
fn nft_words(text: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut chars = text.chars();
    let flush = |word: &mut String, words: &mut Vec<String>| {
        if !word.is_empty() {
            words.push(std::mem::take(word));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                word.push('"');
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\n') | None => return Err("a string is never closed".into()),
                        Some(c) => word.push(c),
                    }
                }
                word.push('"');
            }
            '#' => {
                flush(&mut word, &mut words);
                if chars.by_ref().any(|c| c == '\n') {
                    words.push("\n".into());
                }
            }
            '{' | '}' | ';' | '\n' => {
                flush(&mut word, &mut words);
                words.push(c.to_string());
            }
            c if c.is_whitespace() => flush(&mut word, &mut words),
            c => word.push(c),
        }
    }
    flush(&mut word, &mut words);
    Ok(words)
}

/// Why `text` is not plain `ip[6]tables-save` text (`None`: it is): each
/// line a table (`*filter`), a chain (`:FORWARD ACCEPT [0:0]`), a rule
/// (`-A …`, `-I …`, `-N …`, `-X …`, `-P …`), `COMMIT` or a comment, and no
/// rule that makes the restoring tool open a path (`--object-pinned`, a
/// BPF object by its file).
pub(crate) fn iptables_text_problem(text: &str) -> Option<String> {
    for (k, line) in text.lines().enumerate() {
        let line = line.trim_end();
        let ok = line.is_empty()
            || line == "COMMIT"
            || line.starts_with('#')
            || line.starts_with('*')
            || line.starts_with(':')
            || ["-A ", "-I ", "-N ", "-X ", "-P ", "-F", "-Z"]
                .iter()
                .any(|p| line.starts_with(p));
        if !ok {
            return Some(format!(
                "line {}: {:?} is not a line of iptables-save text",
                k + 1,
                line
            ));
        }
        if line.contains("--object-pinned") {
            return Some(format!(
                "line {}: a rule that reads a file ({:?}) is not taken",
                k + 1,
                line
            ));
        }
    }
    None
}
