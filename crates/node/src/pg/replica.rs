//! The member side: sub-operations and peering messages from a PG's primary.
//!
//! Rules a member keeps (docs/design/replication.md):
//! - it applies a sub-operation only if it belongs to the interval the member was activated in
//!   and no newer peering has asked it since (`promised`): a deposed primary gets no acks;
//! - sub-operations are handed to the store in the order they arrive (the connection's read
//!   loop calls [`Pgs::rep`] before decoding the next frame), so every member applies a PG's
//!   writes to one object in the primary's order;
//! - a sub-operation sent behind an earlier write to its object is applied only onto that
//!   write's version (`RepOp::prior`): where the earlier one failed, this one fails too, and no
//!   copy ends at the primary's version without every write to it;
//! - what it reports to a peering primary is durable first (the store is flushed).

use super::Pgs;
use super::info::MemberInfo;
use super::messages::{Held, Holding, ImageMeta, ObjectDigest, PeerAnswer, PeerMsg};
use crate::error::engine_to_wire;
use basalt_engine::{EngineError, Pending, WriteOptions};
use basalt_proto::{ErrorCode, RepKind, RepOp, Response, ResponseFuture, WireError};
use basalt_types::{DeviceId, Epoch, NodeId, PgId, Term, Version};
use bytes::Bytes;

fn refused(code: ErrorCode, msg: impl Into<String>) -> WireError {
    WireError::new(code, msg)
}

/// What the refusal of a backfill copy by a device used past the backfill-full limit says
/// (`backfill.rs` recognizes it in the answer).
pub(crate) const BACKFILL_FULL: &str = "is backfill-full";

impl Pgs {
    /// Applies a sub-operation: checked and handed to the store now (arrival order), answered
    /// once it is durable.
    pub fn rep(&self, op: RepOp) -> ResponseFuture {
        let (pg, term) = (self.existing(op.device, op.pg), op.term);
        let submitted = self.submit_rep(op);
        Box::pin(async move {
            let pending = submitted?;
            if let Err(e) = pending.await {
                // The primary ends the term; until then this copy may lack a write the others
                // hold: it answers no more reads of its own in this term (`replica_read.rs`).
                if let Some(pg) = pg {
                    let mut st = pg.st.lock();
                    if st.readable == Some(term) {
                        st.readable = None;
                    }
                    st.spoiled = st.spoiled.max(Some(term));
                }
                return Err(engine_to_wire(e));
            }
            Ok(Response::RepDone)
        })
    }

    fn submit_rep(&self, op: RepOp) -> Result<Pending<Version>, WireError> {
        let store = self.store(op.device).ok_or_else(|| {
            refused(
                ErrorCode::InvalidArgument,
                format!("{} is not a device of this node", op.device),
            )
        })?;
        let pg = self.get(op.device, op.pg).expect("the store exists");
        let mut st = pg.st.lock();
        if op.term != st.accepting || op.term != st.promised {
            return Err(refused(
                ErrorCode::StaleEpoch,
                format!(
                    "{} on {} accepts term {} (promised {}), not {}",
                    op.pg, op.device, st.accepting, st.promised, op.term
                ),
            ));
        }
        let opts = WriteOptions {
            durable: true,
            version: Some(op.version),
            pg: op.pg.pg,
            pending: false,
            // Not onto a copy where the write it follows failed (`Primary::tails`).
            prior: (op.prior != Version::NONE).then_some(op.prior),
            keep_since: None,
        };
        if op.committed > st.committed {
            st.committed = op.committed;
        }
        // Submitted under the PG's lock: a peering query cannot slip in between the check and
        // the store seeing the write (the query flushes the store after promising).
        let pending = match op.kind {
            RepKind::Write { offset } => store.submit_write(op.oid, offset, op.data, opts),
            RepKind::Zeroes { offset, len } => store.submit_write_zeroes(op.oid, offset, len, opts),
            RepKind::Delete => store.submit_delete(op.oid, opts),
        };
        drop(st);
        Ok(pending)
    }

    /// Answers a peering or recovery message for one of this node's devices.
    pub async fn peer(
        &self,
        msg: PeerMsg,
        payload: Bytes,
    ) -> Result<(PeerAnswer, Bytes), WireError> {
        let dev = msg.device();
        let store = self.store(dev).cloned().ok_or_else(|| {
            refused(
                ErrorCode::InvalidArgument,
                format!("{dev} is not a device of this node"),
            )
        })?;
        let e = engine_to_wire;
        let done = |a: PeerAnswer| Ok((a, Bytes::new()));
        match msg {
            PeerMsg::Query {
                pg,
                term,
                epoch,
                from,
                ..
            } => {
                self.leases_before_promise(epoch, from).await?;
                if let Some(newer) = self.promise(dev, pg, term) {
                    return done(PeerAnswer::Promised(newer));
                }
                // What was submitted before the promise is applied and durable before it is
                // reported (a sub-operation of an older term still waiting in the store must
                // not land after the report: `engine/settle.rs`).
                store.settle().await.map_err(e)?;
                done(PeerAnswer::Holding(self.holding(dev, pg).await?))
            }
            PeerMsg::Log {
                pg, since, limit, ..
            } => match store.list_since(pg, since, limit).await {
                Ok(entries) => done(PeerAnswer::Log {
                    entries: entries.iter().map(Held::from).collect(),
                    trimmed: None,
                }),
                Err(EngineError::LogTrimmed { tail, .. }) => done(PeerAnswer::Log {
                    entries: Vec::new(),
                    trimmed: Some(tail),
                }),
                Err(other) => Err(e(other)),
            },
            PeerMsg::Versions { oids, .. } => {
                let mut out = Vec::with_capacity(oids.len());
                for oid in oids {
                    out.push(
                        store
                            .object_info(oid)
                            .await
                            .map_err(e)?
                            .as_ref()
                            .map(Held::from),
                    );
                }
                done(PeerAnswer::Versions { held: out })
            }
            PeerMsg::List {
                pg, after, limit, ..
            } => {
                let page = store.list(pg, after, limit).await.map_err(e)?;
                done(PeerAnswer::List {
                    entries: page.iter().map(Held::from).collect(),
                })
            }
            PeerMsg::Get { oid, .. } => {
                let (meta, data) = ImageMeta::of(store.read_object(oid).await.map_err(e)?);
                Ok((PeerAnswer::Image(meta), data))
            }
            PeerMsg::Salvage { oid, .. } => {
                let salvage = store.read_object_salvage(oid).await.map_err(e)?;
                let (image, data) = ImageMeta::of(salvage.image);
                let bad_blocks = salvage.bad_blocks;
                Ok((PeerAnswer::Salvaged { image, bad_blocks }, data))
            }
            PeerMsg::Digest { oid, .. } => {
                let (meta, data) = ImageMeta::of(store.read_object(oid).await.map_err(e)?);
                done(PeerAnswer::Digest(ObjectDigest::of(&meta, &data)))
            }
            PeerMsg::Put {
                pg,
                term,
                oid,
                image,
                ..
            } => {
                let p = self.get(dev, pg).expect("the store exists");
                let backfill = p.st.lock().info.backfill.is_some();
                let _room = backfill
                    .then(|| self.room_for_backfill(dev, &store))
                    .transpose()?;
                let opts = WriteOptions::durable().in_pg(pg.pg);
                p.submit_install(term, oid, image.into_image(payload), opts)?
                    .await
                    .map_err(e)?;
                done(PeerAnswer::Done)
            }
            PeerMsg::Purge { pg, term, oid, .. } => {
                let p = self.get(dev, pg).expect("the store exists");
                p.submit_purge(term, oid)?.await.map_err(e)?;
                done(PeerAnswer::Done)
            }
            PeerMsg::Activate {
                pg,
                term,
                info,
                readable,
                ..
            } => {
                self.check_term(dev, pg, term)?;
                self.check_queried(dev, pg)?;
                self.persist(dev, pg, info, Some(term)).await?;
                self.set_readable(dev, pg, term, readable, info.last_complete);
                done(PeerAnswer::Done)
            }
            PeerMsg::Remove { pg, term, .. } => {
                self.check_term(dev, pg, term)?;
                self.check_not_placed(dev, pg)?;
                self.remove(dev, pg, term).await?;
                done(PeerAnswer::Done)
            }
            PeerMsg::Commit { pg, term, upto, .. } => {
                let p = self.get(dev, pg).expect("the store exists");
                let mut st = p.st.lock();
                if term == st.accepting && term == st.promised && upto > st.committed {
                    st.committed = upto;
                }
                done(PeerAnswer::Done)
            }
            PeerMsg::Trim { pg, term, upto, .. } => {
                self.check_term(dev, pg, term)?;
                store.trim_log(pg, upto).await.map_err(e)?;
                done(PeerAnswer::Done)
            }
        }
    }

    /// Before promising a term to a primary at map `epoch` on node `from`: waits until this
    /// node's map is at that epoch and no read lease this node granted at an older epoch still
    /// runs to another node (`readlease.rs`): a deposed primary whose map lags must not answer
    /// reads once the new term may acknowledge writes. The wait is bounded well below the
    /// primary's peer timeout (an answer it no longer waits for helps nobody): past it the
    /// query is refused (`Busy`) and the primary asks again in its next round.
    async fn leases_before_promise(
        &self,
        epoch: Epoch,
        from: Option<NodeId>,
    ) -> Result<(), WireError> {
        let leases = &self.ctx.leases;
        if !leases.enabled() {
            // Off here now, yet the process before may have granted leases (a restart with
            // heartbeats off after a crash): no promise while one may still run.
            let left = leases.restart_wait();
            if left.is_zero() {
                return Ok(());
            }
            return Err(refused(
                ErrorCode::Busy,
                format!(
                    "not promising yet: a read lease the previous process of this node granted \
                     may still run ({} ms)",
                    left.as_millis()
                ),
            ));
        }
        let limit = leases.length().min(self.ctx.peers.timeout / 2);
        let wait = async {
            let mut epochs = self.ctx.maps.subscribe();
            let _ = epochs.wait_for(|e| *e >= epoch).await;
            leases.wait_grants_before(epoch, from).await;
        };
        if tokio::time::timeout(limit, wait).await.is_err() {
            return Err(refused(
                ErrorCode::Busy,
                format!(
                    "not promising yet: at map epoch {} (the primary's: {epoch}), or a read \
                     lease granted at an older epoch still runs",
                    self.ctx.maps.epoch()
                ),
            ));
        }
        Ok(())
    }

    /// A device used past the backfill-full limit takes no more backfill copies: the rest of
    /// it stays for writes to the placement groups it serves (`NoSpace`; the PG keeps its old
    /// devices and its primary tries again later). Copies accepted and not yet installed count
    /// as used, a slot each (the returned reservation holds until the install ends, or until
    /// the request is dropped), so copies of many PGs at once pass the limit by about one
    /// object.
    fn room_for_backfill(
        &self,
        dev: DeviceId,
        store: &basalt_engine::Store,
    ) -> Result<Reserved<'_>, WireError> {
        let bytes = u64::from(store.info().object_size);
        let limit = self.ctx.recovery.throttle.limits().backfill_full_percent;
        let s = store.stats();
        let mut inflight = self.backfill_inflight.lock();
        let pending = inflight.entry(dev).or_insert(0);
        let used = basalt_types::size::percent(s.used_bytes + *pending, s.capacity_bytes);
        if used < u64::from(limit) {
            *pending = pending
                .checked_add(bytes)
                .expect("bytes in flight fit in u64");
            return Ok(Reserved {
                inflight: &self.backfill_inflight,
                dev,
                bytes,
            });
        }
        Err(refused(
            ErrorCode::NoSpace,
            format!(
                "{dev} {BACKFILL_FULL}: {used}% used, backfill stops at {limit}% (`basalt config \
                 set backfill-full`); the placement group stays on its old devices"
            ),
        ))
    }

    /// A primary peers in `term`: refuse older terms from now on. Returns the newer term this
    /// member promised already, if any (the query is refused).
    fn promise(&self, dev: DeviceId, pg: PgId, term: Term) -> Option<Term> {
        let p = self.get(dev, pg).expect("the store exists");
        let mut st = p.st.lock();
        if term < st.promised {
            return Some(st.promised);
        }
        st.promised = term;
        st.queried = true;
        drop(st);
        // A primary of this device in an older term stops serving at once.
        p.changed.notify_waiters();
        None
    }

    /// A member takes an activation only from a primary that queried it since it was loaded
    /// (this process's start): its promises are kept in memory only, so a restarted member has
    /// forgotten the newer term it promised, and would otherwise take an activation of an older
    /// term of its interval from a deposed primary (one whose map lags, still telling members
    /// how far they are complete every 30 s) and apply that term's writes again, which the new
    /// primary, activating it with answers from before the restart, never sees (found by a
    /// review, 2026-11-29). Also, for a suspect member (`info.rs`), a primary that never saw
    /// it suspect would clear the mark or raise its `last_complete` past the writes it lost.
    /// The primary peers again (its query then comes first).
    fn check_queried(&self, dev: DeviceId, pg: PgId) -> Result<(), WireError> {
        let p = self.get(dev, pg).expect("the store exists");
        let st = p.st.lock();
        if !st.queried {
            return Err(refused(
                ErrorCode::StaleEpoch,
                format!(
                    "{pg} on {dev} was not queried since it started (suspect: {}): query it \
                     first",
                    st.info.suspect
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a message of a term older than the newest one this member promised.
    fn check_term(&self, dev: DeviceId, pg: PgId, term: Term) -> Result<(), WireError> {
        let p = self.get(dev, pg).expect("the store exists");
        let st = p.st.lock();
        if term < st.promised {
            return Err(refused(
                ErrorCode::StaleEpoch,
                format!("{pg} on {dev} follows term {} now", st.promised),
            ));
        }
        Ok(())
    }

    /// Refuses to forget a PG this node's own map still places on the device.
    fn check_not_placed(&self, dev: DeviceId, pg: PgId) -> Result<(), WireError> {
        let map = self.ctx.maps.map();
        let placed = map
            .pools
            .get(&pg.pool)
            .and_then(|p| p.pgs.get(pg.pg as usize))
            .is_some_and(|e| e.acting.contains(&dev) || e.up.contains(&dev));
        if placed {
            return Err(refused(
                ErrorCode::StaleEpoch,
                format!("map epoch {} still places {pg} on {dev}", map.epoch.0),
            ));
        }
        Ok(())
    }

    /// What this member holds of `pg`.
    pub(crate) async fn holding(&self, dev: DeviceId, pg: PgId) -> Result<Holding, WireError> {
        let store = self.store(dev).expect("checked by the caller");
        let engine = store
            .pgs()
            .await
            .map_err(engine_to_wire)?
            .into_iter()
            .find(|p| p.pg == pg);
        let p = self.get(dev, pg).expect("the store exists");
        let info = p.st.lock().info;
        Ok(Holding {
            info,
            last_update: engine
                .as_ref()
                .map_or(basalt_types::Version::NONE, |e| e.last_version),
            log_tail: engine
                .as_ref()
                .map_or(basalt_types::Version::NONE, |e| e.log_tail),
            objects: engine.as_ref().map_or(0, |e| e.objects),
        })
    }

    /// Persists a member's info durably; `activate` also makes it accept that interval.
    pub(crate) async fn persist(
        &self,
        dev: DeviceId,
        pg: PgId,
        info: MemberInfo,
        activate: Option<Term>,
    ) -> Result<(), WireError> {
        let store = self.store(dev).expect("checked by the caller");
        store
            .set_pg(pg, Some(info.encode()), true)
            .await
            .map_err(engine_to_wire)?;
        let p = self.get(dev, pg).expect("the store exists");
        let mut st = p.st.lock();
        st.info = info;
        if let Some(term) = activate {
            if st.accepting != term {
                st.readable = None;
                st.committed = Version::NONE;
            }
            st.accepting = term;
            st.promised = st.promised.max(term);
        }
        Ok(())
    }

    /// After an activation in `term`: whether the member may answer reads of its own copy in
    /// it (`replica_read.rs`), unless a newer term came meanwhile. `complete` (the activation's
    /// `last_complete`) is a commit watermark of the term when the primary sends it once
    /// nothing is missing (`recovery.rs::publish_complete`), and older than the term
    /// otherwise: either way every write of the term at or below it is on every member.
    fn set_readable(&self, dev: DeviceId, pg: PgId, term: Term, readable: bool, complete: Version) {
        let p = self.get(dev, pg).expect("the store exists");
        let mut st = p.st.lock();
        if st.accepting != term || st.promised != term {
            return;
        }
        st.readable = (readable && st.spoiled != Some(term)).then_some(term);
        if complete > st.committed && complete.epoch == term.interval.0 {
            st.committed = complete;
        }
    }

    /// Forgets everything this device holds of `pg`, for a primary of `term`. Each batch of
    /// purges is submitted under the PG's lock after checking that no newer term was promised
    /// meanwhile (a map that places the PG here again, whose primary backfills this device,
    /// stops the removal before it erases what the backfill copied).
    pub(crate) async fn remove(
        &self,
        dev: DeviceId,
        pg: PgId,
        term: Term,
    ) -> Result<(), WireError> {
        let store = self.store(dev).expect("checked by the caller");
        let p = self.get(dev, pg).expect("the store exists");
        loop {
            let page = store.list(pg, None, 1024).await.map_err(engine_to_wire)?;
            if page.is_empty() {
                break;
            }
            let purges: Vec<_> = {
                let st = p.st.lock();
                p.check_promise(st.promised, term)?;
                let opts = WriteOptions::buffered().in_pg(pg.pg);
                page.iter()
                    .map(|o| store.submit_purge(o.oid, opts))
                    .collect()
            };
            for r in futures::future::join_all(purges).await {
                r.map_err(engine_to_wire)?;
            }
        }
        // The record goes in journal order before anything a newer term submits after this
        // check (under the PG's lock), and the member state here is reset only if no newer
        // term activated the device meanwhile (its record and state are then the newer ones).
        let removed = {
            let st = p.st.lock();
            p.check_promise(st.promised, term)?;
            store.submit_set_pg(pg, None, true)
        };
        removed.await.map_err(engine_to_wire)?;
        let mut st = p.st.lock();
        p.check_promise(st.promised, term)?;
        st.info = self.unrecorded_info(dev);
        st.accepting = Term::default();
        drop(st);
        tracing::info!(%pg, device = %dev, "removed the PG's data (no longer needed here)");
        Ok(())
    }
}

impl super::Pg {
    /// Installs `image` as `oid` for a primary of `term` (recovery, backfill, rolling back,
    /// repair): refused if this member promised a newer term. Submitted under the PG's lock, so
    /// a peering query of a newer term cannot slip in between the check and the store seeing
    /// the write (the query flushes the store after promising). The primary's own copy goes
    /// through here too: a superseded peering of this very device must not write either.
    ///
    /// Never over a version `term` wrote (`WriteOptions::keep_since`): a put the primary gave
    /// up on (it timed out, its connection broke) may reach the store late, after a write of
    /// the same term the primary sent once it released the object, and must not roll that
    /// write back (a review found a late repair put leaving a readable member with a copy
    /// older than an acknowledged write). Every install a primary means is of a version at or
    /// above what the member holds from its own term, or over a version of an earlier one.
    pub(crate) fn submit_install(
        &self,
        term: Term,
        oid: basalt_types::ObjectId,
        image: basalt_engine::ObjectImage,
        opts: WriteOptions,
    ) -> Result<Pending<Version>, WireError> {
        let st = self.st.lock();
        self.check_promise(st.promised, term)?;
        let opts = opts.keeping_since(term.before());
        let pending = self.store.submit_install(oid, image, opts);
        drop(st);
        Ok(pending)
    }

    /// Forgets `oid` for a primary of `term` (backfill purging what its source lacks), as
    /// [`Self::submit_install`] (never a version `term` wrote).
    pub(crate) fn submit_purge(
        &self,
        term: Term,
        oid: basalt_types::ObjectId,
    ) -> Result<Pending<Version>, WireError> {
        let st = self.st.lock();
        self.check_promise(st.promised, term)?;
        let opts = WriteOptions::durable()
            .in_pg(self.id.pg)
            .keeping_since(term.before());
        let pending = self.store.submit_purge(oid, opts);
        drop(st);
        Ok(pending)
    }

    fn check_promise(&self, promised: Term, term: Term) -> Result<(), WireError> {
        if term < promised {
            return Err(refused(
                ErrorCode::StaleEpoch,
                format!("{} on {} follows term {promised} now", self.id, self.dev),
            ));
        }
        Ok(())
    }
}

/// Backfill bytes a device accepted, released when the install ends.
struct Reserved<'a> {
    inflight: &'a parking_lot::Mutex<std::collections::BTreeMap<DeviceId, u64>>,
    dev: DeviceId,
    bytes: u64,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        let mut inflight = self.inflight.lock();
        let pending = inflight.get_mut(&self.dev).expect("reserved");
        *pending = pending
            .checked_sub(self.bytes)
            .expect("released no more than reserved");
    }
}

#[cfg(test)]
#[path = "replica_tests.rs"]
mod tests;
