//! Cluster-wide settings under [`keys::SETTINGS`]: values an operator changes at runtime
//! (`basalt config set`) and every node follows (a watch on the key). Today: the recovery
//! throttle and the backfill-full limit.
//!
//! A field that is absent (`None`) means "the node's own default" (its `Tuning`).

use crate::catalog::Catalog;
use crate::error::MetaError;
use crate::keys;
use crate::store::Revision;
use serde::{Deserialize, Serialize};

/// The cluster-wide settings record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSettings {
    /// Bytes per second the recovery and backfill driven by one device (the primary's) may
    /// move; 0 = unlimited; `None` = the node's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_bytes_per_sec: Option<u64>,
    /// Percent (1..=100) of the time recovery and backfill driven by one device may keep it
    /// busy; 100 = no limit; `None` = the node's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_share_percent: Option<u8>,
    /// Percent (1..=100) of a device's capacity past which it takes no more backfill (its
    /// placement groups wait on their old devices); `None` = the node's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backfill_full_percent: Option<u8>,
    /// Maintenance (`basalt config set noout on`, Ceph's `noout` flag): the leader marks no
    /// device out for being down longer than the down-out interval, so a planned outage
    /// longer than the interval (a host's reboot, a firmware update) moves no data. Devices
    /// marked out already stay so; an operator's `device out` still works.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub noout: bool,
}

impl ClusterSettings {
    /// Checks the values (a percent outside 1..=100 is refused).
    pub fn validate(&self) -> Result<(), MetaError> {
        for (what, p) in [
            ("recovery share", self.recovery_share_percent),
            ("backfill-full", self.backfill_full_percent),
        ] {
            if let Some(p) = p
                && !(1..=100).contains(&p)
            {
                return Err(MetaError::InvalidSetting(format!(
                    "{what} must be 1% to 100%, not {p}%"
                )));
            }
        }
        Ok(())
    }
}

impl Catalog {
    /// The settings and their revision (defaults and 0 when never written).
    pub async fn get_settings(&self) -> Result<(ClusterSettings, Revision), MetaError> {
        Ok(self
            .read::<ClusterSettings>(keys::SETTINGS)
            .await?
            .map_or((ClusterSettings::default(), 0), |(s, kv)| {
                (s, kv.mod_revision)
            }))
    }

    /// Changes the settings with `f` (compare-and-swap, retried when another writer wins);
    /// invalid results are refused and change nothing.
    pub async fn update_settings(
        &self,
        mut f: impl FnMut(&mut ClusterSettings),
    ) -> Result<ClusterSettings, MetaError> {
        let (settings, _) = self
            .update::<ClusterSettings>(keys::SETTINGS, |cur| {
                let mut next = cur.unwrap_or_default();
                f(&mut next);
                next.validate()?;
                Ok(next)
            })
            .await?;
        Ok(settings)
    }
}
