//! Peering: what the primary of a PG does before it serves an interval.
//!
//! 1. Read the PG's history (intervals since it was last clean).
//! 2. Ask every device that may hold the PG's data (serving members, up-set members, members of
//!    past intervals) what it holds. Asking is a promise: the device refuses sub-operations of
//!    older intervals from then on, so a deposed primary can get no more acknowledgements.
//! 3. Check that the interval can be served: every serving member answered (writes need them
//!    all), and every past interval has a reachable member with complete data (else some
//!    acknowledged write may be unreachable: the PG waits, it is never served without it).
//!    With fewer than `min_size` serving members the PG still peers, recovers and backfills
//!    (status `Peered`) but serves no client I/O, and step 6 does not record its interval
//!    (nothing is acknowledged in it, so no later peering needs a witness of it).
//! 4. Gather what may differ: every source's log since the lowest point every source is known
//!    complete at (a full listing where a log was trimmed), then every device's version of each
//!    such object. A serving member that is not a source is refused, unless it is suspect
//!    (`stale`: its cut journal tail may have held its activation): then every object of the
//!    sources and of it is compared, and it is made current by its own copies.
//! 5. Decide the authoritative version of each (`authority.rs`); reset divergent members now,
//!    remember what members lack (recovered once active).
//! 6. Append the interval to the history (compare-and-swap: a racing primary with a stale map
//!    cannot; skipped below `min_size`), activate every serving member (it persists its new
//!    state and accepts the interval's sub-operations), and go active.

use super::authority::{self, Auth, Verdict};
use super::info::MemberInfo;
use super::messages::{Holding, ImageKind, ImageMeta, PeerAnswer, PeerMsg};
use super::{Ctx, Member, Missing, Pg, Status, Target};
use basalt_engine::WriteOptions;
use basalt_meta::{PgHistory, PgInterval};
use basalt_placement::ClusterMap;
use basalt_types::{DeviceId, Epoch, ObjectId, PgId, Term, Version};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Objects asked about per message.
const BATCH: usize = 1024;

impl Pg {
    /// Peers the map's current interval; `Ok` once the PG is active.
    pub(super) async fn peer(
        self: &Arc<Self>,
        ctx: &Arc<Ctx>,
        generation: u64,
    ) -> Result<(), String> {
        let map = ctx.maps.map();
        let (entry, min_size) = entry_of(&map, self.id)?;
        let interval = entry.since;
        if map.pg_primary(&entry) != Some(self.dev) {
            return Err("no longer the primary".into());
        }
        let serving: Vec<DeviceId> = map.serving(&entry).collect();
        // Below min_size the PG still peers, recovers and backfills (how else would it regain
        // its up set when its acting set is all that is left?), but serves no client I/O.
        let undersized = (serving.len() < min_size).then(|| {
            format!(
                "{} of its acting devices {:?} are up, min_size is {min_size}",
                serving.len(),
                entry.acting
            )
        });
        let (history, revision) = ctx
            .catalog
            .get_pg_history(self.id)
            .await
            .map_err(|e| e.to_string())?;
        // A term in a round past every round of this interval that went active: after a
        // restart this primary forgot its rounds, and the history's record of the interval
        // (its round, the backfills it saw complete) belongs to an older term.
        if let Some(last) = history.last().filter(|l| l.epoch == interval)
            && self.term_of(generation)?.round <= last.round
        {
            self.raise_round(generation, last.round + 1)?;
        }
        let mut candidates: BTreeSet<DeviceId> = serving.iter().copied().collect();
        candidates.extend(entry.up.iter().copied().filter(|d| map.is_up(*d)));
        candidates.extend(history.devices().into_iter().filter(|d| map.is_up(*d)));
        let (term, holdings) = self.query_all(ctx, &map, generation, &candidates).await?;
        check_answers(&map, &history, &serving, &holdings, interval)?;
        if let Err(why) = check_history(&history, &holdings, &BTreeSet::new()) {
            let lost = lost_devices(ctx, &history, &holdings).await?;
            if lost.is_empty() {
                return Err(why);
            }
            for i in check_history(&history, &holdings, &lost)? {
                tracing::warn!(pg = %self.id, interval = %i.epoch, members = ?i.members,
                    "every device of the interval that was not reached is declared lost: writes \
                     acknowledged only there are given up");
            }
        }
        let sources = sources(&history, &holdings);
        let stale = stale(&history, &serving, &sources, &holdings);
        if let Some(d) = serving
            .iter()
            .find(|d| !sources.contains(d) && holdings.get(d).is_some_and(|h| h.info.suspect))
            .filter(|d| !stale.contains(d))
        {
            // Its copy may be the only one of acknowledged writes (one copy, or every other
            // member suspect too): nothing here may reset it, and nothing adopts it yet.
            return Err(format!(
                "serving member {d} lost journal records of the PG (suspect) and looks activated \
                 before its history began, and no other member proves what the PG holds: its \
                 copy may be the only one; the PG waits for a member that does (`basalt pg \
                 mark-lost` gives its data up)"
            ));
        }
        if let Some(d) = serving
            .iter()
            .find(|d| !sources.contains(d) && !stale.contains(d))
        {
            // Cannot happen while devices re-enter acting sets only through backfill (a new
            // PG's members that were down when it first went active hold nothing: sources).
            return Err(format!(
                "serving member {d} holds the PG from before its history began; it needs a \
                 backfill (mark it out and in)"
            ));
        }
        let mut objects = self.changed_objects(ctx, &map, &holdings, &sources).await?;
        if !stale.is_empty() {
            // Where a stale member stands is unknown: compare everything, as a backfill would.
            for d in sources.iter().chain(&stale) {
                self.list_all(ctx, &map, *d, &mut objects).await?;
            }
        }
        let copies = self.versions(ctx, &map, &sources, &objects).await?;
        let stale_copies = self.versions(ctx, &map, &stale, &objects).await?;
        let mut verdicts: BTreeMap<ObjectId, Verdict> = copies
            .iter()
            .map(|(oid, c)| {
                let mut v = authority::decide(&history, &holdings, &sources, &serving, c);
                v.place_stale(&stale, &stale_copies[oid]);
                (*oid, v)
            })
            // An authority with a fallback is kept even when every serving member holds it:
            // its copies may all be bad (`fallback.rs`).
            .filter(|(_, v)| {
                !v.divergent.is_empty() || !v.behind.is_empty() || v.fallback.is_some()
            })
            .collect();
        if tracing::enabled!(tracing::Level::DEBUG) {
            let infos: Vec<_> = holdings.iter().map(|(d, h)| (*d, h.info)).collect();
            for (oid, v) in &verdicts {
                tracing::debug!(
                    pg = %self.id, %term, %oid, auth = ?v.auth, copies = ?copies[oid], ?infos,
                    "verdict"
                );
            }
        }
        let (divergent, behind) = authority::summary(&verdicts);
        if divergent + behind > 0 {
            tracing::info!(
                pg = %self.id, %term, objects = objects.len(), divergent, behind,
                "peering found objects to reconcile"
            );
        }
        self.fall_back(ctx, &map, &serving, &copies, &stale_copies, &mut verdicts)
            .await;
        let dropped = self
            .reset_divergent(ctx, &map, term, &serving, &copies, &mut verdicts)
            .await?;
        // An interval below min_size acknowledges nothing: it needs no witness later.
        let new_history = match undersized {
            None => extend(&history, term, &serving)?,
            Some(_) => history.clone(),
        };
        if new_history != history {
            ctx.catalog
                .put_pg_history(self.id, &new_history, revision)
                .await
                .map_err(|e| e.to_string())?;
        }
        if !self.current(generation) {
            return Err("superseded".into());
        }
        let missing = missing_of(&verdicts, &copies);
        let complete_at = sources
            .iter()
            .map(|d| holdings[d].last_update.max(holdings[d].info.last_complete))
            .max()
            .unwrap_or(Version::NONE);
        for dev in &serving {
            let needs = missing.values().any(|m| m.need.contains(dev));
            // A member that lacks nothing holds the authority of every object as of this
            // interval's start: complete there (`authority.rs` rule 4 tells such a member
            // from one that recovery had yet to bring up to date).
            let info = match undersized {
                // Serving nothing, this peering decides nothing for good (a member of an
                // older interval it could not reach may prove a version it kept was never
                // acknowledged): it raises only the member's promise floor (`info.rs`).
                Some(_) => MemberInfo {
                    activated: interval,
                    ..holdings[dev].info
                },
                None => MemberInfo {
                    les: interval,
                    last_complete: if needs {
                        holdings[dev].info.last_complete
                    } else {
                        complete_at.max(Version::new(interval.0, 0))
                    },
                    backfill: None,
                    activated: interval,
                    // Suspect until it holds every authoritative version: recovery's
                    // `publish_complete` clears it once nothing is missing. So is a member
                    // whose divergent copy of an object with no good copy went (`roll_forward`):
                    // what it lacks then proves nothing.
                    suspect: needs && (holdings[dev].info.suspect || dropped.contains(dev)),
                },
            };
            // Not readable yet (`replica_read.rs`): the authority may have adopted a version
            // only some members hold, never acknowledged, which a later peering without them
            // would drop; and a member activated later may fail. Once the term is active
            // with nothing missing, `recovery.rs::publish_complete` says so.
            self.activate(ctx, &map, *dev, term, info, false).await?;
        }
        let members = self.links(ctx, &map, &serving).await?;
        let targets = self.targets(ctx, &map, &entry, &holdings, term).await?;
        let mut st = self.st.lock();
        if st.generation != generation {
            return Err("superseded".into());
        }
        let p = st
            .primary
            .as_mut()
            .expect("the primary state of this generation");
        p.members = members;
        p.targets = targets;
        p.sources = sources;
        p.missing = missing;
        p.min_size = min_size;
        match undersized {
            None => {
                p.status = Status::Active;
                drop(st);
                tracing::info!(pg = %self.id, device = %self.dev, %term, "active");
            }
            Some(why) => {
                p.status = Status::Peered(why.clone());
                drop(st);
                tracing::info!(pg = %self.id, device = %self.dev, %term, "peered, serving no I/O: {why}");
            }
        }
        self.changed.notify_waiters();
        Ok(())
    }

    /// Queries every candidate in this generation's term; when a member promised a newer
    /// round of the same interval already (a restarted primary forgot its rounds), raises the
    /// round past it and asks again.
    async fn query_all(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        generation: u64,
        candidates: &BTreeSet<DeviceId>,
    ) -> Result<(Term, BTreeMap<DeviceId, Holding>), String> {
        for _ in 0..4 {
            let term = self.term_of(generation)?;
            let answers = self.query(ctx, map, term, candidates).await;
            let newer = answers
                .values()
                .filter_map(|a| match a {
                    PeerAnswer::Promised(t) => Some(*t),
                    _ => None,
                })
                .max();
            match newer {
                None => {
                    let holdings: BTreeMap<DeviceId, Holding> = answers
                        .into_iter()
                        .filter_map(|(d, a)| match a {
                            PeerAnswer::Holding(h) => Some((d, h)),
                            _ => None,
                        })
                        .collect();
                    // Promises are not persisted: after a restart this device may begin again
                    // at a round whose versions members already hold. Take a round above every
                    // version of this interval any member holds, so no version is reused.
                    match used_round(&holdings, term.interval) {
                        Some(r) if r >= term.round => self.raise_round(generation, r + 1)?,
                        _ => return Ok((term, holdings)),
                    }
                }
                Some(t) if t.interval > term.interval => {
                    return Err(format!(
                        "a member promised term {t} already (this map is older)"
                    ));
                }
                Some(t) => self.raise_round(generation, t.round + 1)?,
            }
        }
        Err("members kept promising newer rounds".into())
    }

    /// This generation's term.
    fn term_of(&self, generation: u64) -> Result<Term, String> {
        let st = self.st.lock();
        match &st.primary {
            Some(p) if st.generation == generation => Ok(p.term),
            _ => Err("superseded".into()),
        }
    }

    fn raise_round(&self, generation: u64, round: u64) -> Result<(), String> {
        let mut st = self.st.lock();
        let current = st.generation == generation;
        let raised = match st.primary.as_mut() {
            Some(p) if current => {
                if round > Term::MAX_ROUND {
                    return Err(format!("interval {} ran out of rounds", p.term.interval));
                }
                p.term.round = p.term.round.max(round);
                p.term
            }
            _ => return Err("superseded".into()),
        };
        st.led = st.led.max(raised);
        Ok(())
    }

    /// Asks every candidate what it holds (at once, each bounded by the peer timeout).
    async fn query(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        term: Term,
        candidates: &BTreeSet<DeviceId>,
    ) -> BTreeMap<DeviceId, PeerAnswer> {
        let asks = candidates.iter().map(|&device| async move {
            let msg = PeerMsg::Query {
                device,
                pg: self.id,
                term,
                epoch: map.epoch,
                from: map.device_node(self.dev),
            };
            let answer = ctx.peers.ask(map, device, &msg, Bytes::new()).await;
            (device, answer)
        });
        let mut out = BTreeMap::new();
        for (device, answer) in futures::future::join_all(asks).await {
            match answer {
                Ok((a @ (PeerAnswer::Holding(_) | PeerAnswer::Promised(_)), _)) => {
                    out.insert(device, a);
                }
                Ok((other, _)) => tracing::warn!(%device, "odd answer to a query: {other:?}"),
                Err(e) => tracing::debug!(pg = %self.id, %device, "no answer to the query: {e}"),
            }
        }
        out
    }

    /// Every object whose version may differ between the devices: each source's log since the
    /// lowest point every source is complete at; where a source's log is trimmed past it, every
    /// source's full listing. (A log trimmed by a forgotten tombstone, `reserve_tomb` in the
    /// store, no longer names the delete: the object is missing from that source's listing, and
    /// only another source's listing names it, where a member that missed the delete still
    /// holds it; `authority.rs` then finds the delete forgotten.)
    async fn changed_objects(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        holdings: &BTreeMap<DeviceId, Holding>,
        sources: &[DeviceId],
    ) -> Result<BTreeSet<ObjectId>, String> {
        let since = sources
            .iter()
            .map(|d| holdings[d].info.last_complete)
            .min()
            .unwrap_or(Version::NONE);
        let mut objects = BTreeSet::new();
        for &device in sources {
            let mut after = since;
            loop {
                let msg = PeerMsg::Log {
                    device,
                    pg: self.id,
                    since: after,
                    limit: BATCH,
                };
                let entries = match ask(ctx, map, device, &msg).await? {
                    PeerAnswer::Log {
                        trimmed: Some(_), ..
                    } => {
                        for &d in sources {
                            self.list_all(ctx, map, d, &mut objects).await?;
                        }
                        return Ok(objects);
                    }
                    PeerAnswer::Log { entries, .. } => entries,
                    other => return Err(format!("{device} answered a log query with {other:?}")),
                };
                let Some(last) = entries.last() else { break };
                after = last.version;
                let full = entries.len() == BATCH;
                objects.extend(entries.iter().map(|e| e.oid));
                if !full {
                    break;
                }
            }
        }
        Ok(objects)
    }

    /// Adds every object `device` holds of the PG.
    async fn list_all(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        device: DeviceId,
        objects: &mut BTreeSet<ObjectId>,
    ) -> Result<(), String> {
        let mut after = None;
        loop {
            let msg = PeerMsg::List {
                device,
                pg: self.id,
                after,
                limit: BATCH,
            };
            let PeerAnswer::List { entries: page } = ask(ctx, map, device, &msg).await? else {
                return Err(format!("{device} answered a listing oddly"));
            };
            let Some(last) = page.last() else {
                return Ok(());
            };
            after = Some(last.oid);
            objects.extend(page.iter().map(|h| h.oid));
        }
    }

    /// Every responder's copy of each object.
    async fn versions(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        responders: &[DeviceId],
        objects: &BTreeSet<ObjectId>,
    ) -> Result<BTreeMap<ObjectId, authority::Copies>, String> {
        let mut out: BTreeMap<ObjectId, authority::Copies> =
            objects.iter().map(|o| (*o, BTreeMap::new())).collect();
        let all: Vec<ObjectId> = objects.iter().copied().collect();
        for &device in responders {
            for chunk in all.chunks(BATCH) {
                let msg = PeerMsg::Versions {
                    device,
                    pg: self.id,
                    oids: chunk.to_vec(),
                };
                let PeerAnswer::Versions { held: vs } = ask(ctx, map, device, &msg).await? else {
                    return Err(format!("{device} answered a version query oddly"));
                };
                if vs.len() != chunk.len() {
                    return Err(format!(
                        "{device} answered {} of {} versions",
                        vs.len(),
                        chunk.len()
                    ));
                }
                for (oid, held) in chunk.iter().zip(vs) {
                    if let Some(h) = held {
                        out.get_mut(oid).expect("asked").insert(device, h);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Resets every divergent member's copy to the authority, before activation.
    async fn reset_divergent(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        term: Term,
        serving: &[DeviceId],
        copies: &BTreeMap<ObjectId, authority::Copies>,
        verdicts: &mut BTreeMap<ObjectId, Verdict>,
    ) -> Result<BTreeSet<DeviceId>, String> {
        let mut dropped = BTreeSet::new();
        for (oid, v) in verdicts.iter_mut().filter(|(_, v)| !v.divergent.is_empty()) {
            let c = &copies[oid];
            let (meta, data) = match v.auth {
                Auth::Present {
                    version,
                    deleted: false,
                    source,
                } => {
                    let others = c
                        .iter()
                        .filter(|(d, h)| **d != source && h.version == version && !h.deleted);
                    let holders: Vec<DeviceId> = std::iter::once(source)
                        .chain(others.map(|(d, _)| *d))
                        .collect();
                    let search = self.search(ctx, map, &holders, &[], *oid, version).await;
                    match search.found {
                        Some((_, meta, data)) => (meta, data),
                        None if search.bad.len() == holders.len() => {
                            dropped.extend(
                                self.roll_forward(ctx, map, term, serving, c, *oid, v)
                                    .await?,
                            );
                            continue;
                        }
                        None => {
                            return Err(format!(
                                "{oid}: no copy of {version} to roll back to: {}",
                                search.why.join("; ")
                            ));
                        }
                    }
                }
                _ => self.image(ctx, map, *oid, &v.auth).await?,
            };
            for dev in &v.divergent {
                tracing::info!(pg = %self.id, %oid, device = %dev, to = %v.auth.version(), "rolling back a write that was never acknowledged");
                self.put(ctx, map, *dev, term, *oid, meta.clone(), data.clone())
                    .await?;
            }
        }
        Ok(dropped)
    }

    /// Every copy of the authoritative version of `oid` fails its checksum (a partial-block
    /// write into a bad block failed on its only holder, say): the newest divergent copy that
    /// verifies becomes the authority instead, installed on every serving member that lacks it.
    /// Keeping a write that was never acknowledged is allowed (the client retries it anyway),
    /// and a divergent copy holds every acknowledged write (a member applies a PG's writes to
    /// an object in order, and serves only once current). When every divergent copy fails its
    /// checksum too, they are dropped and the object is left unfound; returns the devices they
    /// were dropped from.
    #[allow(clippy::too_many_arguments)]
    async fn roll_forward(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        term: Term,
        serving: &[DeviceId],
        copies: &authority::Copies,
        oid: ObjectId,
        v: &mut Verdict,
    ) -> Result<Vec<DeviceId>, String> {
        let mut bad = Vec::new();
        let mut newer: Vec<(Version, bool, DeviceId)> = v
            .divergent
            .iter()
            .filter_map(|d| copies.get(d).map(|h| (h.version, h.deleted, *d)))
            .collect();
        newer.sort_unstable_by(|a, b| b.cmp(a));
        for (version, deleted, dev) in newer {
            // A tombstone (an unfound object declared lost, say, whose tombstone was not
            // acknowledged) holds no data to fail a checksum.
            let (meta, data) = if deleted {
                let meta = ImageMeta {
                    version,
                    kind: ImageKind::Tombstone,
                    allocated: Vec::new(),
                };
                (meta, Bytes::new())
            } else {
                let search = self.search(ctx, map, &[dev], &[], oid, version).await;
                bad.extend(search.bad);
                match search.found {
                    Some((_, meta, data)) => (meta, data),
                    None => continue,
                }
            };
            let lacking = serving.iter().filter(|d| {
                copies
                    .get(d)
                    .is_none_or(|h| h.version != version || h.deleted != deleted)
            });
            for d in lacking {
                tracing::warn!(pg = %self.id, %oid, device = %d, from = %v.auth.version(), to = %version, "every copy of the acknowledged version fails its checksum: rolling forward to a newer copy");
                self.put(ctx, map, *d, term, oid, meta.clone(), data.clone())
                    .await?;
            }
            v.auth = Auth::Present {
                version,
                deleted,
                source: dev,
            };
            v.divergent.clear();
            v.behind.clear();
            return Ok(Vec::new());
        }
        if v.divergent.iter().any(|d| !bad.contains(d)) {
            // A divergent copy that did not answer may be good: wait for it.
            return Err(format!(
                "{oid}: every copy of {} fails its checksum and no newer copy verifies",
                v.auth.version()
            ));
        }
        self.repairs.unrepairable(1);
        // No copy of the object verifies anywhere: it is unfound (recovery lists it, its reads
        // fail, the operator may give it up: `lost.rs`), and the rest of the PG serves. The
        // divergent copies (never acknowledged, and bad) go, so that no later peering trusts
        // them; their members lack the object like any member behind, and are suspect
        // (`peer`) so that what they lack proves nothing. (Before, the PG stayed incomplete
        // until a good copy came back.)
        tracing::error!(
            pg = %self.id, %oid, divergent = ?v.divergent,
            "every copy of {} fails its checksum and no newer copy verifies: the divergent copies \
             go and the object is unfound",
            v.auth.version()
        );
        let (meta, data) = self.image(ctx, map, oid, &Auth::Absent).await?;
        let dropped = std::mem::take(&mut v.divergent);
        for d in &dropped {
            self.put(ctx, map, *d, term, oid, meta.clone(), data.clone())
                .await?;
            v.behind.push(*d);
        }
        Ok(dropped)
    }

    /// The authoritative image of `oid`.
    pub(super) async fn image(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        oid: ObjectId,
        auth: &Auth,
    ) -> Result<(ImageMeta, Bytes), String> {
        match *auth {
            Auth::Absent => Ok((
                ImageMeta {
                    version: Version::NONE,
                    kind: ImageKind::Absent,
                    allocated: Vec::new(),
                },
                Bytes::new(),
            )),
            Auth::Present {
                version,
                deleted: true,
                ..
            } => Ok((
                ImageMeta {
                    version,
                    kind: ImageKind::Tombstone,
                    allocated: Vec::new(),
                },
                Bytes::new(),
            )),
            Auth::Present {
                version, source, ..
            } => {
                let msg = PeerMsg::Get {
                    device: source,
                    pg: self.id,
                    oid,
                };
                let (answer, data) = ctx
                    .peers
                    .ask(map, source, &msg, Bytes::new())
                    .await
                    .map_err(|e| e.to_string())?;
                let PeerAnswer::Image(meta) = answer else {
                    return Err(format!("{source} answered a get oddly"));
                };
                if meta.version != version {
                    return Err(format!(
                        "{oid} changed on {source}: {} instead of {version}",
                        meta.version
                    ));
                }
                Ok((meta, data))
            }
        }
    }

    /// Installs an image on `dev` (this device: directly).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn put(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        dev: DeviceId,
        term: Term,
        oid: ObjectId,
        meta: ImageMeta,
        data: Bytes,
    ) -> Result<(), String> {
        if dev == self.dev {
            // Checked against this device's promise as a member's copy is: a peering of an
            // older term (a superseded generation still running) must not roll it back.
            let opts = WriteOptions::durable().in_pg(self.id.pg);
            let pending = self
                .submit_install(term, oid, meta.into_image(data), opts)
                .map_err(|e| e.to_string())?;
            return pending.await.map(|_| ()).map_err(|e| e.to_string());
        }
        let msg = PeerMsg::Put {
            device: dev,
            pg: self.id,
            term,
            oid,
            image: meta,
        };
        match ctx.peers.ask(map, dev, &msg, data).await {
            Ok((PeerAnswer::Done, _)) => Ok(()),
            Ok((other, _)) => Err(format!("{dev} answered a put with {other:?}")),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn activate(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        dev: DeviceId,
        term: Term,
        info: MemberInfo,
        readable: bool,
    ) -> Result<(), String> {
        let msg = PeerMsg::Activate {
            device: dev,
            pg: self.id,
            term,
            info,
            readable,
        };
        match ask(ctx, map, dev, &msg).await? {
            PeerAnswer::Done => Ok(()),
            other => Err(format!("{dev} answered an activation with {other:?}")),
        }
    }

    /// Links to the serving members other than this device.
    async fn links(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        serving: &[DeviceId],
    ) -> Result<Vec<Member>, String> {
        let mut out = Vec::new();
        for dev in serving.iter().copied().filter(|d| *d != self.dev) {
            let link = ctx.peers.link(map, dev).await.map_err(|e| e.to_string())?;
            out.push(Member { dev, link });
        }
        Ok(out)
    }

    /// Up-set members that do not serve: backfill targets (a backfill of this term goes on
    /// from its cursor; any other starts over: a new round may have rolled back writes the
    /// target got).
    async fn targets(
        &self,
        ctx: &Arc<Ctx>,
        map: &ClusterMap,
        entry: &basalt_placement::PgMap,
        holdings: &BTreeMap<DeviceId, Holding>,
        term: Term,
    ) -> Result<Vec<Target>, String> {
        let mut out = Vec::new();
        for &dev in entry.up.iter().filter(|d| !entry.acting.contains(d)) {
            if !map.is_up(dev) || !holdings.contains_key(&dev) {
                continue;
            }
            let cursor = holdings[&dev]
                .info
                .backfill
                .filter(|b| b.term == term)
                .and_then(|b| b.cursor);
            let link = ctx.peers.link(map, dev).await.map_err(|e| e.to_string())?;
            out.push(Target {
                member: Member { dev, link },
                cursor,
                done: false,
                objects: 0,
                walked: 0,
                dirty: Default::default(),
                tail: false,
            });
        }
        Ok(out)
    }
}

/// Sends a message and returns the answer (errors as text).
pub(super) async fn ask(
    ctx: &Arc<Ctx>,
    map: &ClusterMap,
    device: DeviceId,
    msg: &PeerMsg,
) -> Result<PeerAnswer, String> {
    ctx.peers
        .ask(map, device, msg, Bytes::new())
        .await
        .map(|(a, _)| a)
        .map_err(|e| e.to_string())
}

/// The map entry and `min_size` of `pg`.
pub(super) fn entry_of(
    map: &ClusterMap,
    pg: PgId,
) -> Result<(basalt_placement::PgMap, usize), String> {
    let pool = map
        .pools
        .get(&pg.pool)
        .ok_or_else(|| format!("{} is not in map epoch {}", pg.pool, map.epoch.0))?;
    let entry = pool
        .pgs
        .get(pg.pg as usize)
        .ok_or_else(|| format!("{pg} is not in map epoch {}", map.epoch.0))?;
    Ok((entry.clone(), usize::from(pool.min_size).max(1)))
}

/// Every serving member must answer (writes need them all), and so must every device of the
/// PG's last interval that the map says is up: answering is its promise to stop, so the primary
/// of that interval (alive but deposed) can serve no read or write once this term is active.
fn check_answers(
    map: &ClusterMap,
    history: &PgHistory,
    serving: &[DeviceId],
    holdings: &BTreeMap<DeviceId, Holding>,
    interval: Epoch,
) -> Result<(), String> {
    if let Some(d) = serving.iter().find(|d| !holdings.contains_key(d)) {
        return Err(format!("serving member {d} did not answer"));
    }
    if let Some(last) = history.last()
        && let Some(d) = last
            .members
            .iter()
            .find(|d| map.is_up(**d) && !holdings.contains_key(d))
    {
        return Err(format!(
            "{d}, a member of interval {} and up, did not answer",
            last.epoch
        ));
    }
    if let Some(h) = holdings
        .values()
        .find(|h| h.info.promised_floor() > interval)
    {
        return Err(format!(
            "a member was activated in interval {} (this map is older)",
            h.info.promised_floor()
        ));
    }
    Ok(())
}

/// Every past interval needs a reachable member that was activated in it (or later) and holds
/// complete data: it has every write acknowledged in that interval. A reachable member whose
/// last activation is older than the interval proves the interval never went active (a
/// primary activates every serving member before it serves), so it needs nobody. A suspect
/// member (its store dropped a journal tail: it may lack acknowledged writes, even its
/// activation) is neither, unless every member of the interval answered (nobody knows more).
/// A backfill target that completed in the interval is a witness too ([`completed_in`]), as
/// is a device made complete in a later interval ([`complete_after`]).
///
/// An interval with neither, some device of which did not answer, is given up (returned) when
/// every device that did not answer and is named by it or by a later interval is in `lost`
/// (an operator declared it gone for good: `basalt device lost`; a member of a later interval
/// may hold the interval's writes, copied there by recovery, without being its witness), so
/// long as a device that answered took part in the history (else nothing holds the PG's data,
/// and serving it empty is `basalt pg mark-lost`'s decision, not this one's).
fn check_history<'h>(
    history: &'h PgHistory,
    holdings: &BTreeMap<DeviceId, Holding>,
    lost: &BTreeSet<DeviceId>,
) -> Result<Vec<&'h PgInterval>, String> {
    let first = history.intervals.first().map_or(Epoch(0), |i| i.epoch);
    let survivor = holdings
        .values()
        .any(|h| h.info.backfill.is_none() && h.info.les >= first);
    let mut given_up = Vec::new();
    for (k, i) in history.intervals.iter().enumerate() {
        let answered: Vec<&Holding> = i.members.iter().filter_map(|d| holdings.get(d)).collect();
        let all = answered.len() == i.members.len();
        let counts = |h: &&&Holding| all || !h.info.suspect;
        let witness = answered
            .iter()
            .filter(counts)
            .any(|h| h.info.backfill.is_none() && h.info.les >= i.epoch)
            || holdings.iter().any(|(d, h)| completed_in(i, *d, h))
            || holdings.values().any(|h| complete_after(history, i, h));
        let never_active = answered.iter().filter(counts).any(|h| h.info.les < i.epoch);
        if witness || never_active {
            continue;
        }
        let unreached = |j: &'h PgInterval| j.devices().filter(|d| !holdings.contains_key(d));
        if unreached(i).next().is_none() {
            // Every device of it answered and none is a witness: no declaration helps.
            return Err(format!(
                "no device of interval {} ({}) is a witness: it may hold acknowledged writes no \
                 other device has",
                i.epoch,
                names(&i.members)
            ));
        }
        // A device of a later interval may hold this one's writes (recovery copied them to
        // it) without being its witness: it must not be waiting either.
        let mut waiting: Vec<DeviceId> = history.intervals[k..]
            .iter()
            .flat_map(unreached)
            .filter(|d| !lost.contains(d))
            .collect();
        waiting.sort_unstable();
        waiting.dedup();
        if !waiting.is_empty() {
            return Err(format!(
                "no device of interval {} ({}) is reachable: it may hold acknowledged writes no \
                 other device has; waiting for {} (if they are gone for good, `basalt device \
                 lost ID` gives up the writes only they hold)",
                i.epoch,
                names(&i.members),
                names(&waiting)
            ));
        }
        if !survivor {
            return Err(format!(
                "every device of interval {} ({}) that may hold its writes is declared lost, \
                 and no device that answered took part in the PG's history: none holds its data \
                 (`basalt pg mark-lost` gives it up)",
                i.epoch,
                names(&i.members)
            ));
        }
        given_up.push(i);
    }
    Ok(given_up)
}

/// `dev.1, dev.2`.
fn names(devices: &[DeviceId]) -> String {
    let names: Vec<String> = devices.iter().map(DeviceId::to_string).collect();
    names.join(", ")
}

/// The devices named by `history` that did not answer and that an operator declared lost
/// (their records say so: `basalt device lost`). Read only when peering would otherwise wait.
async fn lost_devices(
    ctx: &Ctx,
    history: &PgHistory,
    holdings: &BTreeMap<DeviceId, Holding>,
) -> Result<BTreeSet<DeviceId>, String> {
    let named = history.devices();
    let records = ctx
        .catalog
        .list_devices()
        .await
        .map_err(|e| e.to_string())?;
    let lost = records
        .into_iter()
        .filter(|r| r.lost && named.contains(&r.id) && !holdings.contains_key(&r.id))
        .map(|r| r.id)
        .collect();
    Ok(lost)
}

/// Whether `dev`, not a member of interval `i`, completed a backfill in the interval's last
/// term that went active: the history lists it (`backfill.rs::record_completion`, by the
/// primary of that term once the target was activated complete, and only while the history
/// names that term: a later term clears the list before it serves, `extend`), and its own
/// record does not contradict it (activated in `i` or later, complete, not suspect). It holds
/// every write acknowledged in `i`: those of earlier terms and of this one before its
/// completion it got from the backfill, the later ones of this term as any member (a write
/// it fails is not acknowledged), and no later term of `i` served; what it got since only
/// adds to that (an activation in a later interval, or a later backfill completed). Without
/// it, a PG moved by a backfill onto new devices stays incomplete when every member of its old
/// interval dies before the new ones peer (one copy: the node drained, killed as the move
/// completed).
fn completed_in(i: &PgInterval, dev: DeviceId, h: &Holding) -> bool {
    i.backfilled.contains(&dev)
        && !i.members.contains(&dev)
        && !h.info.suspect
        && h.info.backfill.is_none()
        && h.info.les >= i.epoch
}

/// Whether a device that answered was made complete in an interval the history records after
/// `i` (its `last_complete`, set only by the activation of a member that lacked nothing, by
/// recovery once it lacks nothing, or by a backfill's completion, names that interval), and
/// lost nothing since (not suspect, no backfill under way). It holds every write acknowledged
/// in `i`: the peering of that later interval read a history holding `i` (an interval is
/// appended only after every older one it knows of, by compare-and-swap), so it had a witness
/// of `i` (or the operator gave `i` up), and the authority it decided, which the device held
/// whole, includes them; what the device applied since only adds to that. The interval must
/// be recorded: one below `min_size` is not, and a backfill completed in it raises
/// `last_complete` all the same, while a primary with an older map may still append an
/// interval older than it (a review found the schedule). As Ceph's peering, which needs no
/// member of an interval that ended before the newest activation it finds. Without it, a PG
/// whose old interval's members are all down waited for one of them although a device held
/// everything (three copies: interval e4 on A and B while C was down, C back and recovered in
/// e5 on B and C, then A and B down).
fn complete_after(history: &PgHistory, i: &PgInterval, h: &Holding) -> bool {
    let lc = h.info.last_complete.epoch;
    !h.info.suspect
        && h.info.backfill.is_none()
        && history
            .intervals
            .iter()
            .any(|j| j.epoch > i.epoch && j.epoch.0 == lc)
}

/// The devices whose data counts: they answered, hold complete data (no backfill under way),
/// and were activated since the history began (a device last active before the PG was last
/// clean holds nothing the clean members lack, and may hold objects deleted since), or never
/// held anything of the PG (no object, nothing in its log: an acting member of a new PG that
/// was down when the PG first went active; it adds nothing to any object's authority, and as
/// its `last_complete` is none, peering compares every object and recovery copies each onto
/// it).
fn sources(history: &PgHistory, holdings: &BTreeMap<DeviceId, Holding>) -> Vec<DeviceId> {
    let first = history.intervals.first().map_or(Epoch(0), |i| i.epoch);
    let empty = |h: &Holding| h.objects == 0 && h.last_update == Version::NONE;
    holdings
        .iter()
        .filter(|(_, h)| h.info.backfill.is_none() && (h.info.les >= first || empty(h)))
        .map(|(d, _)| *d)
        .collect()
}

/// Serving members that are not sources but suspect: their store cut a journal tail of the
/// PG, and with it maybe their activation in a later interval, so they look activated last
/// before the history began although they may have served in it (seed 460723: the record of
/// an activation in the one interval the history was compacted to). They are brought up to
/// date from a full comparison (`Verdict::place_stale`) instead of being refused, which resets
/// what they hold that the sources lack: so only while the sources provably hold every
/// acknowledged write. Every interval of the history must have a member of its own, not one of
/// these, that answered, is not suspect and has complete data: activated in the interval or
/// later, it served the interval and lost nothing since (a source; the first interval's was
/// complete when the history began); activated last before it, it proves the interval never
/// went active (nothing was acknowledged in it). Else none is stale, and peering refuses them as
/// before (a stale member's copy may then be the only one: one copy, or every other member
/// suspect too). So is any other serving member that is not a source: a PG whose every acting
/// device went down and was marked out moved to its up set (`placement/src/acting.rs`), which
/// may name a target whose backfill had not finished, or a device that held the PG before its
/// history began and was never made a target (a stray back in the up set); what it holds is
/// not authoritative. A backfill target listed complete in an interval (`completed_in`) is a
/// witness of it here too, as is a device made complete in a later interval
/// (`complete_after`).
fn stale(
    history: &PgHistory,
    serving: &[DeviceId],
    sources: &[DeviceId],
    holdings: &BTreeMap<DeviceId, Holding>,
) -> Vec<DeviceId> {
    let stale: Vec<DeviceId> = serving
        .iter()
        .filter(|d| !sources.contains(d) && holdings.contains_key(d))
        .copied()
        .collect();
    let witnessed = |i: &PgInterval| {
        i.members.iter().any(|m| {
            !stale.contains(m)
                && holdings
                    .get(m)
                    .is_some_and(|h| !h.info.suspect && h.info.backfill.is_none())
        }) || holdings.iter().any(|(d, h)| {
            !stale.contains(d) && (completed_in(i, *d, h) || complete_after(history, i, h))
        })
    };
    match history.intervals.iter().all(witnessed) {
        true => stale,
        false => Vec::new(),
    }
}

/// The highest round of `interval` whose versions some member holds.
fn used_round(holdings: &BTreeMap<DeviceId, Holding>, interval: Epoch) -> Option<u64> {
    holdings
        .values()
        .map(|h| h.last_update)
        .filter(|v| v.epoch == interval.0)
        .map(|v| v.seq >> Term::ROUND_SHIFT)
        .max()
}

/// The history with the interval of `term` appended (unless it is already the last) and
/// recorded as served by `term`: a later round of the same interval clears the backfill
/// targets an earlier round saw complete (`completed_in`), since this term's writes reach
/// them only as its own backfill covers them. Fails if a newer round recorded itself already.
fn extend(history: &PgHistory, term: Term, serving: &[DeviceId]) -> Result<PgHistory, String> {
    let mut h = history.clone();
    match h.intervals.last_mut() {
        Some(l) if l.epoch == term.interval => {
            if l.round > term.round {
                return Err(format!(
                    "round {} of interval {} went active already",
                    l.round, l.epoch
                ));
            }
            if l.round < term.round {
                l.round = term.round;
                l.backfilled.clear();
            }
        }
        Some(l) if l.epoch > term.interval => {
            return Err(format!("the history has a newer interval {}", l.epoch));
        }
        _ => h
            .intervals
            .push(PgInterval::new(term.interval, serving.to_vec(), term.round)),
    }
    Ok(h)
}

/// What members lack, by object, and which devices hold the authoritative version.
fn missing_of(
    verdicts: &BTreeMap<ObjectId, Verdict>,
    copies: &BTreeMap<ObjectId, authority::Copies>,
) -> BTreeMap<ObjectId, Missing> {
    verdicts
        .iter()
        .filter(|(_, v)| !v.behind.is_empty())
        .filter_map(|(oid, v)| match v.auth {
            Auth::Present {
                version,
                deleted,
                source,
            } => {
                let others = copies[oid]
                    .iter()
                    .filter(|(d, h)| **d != source && h.version == version && h.deleted == deleted)
                    .map(|(d, _)| *d);
                let m = Missing {
                    version,
                    deleted,
                    sources: std::iter::once(source).chain(others).collect(),
                    need: v.behind.clone(),
                };
                Some((*oid, m))
            }
            Auth::Absent => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::info::Backfill;
    use super::*;

    fn history(intervals: &[(u64, &[u32])]) -> PgHistory {
        PgHistory {
            intervals: intervals
                .iter()
                .map(|(e, m)| {
                    PgInterval::new(Epoch(*e), m.iter().map(|d| DeviceId(*d)).collect(), 0)
                })
                .collect(),
            clean: Epoch(0),
            strays: Vec::new(),
        }
    }

    fn holding(les: u64, backfill: bool) -> Holding {
        Holding {
            info: MemberInfo {
                les: Epoch(les),
                last_complete: Version::NONE,
                backfill: backfill.then_some(Backfill {
                    term: Term::new(Epoch(les), 0),
                    cursor: None,
                }),
                activated: Epoch(les),
                suspect: false,
            },
            last_update: Version::NONE,
            log_tail: Version::NONE,
            objects: 0,
        }
    }

    fn holdings(h: &[(u32, Holding)]) -> BTreeMap<DeviceId, Holding> {
        h.iter().map(|(d, h)| (DeviceId(*d), *h)).collect()
    }

    #[test]
    fn an_interval_needs_a_reachable_witness() {
        // Interval 5 ran on devices 1 and 2; only device 3 (not a member) answers.
        let h = history(&[(5, &[1, 2]), (7, &[3])]);
        let err = check_history(&h, &holdings(&[(3, holding(7, false))]), &none()).unwrap_err();
        assert!(err.contains("interval e5"), "{err}");
        // Device 2 answers and was activated in 5: a witness.
        check_history(
            &h,
            &holdings(&[(2, holding(5, false)), (3, holding(7, false))]),
            &none(),
        )
        .unwrap();
    }

    fn none() -> BTreeSet<DeviceId> {
        BTreeSet::new()
    }

    fn lost(ds: &[u32]) -> BTreeSet<DeviceId> {
        ds.iter().map(|d| DeviceId(*d)).collect()
    }

    /// An interval no device of which answered is given up only when every such device is
    /// declared lost, and only while a device that answered took part in the history.
    #[test]
    fn an_interval_whose_unreached_devices_are_lost_is_given_up() {
        // Interval 5 ran on 1 and 2, interval 7 on 2 alone; 1 answers (activated in 5).
        let h = history(&[(5, &[1, 2]), (7, &[2])]);
        let one = holdings(&[(1, holding(5, false))]);
        let err = check_history(&h, &one, &none()).unwrap_err();
        assert!(
            err.contains("interval e7") && err.contains("device lost"),
            "{err}"
        );
        let given_up = check_history(&h, &one, &lost(&[2])).unwrap();
        assert_eq!(
            given_up.iter().map(|i| i.epoch).collect::<Vec<_>>(),
            [Epoch(7)]
        );
        // A device lost but another of the interval not: still waits for that one.
        let h2 = history(&[(5, &[1, 2]), (7, &[2, 3])]);
        let err = check_history(&h2, &one, &lost(&[2])).unwrap_err();
        assert!(err.contains("interval e7"), "{err}");
        // A backfill target listed complete in it that did not answer counts as its device.
        let mut h3 = history(&[(5, &[1, 2]), (7, &[2])]);
        h3.intervals[1].backfilled.push(DeviceId(4));
        check_history(&h3, &one, &lost(&[2])).unwrap_err();
        check_history(&h3, &one, &lost(&[2, 4])).unwrap();
        // Every device of interval 7 answered, none a witness (backfilling again): a device
        // lost elsewhere in the history gives nothing up.
        let h4 = history(&[(5, &[1, 3]), (7, &[2])]);
        let busy = holdings(&[(1, holding(5, false)), (2, holding(7, true))]);
        check_history(&h4, &busy, &lost(&[3])).unwrap_err();
        // A member of a later interval that did not answer may hold interval 5's writes
        // (recovery copied them to it): waited for unless it is lost too (review finding: 4,
        // complete in 7, lacked what recovery had copied to 3 only).
        let h5 = history(&[(5, &[2]), (7, &[2, 3, 4])]);
        let four = holdings(&[(4, holding(7, false))]);
        let err = check_history(&h5, &four, &lost(&[2])).unwrap_err();
        assert!(err.contains("waiting for dev.3"), "{err}");
        let given_up = check_history(&h5, &four, &lost(&[2, 3])).unwrap();
        assert_eq!(given_up.len(), 1);
        // Only a device that never took part answered: nothing holds the data.
        let stranger = holdings(&[(9, holding(0, false))]);
        let err = check_history(&h, &stranger, &lost(&[1, 2])).unwrap_err();
        assert!(err.contains("pg mark-lost"), "{err}");
    }

    /// A device made complete in a later interval holds every write acknowledged in an
    /// earlier one whose members are all unreachable.
    #[test]
    fn a_device_complete_in_a_later_interval_witnesses_an_earlier_one() {
        // Interval 4 ran on 1 and 2 (3 down); 3 came back and served interval 5 with 2.
        let h = history(&[(4, &[1, 2]), (5, &[2, 3])]);
        let complete = |lc: Version, suspect: bool| {
            let mut h = holding(5, false);
            h.info.last_complete = lc;
            h.info.suspect = suspect;
            holdings(&[(3, h)])
        };
        // Activated in 5 but not yet recovered: it may lack writes acknowledged in 4.
        let err = check_history(&h, &complete(Version::new(3, 7), false), &none()).unwrap_err();
        assert!(
            err.contains("interval e4") && err.contains("dev.1, dev.2"),
            "{err}"
        );
        // Complete in 5: it holds them, and is 5's own witness too.
        let given_up = check_history(&h, &complete(Version::new(5, 0), false), &none()).unwrap();
        assert!(given_up.is_empty());
        // Suspect (its store dropped a journal tail since): it may have lost them.
        check_history(&h, &complete(Version::new(5, 0), true), &none()).unwrap_err();
        // Complete in 6, an interval the history does not record (below `min_size`, a
        // backfill completed in it): an older interval may still be appended before it.
        check_history(&h, &complete(Version::new(6, 0), false), &none()).unwrap_err();
        // Complete in 5 but backfilling again: its data is not whole.
        let mut busy = holding(5, true);
        busy.info.last_complete = Version::new(5, 0);
        check_history(&h, &holdings(&[(3, busy)]), &none()).unwrap_err();
    }

    #[test]
    fn a_backfill_target_complete_in_an_interval_is_its_witness() {
        // Interval 5 ran on device 1 alone; device 2 was backfilled in its last term.
        let mut h = history(&[(5, &[1])]);
        let err = check_history(&h, &holdings(&[(2, holding(5, false))]), &none()).unwrap_err();
        assert!(err.contains("interval e5"), "not listed: {err}");
        h.intervals[0].backfilled = vec![DeviceId(2)];
        check_history(&h, &holdings(&[(2, holding(5, false))]), &none()).unwrap();
        // Activated later (a member of a later interval): still holds what it got.
        check_history(&h, &holdings(&[(2, holding(6, false))]), &none()).unwrap();
        // Backfilling again, suspect, or last activated before the interval: no witness.
        let mut suspect = holding(5, false);
        suspect.info.suspect = true;
        for h2 in [holding(5, true), suspect, holding(4, false)] {
            let err = check_history(&h, &holdings(&[(2, h2)]), &none()).unwrap_err();
            assert!(err.contains("interval e5"), "{err}");
        }
    }

    #[test]
    fn a_later_term_of_an_interval_clears_its_completed_backfills() {
        let term = |round| Term::new(Epoch(5), round);
        let mut h = extend(&PgHistory::default(), term(1), &[DeviceId(1)]).unwrap();
        assert_eq!(h.intervals[0].round, 1);
        h.intervals[0].backfilled = vec![DeviceId(2)];
        // The same term again: unchanged.
        assert_eq!(extend(&h, term(1), &[DeviceId(1)]).unwrap(), h);
        // A later round: recorded, the list cleared.
        let later = extend(&h, term(2), &[DeviceId(1)]).unwrap();
        assert_eq!(later.intervals.len(), 1);
        assert_eq!(later.intervals[0].round, 2);
        assert!(later.intervals[0].backfilled.is_empty());
        // An older round, or an older interval than the history's last: refused.
        assert!(extend(&later, term(1), &[DeviceId(1)]).is_err());
        assert!(extend(&later, Term::new(Epoch(4), 9), &[DeviceId(1)]).is_err());
        // A newer interval: appended with its round.
        let next = extend(&later, Term::new(Epoch(7), 0), &[DeviceId(2)]).unwrap();
        assert_eq!(next.intervals.len(), 2);
        assert_eq!(next.intervals[0].backfilled, Vec::<DeviceId>::new());
    }

    #[test]
    fn a_member_still_backfilling_is_no_witness() {
        let h = history(&[(5, &[1, 2])]);
        let err = check_history(&h, &holdings(&[(2, holding(5, true))]), &none()).unwrap_err();
        assert!(err.contains("interval e5"), "{err}");
    }

    #[test]
    fn a_suspect_member_is_a_witness_only_when_every_member_answered() {
        // Device 2's store dropped a journal tail: it may lack writes of interval 5 (or even
        // its activation in it) that device 1 holds. Wait for device 1.
        let h = history(&[(5, &[1, 2])]);
        let suspect = |les| {
            let mut h = holding(les, false);
            h.info.suspect = true;
            h
        };
        let err = check_history(&h, &holdings(&[(2, suspect(5))]), &none()).unwrap_err();
        assert!(err.contains("interval e5"), "{err}");
        let err = check_history(&h, &holdings(&[(2, suspect(3))]), &none()).unwrap_err();
        assert!(err.contains("interval e5"), "{err}");
        // Every member answered, both suspect (a power loss of both): nobody knows more.
        check_history(&h, &holdings(&[(1, suspect(5)), (2, suspect(5))]), &none()).unwrap();
    }

    #[test]
    fn a_member_last_active_before_an_interval_proves_it_never_went_active() {
        // Device 1 was last activated in 3: interval 5, which names it, never activated it,
        // so interval 5 never served a write.
        let h = history(&[(5, &[1, 2])]);
        check_history(&h, &holdings(&[(1, holding(3, false))]), &none()).unwrap();
    }

    #[test]
    fn sources_are_complete_members_activated_since_the_history_began() {
        let h = history(&[(5, &[1, 2]), (7, &[1, 3])]);
        // Device 4 was last active before the history began and holds objects, device 6 only
        // tombstones (its log is not empty); device 5 was never activated and never held
        // anything (it counts: it adds nothing, and lacks everything).
        let mut old = holding(2, false);
        old.objects = 3;
        old.last_update = Term::new(Epoch(2), 0).version(4).unwrap();
        let mut tombs = holding(2, false);
        tombs.last_update = Term::new(Epoch(2), 0).version(9).unwrap();
        let all = holdings(&[
            (1, holding(7, false)),
            (2, holding(5, false)),
            (3, holding(7, true)),
            (4, old),
            (5, holding(0, false)),
            (6, tombs),
        ]);
        assert_eq!(
            sources(&h, &all),
            vec![DeviceId(1), DeviceId(2), DeviceId(5)]
        );
    }

    /// A suspect serving member last activated before the history began is made current only
    /// while every interval has a witness of its own that is neither suspect nor stale (seed
    /// 460723); else the sources may lack what it holds, and it is refused as before.
    #[test]
    fn a_stale_member_is_made_current_only_while_every_interval_is_witnessed() {
        let mut cut = holding(10, false);
        cut.objects = 4;
        cut.last_update = Term::new(Epoch(10), 0).version(3).unwrap();
        cut.info.suspect = true;
        let h = history(&[(14, &[40, 31, 11])]);
        let all = holdings(&[
            (40, holding(14, false)),
            (31, holding(14, false)),
            (11, cut),
        ]);
        let serving = [DeviceId(40), DeviceId(31), DeviceId(11)];
        let src = sources(&h, &all);
        assert_eq!(src, vec![DeviceId(31), DeviceId(40)]);
        assert_eq!(stale(&h, &serving, &src, &all), vec![DeviceId(11)]);
        // The other members suspect too: nobody provably holds every acknowledged write.
        let mut doubt = all.clone();
        for d in [40, 31] {
            doubt.get_mut(&DeviceId(d)).unwrap().info.suspect = true;
        }
        assert!(stale(&h, &serving, &src, &doubt).is_empty());
        // One copy: the stale member is all there is (its copies may be the only ones).
        let one = history(&[(14, &[11])]);
        let alone = holdings(&[(11, cut)]);
        let src = sources(&one, &alone);
        assert!(src.is_empty());
        assert!(stale(&one, &[DeviceId(11)], &src, &alone).is_empty());
        // An older interval whose other member did not answer: unwitnessed.
        let two = history(&[(12, &[11, 21]), (14, &[40, 31, 11])]);
        let src = sources(&two, &all);
        assert!(stale(&two, &serving, &src, &all).is_empty());
        // Unless a source was made complete in the later interval: it holds every write
        // acknowledged in the older one (`complete_after`).
        let mut complete = all.clone();
        complete.get_mut(&DeviceId(40)).unwrap().info.last_complete = Version::new(14, 0);
        check_history(&two, &complete, &none()).unwrap();
        assert_eq!(stale(&two, &serving, &src, &complete), vec![DeviceId(11)]);
        // A later interval that never went active (its members were activated last before it,
        // seed 460723's second peering): witnessed by that proof.
        let never = history(&[(14, &[40, 31, 11]), (47, &[40, 31, 11])]);
        let src = sources(&never, &all);
        assert_eq!(stale(&never, &serving, &src, &all), vec![DeviceId(11)]);
    }

    #[test]
    fn a_serving_member_that_is_no_source_is_stale_while_every_interval_is_witnessed() {
        // Interval 14 on 40 and 31; serving now (the up set, after every acting device was
        // marked out): 50, part way through a backfill, and 60, a stray that held the PG before
        // its history began. Both are compared and made current while 40 witnesses 14.
        let mut part = holding(14, true);
        part.objects = 2;
        let mut stray = holding(9, false);
        stray.objects = 3;
        stray.last_update = Term::new(Epoch(9), 0).version(5).unwrap();
        let h = history(&[(14, &[40, 31])]);
        let all = holdings(&[(40, holding(14, false)), (50, part), (60, stray)]);
        let serving = [DeviceId(50), DeviceId(60)];
        let src = sources(&h, &all);
        assert_eq!(src, vec![DeviceId(40)]);
        assert_eq!(
            stale(&h, &serving, &src, &all),
            vec![DeviceId(50), DeviceId(60)]
        );
        // Nobody of interval 14 answered: nothing is reset.
        let alone = holdings(&[(50, part), (60, stray)]);
        assert!(stale(&h, &serving, &sources(&h, &alone), &alone).is_empty());
        // A backfill target listed complete in 14 witnesses it instead.
        let mut listed = h.clone();
        listed.intervals[0].backfilled = vec![DeviceId(70)];
        let with_target = holdings(&[(50, part), (60, stray), (70, holding(14, false))]);
        let src = sources(&listed, &with_target);
        assert_eq!(
            stale(&listed, &serving, &src, &with_target),
            vec![DeviceId(50), DeviceId(60)]
        );
    }

    #[test]
    fn a_new_round_is_above_every_version_members_hold() {
        let mut h = holding(7, false);
        let term = Term::new(Epoch(7), 3);
        h.last_update = term.version(12).unwrap();
        let mut older = holding(5, false);
        older.last_update = Term::new(Epoch(5), 9).version(1).unwrap();
        let all = holdings(&[(1, h), (2, older)]);
        assert_eq!(used_round(&all, Epoch(7)), Some(3));
        assert_eq!(used_round(&all, Epoch(8)), None);
    }
}
