//! Recovery: objects that serving members lack after peering (they were away while the PG
//! changed) are copied from a device holding the authoritative version, a few at a time, as
//! the recovery throttle allows (`throttle.rs`). Writes to such an object wait until it is
//! recovered (every member must hold the object before it takes a write), reads on the primary
//! too when the primary lacks it; so objects clients wait for are recovered first
//! (`Primary::next_to_recover`), the rest in order.
//!
//! Then the PG settles: members learn how far they are complete (so the next peering compares
//! less), and when every up-set member serves and nothing is missing the PG is clean: its
//! history shrinks to the current interval, tombstones everyone has seen are trimmed, and
//! devices that held the PG before and are no longer needed forget it.

use super::info::MemberInfo;
use super::messages::{ImageKind, ImageMeta, PeerAnswer, PeerMsg};
use super::peering::{ask, entry_of};
use super::throttle::Pass;
use super::{Ctx, Missing, Pg};
use basalt_meta::PgHistory;
use basalt_placement::{ClusterMap, PgMap};
use basalt_types::{DeviceId, ObjectId, Term, Version};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How often an active primary tells its members how far they are complete.
const PUBLISH_COMPLETE: Duration = Duration::from_secs(30);

/// Why one object was not recovered.
struct RecoverFail {
    /// Every source's copy of its authoritative version fails its checksum.
    unfound: bool,
    why: String,
}

impl Pg {
    /// Recovers every missing object (returns when none is left, or the generation ended).
    pub(super) async fn recover(
        self: &Arc<Self>,
        ctx: &Arc<Ctx>,
        generation: u64,
    ) -> Result<(), String> {
        loop {
            if !self.has_missing(generation) {
                return Ok(());
            }
            // Throttled before objects are picked: writes to them wait only while they move.
            let parallel = ctx.tuning.recovery_parallel.max(1);
            let most = u64::from(self.store.info().object_size) * parallel as u64;
            let pass = self.admit(ctx, generation, most).await;
            let picked = {
                let mut st = self.st.lock();
                let same = st.generation == generation;
                let Some(p) = st.primary.as_mut().filter(|_| same) else {
                    ctx.recovery.throttle.spent(pass, 0);
                    return Ok(());
                };
                let picks = p.next_to_recover(parallel);
                for (oid, _) in &picks {
                    p.busy.insert(*oid);
                }
                (p.term, picks)
            };
            let (term, batch) = picked;
            if batch.is_empty() {
                ctx.recovery.throttle.spent(pass, 0);
                return Ok(());
            }
            let map = ctx.maps.map();
            let results = futures::future::join_all(
                batch
                    .iter()
                    .map(|(oid, m)| self.recover_one(ctx, &map, term, *oid, m)),
            )
            .await;
            let (mut moved, mut objects) = (0, 0);
            let mut failure = None;
            {
                let mut st = self.st.lock();
                if st.generation != generation {
                    let moved = results.iter().filter_map(|r| r.as_ref().ok()).sum();
                    ctx.recovery.throttle.spent(pass, moved);
                    return Ok(());
                }
                let p = st.primary.as_mut().expect("same generation");
                for ((oid, _), r) in batch.iter().zip(results) {
                    p.busy.remove(oid);
                    match r {
                        Ok(bytes) => {
                            p.missing.remove(oid);
                            p.unfound.remove(oid);
                            p.recovered_objects += 1;
                            p.recovered_bytes += bytes;
                            moved += bytes;
                            objects += 1;
                        }
                        Err(e) => {
                            if e.unfound && p.unfound.insert(*oid, e.why.clone()).is_none() {
                                tracing::error!(pg = %self.id, %oid, "unfound: {}; its reads and writes fail until it is recovered", e.why);
                            }
                            failure = Some(format!("{oid}: {}", e.why));
                        }
                    }
                    p.release(oid);
                }
            }
            self.changed.notify_waiters();
            ctx.recovery.throttle.spent(pass, moved);
            ctx.recovery.rate.record(objects, moved);
            if let Some(e) = failure {
                return Err(e);
            }
        }
    }

    /// Waits for the recovery throttle, unless a client's read or write waits for a missing
    /// object of this PG (before or while it waits): then recovery is that client's I/O, which
    /// no throttle holds back (charged all the same, so the device's other recovery waits).
    async fn admit(&self, ctx: &Arc<Ctx>, generation: u64, most: u64) -> Pass {
        let throttle = &ctx.recovery.throttle;
        let waited = self.client_waits.notified();
        tokio::pin!(waited);
        waited.as_mut().enable();
        if self.clients_wait(generation) {
            return throttle.admit_now(self.dev, most);
        }
        tokio::select! {
            pass = throttle.admit(self.dev, most) => pass,
            _ = waited => throttle.admit_now(self.dev, most),
        }
    }

    /// Whether a client's read or write waits for a missing object of this generation.
    fn clients_wait(&self, generation: u64) -> bool {
        let st = self.st.lock();
        let waits = |p: &super::Primary| {
            let live = |w: &Vec<tokio::sync::oneshot::Sender<()>>| w.iter().any(|t| !t.is_closed());
            p.waiters
                .iter()
                .any(|(o, w)| p.missing.contains_key(o) && live(w))
        };
        st.generation == generation && st.primary.as_ref().is_some_and(waits)
    }

    /// Whether objects are left to recover in `generation`.
    fn has_missing(&self, generation: u64) -> bool {
        let st = self.st.lock();
        st.generation == generation && st.primary.as_ref().is_some_and(|p| !p.missing.is_empty())
    }

    /// Copies one object's authoritative image to every member that needs it; returns the bytes
    /// moved.
    async fn recover_one(
        &self,
        ctx: &Arc<Ctx>,
        map: &basalt_placement::ClusterMap,
        term: Term,
        oid: ObjectId,
        m: &Missing,
    ) -> Result<u64, RecoverFail> {
        let failed = |why: String| RecoverFail {
            unfound: false,
            why,
        };
        let (meta, data) = if m.deleted {
            let meta = ImageMeta {
                version: m.version,
                kind: ImageKind::Tombstone,
                allocated: Vec::new(),
            };
            (meta, Bytes::new())
        } else {
            self.good_image(ctx, map, term, &m.sources, &[], oid, m.version)
                .await
                .map_err(|e| RecoverFail {
                    unfound: e.every_copy_bad,
                    why: e.why,
                })?
        };
        if meta.version != m.version {
            return Err(failed(format!(
                "the source holds {} instead of {}",
                meta.version, m.version
            )));
        }
        for dev in &m.need {
            self.put(ctx, map, *dev, term, oid, meta.clone(), data.clone())
                .await
                .map_err(failed)?;
        }
        Ok(data.len() as u64 * m.need.len() as u64)
    }

    /// After recovery and backfill: members learn how far they are complete; a clean PG trims
    /// tombstones. Then keeps members' completeness current while the generation lasts.
    pub(super) async fn settle(self: &Arc<Self>, ctx: &Arc<Ctx>, generation: u64) {
        let mut cleaned = false;
        let mut trimmed = Version::NONE;
        // Stray holders that were down when last told to forget the PG (`strays.rs`).
        let mut strays = Vec::new();
        let mut first = true;
        loop {
            if !self.current(generation) {
                return;
            }
            if !std::mem::take(&mut first)
                && let Err(e) = self.report_again(ctx, generation).await
            {
                tracing::warn!(pg = %self.id, "reporting the PG ready again: {e}");
            }
            if let Err(e) = self.publish_complete(ctx, generation).await {
                tracing::warn!(pg = %self.id, "telling members how far they are complete: {e}");
            }
            if !cleaned {
                match self.clean(ctx, generation, &mut trimmed).await {
                    Ok(c) => cleaned = c,
                    Err(e) => tracing::warn!(pg = %self.id, "cleaning: {e}"),
                }
            } else if let Err(e) = self.trim(ctx, &mut trimmed).await {
                tracing::warn!(pg = %self.id, "trimming tombstones: {e}");
            }
            if cleaned {
                match self.forget_strays(ctx, generation).await {
                    Ok(down) => strays = down,
                    Err(e) => {
                        // Tried again at the next pass, not whenever a listed stray is up
                        // (that would retry in a loop while the metadata store fails).
                        strays.clear();
                        tracing::warn!(pg = %self.id, "stray copies: {e}");
                    }
                }
            }
            let deadline = Instant::now() + PUBLISH_COMPLETE;
            while Instant::now() < deadline && self.current(generation) {
                self.wait_change().await;
                if super::strays::any_up(&ctx.maps.map(), &strays) {
                    break;
                }
            }
        }
    }

    /// Everything written before the oldest write still in flight is on every member: the
    /// term, that version, and the members (this device included).
    pub(super) fn committed(&self) -> Option<(Term, Version, Vec<DeviceId>)> {
        let st = self.st.lock();
        let p = st.primary.as_ref()?;
        if !p.missing.is_empty() || p.status != super::Status::Active {
            return None;
        }
        let upto = p.committed_upto()?;
        let mut devs: Vec<DeviceId> = p.members.iter().map(|m| m.dev).collect();
        devs.push(self.dev);
        Some((p.term, upto, devs))
    }

    /// The current term, if `entry` (the PG in `map`) is still the term's interval with every
    /// acting device up and a member of the term, and nothing is missing: then every acting
    /// device holds every acknowledged write, which is what compacting the history and
    /// cleaning rest on. A map newer than the term can bring back a device that was down
    /// through it (a new interval, which the PG has yet to peer): judged by that map alone,
    /// the term looked whole although the returning device lacks all it missed (seen: the
    /// history compacted to the term's interval, the returning device no longer a source and
    /// its PG stuck; with deletes in the term, tombstones trimmed it still needed).
    pub(super) fn whole(&self, map: &ClusterMap, entry: &PgMap) -> Option<Term> {
        let (term, _, mut members) = self.committed()?;
        let mut serving: Vec<DeviceId> = map.serving(entry).collect();
        if entry.since != term.interval || serving.len() != entry.acting.len() {
            return None;
        }
        members.sort_unstable();
        serving.sort_unstable();
        (members == serving).then_some(term)
    }

    async fn publish_complete(
        self: &Arc<Self>,
        ctx: &Arc<Ctx>,
        generation: u64,
    ) -> Result<(), String> {
        let Some((term, complete, devs)) = self.committed() else {
            return Ok(());
        };
        let readable = self
            .st
            .lock()
            .primary
            .as_ref()
            .is_some_and(|p| p.term == term && p.members_readable());
        let map = ctx.maps.map();
        for dev in devs {
            if !self.current(generation) {
                return Ok(());
            }
            let info = MemberInfo {
                les: term.interval,
                last_complete: complete,
                backfill: None,
                activated: term.interval,
                suspect: false,
            };
            let msg = PeerMsg::Activate {
                device: dev,
                pg: self.id,
                term,
                info,
                readable,
            };
            match ask(ctx, &map, dev, &msg).await? {
                PeerAnswer::Done => {}
                other => return Err(format!("{dev} answered {other:?}")),
            }
        }
        let mut st = self.st.lock();
        if st.generation == generation
            && let Some(p) = st.primary.as_mut().filter(|p| p.term == term)
        {
            p.members_complete = true;
        }
        Ok(())
    }

    /// Once every acting member serves and nothing is missing, every serving member holds
    /// every acknowledged write: the history shrinks to the current interval (older intervals
    /// need no witness any more, and devices last activated before it stop counting as sources
    /// of data), and devices of the old intervals that the PG is no longer placed on forget it.
    pub(super) async fn compact(
        self: &Arc<Self>,
        ctx: &Arc<Ctx>,
        generation: u64,
    ) -> Result<(), String> {
        let map = ctx.maps.map();
        let (entry, _) = entry_of(&map, self.id)?;
        let Some(term) = self.whole(&map, &entry) else {
            return Ok(());
        };
        if !self.current(generation) {
            return Ok(());
        }
        let (history, revision) = ctx
            .catalog
            .get_pg_history(self.id)
            .await
            .map_err(|e| e.to_string())?;
        let Some(current) = history.last().filter(|l| l.epoch == term.interval).cloned() else {
            return Ok(());
        };
        if history.intervals.len() == 1 {
            return Ok(());
        }
        let former: Vec<DeviceId> = history
            .devices()
            .into_iter()
            .filter(|d| !entry.acting.contains(d) && !entry.up.contains(d))
            .collect();
        let mut strays = history.strays.clone();
        strays.extend(former);
        strays.sort_unstable();
        strays.dedup();
        let compacted = PgHistory {
            intervals: vec![current],
            clean: history.clean,
            strays,
        };
        ctx.catalog
            .put_pg_history(self.id, &compacted, revision)
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(pg = %self.id, %term, "recovered: history compacted to the current interval");
        // The former holders forget the PG now or, those down, when they are up again.
        self.forget_strays(ctx, generation).await?;
        Ok(())
    }

    /// If the PG is clean (its up set is its acting set, every member serves, nothing is
    /// missing): records it, and trims tombstones every member has (no device that could hold
    /// an older copy of a deleted object counts as a source any more). Returns whether it was
    /// clean.
    async fn clean(
        self: &Arc<Self>,
        ctx: &Arc<Ctx>,
        generation: u64,
        trimmed: &mut Version,
    ) -> Result<bool, String> {
        let map = ctx.maps.map();
        let (entry, _) = entry_of(&map, self.id)?;
        let Some(term) = self.whole(&map, &entry) else {
            return Ok(false);
        };
        if entry.acting != entry.up || !self.current(generation) {
            return Ok(false);
        }
        self.compact(ctx, generation).await?;
        let (history, revision) = ctx
            .catalog
            .get_pg_history(self.id)
            .await
            .map_err(|e| e.to_string())?;
        if history.intervals.len() != 1 || history.last().is_none_or(|l| l.epoch != term.interval) {
            return Ok(false);
        }
        if history.clean != term.interval {
            let marked = PgHistory {
                clean: term.interval,
                ..history
            };
            ctx.catalog
                .put_pg_history(self.id, &marked, revision)
                .await
                .map_err(|e| e.to_string())?;
        }
        self.trim(ctx, trimmed).await?;
        {
            let mut st = self.st.lock();
            if st.generation == generation
                && let Some(p) = st.primary.as_mut()
            {
                p.clean = true;
            }
        }
        tracing::info!(pg = %self.id, %term, "clean");
        Ok(true)
    }
}

impl Pg {
    /// On a clean PG (every member serves and has every committed write): tells every member to
    /// forget tombstones up to the committed version, when it moved past `trimmed`.
    async fn trim(self: &Arc<Self>, ctx: &Arc<Ctx>, trimmed: &mut Version) -> Result<(), String> {
        let Some((term, complete, devs)) = self.committed() else {
            return Ok(());
        };
        if complete <= *trimmed {
            return Ok(());
        }
        let map = ctx.maps.map();
        for dev in devs {
            let msg = PeerMsg::Trim {
                device: dev,
                pg: self.id,
                term,
                upto: complete,
            };
            ask(ctx, &map, dev, &msg).await?;
        }
        *trimmed = complete;
        Ok(())
    }
}
