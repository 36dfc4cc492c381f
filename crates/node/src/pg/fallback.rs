//! Falling back from an authority that was never acknowledged and has no good copy.
//!
//! A peering that cannot reach a member of an interval adopts a version written in it that
//! nothing proves unacknowledged (an acknowledged write must never be dropped on doubt), and
//! later peerings trust it (`authority.rs` rule 2). When that member comes back it proves the
//! version never was acknowledged (`Verdict::fallback`), but the version stays the authority: a
//! client may have read it. If every copy of it fails its checksum, though, no client can read
//! it again, and the object would be unfound although the member holds a good copy of every
//! acknowledged write: peering makes the newest good copy at or past the floor the authority
//! instead, and the holders of the bad version are reset to it before activation like any
//! divergent member (cluster simulation seed 633391).
//!
//! Only when every device the history names from the version's interval on answered (one
//! that did not may hold a good copy that clients read, and would bring it back:
//! `authority.rs::fallback`), and only to a copy a member of that interval holds (a step of
//! the one run of writes its members applied in order; a copy from elsewhere may be a write a
//! peering decided against). The decision is not recorded: a later peering finds the same
//! proof and the same bad copies, and decides alike.

use super::authority::{Auth, Copies, Fallback, Verdict};
use super::{Ctx, Pg};
use basalt_placement::ClusterMap;
use basalt_types::{DeviceId, ObjectId, Version};
use std::collections::BTreeMap;
use std::sync::Arc;

impl Pg {
    /// Falls back, for every object whose authority was never acknowledged (`fallback` set)
    /// and every copy of whose authority on the devices that answered fails its checksum, to the
    /// newest of its candidates that verifies, and files the serving members again by their
    /// copies (`copies` from the sources, `stale_copies` from stale members). An object none of
    /// whose candidates verifies stays as decided (unfound after activation), as does one
    /// whose holder did not answer the search.
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
            let (Some(fallback), Auth::Present { version, .. }) = (&v.fallback, v.auth) else {
                continue;
            };
            if !v.divergent.is_empty() {
                // A member holds a newer copy: `peering.rs::roll_forward` keeps a good one
                // (it holds every acknowledged write, and more), or drops them all, and the
                // next peering falls back.
                continue;
            }
            let mut all = copies[oid].clone();
            all.extend(stale_copies[oid].iter().map(|(d, h)| (*d, *h)));
            let holders: Vec<DeviceId> = all
                .iter()
                .filter(|(_, h)| h.version == version && !h.deleted)
                .map(|(d, _)| *d)
                .collect();
            let search = self.search(ctx, map, &holders, &[], *oid, version).await;
            if search.found.is_some() || search.bad.len() < holders.len() {
                continue;
            }
            let Some(auth) = self.good_candidate(ctx, map, *oid, fallback).await else {
                tracing::error!(pg = %self.id, %oid, %version, floor = %fallback.floor, "every copy of a version never acknowledged fails its checksum, and no copy between it and what its interval's witness holds verifies");
                continue;
            };
            tracing::warn!(pg = %self.id, %oid, from = %version, to = %auth.version(), bad = ?holders,
                "every copy of a version never acknowledged (a peering adopted it while a member of its interval was unreachable) fails its checksum: falling back to the newest good copy holding every acknowledged write");
            v.auth = auth;
            v.place_all(serving, &all);
        }
    }

    /// The newest candidate that verifies (a tombstone holds nothing to fail); absent when
    /// the floor is nothing and none does.
    async fn good_candidate(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        oid: ObjectId,
        fallback: &Fallback,
    ) -> Option<Auth> {
        for &(version, deleted, source) in &fallback.candidates {
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
        (fallback.floor == Version::NONE).then_some(Auth::Absent)
    }
}
