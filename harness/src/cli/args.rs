//! Flag groups shared by several subcommands (flattened with
//! `#[command(flatten)]`).

use crate::report::Format;
use crate::util::parse_duration;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use std::path::PathBuf;
use std::time::Duration;

/// The plugin under test and how it is called.
#[derive(clap::Args, Clone, Debug)]
pub struct PluginArgs {
    /// Directory (or colon-separated list, like CNI_PATH) with the plugin binaries.
    #[arg(long)]
    pub plugin_dir: String,
    /// Network config (.conf or .conflist). Its ipam.dataDir is replaced by a scratch directory.
    #[arg(long)]
    pub config: PathBuf,
    /// Container interface name.
    #[arg(long, default_value = "eth0")]
    pub ifname: String,
    /// Timeout of each plugin call (30s, 2m; a bare number is seconds).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
}

fn table_or_json() -> impl TypedValueParser<Value = Format> {
    PossibleValuesParser::new(["table", "json"]).map(|s| {
        if s == "json" {
            Format::Json
        } else {
            Format::Table
        }
    })
}

/// `-o table|json` for commands whose result is not a list of checks.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct OutputArgs {
    /// Output format on stdout.
    #[arg(short = 'o', long = "output", visible_alias = "format", value_name = "FORMAT",
          default_value = "table", value_parser = table_or_json())]
    pub output: Format,
}

/// `-o table|json|junit` for commands whose result is a list of checks.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct CheckOutputArgs {
    /// Output format on stdout (junit: JUnit XML).
    #[arg(short = 'o', long = "output", visible_alias = "format", value_name = "FORMAT",
          value_enum, default_value_t = Format::Table)]
    pub output: Format,
}
