//! The clients (writes and reads of 4 KiB blocks, trims and write-zeroes, through the client
//! library) and the fault injector, as futures of the harness's one task; the model records
//! and checks every answer.

use crate::cluster::{CLIENT, SimCluster};
use crate::config::{Config, Rng};
use crate::model::{BLOCK, Model, pattern, value_of};
use crate::trace::Trace;
use basalt_client::{ClientError, Volume};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::time::Duration;
use tokio::time::Instant;

/// What the clients saw, shared by the futures of one run.
#[derive(Default)]
pub struct Seen {
    pub model: Model,
    pub trace: Trace,
    pub reads: u64,
    /// Trims and write-zeroes acknowledged.
    pub zeroings: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub violations: Vec<String>,
    /// Final reads that failed for good on an object with no good copy left by a double fault
    /// the harness could not foresee (see [`final_check`]).
    pub double_faults: u64,
    /// Clients still running.
    pub running: u32,
}

pub type Shared = Rc<RefCell<Seen>>;

fn ms_since(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64
}

/// One client: the configured number of operations on random blocks, `reads` of them reads.
pub async fn client(
    c: u32,
    volume: &Volume,
    seen: Shared,
    mut rng: Rng,
    cfg: &Config,
    reads: f64,
    start: Instant,
) {
    let (blocks, think) = (cfg.blocks, cfg.think);
    // The clients share one `Cluster`, the gateway (client `cfg.clients`) has its own.
    let session = u8::from(c >= cfg.clients);
    for n in 0..cfg.ops_per_client {
        let pause = rng.ms(think.0, think.1);
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let block = rng.range(0, blocks - 1);
        let offset = block * BLOCK as u64;
        if rng.chance(reads) {
            let sent = seen.borrow_mut().model.now();
            let answer = volume.read(offset, BLOCK as u32).await;
            let mut s = seen.borrow_mut();
            s.reads += 1;
            match answer {
                Ok(data) => {
                    let checked = value_of(&data)
                        .and_then(|v| s.model.check_read(block, sent, v).map(|()| v));
                    let v = checked.as_ref().copied().unwrap_or(u64::MAX);
                    s.trace.add(10, &[u64::from(c), block, v, ms_since(start)]);
                    if let Err(e) = checked {
                        s.violations
                            .push(format!("client {c} at {} ms: {e}", ms_since(start)));
                    }
                }
                Err(e) => {
                    s.read_errors += 1;
                    s.trace.add(11, &[u64::from(c), block, ms_since(start)]);
                    s.trace.add_str(12, &e.to_string());
                }
            }
        } else if cfg.zeroes > 0.0 && rng.chance(cfg.zeroes) {
            zero(c, volume, &seen, &mut rng, cfg, block, start).await;
        } else {
            let value = (u64::from(c) + 1) << 32 | u64::from(n + 1);
            let i = seen.borrow_mut().model.write_sent(block, value, session);
            let answer = volume.write(offset, pattern(value), true).await;
            let mut s = seen.borrow_mut();
            s.model.write_done(block, i, answer.is_ok());
            s.trace.add(
                13,
                &[
                    u64::from(c),
                    block,
                    value,
                    u64::from(answer.is_ok()),
                    ms_since(start),
                ],
            );
            if let Err(e) = answer {
                s.write_errors += 1;
                s.trace.add_str(14, &e.to_string());
            }
        }
    }
    seen.borrow_mut().running -= 1;
}

/// One zeroing operation from `block`: a trim or a write-zeroes (durable) of one to three
/// blocks, or of the whole object (a tombstone where the volume covers it).
async fn zero(
    c: u32,
    volume: &Volume,
    seen: &Shared,
    rng: &mut Rng,
    cfg: &Config,
    block: u64,
    start: Instant,
) {
    let per_object = u64::from(cfg.object_size) / BLOCK as u64;
    let (first, count) = if rng.chance(0.5) {
        let first = block / per_object * per_object;
        (first, per_object.min(cfg.blocks - first))
    } else {
        (block, rng.range(1, 3).min(cfg.blocks - block))
    };
    let trim = rng.chance(0.5);
    let sent: Vec<usize> = {
        let mut s = seen.borrow_mut();
        (first..first + count)
            .map(|b| s.model.write_sent(b, 0, u8::from(c >= cfg.clients)))
            .collect()
    };
    let (offset, len) = (first * BLOCK as u64, count * BLOCK as u64);
    let answer = match trim {
        true => volume.trim(offset, len).await,
        false => volume.write_zeroes(offset, len, true).await,
    };
    let mut s = seen.borrow_mut();
    for (b, i) in (first..).zip(sent) {
        s.model.write_done(b, i, answer.is_ok());
    }
    s.trace.add(
        15,
        &[
            u64::from(c),
            first,
            count,
            u64::from(trim),
            u64::from(answer.is_ok()),
            ms_since(start),
        ],
    );
    match answer {
        Ok(()) => s.zeroings += 1,
        Err(e) => {
            s.write_errors += 1;
            s.trace.add_str(14, &e.to_string());
        }
    }
}

/// Seconds of virtual time the final check retries a block's read: the cluster may still be
/// settling after the heal (a node cut off by a partition is marked up again only once its
/// peers withdraw their failure reports, then its PGs peer again).
const SETTLE_TRIES: u32 = 60;

/// Reads every block once the faults are healed: each must hold a value the model allows (so
/// every acknowledged write that was not replaced reads back). Retries errors for a while (the
/// cluster may still be peering).
///
/// One failure is not a violation: a read that keeps failing with a checksum error (never
/// wrong data) in an object that had a bit flipped in one copy (`damaged`: object indices)
/// and a write that failed. The flip was made while another copy was good, but the failed
/// write may have reached only the flipped copy, been kept (nobody could prove it was never
/// acknowledged) and made that copy the only one of the newest version, its untouched bad
/// block included: a media fault plus a failed member, a double failure (seed 210336).
/// Counted as `double_faults`.
pub async fn final_check(
    volume: &Volume,
    seen: &Shared,
    blocks: u64,
    damaged: &BTreeSet<u64>,
    blocks_per_object: u64,
    start: Instant,
) {
    for block in 0..blocks {
        let offset = block * BLOCK as u64;
        let mut tries = 0;
        loop {
            let sent = seen.borrow_mut().model.now();
            match volume.read(offset, BLOCK as u32).await {
                Ok(data) => {
                    let mut s = seen.borrow_mut();
                    let checked = value_of(&data)
                        .and_then(|v| s.model.check_read(block, sent, v).map(|()| v));
                    let v = checked.as_ref().copied().unwrap_or(u64::MAX);
                    s.trace.add(20, &[block, v, ms_since(start)]);
                    if let Err(e) = checked {
                        s.violations.push(format!("final read: {e}"));
                    }
                    break;
                }
                Err(e) => {
                    tries += 1;
                    if tries == SETTLE_TRIES {
                        let mut s = seen.borrow_mut();
                        let object = block / blocks_per_object;
                        let first = object * blocks_per_object;
                        let failed_write = (first..first + blocks_per_object).any(|b| {
                            s.model
                                .blocks
                                .get(b as usize)
                                .is_some_and(|ws| ws.iter().any(|w| w.failed))
                        });
                        if matches!(e, ClientError::Checksum(_))
                            && damaged.contains(&object)
                            && failed_write
                        {
                            s.double_faults += 1;
                            s.trace.add(21, &[block, ms_since(start)]);
                            break;
                        }
                        s.violations.push(format!(
                            "final read of block {block} failed {tries} times after every fault \
                             healed: {e}"
                        ));
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

/// How long after a clean stop the node starts again, milliseconds: a rolling restart's quick
/// return, often before the PGs it led have finished peering without it.
pub const STOP_GAP: (u64, u64) = (0, 1000);

/// Injects faults until the clients are done: each pause, one fault drawn from the seed's mix,
/// and the faults whose time is up are healed. The clients never touch the cluster: this
/// future owns it.
pub async fn faults(c: &mut SimCluster, seen: &Shared, start: Instant) {
    // (slot, what, heal at)
    let mut active: Vec<(usize, Fault, Instant)> = Vec::new();
    let f = c.cfg.faults.clone();
    let mut kinds = Vec::new();
    for (on, kind) in [
        (f.kills, Fault::Kill),
        (f.partitions, Fault::Partition),
        (f.meta_cuts, Fault::MetaCut),
        (f.breaks, Fault::Break),
        (f.map_changes, Fault::Out),
        (f.media, Fault::Flip),
        (f.stops, Fault::Stop),
        (f.lags, Fault::Lag),
    ] {
        if on {
            kinds.push(kind);
        }
    }
    loop {
        let (lo, hi) = c.cfg.fault_every;
        let pause = c.rng.ms(lo, hi);
        tokio::time::sleep(pause).await;
        if seen.borrow().running == 0 {
            break;
        }
        let now = Instant::now();
        let mut due = Vec::new();
        active.retain(|(i, what, at)| {
            let keep = *at > now;
            if !keep {
                due.push((*i, *what));
            }
            keep
        });
        for (i, what) in due {
            heal(c, i, what, start).await;
        }
        if kinds.is_empty() {
            continue;
        }
        let what = c.rng.pick(&kinds);
        let mut i = c.rng.range(0, c.slots.len() as u64 - 1) as usize;
        if what == Fault::Lag && c.gateway.is_some() {
            // Where the gateway reads from: its node's copies are what may be stale.
            i = 0;
        }
        let (lo, hi) = c.cfg.fault_length;
        let until = Instant::now() + c.rng.ms(lo, hi);
        let t = ms_since(start);
        match what {
            Fault::Break => {
                let host = c.slots[i].host;
                c.net.break_links(|a, b| a == host || b == host);
                c.trace.add(30, &[i as u64, t]);
            }
            Fault::Flip => {
                let flipped = c.flip(i, |v| seen.borrow().model.block_of(v)).await;
                match flipped {
                    Some((dev, byte, false)) => {
                        tracing::info!(device = %dev, byte, "simulator: flipped a bit");
                        c.trace.add(34, &[u64::from(dev.0), byte, t]);
                    }
                    Some((dev, byte, true)) => {
                        tracing::info!(device = %dev, byte, "simulator: an unreadable sector");
                        c.trace.add(37, &[u64::from(dev.0), byte, t]);
                    }
                    None => {}
                }
            }
            Fault::Out if c.rng.chance(0.15) && c.slots.len() < 6 => {
                c.trace.add(31, &[t]);
                c.add_node().await;
            }
            Fault::Out => {
                let dev = c.rng.pick(&c.slots[i].devices);
                c.set_out(dev, true).await;
                active.push((i, Fault::In(dev), until));
            }
            _ => {
                let down = c.slots.iter().filter(|s| s.faulted).count() as u32;
                if c.slots[i].faulted || down >= c.cfg.max_down {
                    continue;
                }
                c.slots[i].faulted = true;
                c.trace.add(32, &[i as u64, what.code(), t]);
                tracing::info!(slot = i, fault = ?what, "simulator: fault");
                if what == Fault::Stop {
                    c.stop_node(i).await;
                    let (lo, hi) = STOP_GAP;
                    active.push((i, what, Instant::now() + c.rng.ms(lo, hi)));
                    continue;
                }
                inject(c, i, what);
                if what == Fault::Kill && c.cfg.min_size == 1 {
                    // Only a PG serving from one copy shows a write before it is durable.
                    seen.borrow_mut().model.crashed();
                }
                if what == Fault::Kill
                    && c.cfg.faults.replacements
                    && c.rng.chance(0.3)
                    && let Some((old, new)) = c.replace_disk(i).await
                {
                    tracing::info!(%old, %new, "simulator: a drive died; replaced by a blank one");
                    c.trace.add(36, &[u64::from(old.0), u64::from(new.0), t]);
                    // The dead drive stays out: an earlier `out` of it is not undone (seed
                    // 500488: it came back in, and its PGs waited for it).
                    active.retain(|(_, what, _)| *what != Fault::In(old));
                } else if what == Fault::Kill
                    && c.cfg.faults.journal_tail
                    && let Some((dev, byte)) = c.damage_tail(i).await
                {
                    tracing::info!(device = %dev, byte, "simulator: flipped a bit in the newest journal record");
                    c.trace.add(35, &[u64::from(dev.0), byte, t]);
                }
                active.push((i, what, until));
            }
        }
    }
    for (i, what, _) in active {
        heal(c, i, what, start).await;
    }
}

fn inject(c: &mut SimCluster, i: usize, what: Fault) {
    match what {
        Fault::Kill => c.kill(i),
        Fault::Lag => {
            let host = c.slots[i].host;
            let hosts: Vec<_> = c.slots.iter().map(|s| s.host).chain([CLIENT]).collect();
            for h in hosts.into_iter().filter(|h| *h != host) {
                c.net.cut(h, host);
                c.net.cut(host, h);
            }
            c.lag_maps(i, true);
        }
        Fault::Partition => {
            let host = c.slots[i].host;
            let hosts: Vec<_> = c.slots.iter().map(|s| s.host).chain([CLIENT]).collect();
            let one_way = c.rng.chance(0.3);
            let inbound = c.rng.chance(0.5);
            // Some partitions leave the client's way open, some do not.
            let client_too = c.rng.chance(0.5);
            for h in hosts.into_iter().filter(|h| *h != host) {
                if h == CLIENT && !client_too {
                    continue;
                }
                if !one_way || inbound {
                    c.net.cut(h, host);
                }
                if !one_way || !inbound {
                    c.net.cut(host, h);
                }
            }
        }
        Fault::MetaCut => c.set_meta_reachable(i, false),
        Fault::Break | Fault::Out | Fault::In(_) | Fault::Flip | Fault::Stop => {
            unreachable!("not a fault that lasts on one node")
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Kill,
    /// A clean stop, started again after [`STOP_GAP`].
    Stop,
    Partition,
    MetaCut,
    /// Partitioned from every host while its map watch lags (and the gateway's beside it).
    Lag,
    Break,
    Out,
    In(basalt_engine::DeviceId),
    Flip,
}

impl Fault {
    fn code(self) -> u64 {
        match self {
            Fault::Kill => 1,
            Fault::Partition => 2,
            Fault::MetaCut => 3,
            Fault::Break => 4,
            Fault::Out => 5,
            Fault::In(d) => 6 | (u64::from(d.0) << 8),
            Fault::Flip => 7,
            Fault::Stop => 8,
            Fault::Lag => 9,
        }
    }
}

async fn heal(c: &mut SimCluster, i: usize, what: Fault, start: Instant) {
    let t = ms_since(start);
    c.trace.add(33, &[i as u64, what.code(), t]);
    match what {
        Fault::Kill | Fault::Stop => c.restart(i).await,
        Fault::Partition | Fault::Lag => {
            let host = c.slots[i].host;
            let hosts: Vec<_> = c.slots.iter().map(|s| s.host).chain([CLIENT]).collect();
            for h in hosts {
                c.net.heal(h, host);
                c.net.heal(host, h);
            }
            if what == Fault::Lag {
                c.lag_maps(i, false);
            }
        }
        Fault::MetaCut => c.set_meta_reachable(i, true),
        Fault::In(dev) => c.set_out(dev, false).await,
        Fault::Break | Fault::Out | Fault::Flip => {}
    }
    if !matches!(what, Fault::In(_)) {
        c.slots[i].faulted = false;
    }
}
