//! PG-ready reports under [`keys::PG_READY`]: the primary of a PG says it completed the PG on
//! its `up` set (every member of `up` holds the PG's current data), so the leader may make
//! `acting = up`. The leader applies a report only when it names the PG's current `up` set and,
//! when it names one, the PG's current interval; it deletes every report it has considered
//! (applied or stale).
//!
//! Written by a PG's primary once its backfill is done (`node/src/pg/backfill.rs`), and by
//! `basalt pg mark-lost` (an operator's statement that the PG's data is gone, `lost: true`).

use crate::catalog::{Catalog, encode, now_secs};
use crate::error::MetaError;
use crate::keys;
use crate::leader::Leadership;
use crate::store::{Compare, Revision, Txn, TxnOp};
use basalt_types::{DeviceId, Epoch, PgId};
use serde::{Deserialize, Serialize};

/// A report that a PG is complete on `up`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgReadyRecord {
    pub pg: PgId,
    /// The map epoch at which the PG was complete on `up`.
    pub epoch: Epoch,
    /// The `up` set the PG was completed on.
    pub up: Vec<DeviceId>,
    /// The interval of the primary's term that completed it: the report holds only while the
    /// PG's interval is still this one (a newer interval's primary reports again). `None`
    /// (`basalt pg mark-lost`, or a report of an older version): any interval.
    #[serde(default)]
    pub interval: Option<Epoch>,
    /// Written by an operator (`basalt pg mark-lost`): the PG's data is given up for lost.
    #[serde(default)]
    pub lost: bool,
    /// Unix seconds.
    pub at: u64,
}

impl PgReadyRecord {
    pub fn new(pg: PgId, epoch: Epoch, up: Vec<DeviceId>) -> PgReadyRecord {
        PgReadyRecord {
            pg,
            epoch,
            up,
            interval: None,
            lost: false,
            at: now_secs(),
        }
    }

    /// The report, valid only while the PG's interval is `interval`.
    pub fn in_interval(self, interval: Epoch) -> PgReadyRecord {
        PgReadyRecord {
            interval: Some(interval),
            ..self
        }
    }
}

impl Catalog {
    /// Writes (or replaces) the report of `record.pg`.
    pub async fn put_pg_ready(&self, record: &PgReadyRecord) -> Result<Revision, MetaError> {
        self.store()
            .put(&keys::pg_ready(record.pg), encode(record), None)
            .await
    }

    /// Every report, with the revision it was written at (for [`Catalog::remove_pg_ready`]).
    /// Unreadable reports are skipped with a warning (and never applied).
    pub async fn list_pg_ready(&self) -> Result<Vec<(PgReadyRecord, Revision)>, MetaError> {
        let listing = self.store().list(keys::PG_READY).await?;
        let mut out = Vec::new();
        for kv in listing.kvs {
            match crate::catalog::decode::<PgReadyRecord>(&kv.key, &kv.value) {
                Ok(r) if keys::parse_pg_ready(&kv.key) == Some(r.pg) => {
                    out.push((r, kv.mod_revision))
                }
                Ok(_) => tracing::warn!("ignoring {}: it names another PG", kv.key),
                Err(e) => tracing::warn!("ignoring an unreadable PG-ready report: {e}"),
            }
        }
        Ok(out)
    }

    /// Deletes the report of `pg` if it is still the one written at `revision` (a newer one
    /// stays), as the leader that considered it. Returns whether it was deleted; `NotLeader`
    /// once `leadership`'s term is over (a deposed leader that has not noticed yet must not
    /// delete a report its successor has not applied: the PG would wait for its primary to
    /// write it again, `backfill.rs::Pg::report_again`, about 30 s).
    pub async fn remove_pg_ready(
        &self,
        pg: PgId,
        revision: Revision,
        leadership: &Leadership,
    ) -> Result<bool, MetaError> {
        let key = keys::pg_ready(pg);
        let txn = Txn::new()
            .when([
                Compare::mod_revision_is(&key, revision),
                leadership.holds_key(),
            ])
            .and_then([TxnOp::delete(&key)]);
        if self.store().txn(txn).await?.succeeded {
            return Ok(true);
        }
        match self.still_leads(leadership).await? {
            true => Ok(false),
            false => Err(MetaError::NotLeader),
        }
    }
}
