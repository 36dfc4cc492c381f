//! A checking NBD writer: a thread that writes a block at the start of each of a set of objects
//! in turn, every write with new bytes, and records every acknowledgement and how long each
//! write took. At the end [`Writer::finish`] returns the log and [`Log::verify`] reads every
//! object back: it must hold the last acknowledged bytes (or, after a failed write, the bytes of
//! that write: it may have been applied).

use super::nbd::NbdClient;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes of each write, at the start of its object.
pub const BLOCK: usize = 16 << 10;

/// One write: when it was sent, when its answer came, and the NBD error (0: acknowledged).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Write {
    pub object: u64,
    pub generation: u64,
    pub sent: Instant,
    pub got: Instant,
    pub error: u32,
}

impl Write {
    pub fn latency(&self) -> Duration {
        self.got - self.sent
    }
}

/// What the writer did.
#[derive(Debug, Default)]
pub struct Log {
    /// Every answered write, in order.
    pub writes: Vec<Write>,
    /// The write sent and not answered yet: (object, generation, sent).
    pub in_flight: Option<(u64, u64, Instant)>,
}

impl Log {
    pub fn acks(&self) -> usize {
        self.writes.iter().filter(|w| w.error == 0).count()
    }

    pub fn errors(&self) -> Vec<Write> {
        self.writes
            .iter()
            .filter(|w| w.error != 0)
            .copied()
            .collect()
    }

    /// The write that took longest.
    pub fn slowest(&self) -> Option<Write> {
        self.writes.iter().copied().max_by_key(Write::latency)
    }

    /// Acknowledged writes sent after `t`.
    pub fn acks_sent_after(&self, t: Instant) -> usize {
        self.writes
            .iter()
            .filter(|w| w.error == 0 && w.sent > t)
            .count()
    }

    /// Reads every object written back through `nbd`; panics on the first that does not hold
    /// its last acknowledged bytes (or those of a later write that failed).
    pub fn verify(&self, nbd: &mut NbdClient, object_size: u64) {
        let mut expect: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for w in &self.writes {
            let e = expect.entry(w.object).or_insert_with(|| vec![0]);
            if w.error == 0 {
                e.clear();
            }
            e.push(w.generation);
        }
        assert!(self.acks() > 0, "the writer wrote nothing");
        for (object, allowed) in &expect {
            let got = nbd
                .read(object * object_size, BLOCK as u32)
                .unwrap()
                .unwrap_or_else(|e| panic!("reading object {object} back: NBD error {e}"));
            let found = generation_in(&got, *object);
            assert!(
                found.is_some_and(|g| allowed.contains(&g)),
                "object {object} holds {} instead of generation {allowed:?} (the last \
                 acknowledged, or a later failed write)",
                found.map_or("other bytes".to_string(), |g| format!("generation {g}"))
            );
        }
    }
}

/// The bytes of `object`'s write number `generation`: every 8-byte word names both.
pub fn pattern(object: u64, generation: u64) -> Vec<u8> {
    let word = ((generation << 32) | object).to_le_bytes();
    word.iter().copied().cycle().take(BLOCK).collect()
}

/// The generation `data` holds if it is a whole write of `object` (0: never written, zeros).
fn generation_in(data: &[u8], object: u64) -> Option<u64> {
    if data.iter().all(|b| *b == 0) {
        return Some(0);
    }
    let word = u64::from_le_bytes(data[..8].try_into().unwrap());
    let generation = word >> 32;
    (word & 0xffff_ffff == object && data == pattern(object, generation).as_slice())
        .then_some(generation)
}

/// The writer thread.
pub struct Writer {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Log>>,
    thread: Option<JoinHandle<NbdClient>>,
}

impl Writer {
    /// Writes `objects` (object numbers of `object_size` bytes) in turn through `nbd`.
    pub fn start(mut nbd: NbdClient, objects: Vec<u64>, object_size: u64) -> Writer {
        assert!(!objects.is_empty());
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Log::default()));
        let (s, l) = (stop.clone(), log.clone());
        let thread = std::thread::spawn(move || {
            let mut generation = 0;
            while !s.load(Ordering::Relaxed) {
                generation += 1;
                for &object in &objects {
                    let sent = Instant::now();
                    l.lock().unwrap().in_flight = Some((object, generation, sent));
                    let error = nbd
                        .write(object * object_size, &pattern(object, generation), 0)
                        .expect("the gateway closed the NBD connection");
                    let mut log = l.lock().unwrap();
                    log.in_flight = None;
                    log.writes.push(Write {
                        object,
                        generation,
                        sent,
                        got: Instant::now(),
                        error,
                    });
                    drop(log);
                    if s.load(Ordering::Relaxed) {
                        break;
                    }
                    // Pacing, so that the nodes and fio keep their share of a small machine.
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            nbd
        });
        Writer {
            stop,
            log,
            thread: Some(thread),
        }
    }

    /// Runs `f` on the log as it is now.
    pub fn peek<T>(&self, f: impl FnOnce(&Log) -> T) -> T {
        f(&self.log.lock().unwrap())
    }

    /// Stops after the write in flight is answered; returns the connection and the log.
    pub fn finish(mut self) -> (NbdClient, Log) {
        self.stop.store(true, Ordering::Relaxed);
        let nbd = self
            .thread
            .take()
            .unwrap()
            .join()
            .expect("the writer panicked");
        let log = std::mem::take(&mut *self.log.lock().unwrap());
        (nbd, log)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
