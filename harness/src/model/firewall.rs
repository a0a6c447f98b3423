//! The firewall of a namespace as the model holds it: the nftables
//! ruleset (which includes iptables-nft) one entry per table, and
//! `iptables-save` text of legacy x_tables where the namespace has any
//! (`/proc/net/ip_tables_names` lists them: read first, so a namespace
//! without legacy tables runs no tool and loads no module) and of the
//! iptables-nft tables (their comments and untranslatable matches). A
//! namespace without any nftables table (one netlink dump says so) runs
//! no `nft`.

use super::{IptablesSave, LabModel, NftTable};
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

fn tables_of(ruleset: &str) -> Vec<NftTable> {
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
            let names: Vec<String> = text.split_whitespace().map(str::to_string).collect();
            (!names.is_empty()).then(|| (family.to_string(), names))
        })
        .collect()
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
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    let nft = iptables_nft_names(nft);
    let all = legacy
        .iter()
        .map(|t| ("legacy", t))
        .chain(nft.iter().map(|t| ("nft", t)));
    for (backend, (family, tables)) in all {
        let v6 = if family == "ipv6" { "6" } else { "" };
        let tool = format!("ip{v6}tables-{backend}-save");
        let done = cnilab_net::nft::run(std::path::Path::new(&tool), Some(file), &[], None)
            .map_err(|e| match e {
                cnilab_net::nft::NftError::Failed { stderr, .. } => stderr,
                other => other.to_string(),
            });
        match done {
            Ok(text) => out.push(IptablesSave {
                backend: backend.to_string(),
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
