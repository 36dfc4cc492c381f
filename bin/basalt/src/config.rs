//! `basalt config get|set|unset`: cluster-wide settings every node follows at runtime
//! (`/basalt/settings` in the metadata store; `crates/meta/src/settings.rs`). Today the
//! recovery throttle, per device driving recovery (`crates/node/src/pg/throttle.rs`):
//! `recovery-rate` (bytes per second, 0 = unlimited) and `recovery-share` (percent of the
//! device's time, 100% = unlimited); `backfill-full` (percent of a device's capacity past
//! which it takes no more backfill: `crates/node/src/pg/replica.rs`); and `noout`
//! (maintenance: no device goes out for being down, `crates/node/src/leader.rs`).

use crate::connect::Common;
use crate::output;
use anyhow::{Context, bail};
use basalt_meta::{Catalog, ClusterSettings};
use basalt_types::size::{format_size, parse_size};
use clap::{Subcommand, ValueEnum};
use serde::Serialize;

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Show the cluster-wide settings (unset ones use each node's default).
    Get {
        #[command(flatten)]
        common: Common,
    },
    /// Change a setting; nodes apply it at once.
    Set {
        key: Key,
        /// recovery-rate: bytes per second, e.g. 64MiB (0 or `unlimited`: no limit);
        /// recovery-share: percent of a device's time, 1% to 100%, e.g. 30%; backfill-full:
        /// percent of a device's capacity, 1% to 100%, e.g. 90%; noout: on or off.
        value: String,
        #[command(flatten)]
        common: Common,
    },
    /// Remove a setting: nodes use their own default again.
    Unset {
        key: Key,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Key {
    /// Bytes per second the recovery and backfill driven by one device may move.
    RecoveryRate,
    /// Percent of the time recovery and backfill may keep a device busy.
    RecoveryShare,
    /// Percent of a device's capacity past which it takes no more backfill (default 90%).
    BackfillFull,
    /// Maintenance: no device is marked out for being down longer than the down-out
    /// interval, so a planned outage moves no data (default off).
    Noout,
}

/// The settings as printed.
#[derive(Serialize)]
struct View {
    /// Bytes per second; null: unset (each node's default).
    recovery_rate: Option<u64>,
    /// Percent; null: unset.
    recovery_share: Option<u8>,
    /// Percent; null: unset.
    backfill_full: Option<u8>,
    /// Devices down past the down-out interval stay in.
    noout: bool,
}

pub async fn run(cmd: ConfigCommand) -> anyhow::Result<()> {
    match cmd {
        ConfigCommand::Get { common } => {
            let catalog = Catalog::new(common.cluster.meta().await?);
            let (s, _) = catalog.get_settings().await?;
            show(&s, common.json)
        }
        ConfigCommand::Set { key, value, common } => {
            let catalog = Catalog::new(common.cluster.meta().await?);
            let s = match key {
                Key::RecoveryRate => {
                    let rate = parse_rate(&value)?;
                    catalog
                        .update_settings(|s| s.recovery_bytes_per_sec = Some(rate))
                        .await?
                }
                Key::RecoveryShare => {
                    let share = parse_percent("recovery-share", &value)?;
                    catalog
                        .update_settings(|s| s.recovery_share_percent = Some(share))
                        .await?
                }
                Key::BackfillFull => {
                    let full = parse_percent("backfill-full", &value)?;
                    catalog
                        .update_settings(|s| s.backfill_full_percent = Some(full))
                        .await?
                }
                Key::Noout => {
                    let on = parse_switch("noout", &value)?;
                    catalog.update_settings(|s| s.noout = on).await?
                }
            };
            show(&s, common.json)
        }
        ConfigCommand::Unset { key, common } => {
            let catalog = Catalog::new(common.cluster.meta().await?);
            let s = catalog
                .update_settings(|s| match key {
                    Key::RecoveryRate => s.recovery_bytes_per_sec = None,
                    Key::RecoveryShare => s.recovery_share_percent = None,
                    Key::BackfillFull => s.backfill_full_percent = None,
                    Key::Noout => s.noout = false,
                })
                .await?;
            show(&s, common.json)
        }
    }
}

fn show(s: &ClusterSettings, json: bool) -> anyhow::Result<()> {
    let view = View {
        recovery_rate: s.recovery_bytes_per_sec,
        recovery_share: s.recovery_share_percent,
        backfill_full: s.backfill_full_percent,
        noout: s.noout,
    };
    if json {
        return output::json(&view);
    }
    let rate = match view.recovery_rate {
        None => "(node default)".to_string(),
        Some(0) => "unlimited".to_string(),
        Some(r) => format!("{}/s", format_size(r)),
    };
    let percent = |p: Option<u8>| match p {
        None => "(node default)".to_string(),
        Some(p) => format!("{p}%"),
    };
    println!("recovery-rate   {rate}");
    println!("recovery-share  {}", percent(view.recovery_share));
    println!("backfill-full   {}", percent(view.backfill_full));
    println!(
        "noout           {}",
        if view.noout {
            "on (devices down past the down-out interval stay in)"
        } else {
            "off"
        }
    );
    Ok(())
}

/// `on`/`off` (also `true`/`false`, `yes`/`no`, `1`/`0`).
fn parse_switch(key: &str, value: &str) -> anyhow::Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => bail!("bad {key} '{value}': give on or off"),
    }
}

/// `64MiB`, `64MiB/s`, `0`, `unlimited`.
fn parse_rate(value: &str) -> anyhow::Result<u64> {
    let v = value.trim();
    if v.eq_ignore_ascii_case("unlimited") {
        return Ok(0);
    }
    let v = v.strip_suffix("/s").unwrap_or(v);
    parse_size(v).with_context(|| {
        format!("bad recovery-rate '{value}': give bytes per second, e.g. 64MiB, or unlimited")
    })
}

/// `30%` or `30`, 1 to 100.
fn parse_percent(key: &str, value: &str) -> anyhow::Result<u8> {
    let v = value.trim();
    let v = v.strip_suffix('%').unwrap_or(v).trim();
    match v.parse::<u8>() {
        Ok(p) if (1..=100).contains(&p) => Ok(p),
        _ => bail!("bad {key} '{value}': give a percent from 1% to 100%, e.g. 30%"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_shares_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_rate("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_rate("64MiB/s").unwrap(), 64 << 20);
        assert_eq!(parse_rate("unlimited").unwrap(), 0);
        assert_eq!(parse_rate("0").unwrap(), 0);
        assert!(parse_rate("fast").is_err());
        assert_eq!(parse_percent("recovery-share", "30%").unwrap(), 30);
        assert_eq!(parse_percent("backfill-full", "100").unwrap(), 100);
        for bad in ["0%", "101%", "-5", "half"] {
            let e = parse_percent("backfill-full", bad).unwrap_err().to_string();
            assert!(
                e.contains("1% to 100%") && e.contains("backfill-full"),
                "{e}"
            );
        }
    }
}
