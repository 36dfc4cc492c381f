//! The clients of a simulated run and what they observe. Every operation is submitted with the
//! store's `submit_*` methods, so its arrival order is the order of the calls, fixed by the
//! seed; the [`Recorder`] keeps the history per object (the model) and every reply.

use super::config::Config;
use super::model::{BLK, History, OpKind};
use super::trace::Trace;
use basalt_engine::sim::SimDisk;
use basalt_engine::{EngineError, ObjectId, PoolId, Store, Version, VolumeId, WriteOptions};
use bytes::Bytes;
use futures::future::{LocalBoxFuture, join_all};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;
use std::rc::Rc;
use tokio::time::Instant;

pub fn oid(index: usize) -> ObjectId {
    ObjectId::new(PoolId(1), VolumeId(1), index as u64)
}

/// How an operation ended, as far as the clients saw before the crash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// No reply seen: it may or may not have happened.
    Pending,
    /// Acknowledged at this recorder clock value, with this version.
    Ok { at: u64, version: u64 },
    /// Refused as stale: no effect.
    Stale,
    /// Failed because the store was poisoned (or stopped): it may or may not have happened.
    Unknown,
}

pub struct OpRec {
    pub obj: usize,
    pub kind: OpKind,
    pub durable: bool,
    pub explicit: Option<u64>,
    /// Index of the state after this operation in its object's history.
    pub index: usize,
    pub outcome: Outcome,
}

pub struct ReadRec {
    pub obj: usize,
    pub off: usize,
    pub len: usize,
    /// The reply must match a state from `lo` (everything acknowledged before it was sent) to
    /// `hi` (everything that had arrived when the reply was seen).
    pub lo: usize,
    pub hi: usize,
    pub data: Option<Bytes>,
}

pub struct Recorder {
    pub disk: SimDisk,
    pub start: Instant,
    pub clock: u64,
    pub ops: Vec<OpRec>,
    /// Operation indices per object, in arrival order.
    pub per_obj: Vec<Vec<usize>>,
    pub hist: Vec<History>,
    pub reads: Vec<ReadRec>,
    /// Operations acknowledged before this clock value were followed by a completed flush.
    pub flushed_before: u64,
    pub trace: Trace,
    /// Things that are wrong at once (unexpected errors, wrong versions).
    pub failures: Vec<String>,
    pub poison_expected: bool,
    /// The disk has started failing writes or flushes.
    pub poisoned: bool,
    /// `SIM_LOG=1`: print every reply to stderr.
    pub log: bool,
}

impl Recorder {
    pub fn new(cfg: &Config, disk: SimDisk) -> Recorder {
        Recorder {
            disk,
            start: Instant::now(),
            clock: 0,
            ops: Vec::new(),
            per_obj: vec![Vec::new(); cfg.objects],
            hist: (0..cfg.objects)
                .map(|_| History::new(cfg.object_size))
                .collect(),
            reads: Vec::new(),
            flushed_before: 0,
            trace: Trace::default(),
            failures: Vec::new(),
            poison_expected: cfg.poison.is_some(),
            poisoned: false,
            log: super::log_enabled(),
        }
    }

    fn now_us(&self) -> u64 {
        (Instant::now() - self.start).as_micros() as u64
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Replies seen after the disk lost power do not count as seen before the crash.
    fn crashed(&self) -> bool {
        self.disk.crashed().is_some()
    }

    /// Records the arrival of a write-class operation; returns its id and the version the model
    /// predicts (`None`: stale).
    fn begin_op(
        &mut self,
        obj: usize,
        kind: OpKind,
        durable: bool,
        explicit: Option<u64>,
    ) -> usize {
        let at = self.tick();
        let id = self.ops.len();
        self.hist[obj].push(&kind, explicit);
        let (off, len) = kind.range();
        let t = self.now_us();
        if self.log {
            eprintln!(
                "t={t}us op {id} object {obj} {} durable {durable} version {explicit:?}: issued",
                kind.short()
            );
        }
        self.trace.add(
            1,
            &[
                at,
                t,
                id as u64,
                obj as u64,
                kind.code(),
                off as u64,
                len as u64,
                durable as u64,
                explicit.unwrap_or(0),
            ],
        );
        if let OpKind::Write { data, .. } = &kind {
            self.trace.add(2, &[Trace::digest(data)]);
        }
        self.per_obj[obj].push(id);
        self.ops.push(OpRec {
            obj,
            kind,
            durable,
            explicit,
            index: self.hist[obj].states.len() - 1,
            outcome: Outcome::Pending,
        });
        id
    }

    fn expected(&self, id: usize) -> Option<u64> {
        let op = &self.ops[id];
        let h = &self.hist[op.obj];
        h.states[op.index - 1].apply(&op.kind, op.explicit).1
    }

    fn finish_op(&mut self, id: usize, res: Result<u64, EngineError>) {
        if self.crashed() {
            return;
        }
        let at = self.tick();
        let t = self.now_us();
        let expect = self.expected(id);
        let op = &self.ops[id];
        let what = format!("op {id} ({} on object {})", op.kind.short(), op.obj);
        let outcome = match res {
            Ok(v) => {
                if expect.is_none() {
                    self.failures
                        .push(format!("{what}: applied, the model says it is stale"));
                } else if Some(v) != expect {
                    self.failures
                        .push(format!("{what}: version {v:?}, the model says {expect:?}"));
                }
                Outcome::Ok { at, version: v }
            }
            Err(EngineError::StaleVersion { .. }) => {
                if expect.is_some() {
                    self.failures.push(format!(
                        "{what}: refused as stale, the model says {expect:?}"
                    ));
                }
                Outcome::Stale
            }
            Err(EngineError::Poisoned(_)) if self.poison_expected => Outcome::Unknown,
            Err(e) => {
                self.failures.push(format!("{what}: unexpected error {e}"));
                Outcome::Unknown
            }
        };
        let code = match &outcome {
            Outcome::Ok { version, .. } => 1 + version,
            _ => 0,
        };
        self.trace.add(3, &[at, t, id as u64, code]);
        if self.log {
            let o = &self.ops[id];
            eprintln!(
                "t={t}us op {id} object {} {}: {outcome:?}",
                o.obj,
                o.kind.short()
            );
        }
        self.ops[id].outcome = outcome;
    }

    /// The state index every acknowledged operation of `obj` has reached.
    fn acked_prefix(&self, obj: usize) -> usize {
        self.per_obj[obj]
            .iter()
            .rev()
            .find(|&&id| matches!(self.ops[id].outcome, Outcome::Ok { .. }))
            .map_or(0, |&id| self.ops[id].index)
    }

    fn begin_read(&mut self, obj: usize, off: usize, len: usize) -> usize {
        let at = self.tick();
        let t = self.now_us();
        self.trace
            .add(4, &[at, t, obj as u64, off as u64, len as u64]);
        self.reads.push(ReadRec {
            obj,
            off,
            len,
            lo: self.acked_prefix(obj),
            hi: 0,
            data: None,
        });
        self.reads.len() - 1
    }

    fn finish_read(&mut self, r: usize, res: Result<Bytes, EngineError>) {
        if self.crashed() {
            return;
        }
        let at = self.tick();
        let t = self.now_us();
        let obj = self.reads[r].obj;
        self.reads[r].hi = self.hist[obj].states.len() - 1;
        match res {
            Ok(data) => {
                self.trace.add(5, &[at, t, r as u64, Trace::digest(&data)]);
                self.reads[r].data = Some(data);
            }
            Err(e) => {
                self.trace.add(5, &[at, t, r as u64, u64::MAX]);
                // A poisoned store refuses reads (its cache may hold data of writes that
                // failed); a read already under way may see a checksum error for the blocks a
                // failed write did not store (an error, not wrong data: see the simulation
                // document). Any other read error is wrong.
                let excused = match e {
                    EngineError::Poisoned(_) => self.poison_expected,
                    EngineError::Checksum { .. } => self.poisoned,
                    _ => false,
                };
                if !excused {
                    self.failures
                        .push(format!("read {r} of object {obj}: unexpected error {e}"));
                }
            }
        }
    }

    fn finish_flush(&mut self, issued: u64, res: Result<(), EngineError>) {
        if self.crashed() {
            return;
        }
        let t = self.now_us();
        match res {
            Ok(()) => {
                if self.log {
                    eprintln!("t={t}us flush issued at clock {issued}: ok");
                }
                self.flushed_before = self.flushed_before.max(issued);
                self.trace.add(6, &[issued, t, 1]);
            }
            Err(EngineError::Poisoned(_)) if self.poison_expected => {
                self.trace.add(6, &[issued, t, 0])
            }
            Err(e) => self.failures.push(format!("flush: unexpected error {e}")),
        }
    }

    /// Checks every read the clients saw against the states it could have seen.
    pub fn check_reads(&self) -> Result<usize, String> {
        let mut n = 0;
        for (i, r) in self.reads.iter().enumerate() {
            let Some(data) = &r.data else { continue };
            let h = &self.hist[r.obj];
            let ok = (r.lo..=r.hi).any(|k| h.states[k].data[r.off..r.off + r.len] == data[..]);
            if !ok {
                return Err(format!(
                    "read {i} of object {} at {}+{} matches no state from {} to {}",
                    r.obj, r.off, r.len, r.lo, r.hi
                ));
            }
            n += 1;
        }
        Ok(n)
    }

    /// The state index each object must have reached after a crash: every write acknowledged
    /// as durable, or acknowledged before a flush that completed, must be there.
    pub fn must(&self, obj: usize) -> usize {
        self.per_obj[obj]
            .iter()
            .filter(|&&id| match self.ops[id].outcome {
                Outcome::Ok { at, .. } => self.ops[id].durable || at < self.flushed_before,
                _ => false,
            })
            .map(|&id| self.ops[id].index)
            .max()
            .unwrap_or(0)
    }

    pub fn acked(&self) -> usize {
        self.ops
            .iter()
            .filter(|o| matches!(o.outcome, Outcome::Ok { .. }))
            .count()
    }

    /// Operations of `obj` in arrival order, for failure messages.
    pub fn describe(&self, obj: usize) -> String {
        let ops: Vec<String> = self.per_obj[obj]
            .iter()
            .map(|&id| {
                let o = &self.ops[id];
                let mark = match o.outcome {
                    Outcome::Pending => "?",
                    Outcome::Ok { .. } if o.durable => "!",
                    Outcome::Ok { .. } => "a",
                    Outcome::Stale => "s",
                    Outcome::Unknown => "u",
                };
                format!("{}{mark}", o.kind.short())
            })
            .collect();
        ops.join(" ")
    }
}

/// `data` as a write payload: in a 4 KiB-aligned buffer (as the NBD server receives whole-block
/// writes; the store then writes it without a copy) or in an ordinary allocation.
fn payload(data: &[u8], aligned: bool) -> Bytes {
    if aligned {
        basalt_buf::AlignedBuf::copy_from(data)
            .into_bytes()
            .slice(..data.len())
    } else {
        Bytes::copy_from_slice(data)
    }
}

/// Random bytes: a slice of a per-client pool of random data at a random byte offset (cheap in
/// debug builds, and distinct enough that a misplaced block never matches).
fn pattern(rng: &mut StdRng, pool: &[u8], len: usize) -> Vec<u8> {
    let start = rng.random_range(0..=pool.len() - len);
    pool[start..start + len].to_vec()
}

/// Random data the clients' payloads are cut from.
pub fn random_pool(seed: u64, len: usize) -> Vec<u8> {
    let mut x: u64 = seed | 1;
    let mut v = vec![0u8; len];
    for c in v.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes());
    }
    v
}

/// One operation a client is about to submit.
enum Action {
    Op {
        obj: usize,
        kind: OpKind,
        durable: bool,
        /// Explicit version: this much above the object's predicted version (0 = stale).
        version_step: Option<u64>,
        aligned: bool,
    },
    Flush,
    Read {
        obj: usize,
        off: usize,
        len: usize,
    },
}

/// One client: rounds of up to `pipeline` operations submitted back to back, then awaited
/// together, with a think time before each round.
pub async fn client(
    id: usize,
    cfg: Rc<Config>,
    store: Store,
    rec: Rc<RefCell<Recorder>>,
    pool: Rc<Vec<u8>>,
) {
    let mut rng =
        StdRng::seed_from_u64(cfg.seed ^ (id as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    for _ in 0..cfg.rounds {
        let think = rng.random_range(0..=cfg.think.as_micros() as u64);
        tokio::time::sleep(std::time::Duration::from_micros(think)).await;
        let n = rng.random_range(1..=cfg.pipeline);
        let mut waits: Vec<LocalBoxFuture<'static, ()>> = Vec::new();
        for _ in 0..n {
            let action = draw(&cfg, &mut rng, &pool);
            waits.push(start(&store, &rec, action));
        }
        join_all(waits).await;
    }
}

/// Draws one operation.
fn draw(cfg: &Config, rng: &mut StdRng, pool: &[u8]) -> Action {
    let size = cfg.object_size;
    let obj = if rng.random_bool(cfg.hot) {
        0
    } else {
        rng.random_range(0..cfg.objects)
    };
    let m = &cfg.mix;
    let mut pick = rng.random_range(0..m.total().max(1));
    let mut take = |w: u32| {
        let hit = pick < w;
        pick = pick.saturating_sub(w);
        hit
    };
    let kind = if take(m.write) {
        let off = rng.random_range(0..size);
        let len = rng.random_range(1..=(size - off).min(3 * BLK));
        OpKind::Write {
            off,
            data: pattern(rng, pool, len),
        }
    } else if take(m.write_blocks) {
        let first = rng.random_range(0..size / BLK);
        let n = rng.random_range(1..=(size / BLK - first).min(4));
        OpKind::Write {
            off: first * BLK,
            data: pattern(rng, pool, n * BLK),
        }
    } else if take(m.full) {
        OpKind::Write {
            off: 0,
            data: pattern(rng, pool, size),
        }
    } else if take(m.zero) {
        let off = rng.random_range(0..size);
        let len = rng.random_range(1..=(size - off).min(4 * BLK));
        OpKind::Zero {
            off,
            len,
            trim: false,
        }
    } else if take(m.trim) {
        // Whole blocks, sometimes the whole object (which removes it).
        let (first, n) = if rng.random_bool(0.25) {
            (0, size / BLK)
        } else {
            let first = rng.random_range(0..size / BLK);
            (first, rng.random_range(1..=size / BLK - first))
        };
        OpKind::Zero {
            off: first * BLK,
            len: n * BLK,
            trim: true,
        }
    } else if take(m.delete) {
        OpKind::Delete
    } else if take(m.flush) {
        return Action::Flush;
    } else {
        let off = rng.random_range(0..size);
        let len = rng.random_range(1..=size - off);
        return Action::Read { obj, off, len };
    };
    Action::Op {
        obj,
        kind,
        durable: rng.random_bool(cfg.durable),
        version_step: rng
            .random_bool(cfg.explicit_version)
            .then(|| rng.random_range(0..=3)),
        aligned: rng.random_bool(cfg.aligned_payload),
    }
}

/// Submits `action` now; the future records its reply.
fn start(
    store: &Store,
    rec: &Rc<RefCell<Recorder>>,
    action: Action,
) -> LocalBoxFuture<'static, ()> {
    let (obj, kind, durable, version_step, aligned) = match action {
        Action::Flush => {
            let issued = rec.borrow_mut().tick();
            let p = store.submit_flush();
            let rec = rec.clone();
            return Box::pin(async move {
                let res = p.await;
                rec.borrow_mut().finish_flush(issued, res);
            });
        }
        Action::Read { obj, off, len } => {
            let r = rec.borrow_mut().begin_read(obj, off, len);
            let p = store.submit_read(oid(obj), off as u32, len as u32);
            let rec = rec.clone();
            return Box::pin(async move {
                let res = p.await;
                rec.borrow_mut().finish_read(r, res);
            });
        }
        Action::Op {
            obj,
            kind,
            durable,
            version_step,
            aligned,
        } => (obj, kind, durable, version_step, aligned),
    };
    // Usually newer than what the object will be at when it applies, sometimes not.
    let explicit = version_step.map(|step| rec.borrow().hist[obj].last().version + step);
    let opts = WriteOptions {
        durable,
        version: explicit.map(|v| Version::new(0, v)),
        ..WriteOptions::default()
    };
    let id = rec
        .borrow_mut()
        .begin_op(obj, kind.clone(), durable, explicit);
    let o = oid(obj);
    let p = match kind {
        OpKind::Write { off, data } => {
            store.submit_write(o, off as u32, payload(&data, aligned), opts)
        }
        OpKind::Zero { off, len, .. } => store.submit_write_zeroes(o, off as u32, len as u32, opts),
        OpKind::Delete => store.submit_delete(o, opts),
    };
    let fut: LocalBoxFuture<'static, Result<u64, EngineError>> = Box::pin(async move {
        p.await.map(|v| {
            assert_eq!(v.epoch, 0, "the workload writes in epoch 0");
            v.seq
        })
    });
    let rec = rec.clone();
    Box::pin(async move {
        let res = fut.await;
        rec.borrow_mut().finish_op(id, res);
    })
}
