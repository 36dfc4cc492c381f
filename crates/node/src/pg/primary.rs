//! The primary's data path: reads, and writes ordered and versioned here, then applied on every
//! serving member (and on backfill targets that already hold the object) before they are
//! acknowledged.
//!
//! A write:
//! 1. waits while its object is missing on a member or being recovered/backfilled (recovery of
//!    it is already queued: peering put it in the missing set);
//! 2. under the PG's lock, takes the next version `(interval, seq)`, sends the write to every
//!    other member on their links and hands it to the local store (held invisible: reads of the
//!    object wait until it is committed), so every member applies the PG's writes to one object
//!    in the same order;
//! 3. once every copy is durable, commits the local write and acknowledges. A member that fails
//!    makes the PG peer again (the write is not acknowledged; the client retries it).

use super::{Ctx, Pg, Status};
use crate::error::engine_to_wire;
use basalt_engine::{EngineError, Pending, WriteOptions};
use basalt_proto::{ErrorCode, RepKind, RepOp, Request, Response, Session, WireError};
use basalt_types::{Epoch, ObjectId, Term, Version, VolumeId};
use bytes::Bytes;
use std::sync::Arc;
use tokio::sync::oneshot;

/// What a write does to its object.
#[derive(Clone, Debug)]
pub(crate) enum WriteKind {
    Data { offset: u32, data: Bytes },
    Zeroes { offset: u32, len: u32 },
    Delete,
}

/// Why the primary did not serve a request now.
fn busy(msg: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::Busy, msg)
}

/// How a request passes an object's gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// A client's: waits while the object is missing on a member, fails while it is unfound.
    Normal,
    /// The tombstone of an unfound object declared lost, claimed in `generation` (`lost.rs`).
    Lost { generation: u64 },
}

/// What a read does once read repair fetched a good copy of its object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AfterRepair {
    /// Answers from that copy (a client's read).
    Serve,
    /// Reads the local copy again, and fails if it still fails (a block about to be merged
    /// with part of a write must be readable here).
    ReadAgain,
}

/// Read repairs one read may start or wait for before it fails with the local copy's error.
/// A repair that found the object held by someone else (`None`) counts too: each such wait
/// followed another's repair, recovery or scrub of the object.
const REPAIR_TRIES: u32 = 16;

/// What to do with a request on the primary after looking at the PG's state.
enum Gate<T> {
    Go(T),
    Wait(oneshot::Receiver<()>),
}

impl Pg {
    /// Checks that the PG is active (as primary) and the object can be served now; else
    /// registers a waiter for the object.
    fn gate<T>(
        &self,
        oid: &ObjectId,
        pass: Pass,
        go: impl FnOnce(&mut super::Primary, u64) -> Result<T, WireError>,
    ) -> Result<Gate<T>, WireError> {
        let mut st = self.st.lock();
        let (promised, generation) = (st.promised, st.generation);
        let Some(p) = st.primary.as_mut() else {
            return Err(busy(format!(
                "{} is not the primary of {}",
                self.dev, self.id
            )));
        };
        if promised != p.term {
            // A primary of a newer term asked this device: this one serves nothing more.
            return Err(busy(format!(
                "{} on {} promised term {promised}; it serves {} no more",
                self.id, self.dev, p.term
            )));
        }
        match &p.status {
            Status::Active => {}
            Status::Peering => return Err(busy(format!("{} is peering", self.id))),
            Status::Peered(why) => {
                return Err(busy(format!("{} serves no I/O: {why}", self.id)));
            }
            Status::Incomplete(why) => {
                return Err(busy(format!("{} is incomplete: {why}", self.id)));
            }
        }
        if let Pass::Lost {
            generation: claimed,
        } = pass
        {
            // Declared lost and claimed in this generation (`lost.rs`): a tombstone needs no
            // current copy anywhere, and nothing else touches the object until it is done.
            if claimed != generation {
                return Err(busy(format!("{} peered again", self.id)));
            }
            return go(p, generation).map(Gate::Go);
        }
        // Unfound by recovery (a member lacks it): fails. Unfound by backfill (every copy bad,
        // none lacking): served as any object (a read fails on the bad copies, a write of the
        // whole object makes it whole again).
        if let Some(why) = p.unfound.get(oid).filter(|_| p.missing.contains_key(oid)) {
            return Err(WireError::new(
                ErrorCode::Checksum,
                format!(
                    "{oid} is unfound: {why} (recovery retries; `basalt pg mark-unfound-lost` \
                     gives it up)"
                ),
            ));
        }
        if p.must_wait(oid) {
            let (tx, rx) = oneshot::channel();
            p.waiters.entry(*oid).or_default().push(tx);
            if p.missing.contains_key(oid) {
                self.client_waits.notify_waiters();
            }
            return Ok(Gate::Wait(rx));
        }
        go(p, generation).map(Gate::Go)
    }

    /// A local store error as the client gets it. A poisoned store is a device fault its node
    /// reports (`faults.rs`): when other members hold the PG the map soon moves it to them, so
    /// the client is told to retry (`Busy`) rather than fail.
    fn local_error(&self, e: EngineError, others: bool) -> WireError {
        match e {
            EngineError::Poisoned(_) if others => busy(format!(
                "{}: device {} failed ({e}); the PG moves to its other members",
                self.id, self.dev
            )),
            e => engine_to_wire(e),
        }
    }

    /// Whether the PG has serving members besides this device.
    fn has_members(&self) -> bool {
        self.st
            .lock()
            .primary
            .as_ref()
            .is_some_and(|p| !p.members.is_empty())
    }

    /// Whether this device serves the PG as its active primary now.
    pub fn is_active_primary(&self) -> bool {
        let st = self.st.lock();
        st.primary
            .as_ref()
            .is_some_and(|p| p.status == Status::Active && p.term == st.promised)
    }

    /// Reads `len` bytes of `oid` at `offset` (the object is current here: peering and
    /// recovery made it so; held writes of it are waited for by the store). A read that
    /// waited on a write whose term ended meanwhile is not answered (the write's fate is
    /// peering's to decide): the client retries.
    ///
    /// A local copy that fails its checksum (or cannot be read) is repaired from another
    /// member's good copy (`repair.rs`), and the read is answered from that copy, so that a
    /// local copy still failing after its rewrite does not fail it; with no good copy anywhere
    /// the read fails (never bad data).
    pub async fn read(
        &self,
        ctx: &Arc<Ctx>,
        oid: ObjectId,
        offset: u32,
        len: u32,
    ) -> Result<Bytes, WireError> {
        self.read_as(ctx, oid, offset, len, AfterRepair::Serve)
            .await
    }

    /// [`Pg::read`], doing `after` once a read repair fetched a good copy.
    async fn read_as(
        &self,
        ctx: &Arc<Ctx>,
        oid: ObjectId,
        offset: u32,
        len: u32,
        after: AfterRepair,
    ) -> Result<Bytes, WireError> {
        let mut repairs = 0;
        loop {
            let gate = self.gate(&oid, Pass::Normal, |p, generation| {
                Ok((generation, p.term, self.store.submit_read(oid, offset, len)))
            })?;
            match gate {
                Gate::Go((generation, term, pending)) => {
                    // A local device that hangs never answers: once the term ended (the node
                    // reported the device down and the map moved the PG), the client retries
                    // on the new primary.
                    let answer = tokio::select! {
                        biased;
                        r = pending => r,
                        _ = self.term_ended(term) => {
                            return Err(busy(format!(
                                "{}: the local store (device {}) did not answer a read of {oid} \
                                 before term {term} ended",
                                self.id, self.dev
                            )));
                        }
                    };
                    let data = match answer {
                        Ok(data) => data,
                        Err(e) if e.is_bad_copy() && repairs < REPAIR_TRIES => {
                            repairs += 1;
                            // `None`: someone else held the object (a concurrent read's
                            // repair, recovery, scrub); read again once they are done.
                            let Some(image) = self.repair_read(ctx, generation, oid).await? else {
                                continue;
                            };
                            let (start, end) = (offset as usize, offset as usize + len as usize);
                            match after {
                                // The good copy, read while the object was held: a local copy
                                // still failing after its rewrite does not fail the read.
                                AfterRepair::Serve if end <= image.len() => image.slice(start..end),
                                // Once more from the local copy; its failing again fails.
                                _ => {
                                    repairs = REPAIR_TRIES;
                                    continue;
                                }
                            }
                        }
                        Err(e) => {
                            let others = self.has_members();
                            return Err(self.local_error(e, others));
                        }
                    };
                    self.answerable(ctx, generation)?;
                    return Ok(data);
                }
                Gate::Wait(rx) => {
                    let _ = rx.await;
                }
            }
        }
    }

    /// Whether a read that started in `generation` may be answered: that generation is still
    /// current and active in the term this device promised; this node holds a read lease of
    /// every other node with a serving member of the term, or a backfill target that completed
    /// in it (`readlease.rs`: without one, a
    /// newer term may have been promised there and have acknowledged writes this copy lacks,
    /// this node's map lagging); and the map, read after the leases were checked, still makes
    /// this device the primary of the term's interval (a lease granted at an epoch means this
    /// node had that map when it asked, so a map that took the PG away is seen here even
    /// before the PG's own state follows it). Else `Busy`: the client retries, on the new
    /// primary once its map names it.
    fn answerable(&self, ctx: &Ctx, generation: u64) -> Result<(), WireError> {
        let changed = || busy(format!("{} changed terms during a read", self.id));
        let leases = ctx.leases.enabled();
        let interval = {
            let st = self.st.lock();
            let p = st
                .primary
                .as_ref()
                .filter(|p| {
                    st.generation == generation
                        && p.status == Status::Active
                        && p.term == st.promised
                })
                .ok_or_else(changed)?;
            if leases {
                let map = ctx.maps.map();
                let me = map.device_node(self.dev);
                // A backfill target that completed witnesses the interval for later peerings
                // (`peering.rs::completed_in`) as a member does: its promise too may let a
                // newer term go active. It is marked done before the history lists it.
                let done = p.targets.iter().filter(|t| t.done).map(|t| &t.member);
                for m in p.members.iter().chain(done) {
                    let node = map.device_node(m.dev);
                    if node != me && !node.is_some_and(|n| ctx.leases.holds(n)) {
                        return Err(busy(format!(
                            "{}: no read lease of the node of member {} (it may follow a \
                             newer term)",
                            self.id, m.dev
                        )));
                    }
                }
            }
            p.term.interval
        };
        if leases {
            let map = ctx.maps.map();
            let entry = map
                .pools
                .get(&self.id.pool)
                .and_then(|p| p.pgs.get(self.id.pg as usize));
            let still =
                entry.is_some_and(|e| e.since == interval && map.pg_primary(e) == Some(self.dev));
            if !still {
                return Err(busy(format!(
                    "{}: map {} no longer makes {} its primary in interval {interval}",
                    self.id, map.epoch, self.dev
                )));
            }
        }
        Ok(())
    }

    /// Applies one write on every member; returns its version once it is durable everywhere,
    /// and whether it is durable here too (asked for, or the PG replicated: every replicated
    /// write is). `epoch` and `session`: the request's (a client's write; `Session::NONE` for
    /// the node's own).
    pub async fn write(
        self: &Arc<Self>,
        ctx: &Arc<Ctx>,
        epoch: Epoch,
        session: Session,
        oid: ObjectId,
        kind: WriteKind,
        durable: bool,
    ) -> Result<(Version, bool), WireError> {
        let from = (epoch, session);
        self.write_as(ctx, from, oid, kind, durable, Pass::Normal)
            .await
    }

    /// [`Pg::write`], passing the object's gate as `pass` says.
    pub(super) async fn write_as(
        self: &Arc<Self>,
        ctx: &Arc<Ctx>,
        (epoch, session): (Epoch, Session),
        oid: ObjectId,
        kind: WriteKind,
        durable: bool,
        pass: Pass,
    ) -> Result<(Version, bool), WireError> {
        self.check_partial_blocks(ctx, oid, &kind).await?;
        let (version, local, reps, term, to_members) = loop {
            let submitted = self.gate(&oid, pass, |p, _| {
                // Versioned only in an interval the request's map knew. A request the node
                // admitted may wait (for the volume records, for its object) while the map
                // moves the PG away and back: versioned in the later interval, it would land
                // after writes its client sent since, rerouted to another primary, and had
                // acknowledged (found by a helper's review). Refused, the client retries with
                // a newer map, if it still waits for the write.
                if epoch < p.term.interval {
                    return Err(WireError::stale_epoch(p.term.interval, epoch));
                }
                // Versioned only while no later attempt of its client reached the node: one
                // the client gave up on must not land after a write it sent since
                // (`sessions.rs`).
                if !ctx.sessions.current(session) {
                    return Err(busy(format!(
                        "{}: a later attempt of client {:016x} reached this node first; this \
                         write is not applied",
                        self.id, session.client
                    )));
                }
                // Written now, an object a backfill found no good copy of is no longer offered
                // to be given up (`lost.rs` would delete what this write acknowledges); the
                // backfill finds it again if the write does not make it whole.
                p.unfound.remove(&oid);
                let n = p.seq + 1;
                let Some(version) = p.term.version(n) else {
                    return Err(busy(format!(
                        "{} used up the versions of term {}",
                        self.id, p.term
                    )));
                };
                p.seq = n;
                p.inflight.insert(n);
                // Applied everywhere only onto the write to this object still in flight, if
                // any (`Primary::tails`).
                let prior = p.tails.insert(oid, version);
                // What members may answer reads of (`replica_read.rs`): never this write.
                let committed = p.committed_upto().unwrap_or(Version::NONE);
                let replicated = !p.members.is_empty() || p.targets.iter().any(|t| t.covers(&oid));
                let opts = WriteOptions {
                    durable: durable || replicated,
                    version: Some(version),
                    pg: self.id.pg,
                    pending: replicated,
                    prior,
                    keep_since: None,
                };
                let rep = |dev| {
                    Request::Rep(RepOp {
                        epoch,
                        device: dev,
                        pg: self.id,
                        term: p.term,
                        oid,
                        version,
                        kind: match &kind {
                            WriteKind::Data { offset, .. } => RepKind::Write { offset: *offset },
                            WriteKind::Zeroes { offset, len } => RepKind::Zeroes {
                                offset: *offset,
                                len: *len,
                            },
                            WriteKind::Delete => RepKind::Delete,
                        },
                        data: match &kind {
                            WriteKind::Data { data, .. } => data.clone(),
                            WriteKind::Zeroes { .. } | WriteKind::Delete => Bytes::new(),
                        },
                        committed,
                        prior: prior.unwrap_or(Version::NONE),
                    })
                };
                // A target that does not get the write copies the object again later.
                for t in p.targets.iter_mut().filter(|t| !t.covers(&oid)) {
                    t.dirty.insert(oid);
                }
                // Each with whether it serves the PG (else a backfill target).
                let members = p.members.iter().map(|m| (m.clone(), true));
                let targets = p
                    .targets
                    .iter()
                    .filter(|t| t.covers(&oid))
                    .map(|t| (t.member.clone(), false));
                let reps: Vec<_> = members
                    .chain(targets)
                    .map(|(m, serving)| (m.dev, serving, m.link.call(rep(m.dev))))
                    .collect();
                // The copies go out before the local write is handed to the store: on a node
                // whose stores run on its network thread, the store's submission (the kernel's
                // part of a direct write) would otherwise run before the links send.
                let local = self.submit_local(oid, &kind, opts);
                Ok((version, local, reps, p.term, !p.members.is_empty()))
            })?;
            match submitted {
                Gate::Go(x) => break x,
                Gate::Wait(rx) => {
                    let _ = rx.await;
                }
            }
        };
        let replicated = !reps.is_empty();
        // A member cut off by the network never answers, nor does a local device that hangs
        // (firmware stall, dead path: no error comes back). Once a new map (or another failed
        // write) ended the term, the write is not acknowledged and the client retries it on the
        // PG's new primary. The map that ends it comes from the leader when this node reports
        // its stalled device down (`faults.rs`), or from the member's failure.
        let ended = self.term_ended(term);
        tokio::pin!(ended);
        let mut local = local;
        let local_res = tokio::select! {
            biased;
            r = &mut local => r,
            _ = &mut ended => {
                if replicated {
                    // Released once the device answers: peering decides its fate, and this
                    // term serves no more. Not before: the store counts a held write when it
                    // applies it and drops a commit that comes first, so a write still
                    // waiting in the store (a partial block's read, a full journal) would stay
                    // held, and the object's reads wait, for good.
                    let store = self.store.clone();
                    tokio::spawn(async move {
                        if local.await.is_ok() {
                            let _ = store.commit(oid, version);
                        }
                    });
                }
                return Err(busy(format!(
                    "{}: the local store (device {}) did not answer {oid} at {version} before \
                     term {term} ended",
                    self.id, self.dev
                )));
            }
        };
        let done = |pg: &Pg| {
            if let Some(p) = pg.st.lock().primary.as_mut()
                && p.term.version(version.seq & Term::WRITES_PER_ROUND) == Some(version)
            {
                p.inflight.remove(&(version.seq & Term::WRITES_PER_ROUND));
                if p.tails.get(&oid) == Some(&version) {
                    p.tails.remove(&oid);
                }
                if p.inflight.is_empty() {
                    pg.writes_idle.notify_one();
                }
            }
        };
        let mut failed: Option<(String, ErrorCode)> = None;
        let mut term_over = false;
        for (dev, serving, fut) in reps {
            tokio::select! {
                biased;
                answer = fut => match answer {
                    Ok(Response::RepDone) => {}
                    Ok(other) => {
                        failed = Some((format!("{dev} answered {other:?}"), ErrorCode::Busy))
                    }
                    // A backfill target out of space is no reason to refuse the client a
                    // write its serving copies have room for: retried, the next term's
                    // backfill starts over, stops at the target's backfill-full limit before
                    // it covers the object (`Pgs::room_for_backfill`), and the write goes to
                    // the serving copies only.
                    Err(e) if !serving => {
                        failed = Some((format!("backfill target {dev}: {e}"), ErrorCode::Busy))
                    }
                    Err(e) => failed = Some((format!("{dev}: {e}"), e.code)),
                },
                _ = &mut ended => {
                    failed = Some((format!("{dev} did not answer before term {term} ended"),
                        ErrorCode::Busy));
                    term_over = true;
                    break;
                }
            }
        }
        if let Err(e) = local_res {
            if replicated || matches!(e, EngineError::Poisoned(_)) {
                // Members may have applied it: peering decides what stays.
                self.repeer(
                    ctx.clone(),
                    &format!("{oid} at {version}: local store: {e}"),
                );
            } else {
                // Failed here only (a full device, say): nothing of it exists anywhere.
                done(self);
            }
            if matches!(e, EngineError::PriorVersion { .. }) {
                // Sent behind a write to the object that failed here: the next term's peering
                // decides what stays of both, and the client retries.
                return Err(busy(format!("{}: {e}", self.id)));
            }
            if to_members && e.is_bad_copy() {
                // A partial-block write into a block bad here: the serving members that
                // applied it hold a newer version than this copy, so the next term's peering
                // rolls forward to theirs (`peering.rs::roll_forward`); the client's retry then
                // applies. (Backfill targets alone cannot be rolled forward from: then the
                // write fails like an unreplicated one.)
                return Err(busy(format!(
                    "{}: {e}; the copy here is recovered from the other members",
                    self.id
                )));
            }
            return Err(self.local_error(e, replicated));
        }
        if let Some((why, code)) = failed {
            // Not acknowledged: peering decides whether this version stays, and the client
            // retries (a block write may be applied twice, never half) unless a member is out
            // of space, which the client is told. The term ends first, so no read can see the
            // write before peering decided; then the hold is released (reads of the next term
            // see whatever peering kept).
            if !term_over {
                self.repeer(ctx.clone(), &format!("{oid} at {version}: {why}"));
            }
            if replicated {
                let _ = self.store.commit(oid, version);
            }
            let code = if code == ErrorCode::NoSpace {
                code
            } else {
                ErrorCode::Busy
            };
            return Err(WireError::new(
                code,
                format!("{}: a member failed a write ({why})", self.id),
            ));
        }
        // Durable on every copy: off the in-flight list even when the commit below fails (the
        // store closed), so the commit watermark members read by does not stop here.
        done(self);
        if replicated {
            // Held until every copy was durable: visible from now on. (An unreplicated write
            // was never held: no extra message to the device thread.)
            self.store.commit(oid, version).map_err(engine_to_wire)?;
        }
        Ok((version, durable || replicated))
    }

    /// A write of part of a 4 KiB block merges with the block's data here: reads (and so
    /// verifies, repairing it from a member when it fails its checksum: [`Pg::read`]) the
    /// partly written blocks first. Without it, a bad block here would fail the write after
    /// the members applied it, and peering could only roll it back from the bad copy. A block
    /// still unreadable here after its repair fails the write before any member applies it.
    async fn check_partial_blocks(
        &self,
        ctx: &Arc<Ctx>,
        oid: ObjectId,
        kind: &WriteKind,
    ) -> Result<(), WireError> {
        const BLOCK: u32 = 4096;
        let (offset, len) = match kind {
            WriteKind::Data { offset, data } => (*offset, data.len() as u32),
            WriteKind::Zeroes { offset, len } => (*offset, *len),
            WriteKind::Delete => return Ok(()),
        };
        let end = offset + len;
        let head = offset % BLOCK != 0;
        let tail = end % BLOCK != 0 && (!head || end / BLOCK != offset / BLOCK);
        if !self.has_members() || len == 0 {
            return Ok(());
        }
        // The local copy must be readable, not only the good copy a repair fetched: the store
        // merges the write with what it reads here.
        let check = AfterRepair::ReadAgain;
        if head {
            self.read_as(ctx, oid, offset - offset % BLOCK, BLOCK, check)
                .await?;
        }
        if tail {
            self.read_as(ctx, oid, end - end % BLOCK, BLOCK, check)
                .await?;
        }
        Ok(())
    }

    /// Resolves once `term` is no longer this PG's current term (or it stopped serving).
    async fn term_ended(&self, term: Term) {
        while self
            .st
            .lock()
            .primary
            .as_ref()
            .is_some_and(|p| p.term == term)
        {
            self.wait_change().await;
        }
    }

    fn submit_local(
        &self,
        oid: ObjectId,
        kind: &WriteKind,
        opts: WriteOptions,
    ) -> Pending<Version> {
        match kind {
            WriteKind::Data { offset, data } => {
                self.store.submit_write(oid, *offset, data.clone(), opts)
            }
            WriteKind::Zeroes { offset, len } => {
                self.store.submit_write_zeroes(oid, *offset, *len, opts)
            }
            WriteKind::Delete => self.store.submit_delete(oid, opts),
        }
    }
}

impl Pg {
    /// Deletes the objects of `volume` at or past `from_index` that this PG holds, each as a
    /// replicated write (a tombstone on every member), a page at a time, each only once
    /// `still` allows it (the range is still past the volume's end). Returns how many it
    /// deleted.
    pub async fn delete_volume(
        self: &Arc<Self>,
        ctx: &Arc<Ctx>,
        epoch: Epoch,
        volume: VolumeId,
        from_index: u64,
        still: &(dyn Fn() -> Result<(), WireError> + Send + Sync),
    ) -> Result<u64, WireError> {
        self.whole_here(volume, from_index)?;
        let pool = self.id.pool;
        let mut after = match (from_index, volume.0) {
            (0, 0) => None,
            (0, v) => Some(ObjectId::new(pool, VolumeId(v - 1), u64::MAX)),
            (i, v) => Some(ObjectId::new(pool, VolumeId(v), i - 1)),
        };
        let mut deleted = 0;
        loop {
            let page = self
                .store
                .list(self.id, after, 256)
                .await
                .map_err(engine_to_wire)?;
            let Some(last) = page.last() else {
                return Ok(deleted);
            };
            after = Some(last.oid);
            let mine: Vec<ObjectId> = page
                .iter()
                .filter(|o| o.oid.volume == volume && !o.deleted)
                .map(|o| o.oid)
                .collect();
            let past_volume = last.oid.volume != volume;
            if !mine.is_empty() {
                still()?;
            }
            let writes = mine
                .iter()
                .map(|oid| self.write(ctx, epoch, Session::NONE, *oid, WriteKind::Delete, false));
            for r in futures::future::join_all(writes).await {
                r?;
                deleted += 1;
            }
            if past_volume {
                return Ok(deleted);
            }
        }
    }
}

impl Pg {
    /// Whether the objects of `volume` from index `from` may be deleted from here: the deletion
    /// lists this device's store, so it must be the PG's active primary (not still peering:
    /// its store may lack what the members hold) with none of those objects still to recover
    /// onto it (an object it lacks would survive the deletion, and show its old data after the
    /// volume grew again: found by a review). Else `Busy`: the caller retries.
    fn whole_here(&self, volume: VolumeId, from: u64) -> Result<(), WireError> {
        let st = self.st.lock();
        let active = st
            .primary
            .as_ref()
            .filter(|p| p.status == Status::Active && p.term == st.promised);
        let Some(p) = active else {
            return Err(busy(format!(
                "{} is not active on {} yet: the objects of {volume} are deleted once it is",
                self.id, self.dev
            )));
        };
        let lacking = p
            .missing
            .iter()
            .filter(|(o, _)| o.volume == volume && o.index >= from)
            .filter(|(_, m)| !m.deleted && m.need.contains(&self.dev))
            .count();
        if lacking > 0 {
            return Err(busy(format!(
                "{}: {lacking} objects of {volume} are still being recovered onto {}; they are \
                 deleted once they are",
                self.id, self.dev
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "primary_tests.rs"]
mod tests;
