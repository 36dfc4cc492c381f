//! Reading a finished run back, and running short ones: for tests of the bench and for tools
//! that post-process its reports.

use crate::{BenchArgs, BenchError};
use clap::Parser;
use std::path::{Path, PathBuf};

/// One number of a report table: `<td data-step=.. data-metric=.. data-value=..>` in
/// report.html, so every number traces back to `fio/<step>.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct DataCell {
    pub step: String,
    pub metric: String,
    pub value: f64,
}

/// Every numeric cell of a report's HTML tables.
pub fn data_cells(html: &str) -> Vec<DataCell> {
    let attr = |s: &str, name: &str| -> Option<String> {
        let i = s.find(&format!("{name}=\""))? + name.len() + 2;
        Some(s[i..i + s[i..].find('"')?].to_string())
    };
    html.split("<td")
        .skip(1)
        .filter_map(|td| {
            let head = &td[..td.find('>')?];
            Some(DataCell {
                step: attr(head, "data-step")?,
                metric: attr(head, "data-metric")?,
                value: attr(head, "data-value")?.parse().ok()?,
            })
        })
        .collect()
}

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

/// Runs `basalt bench ARGS` with steps of one second and no waiting for a quiet machine,
/// writing to `out` with data under `scratch`; returns the report directory.
pub fn run_short(args: &[&str], out: &Path, scratch: &Path) -> Result<PathBuf, BenchError> {
    let mut v: Vec<String> = vec!["bench".into()];
    v.extend(args.iter().map(|s| s.to_string()));
    let (out, scratch) = (out.display().to_string(), scratch.display().to_string());
    v.extend(
        [
            "--out",
            &out,
            "--scratch",
            &scratch,
            "--runtime",
            "1",
            "--ramp",
            "0.5",
            "--size",
            "64MiB",
            "--quiet-timeout",
            "0",
            "--settle-timeout",
            "0",
            "--attempts",
            "1",
            "--no-progress",
            "--net-seconds",
            "0.3",
        ]
        .map(String::from),
    );
    let cli = Cli::try_parse_from(v).map_err(|e| BenchError::InvalidOption(e.to_string()))?;
    crate::run_to_dir(cli.bench)
}
