//! What a local device holds of each PG (objects, tombstones, whether it has a member record),
//! from the store itself: for `basalt device pgs`, e.g. to see that a former member still holds
//! a PG's copy until the new members are complete, and forgets it after.

use super::Pgs;
use basalt_types::{DeviceId, PgId};
use serde::{Deserialize, Serialize};

/// One PG on one device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldPg {
    pub pg: PgId,
    pub objects: u64,
    pub tombstones: u64,
    /// The device keeps a member record of the PG.
    pub record: bool,
}

impl Pgs {
    /// Every PG `dev` holds anything of, in PG order; `None` when `dev` is not a device of this
    /// node.
    pub async fn held(
        &self,
        dev: DeviceId,
    ) -> Option<Result<Vec<HeldPg>, basalt_engine::EngineError>> {
        let store = self.store(dev)?;
        Some(store.pgs().await.map(|pgs| {
            let mut out: Vec<HeldPg> = pgs
                .into_iter()
                .filter(|p| p.pg != super::cut::NOTE_PG)
                .map(|p| HeldPg {
                    pg: p.pg,
                    objects: p.objects,
                    tombstones: p.tombstones,
                    record: p.has_record,
                })
                .collect();
            out.sort_by_key(|h| h.pg);
            out
        }))
    }
}
