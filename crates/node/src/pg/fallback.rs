//! Falling back from an authority that was never acknowledged and has no good copy.
//!
//! A peering that cannot reach a member of an interval adopts a version written in it that
//! nothing proves unacknowledged (an acknowledged write must never be dropped on doubt), and
//! later peerings trust it (`authority.rs` rule 2). When that member comes back it proves the
//! version never was acknowledged (`Verdict::floor`), but the version stays the authority: a
//! client may have read it. If every copy of it fails its checksum, though, no client can read
//! it again, and the object would be unfound although the member holds a good copy of every
//! acknowledged write: peering makes the newest good copy at or past the floor the authority
//! instead, and the holders of the bad version are reset to it before activation like any
//! divergent member (cluster simulation seed 633391).

use super::authority::{Auth, Copies, Verdict};
use super::{Ctx, Pg};
use basalt_placement::ClusterMap;
use basalt_types::{DeviceId, ObjectId, Version};
use std::collections::BTreeMap;
use std::sync::Arc;

impl Pg {
    /// Falls back, for every object whose authority was never acknowledged (`floor` set) and
    /// every copy of whose authority fails its checksum, to its newest good copy at or past the
    /// floor, and files the serving members again by their copies (`copies` from the sources,
    /// `stale_copies` from stale members). An object none of whose candidates verifies stays
    /// as decided (unfound after activation), as does one whose holder did not answer.
    pub(super) async fn fall_back(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        serving: &[DeviceId],
        copies: &BTreeMap<ObjectId, Copies>,
        stale_copies: &BTreeMap<ObjectId, Copies>,
        verdicts: &mut BTreeMap<ObjectId, Verdict>,
    ) {
        for (oid, v) in verdicts.iter_mut() {
            let (Some(floor), Auth::Present { version, .. }) = (v.floor, v.auth) else {
                continue;
            };
            let c = &copies[oid];
            let holders: Vec<DeviceId> = c
                .iter()
                .filter(|(_, h)| h.version == version && !h.deleted)
                .map(|(d, _)| *d)
                .collect();
            let search = self.search(ctx, map, &holders, &[], *oid, version).await;
            if search.found.is_some() || search.bad.len() < holders.len() {
                continue;
            }
            let Some(auth) = self.good_older(ctx, map, c, *oid, floor, version).await else {
                tracing::error!(pg = %self.id, %oid, %version, %floor, "every copy of a version never acknowledged fails its checksum, and no older copy at or past what its interval's witness holds verifies");
                continue;
            };
            tracing::warn!(pg = %self.id, %oid, from = %version, to = %auth.version(), bad = ?holders,
                "every copy of a version never acknowledged (a peering adopted it while a member of its interval was unreachable) fails its checksum: falling back to the newest good copy holding every acknowledged write");
            v.auth = auth;
            let mut all = c.clone();
            all.extend(stale_copies[oid].iter().map(|(d, h)| (*d, *h)));
            v.place_all(serving, &all);
        }
    }

    /// The newest copy in `copies` at or past `floor` and older than `version` that verifies
    /// (a tombstone holds nothing to fail); absent when the floor is nothing and none does.
    async fn good_older(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        copies: &Copies,
        oid: ObjectId,
        floor: Version,
        version: Version,
    ) -> Option<Auth> {
        let mut older: Vec<(Version, bool, DeviceId)> = copies
            .iter()
            .filter(|(_, h)| h.version >= floor && h.version < version)
            .map(|(d, h)| (h.version, h.deleted, *d))
            .collect();
        older.sort_unstable_by(|a, b| b.cmp(a));
        for (version, deleted, source) in older {
            let present = Auth::Present {
                version,
                deleted,
                source,
            };
            if deleted {
                return Some(present);
            }
            let search = self.search(ctx, map, &[source], &[], oid, version).await;
            if search.found.is_some() {
                return Some(present);
            }
        }
        (floor == Version::NONE).then_some(Auth::Absent)
    }
}
