//! Stray copies: devices that held a PG before it was recovered elsewhere and were down when
//! its history was compacted (so they could not be told to forget it then) keep their old copy,
//! never served again (peering never asks a device the history does not name). Compaction
//! records them in the history (`PgHistory::strays`); the primary of the clean PG tells each to
//! forget the PG (`Remove`) once it is up, and drops it from the list when it did or when the
//! device left the map. A device the map places the PG on again stays listed but is not told
//! (backfill brings its copy up to date): if the placement moves away again before it served,
//! its old copy is still known and removed then.

use super::messages::PeerMsg;
use super::peering::{ask, entry_of};
use super::{Ctx, Pg};
use basalt_meta::PgHistory;
use basalt_placement::ClusterMap;
use basalt_types::DeviceId;
use std::sync::Arc;

impl Pg {
    /// Tells the history's strays that are up to forget the PG; returns those down (the others
    /// that did not answer stay listed too, for the next pass).
    pub(super) async fn forget_strays(
        self: &Arc<Self>,
        ctx: &Arc<Ctx>,
        generation: u64,
    ) -> Result<Vec<DeviceId>, String> {
        let map = ctx.maps.map();
        let (entry, _) = entry_of(&map, self.id)?;
        let Some((term, _, _)) = self.committed() else {
            return Ok(Vec::new());
        };
        let (history, revision) = ctx
            .catalog
            .get_pg_history(self.id)
            .await
            .map_err(|e| e.to_string())?;
        if history.strays.is_empty() {
            return Ok(Vec::new());
        }
        let (mut left, mut down) = (Vec::new(), Vec::new());
        for &dev in &history.strays {
            if !map.devices.contains_key(&dev) {
                continue;
            }
            if entry.up.contains(&dev) || entry.acting.contains(&dev) {
                left.push(dev);
                continue;
            }
            if !map.is_up(dev) {
                down.push(dev);
            }
            if !map.is_up(dev) || !self.current(generation) {
                left.push(dev);
                continue;
            }
            let msg = PeerMsg::Remove {
                device: dev,
                pg: self.id,
                term,
            };
            match ask(ctx, &map, dev, &msg).await {
                Ok(_) => tracing::info!(pg = %self.id, device = %dev, "a stray copy was forgotten"),
                Err(e) => {
                    tracing::info!(pg = %self.id, device = %dev, "a stray did not forget the PG: {e}");
                    left.push(dev);
                }
            }
        }
        if left != history.strays {
            let updated = PgHistory {
                strays: left.clone(),
                ..history
            };
            ctx.catalog
                .put_pg_history(self.id, &updated, revision)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(down)
    }
}

/// Whether one of `strays` (down when last seen) is up in `map`: the primary tries it at once.
pub(super) fn any_up(map: &ClusterMap, strays: &[DeviceId]) -> bool {
    strays.iter().any(|d| map.is_up(*d))
}
