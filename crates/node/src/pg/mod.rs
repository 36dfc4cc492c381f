//! Placement groups on this node: replication, peering, recovery and backfill.
//!
//! Every (local device, PG) pair the map names (acting or up) has a [`Pg`]. Its state says what
//! the device is for the PG:
//! - a **member** (any device of the acting or up set): it persists what it knows
//!   ([`info::MemberInfo`] in the store's PG record), promises to refuse sub-operations of
//!   intervals older than the newest peering it answered, and applies sub-operations of the
//!   interval it was activated in (`replica.rs`);
//! - the **primary** (first up device of the acting set) also runs the PG: it peers when the
//!   PG's interval changes (`peering.rs`), serves reads and orders writes (`primary.rs`),
//!   recovers objects that members miss (`recovery.rs`), copies the PG to up-set members that do
//!   not have it yet (`backfill.rs`), and reports when the PG is clean.
//!
//! docs/design/replication.md describes the protocol and why it never loses or rolls back an
//! acknowledged write.

mod authority;
mod backfill;
pub(crate) mod cut;
mod fallback;
pub(crate) mod held;
pub(crate) mod info;
pub(crate) mod lost;
mod merge;
pub(crate) mod messages;
mod peering;
mod primary;
pub(crate) use primary::WriteKind;
mod recovery;
pub(crate) mod repair;
pub(crate) mod replica;
mod replica_read;
pub mod scrub;
mod strays;
pub(crate) mod throttle;

use crate::mapstate::MapState;
use crate::peers::Peers;
use basalt_engine::Store;
use basalt_link::Link;
use basalt_meta::Catalog;
use basalt_placement::{ClusterMap, PgMap};
use basalt_types::{DeviceId, Epoch, ObjectId, PgId, Term, Version};
use info::MemberInfo;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, oneshot};

/// What the PG machinery needs from the node.
pub(crate) struct Ctx {
    pub maps: Arc<MapState>,
    pub catalog: Catalog,
    pub peers: Arc<Peers>,
    pub tuning: Tuning,
    /// The recovery throttle and what recovery moved.
    pub recovery: Recovery,
    /// Read leases given and held (`readlease.rs`).
    pub leases: Arc<crate::readlease::ReadLeases>,
    /// The node stopped (`Node::shutdown`, `Node::kill`): no primary starts on its behalf
    /// again (a write that failed on the closed store would otherwise peer anew).
    pub stopped: AtomicBool,
    /// The newest session generation of each client (`sessions.rs`): a write of an older one
    /// is not versioned.
    pub sessions: crate::sessions::Sessions,
}

/// The node's recovery throttle (following the cluster settings) and counters.
pub(crate) struct Recovery {
    pub throttle: Arc<throttle::Throttle>,
    pub rate: throttle::RecoveryRate,
}

impl Recovery {
    pub fn new(tuning: &Tuning) -> Recovery {
        Recovery {
            throttle: Arc::new(throttle::Throttle::new(throttle::Limits {
                bytes_per_sec: tuning.recovery_bytes_per_sec,
                share_percent: tuning.recovery_share_percent,
                backfill_full_percent: tuning.backfill_full_percent,
            })),
            rate: throttle::RecoveryRate::default(),
        }
    }
}

/// Settings of recovery and peering.
#[derive(Clone, Debug)]
pub struct Tuning {
    /// Bytes per second the recovery and backfill driven by one device may move (0:
    /// unlimited), unless the cluster settings say otherwise (`pg/throttle.rs`).
    pub recovery_bytes_per_sec: u64,
    /// Percent of a device's time its recovery and backfill may keep it busy (1..=100), unless
    /// the cluster settings say otherwise.
    pub recovery_share_percent: u8,
    /// Percent of a device's capacity past which it takes no more backfill (1..=100), unless
    /// the cluster settings say otherwise (`replica.rs`).
    pub backfill_full_percent: u8,
    /// Objects a PG recovers or backfills at once.
    pub recovery_parallel: usize,
    /// How long an incomplete PG waits before peering again on its own.
    pub retry: Duration,
    /// How long after the node starts the background scrub begins (peering and recovery
    /// first), and the least time between two of its passes over the node's PGs.
    pub scrub_start_delay: Duration,
    pub scrub_pass_pause: Duration,
    /// How long the node takes to act on a newly installed map (its PGs see it that much
    /// later than the rest of the node): 0, except in the cluster simulation, where it stands
    /// for a busy node and opens the window in which a PG's work of the older map meets the
    /// newer one.
    pub map_lag: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            recovery_bytes_per_sec: 256 << 20,
            recovery_share_percent: 100,
            backfill_full_percent: 90,
            recovery_parallel: 4,
            retry: Duration::from_secs(1),
            scrub_start_delay: Duration::from_secs(30),
            scrub_pass_pause: Duration::from_secs(60),
            map_lag: Duration::ZERO,
        }
    }
}

/// The PGs of this node's devices.
pub(crate) struct Pgs {
    pub ctx: Arc<Ctx>,
    stores: BTreeMap<DeviceId, Store>,
    pgs: Mutex<BTreeMap<(DeviceId, PgId), Arc<Pg>>>,
    /// The background scrub's rate and what scrubs compared (`scrub.rs`).
    pub scrub: ScrubStats,
    /// Repairs of every PG since the node started (they outlive a PG that leaves the node).
    repairs: Arc<repair::RepairTotals>,
    /// Devices whose note says a PG without a record is suspect (`cut.rs`).
    unknown_suspect: Mutex<BTreeSet<DeviceId>>,
    /// Bytes of backfill copies each device accepted and has not installed yet
    /// (`replica.rs::Pgs::room_for_backfill`).
    pub(crate) backfill_inflight: Mutex<BTreeMap<DeviceId, u64>>,
}

/// The scrub setting and counters of a node.
#[derive(Default)]
pub(crate) struct ScrubStats {
    /// Bytes of object data the background scrub compares per second (0: off).
    pub rate: std::sync::atomic::AtomicU64,
    /// Objects, bytes and PGs scrubbed since the node started (background and on demand).
    pub objects: std::sync::atomic::AtomicU64,
    pub bytes: std::sync::atomic::AtomicU64,
    pub pgs: std::sync::atomic::AtomicU64,
}

/// One PG on one local device.
pub(crate) struct Pg {
    pub dev: DeviceId,
    pub id: PgId,
    pub store: Store,
    pub st: Mutex<PgState>,
    /// Woken whenever the state changes (activation, an object recovered, a status change).
    pub changed: Notify,
    /// Woken when the primary's last write in flight completes (`replica_read.rs`:
    /// `publish_commits`).
    pub writes_idle: Notify,
    /// Woken when a client's read or write starts waiting for a missing object: recovery
    /// stops waiting for the throttle (`recovery.rs`).
    pub client_waits: Notify,
    /// Copies repaired here as the primary (read repair, scrub), since the node started.
    pub repairs: repair::RepairStats,
    /// Held while the PG is scrubbed (one scrub of a PG at a time).
    pub scrubbing: tokio::sync::Mutex<()>,
    /// Recovery or backfill rounds in a row that failed (reset once one completes): each
    /// waits longer before the PG peers again ([`retry_after`]).
    pub failed_rounds: AtomicU32,
    /// Why the last backfill stopped, when a target refused copies for being used past the
    /// backfill-full limit (`replica.rs::BACKFILL_FULL`), by the current generation; cleared
    /// once a backfill round of the PG completes. Status shows it (`backfill_toofull`) while
    /// the primary has targets left.
    pub toofull: Mutex<Option<String>>,
}

/// How long the primary waits before peering again after `failed` rounds of recovery or
/// backfill in a row failed: `retry` doubled per failure, at most [`MAX_RETRY`]. A failure that
/// lasts (an object with no good copy anywhere, a source that keeps refusing) then costs a few
/// attempts a minute instead of a busy loop, each of which would read every bad copy again.
pub(crate) fn retry_after(retry: Duration, failed: u32) -> Duration {
    retry
        .saturating_mul(1u32 << failed.min(16))
        .min(MAX_RETRY)
        .max(retry)
}

/// The longest wait between two recovery or backfill attempts of a PG.
pub(crate) const MAX_RETRY: Duration = Duration::from_secs(30);

/// Where a PG stands on the primary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "why")]
pub(crate) enum Status {
    Peering,
    Active,
    /// Peered with fewer serving members than the pool's `min_size`: its members are reconciled
    /// and recovery and backfill run (so the PG can regain its up set), but it serves no client
    /// I/O, and its interval is not recorded in the history (nothing is acknowledged in it).
    Peered(String),
    /// Cannot go active: no member of some past interval reachable, or a serving member did
    /// not answer.
    Incomplete(String),
}

/// A member the primary forwards to.
#[derive(Clone)]
pub(crate) struct Member {
    pub dev: DeviceId,
    pub link: Arc<dyn Link>,
}

/// An up-set member being filled by backfill.
#[derive(Clone)]
pub(crate) struct Target {
    pub member: Member,
    /// Objects up to and including this one are current on the target (None: none yet).
    pub cursor: Option<ObjectId>,
    pub done: bool,
    /// Objects and tombstones of the PG on the primary when its backfill began (0: not yet).
    pub objects: u64,
    /// Objects walked past since then.
    pub walked: u64,
    /// Objects written past the cursor since their last copy (the write did not reach the
    /// target): copied again before the cursor is persisted past them and before the target
    /// is done, so an object created after the walk listed its page is not skipped.
    pub dirty: BTreeSet<ObjectId>,
    /// The walk has listed and copied every object of the PG (on the primary and on the
    /// target): an object past the cursor that is not dirty is on neither (created since, its
    /// first write still to come), so its writes reach the target as they are made, and only
    /// the dirty objects, a set that no longer grows, are left to copy. (Before, each object
    /// created past the cursor became dirty, and the last copies chased a steady stream of
    /// new objects, a volume being filled. The walk itself still chases objects created past
    /// it faster than it copies: the recovery throttle sets its pace.) Writes then reach the
    /// target without its backfill-full check, as they do once it completes a moment later.
    pub tail: bool,
}

impl Target {
    /// Whether writes to `oid` must reach the target (it already has the object's state).
    /// Not one written since its last copy, though the cursor moved past it (created after its
    /// page was listed): the target lacks the writes before, and a write applied onto its
    /// copy would reach the primary's version without them, a copy a later backfill comparing
    /// versions would skip (found by a helper's review). It is copied again first.
    pub fn covers(&self, oid: &ObjectId) -> bool {
        self.done
            || (!self.dirty.contains(oid) && (self.tail || self.cursor.is_some_and(|c| *oid <= c)))
    }
}

/// An object some serving member does not have at its authoritative version.
#[derive(Clone, Debug)]
pub(crate) struct Missing {
    pub version: Version,
    /// The authoritative version is a tombstone.
    pub deleted: bool,
    /// Devices holding the authoritative version, the preferred source first (recovery falls
    /// back to the next when a copy fails its checksum).
    pub sources: Vec<DeviceId>,
    /// Serving members (maybe the primary itself) that need it.
    pub need: Vec<DeviceId>,
}

/// The primary's view of an active (or activating) PG.
pub(crate) struct Primary {
    /// The interval and peering round this primary serves.
    pub term: Term,
    pub status: Status,
    /// Serving members other than the primary.
    pub members: Vec<Member>,
    pub targets: Vec<Target>,
    /// The devices peering found complete (serving members, and up members of older intervals
    /// of the history that still hold the PG): where a good copy may be found of an object
    /// the serving members hold bad (backfill's source of last resort).
    pub sources: Vec<DeviceId>,
    /// The ready report this term wrote (`backfill.rs`): written again while the map waits
    /// for it (`report_again`).
    pub reported: Option<basalt_meta::PgReadyRecord>,
    /// Why the PG's complete up set is not reported ready (it would drop serving copies:
    /// `backfill.rs::undersized_move`); status shows it.
    pub kept: Option<String>,
    /// The last sequence number handed out in `interval`.
    pub seq: u64,
    /// Sequence numbers of writes not yet acknowledged by every member.
    pub inflight: BTreeSet<u64>,
    /// Per object with a write in flight, the version of the last one: the next write to it is
    /// applied only onto that version (`RepOp::prior`), so a copy where it failed does not take
    /// the next one either (same version, different bytes: peering could not tell them apart).
    /// Left behind by a failed write (its term ends).
    pub tails: HashMap<ObjectId, Version>,
    pub missing: BTreeMap<ObjectId, Missing>,
    /// Missing objects recovery found no good copy of (every source's copy of the
    /// authoritative version failed its checksum), and why: reads and writes of them fail at
    /// once (`Checksum`) instead of waiting for a recovery that only retries. Recovery keeps
    /// retrying; an object leaves this set when it is recovered after all.
    pub unfound: BTreeMap<ObjectId, String>,
    /// Objects being recovered or backfilled right now: writes wait.
    pub busy: BTreeSet<ObjectId>,
    pub waiters: BTreeMap<ObjectId, Vec<oneshot::Sender<()>>>,
    pub min_size: usize,
    /// Up-set members: the PG is clean when they all serve and nothing is missing.
    pub up: Vec<DeviceId>,
    /// The up-set members that were up in the map this primary started from: one coming up
    /// later (a new node's device, placed before its node registered) makes the primary start
    /// over, so it becomes a backfill target.
    pub live_up: Vec<DeviceId>,
    pub acting: Vec<DeviceId>,
    pub clean: bool,
    /// Every member serving this term was told it holds every write acknowledged before the
    /// term (`recovery.rs::publish_complete` succeeded once in it): in a later interval each
    /// counts as complete without the members of older ones (`peering.rs::complete_after`),
    /// so it can serve the PG as far as `min_size` allows. Not cleared within the term.
    pub members_complete: bool,
    /// Recovery counters (objects and bytes moved since activation).
    pub recovered_objects: u64,
    pub recovered_bytes: u64,
}

impl Primary {
    /// Whether this primary serves the PG as `entry` of `map` has it: the same interval, up set
    /// (and which of it is up) and acting set. Otherwise the node starts the PG's primary over
    /// when it acts on the map (`primary_sees`), and nothing judged on that map belongs to
    /// this one.
    pub fn serves(&self, map: &ClusterMap, entry: &PgMap) -> bool {
        self.term.interval == entry.since
            && self.up == entry.up
            && self.live_up == live_up(map, entry)
            && self.acting == entry.acting
    }

    /// Every write of this term at or below the returned version is durable on every member:
    /// those before the oldest write still in flight (a write that failed on a member stays
    /// in flight until the term ends), or [`Term::before`] when none of the term's was
    /// ever written. `None` past the term's versions.
    pub fn committed_upto(&self) -> Option<Version> {
        let n = self.inflight.first().map_or(self.seq, |s| s - 1);
        match n {
            0 => Some(self.term.before()),
            n => self.term.version(n),
        }
    }

    /// Whether the serving members may answer reads of their own copies in this term
    /// (`replica_read.rs`): it is active (every serving member activated), nothing is missing
    /// on any of them (every version the authority adopted, acknowledged or not, is on each, so
    /// no later peering can drop it), and it has no backfill target (its up set lies within its
    /// acting set; a target that completes would witness the interval for later peerings
    /// without granting the members' nodes the leases their reads check).
    pub fn members_readable(&self) -> bool {
        self.status == Status::Active
            && self.missing.is_empty()
            && self.targets.is_empty()
            && self.up.iter().all(|d| self.acting.contains(d))
    }

    /// Whether a write to `oid` must wait (recovery or backfill of it first).
    pub fn must_wait(&self, oid: &ObjectId) -> bool {
        self.missing.contains_key(oid) || self.busy.contains(oid)
    }

    /// The next (at most) `n` missing objects to recover, not being moved now: first those a
    /// client's read or write waits for (in the order they are listed), then the others in
    /// order, so a client waits for its own object, not for the whole queue before it.
    pub fn next_to_recover(&self, n: usize) -> Vec<(ObjectId, Missing)> {
        let free = |oid: &&ObjectId| !self.busy.contains(*oid);
        let waited = self
            .waiters
            .keys()
            .filter(|o| self.missing.contains_key(*o));
        let rest = self
            .missing
            .keys()
            .filter(|o| !self.waiters.contains_key(*o));
        waited
            .chain(rest)
            .filter(free)
            .take(n)
            .map(|o| (*o, self.missing[o].clone()))
            .collect()
    }

    /// Wakes everyone waiting for `oid`.
    pub fn release(&mut self, oid: &ObjectId) {
        for w in self.waiters.remove(oid).unwrap_or_default() {
            let _ = w.send(());
        }
    }

    /// Wakes every waiter (the PG stops being served).
    pub fn release_all(&mut self) {
        for (_, ws) in std::mem::take(&mut self.waiters) {
            for w in ws {
                let _ = w.send(());
            }
        }
    }
}

/// The whole state of one PG on one device.
pub(crate) struct PgState {
    /// Bumped whenever the primary's work must start over; tasks of an older generation stop.
    pub generation: u64,
    /// The newest term a primary asked this member about (sub-operations and messages of older
    /// terms are refused from then on). Not persisted: after a restart a member accepts nothing
    /// until a primary activates it again.
    pub promised: Term,
    /// The term this member was activated in: its sub-operations are applied (only while no
    /// newer term was promised).
    pub accepting: Term,
    /// The newest term this device peered in as the PG's primary (not persisted). A new
    /// generation of the same interval takes a round past it and past `promised`: two
    /// generations never share a term, even while the older one's query to this very device
    /// is still on its way (else the older one, superseded but still running, could roll
    /// back on the members, in the term they accept, writes the newer one acknowledged).
    pub led: Term,
    pub info: MemberInfo,
    /// A primary queried this member since it was loaded (a suspect member stays suspect
    /// until such a primary activates it: `replica.rs`).
    pub queried: bool,
    /// The term in which this member may answer reads of its own copy (`replica_read.rs`):
    /// its primary said it lacks nothing and the term has no backfill target. Counts only
    /// while it is also the term accepted and the newest promised; cleared when a
    /// sub-operation fails here. Not persisted.
    pub readable: Option<Term>,
    /// The newest commit watermark of the accepted term's primary (`RepOp::committed`):
    /// every write of that term at or below it is durable on every member.
    pub committed: Version,
    /// A term in which a sub-operation failed here: this member is never readable in it
    /// again (a late activation of that term, sent before the failure, must not make it so).
    pub spoiled: Option<Term>,
    pub primary: Option<Primary>,
}

impl Pgs {
    pub fn new(ctx: Arc<Ctx>, stores: BTreeMap<DeviceId, Store>) -> Arc<Pgs> {
        Arc::new(Pgs {
            ctx,
            stores,
            pgs: Mutex::new(BTreeMap::new()),
            scrub: ScrubStats::default(),
            repairs: Arc::default(),
            unknown_suspect: Mutex::default(),
            backfill_inflight: Mutex::default(),
        })
    }

    pub fn store(&self, dev: DeviceId) -> Option<&Store> {
        self.stores.get(&dev)
    }

    /// Loads the PG records of every local store (at start): what each member knew. The marks a
    /// journal tail the store dropped when it opened asks for are persisted first, unless
    /// `devices.rs` did already (`cut.rs`): suspect PGs, and the device note.
    pub async fn load(&self) -> Result<(), basalt_engine::EngineError> {
        for (dev, store) in &self.stores {
            if cut::mark(store).await? {
                self.unknown_suspect.lock().insert(*dev);
            }
            for p in store.pgs().await? {
                if p.has_record && p.pg != cut::NOTE_PG {
                    let info = MemberInfo::decode(&p.blob);
                    self.insert(*dev, p.pg, store.clone(), info);
                }
            }
        }
        Ok(())
    }

    /// What a device knows of a PG it holds no record of: nothing, suspect if its note says so.
    fn unrecorded_info(&self, dev: DeviceId) -> MemberInfo {
        MemberInfo {
            suspect: self.unknown_suspect.lock().contains(&dev),
            ..MemberInfo::default()
        }
    }

    /// PGs of `dev` marked suspect (`info.rs`) that the map places on it (one it left, or
    /// never held, keeps a mark nobody clears, and proves nothing with it either).
    pub fn suspect_count(&self, dev: DeviceId) -> u64 {
        let map = self.ctx.maps.map();
        let placed = |id: PgId| {
            map.pg(id)
                .is_some_and(|e| e.acting.contains(&dev) || e.up.contains(&dev))
        };
        let pgs = self.pgs.lock();
        pgs.iter()
            .filter(|((d, id), pg)| *d == dev && placed(*id) && pg.st.lock().info.suspect)
            .count() as u64
    }

    /// The PG of a local device, created on first use.
    pub fn get(&self, dev: DeviceId, id: PgId) -> Option<Arc<Pg>> {
        if let Some(pg) = self.pgs.lock().get(&(dev, id)) {
            return Some(pg.clone());
        }
        let store = self.stores.get(&dev)?.clone();
        let info = self.unrecorded_info(dev);
        Some(self.insert(dev, id, store, info))
    }

    fn insert(&self, dev: DeviceId, id: PgId, store: Store, info: MemberInfo) -> Arc<Pg> {
        let mut pgs = self.pgs.lock();
        let pg = pgs.entry((dev, id)).or_insert_with(|| {
            Arc::new(Pg {
                dev,
                id,
                store,
                st: Mutex::new(PgState {
                    generation: 0,
                    // No older term than the one backfilling it (its record says so): a
                    // message of an older generation still in flight cannot change it after a
                    // restart.
                    promised: Term::new(info.promised_floor(), 0)
                        .max(info.backfill.map_or(Term::default(), |b| b.term)),
                    accepting: Term::default(),
                    led: Term::default(),
                    info,
                    queried: false,
                    readable: None,
                    committed: Version::NONE,
                    spoiled: None,
                    primary: None,
                }),
                changed: Notify::new(),
                writes_idle: Notify::new(),
                client_waits: Notify::new(),
                repairs: repair::RepairStats::new(self.repairs.clone()),
                scrubbing: tokio::sync::Mutex::new(()),
                failed_rounds: AtomicU32::new(0),
                toofull: Mutex::new(None),
            })
        });
        pg.clone()
    }

    /// The PG if it exists already (no store access).
    pub fn existing(&self, dev: DeviceId, id: PgId) -> Option<Arc<Pg>> {
        self.pgs.lock().get(&(dev, id)).cloned()
    }

    /// Every PG this node knows.
    pub fn all(&self) -> Vec<Arc<Pg>> {
        self.pgs.lock().values().cloned().collect()
    }

    /// A new map: every local device that is the primary of a PG whose interval (or up set)
    /// changed starts peering; a device that stopped being the primary stops serving.
    pub async fn on_map(self: &Arc<Self>, map: Arc<ClusterMap>) {
        for (pool_id, pool) in &map.pools {
            for (i, entry) in pool.pgs.iter().enumerate() {
                let id = PgId {
                    pool: *pool_id,
                    pg: i as u32,
                };
                let primary = map.pg_primary(entry);
                for dev in self.stores.keys().copied() {
                    let member = entry.acting.contains(&dev) || entry.up.contains(&dev);
                    if primary == Some(dev) {
                        self.primary_sees(dev, id, &map, entry, usize::from(pool.min_size))
                            .await;
                    } else if member || self.existing(dev, id).is_some() {
                        self.not_primary(dev, id).await;
                    }
                }
            }
        }
    }

    async fn primary_sees(
        self: &Arc<Self>,
        dev: DeviceId,
        id: PgId,
        map: &ClusterMap,
        entry: &PgMap,
        min_size: usize,
    ) {
        let Some(pg) = self.get(dev, id) else {
            return;
        };
        let restart = {
            let st = pg.st.lock();
            match &st.primary {
                None => true,
                Some(p) => !p.serves(map, entry) || matches!(p.status, Status::Incomplete(_)),
            }
        };
        if restart {
            pg.restart_primary(self.ctx.clone(), map, entry, min_size);
        }
    }

    async fn not_primary(&self, dev: DeviceId, id: PgId) {
        let Some(pg) = self.existing(dev, id) else {
            return;
        };
        if pg.st.lock().primary.is_some() {
            tracing::info!(pg = %id, device = %dev, "no longer the primary");
            pg.stop_primary();
        }
    }
}

/// The members of the PG's up set that are up in `map`.
fn live_up(map: &ClusterMap, entry: &PgMap) -> Vec<DeviceId> {
    entry.up.iter().copied().filter(|d| map.is_up(*d)).collect()
}

impl Pg {
    /// (Re)starts the primary's work for the map's interval: a new generation, status Peering,
    /// and a driver task that peers, recovers and backfills.
    pub fn restart_primary(
        self: &Arc<Self>,
        ctx: Arc<Ctx>,
        map: &ClusterMap,
        entry: &PgMap,
        min_size: usize,
    ) {
        let generation = {
            let mut st = self.st.lock();
            if ctx.stopped.load(Ordering::Acquire) {
                drop(st);
                self.stop_primary();
                return;
            }
            st.generation += 1;
            let seq = st
                .primary
                .as_ref()
                .filter(|p| p.term.interval == entry.since)
                .map_or(0, |p| p.seq);
            // A new round of the same interval outranks every earlier one this device promised
            // or led; peering raises it further if a member promised a newer one.
            let round = [st.promised, st.led]
                .iter()
                .filter(|t| t.interval == entry.since)
                .map(|t| t.round + 1)
                .max()
                .unwrap_or(0);
            st.led = st.led.max(Term::new(entry.since, round));
            if let Some(p) = st.primary.as_mut() {
                p.release_all();
            }
            st.primary = Some(Primary {
                term: Term::new(entry.since, round),
                status: Status::Peering,
                members: Vec::new(),
                targets: Vec::new(),
                seq,
                inflight: BTreeSet::new(),
                tails: HashMap::new(),
                missing: BTreeMap::new(),
                unfound: BTreeMap::new(),
                busy: BTreeSet::new(),
                waiters: BTreeMap::new(),
                min_size: min_size.max(1),
                up: entry.up.clone(),
                live_up: live_up(map, entry),
                sources: Vec::new(),
                reported: None,
                kept: None,
                acting: entry.acting.clone(),
                clean: false,
                recovered_objects: 0,
                recovered_bytes: 0,
                members_complete: false,
            });
            st.generation
        };
        self.changed.notify_waiters();
        tracing::debug!(pg = %self.id, device = %self.dev, epoch = %map.epoch, "peering");
        let pg = self.clone();
        tokio::spawn(async move { pg.drive(ctx, generation).await });
    }

    /// Whether `generation` is still the current generation.
    pub fn current(&self, generation: u64) -> bool {
        self.st.lock().generation == generation
    }

    /// Ends the current term (a member failed a sub-operation, or recovery failed) and peers
    /// again in a new round if this device is still the primary.
    pub fn repeer(self: &Arc<Self>, ctx: Arc<Ctx>, why: &str) {
        let map = ctx.maps.map();
        let found = map
            .pools
            .get(&self.id.pool)
            .and_then(|p| Some((p.pgs.get(self.id.pg as usize)?, usize::from(p.min_size))));
        match found {
            Some((entry, min_size)) if map.pg_primary(entry) == Some(self.dev) => {
                tracing::warn!(pg = %self.id, "peering again: {why}");
                self.restart_primary(ctx, &map, entry, min_size);
            }
            _ => {
                tracing::warn!(pg = %self.id, "stops serving: {why}");
                self.stop_primary();
            }
        }
    }

    /// Stops serving as the primary (a new map moved it, or its term failed without a new one).
    pub fn stop_primary(&self) {
        let mut st = self.st.lock();
        if let Some(mut p) = st.primary.take() {
            p.release_all();
            st.generation += 1;
            drop(st);
            self.changed.notify_waiters();
        }
    }

    /// Waits until the PG's state changes (or a short while passes).
    pub async fn wait_change(&self) {
        let _ = tokio::time::timeout(Duration::from_millis(200), self.changed.notified()).await;
    }

    /// The primary's driver: peers until active (or superseded), then recovers, backfills and
    /// checks whether the PG is clean.
    async fn drive(self: Arc<Self>, ctx: Arc<Ctx>, generation: u64) {
        loop {
            if !self.current(generation) {
                return;
            }
            match self.peer(&ctx, generation).await {
                Ok(()) => {
                    tokio::spawn(self.clone().publish_commits(ctx.clone(), generation));
                    break;
                }
                Err(why) => {
                    if !self.current(generation) {
                        return;
                    }
                    tracing::info!(pg = %self.id, "not active: {why}");
                    self.set_status(generation, Status::Incomplete(why));
                    tokio::time::sleep(ctx.tuning.retry).await;
                    self.set_status(generation, Status::Peering);
                }
            }
        }
        if let Err(why) = self.recover(&ctx, generation).await {
            self.failed_round(ctx, generation, &format!("recovery failed: {why}"))
                .await;
            return;
        }
        if let Err(e) = self.compact(&ctx, generation).await {
            tracing::warn!(pg = %self.id, "compacting the history: {e}");
        }
        if let Err(why) = self.backfill(&ctx, generation).await {
            self.failed_round(ctx, generation, &format!("backfill failed: {why}"))
                .await;
            return;
        }
        self.failed_rounds.store(0, Ordering::Relaxed);
        *self.toofull.lock() = None;
        self.settle(&ctx, generation).await;
    }

    /// A round of recovery or backfill failed: peers again after a wait that grows with the
    /// failures in a row (the PG keeps serving meanwhile; objects still missing wait), unless a
    /// newer generation took over. A round that stopped at unfound objects goes on at once when
    /// none is left (the operator gave them up, or a write took them off the list).
    async fn failed_round(self: Arc<Self>, ctx: Arc<Ctx>, generation: u64, why: &str) {
        let failed = self.failed_rounds.fetch_add(1, Ordering::Relaxed);
        let wait = retry_after(ctx.tuning.retry, failed);
        tracing::warn!(pg = %self.id, failed = failed + 1, "{why}; peering again in {wait:?}");
        let unfound = |pg: &Self| {
            let st = pg.st.lock();
            st.primary.as_ref().map_or(0, |p| p.unfound.len())
        };
        let stopped_at_unfound = unfound(&self) > 0;
        let deadline = tokio::time::Instant::now() + wait;
        while tokio::time::Instant::now() < deadline {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !self.current(generation) {
                return;
            }
            if stopped_at_unfound && unfound(&self) == 0 {
                break;
            }
            let _ = tokio::time::timeout_at(deadline, changed).await;
        }
        if self.current(generation) {
            self.repeer(ctx, why);
        }
    }

    fn set_status(&self, generation: u64, status: Status) {
        let mut st = self.st.lock();
        if st.generation != generation {
            return;
        }
        if let Some(p) = st.primary.as_mut() {
            p.status = status;
        }
        drop(st);
        self.changed.notify_waiters();
    }
}

/// Unfound objects a PG's summary names.
pub const UNFOUND_LISTED: usize = 100;

/// A short summary of one PG this node is primary of (for status).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PgSummary {
    pub pg: PgId,
    pub device: DeviceId,
    pub interval: Epoch,
    pub round: u64,
    #[serde(flatten)]
    pub status: PgStatusView,
    pub missing_objects: u64,
    /// Copies missing on serving members (each missing object once per member lacking it).
    #[serde(default)]
    pub degraded_objects: u64,
    /// Objects backfill targets still lack (an estimate: the PG's size on the primary when
    /// the backfill began, less what it walked past since).
    #[serde(default)]
    pub misplaced_objects: u64,
    /// Missing objects no good copy of was found (every copy fails its checksum): their
    /// reads and writes fail.
    #[serde(default)]
    pub unfound_objects: u64,
    /// The first `UNFOUND_LISTED` of them.
    #[serde(default)]
    pub unfound: Vec<ObjectId>,
    pub backfilling: usize,
    /// A backfill target refused copies: it is used past the backfill-full limit (the PG
    /// stays on its old devices; `why` says which).
    #[serde(default)]
    pub backfill_toofull: bool,
    pub clean: bool,
    /// Every serving member was told it holds every write acknowledged before this interval:
    /// later, any one of them counts as complete without the members of older intervals.
    #[serde(default)]
    pub members_complete: bool,
    pub recovered_objects: u64,
    pub recovered_bytes: u64,
    /// Copies this node replaced with a good one as the PG's primary (read repair and scrub:
    /// its own and members'), since the node started.
    #[serde(default)]
    pub repaired_objects: u64,
    /// Objects found bad with no good copy anywhere (or whose repair failed), since the node
    /// started.
    #[serde(default)]
    pub unrepairable_objects: u64,
}

/// The status of a PG, for status output.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PgStatusView {
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

impl Pgs {
    /// Copies repaired by this node's primaries since it started.
    pub fn repaired(&self) -> u64 {
        self.repairs.repaired.load(Ordering::Relaxed)
    }

    /// Objects this node's primaries found with no good copy since it started.
    pub fn unrepairable(&self) -> u64 {
        self.repairs.unrepairable.load(Ordering::Relaxed)
    }

    /// What this node's recovery moved, how fast, and its throttle.
    pub fn recovery(&self) -> throttle::NodeRecovery {
        throttle::NodeRecovery {
            rate: self.ctx.recovery.rate.view(),
            limits: self.ctx.recovery.throttle.limits(),
        }
    }

    /// What this node's primaries report.
    pub fn summaries(&self) -> Vec<PgSummary> {
        let mut out = Vec::new();
        for pg in self.all() {
            let st = pg.st.lock();
            let Some(p) = &st.primary else { continue };
            // Only while it backfills: a stop of an earlier round says nothing about a PG
            // with no target left.
            let toofull = pg
                .toofull
                .lock()
                .clone()
                .filter(|_| p.targets.iter().any(|t| !t.done));
            let (state, why) = match &p.status {
                Status::Peering => ("peering", None),
                Status::Active => ("active", p.kept.clone().or(toofull.clone())),
                Status::Peered(w) => ("peered", Some(w.clone())),
                Status::Incomplete(w) => ("incomplete", Some(w.clone())),
            };
            out.push(PgSummary {
                pg: pg.id,
                device: pg.dev,
                interval: p.term.interval,
                round: p.term.round,
                status: PgStatusView {
                    state: state.to_string(),
                    why,
                },
                missing_objects: p.missing.len() as u64,
                degraded_objects: p.missing.values().map(|m| m.need.len() as u64).sum(),
                misplaced_objects: p
                    .targets
                    .iter()
                    .filter(|t| !t.done)
                    .map(|t| t.objects.saturating_sub(t.walked))
                    .sum(),
                unfound_objects: p.unfound.len() as u64,
                unfound: p.unfound.keys().take(UNFOUND_LISTED).copied().collect(),
                backfilling: p.targets.iter().filter(|t| !t.done).count(),
                backfill_toofull: toofull.is_some(),
                clean: p.clean,
                members_complete: p.members_complete,
                recovered_objects: p.recovered_objects,
                recovered_bytes: p.recovered_bytes,
                repaired_objects: pg.repairs.repaired.load(Ordering::Relaxed),
                unrepairable_objects: pg.repairs.unrepairable.load(Ordering::Relaxed),
            });
        }
        out.sort_by_key(|s| (s.pg, s.device));
        out
    }
}

#[cfg(test)]
impl Pg {
    /// Runs `f` on the primary's state.
    pub(crate) fn with_primary_for_test<R>(&self, f: impl FnOnce(&mut Primary) -> R) -> R {
        let mut st = self.st.lock();
        f(st.primary.as_mut().expect("the primary of its PG"))
    }

    /// Makes this device the active primary of the PG with no other member, in `interval`
    /// (unit tests of what runs on a primary, without peering).
    pub(crate) fn serve_alone_for_test(&self, interval: Epoch) {
        let mut st = self.st.lock();
        let term = Term::new(interval, 0);
        st.promised = term;
        st.accepting = term;
        st.generation += 1;
        st.primary = Some(Primary {
            term,
            status: Status::Active,
            members: Vec::new(),
            targets: Vec::new(),
            seq: 0,
            inflight: BTreeSet::new(),
            tails: HashMap::new(),
            missing: BTreeMap::new(),
            unfound: BTreeMap::new(),
            busy: BTreeSet::new(),
            waiters: BTreeMap::new(),
            min_size: 1,
            up: vec![self.dev],
            live_up: vec![self.dev],
            sources: Vec::new(),
            reported: None,
            kept: None,
            acting: vec![self.dev],
            clean: true,
            recovered_objects: 0,
            recovered_bytes: 0,
            members_complete: true,
        });
    }
}
