//! PG histories under [`keys::PG_HISTORY`]: for every PG, the intervals that went active since
//! the PG was last recovered (every member of its acting set served and held all of its data),
//! with the devices that were members of each. Peering reads it to know whose data it must see
//! before serving: at least one member of every listed interval, or the PG waits (it may lack
//! acknowledged writes otherwise).
//!
//! Written by the primary that activates an interval (appending it) and by the primary that
//! finds the PG recovered (truncating to the current interval) or clean (recording it), each by
//! compare-and-swap on the record's revision, so two primaries racing through stale maps cannot
//! both succeed.

use crate::catalog::{Catalog, encode};
use crate::error::MetaError;
use crate::keys;
use crate::store::{Compare, Revision, Txn, TxnOp};
use basalt_types::{DeviceId, Epoch, PgId};
use serde::{Deserialize, Serialize};

/// One interval that went active: its epoch and the devices that served it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgInterval {
    pub epoch: Epoch,
    pub members: Vec<DeviceId>,
    /// The round of the interval's latest term that went active: each records itself here
    /// before it serves (absent in records written before this field: 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub round: u64,
    /// Backfill targets (not members) that completed in term `round`: each got every write
    /// that term acknowledged. A later term clears the list before it serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backfilled: Vec<DeviceId>,
}

impl PgInterval {
    /// An interval of `members` at `epoch`, recorded by its term of round `round`.
    pub fn new(epoch: Epoch, members: Vec<DeviceId>, round: u64) -> PgInterval {
        PgInterval {
            epoch,
            members,
            round,
            backfilled: Vec::new(),
        }
    }

    /// Its members and the backfill targets listed complete in it (each may be its witness).
    pub fn devices(&self) -> impl Iterator<Item = DeviceId> + Clone + '_ {
        self.members.iter().chain(&self.backfilled).copied()
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The history of one PG.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgHistory {
    /// Intervals since the PG was last recovered, oldest first; the last is the current one.
    pub intervals: Vec<PgInterval>,
    /// The epoch of the interval in which the PG was last found clean (0: never).
    pub clean: Epoch,
    /// Devices that held the PG before its history was last compacted and have not yet
    /// confirmed forgetting it (they were down then); never sources of data.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub strays: Vec<DeviceId>,
}

impl PgHistory {
    /// The last interval that went active.
    pub fn last(&self) -> Option<&PgInterval> {
        self.intervals.last()
    }

    /// Every device named by an interval: its members and the backfill targets listed complete
    /// in it (they may be needed as its witnesses).
    pub fn devices(&self) -> Vec<DeviceId> {
        let mut all: Vec<DeviceId> = self
            .intervals
            .iter()
            .flat_map(PgInterval::devices)
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }
}

impl Catalog {
    /// The history of `pg` and its revision (0 when there is none yet).
    pub async fn get_pg_history(&self, pg: PgId) -> Result<(PgHistory, Revision), MetaError> {
        Ok(self
            .read::<PgHistory>(&keys::pg_history(pg))
            .await?
            .map_or((PgHistory::default(), 0), |(h, kv)| (h, kv.mod_revision)))
    }

    /// Replaces the history of `pg` if it is still the one read at `revision` (0: none).
    /// Returns the new revision, or [`MetaError::Conflict`] when someone changed it meanwhile.
    pub async fn put_pg_history(
        &self,
        pg: PgId,
        history: &PgHistory,
        revision: Revision,
    ) -> Result<Revision, MetaError> {
        let key = keys::pg_history(pg);
        let txn = Txn::new()
            .when([Compare::mod_revision_is(&key, revision)])
            .and_then([TxnOp::put(&key, encode(history))]);
        let result = self.store().txn(txn).await?;
        if result.succeeded {
            Ok(result.revision)
        } else {
            Err(MetaError::HistoryChanged(pg.to_string()))
        }
    }

    /// Forgets the history of `pg` (its pool was deleted).
    pub async fn remove_pg_history(&self, pg: PgId) -> Result<(), MetaError> {
        self.store().delete(&keys::pg_history(pg)).await.map(|_| ())
    }
}
