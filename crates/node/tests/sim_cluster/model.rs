//! The model a run is checked against: per 4 KiB block, every write with when it was sent and
//! when (if) it was acknowledged, on one logical clock (the harness is one thread: the clock's
//! order is the real order of events).
//!
//! A read sent at `s` and answered at `d` may return the value of write `w` only if `w` was sent
//! before `d` and no write `w2` in place before `s` supersedes it. `w2` supersedes `w` when it
//! is known to have landed after `w` was acknowledged: it was sent after that, or a read sent
//! after that returned it (`w2` was in flight while `w` was acknowledged and landed later).
//! A write is in place from its acknowledgement, or from the answer of a read that returned it,
//! whichever comes first. Zeros are the value of a block never written (as if written and
//! acknowledged at time 0) and of every zeroing write (trim, write-zeroes): a read may return
//! them when one of those is not so superseded. A write that failed (the client gave up) may
//! still land at any time after it was sent, and a write not yet acknowledged may land again
//! (the client retries it), so neither is ever too old while it may; but a failed write never
//! lands after a write its own client (`Write::session`: the handles of one `Cluster` share
//! one) sent after it failed (the node's `sessions.rs`): once that one is in place, the failed
//! one is too old. So: every acknowledged
//! write reads back until a later one replaces it, and no read returns data older than an
//! acknowledged write, or than a write an earlier read returned. Where a PG may serve a write
//! from one copy before it is durable (`min_size` 1), a read may return a write a crash then
//! loses: [`Model::crashed`] forgets what reads saw of writes still in flight.

use bytes::Bytes;

pub const BLOCK: usize = 4096;

#[derive(Clone, Debug)]
pub struct Write {
    pub value: u64,
    pub sent: u64,
    pub acked: Option<u64>,
    pub failed: bool,
    /// When the client gave up on it.
    pub failed_at: Option<u64>,
    /// The client (one `Cluster`) that sent it.
    pub session: u8,
    /// The reads that returned this write's value, as (sent, answered) (values other than
    /// zero only: zeros do not tell which write wrote them).
    pub seen: Vec<(u64, u64)>,
}

impl Write {
    /// How the write came to be in place, for messages.
    fn placed(&self) -> String {
        match (self.acked, self.first_seen()) {
            (Some(a), Some(s)) if s < a => format!("read at {s} before its acknowledgement"),
            (Some(a), _) => format!("acknowledged at {a}"),
            (None, Some(s)) => format!("not acknowledged, read at {s}"),
            (None, None) => "not acknowledged".to_string(),
        }
    }

    /// From when the write is in place for every later read: its acknowledgement, or the answer
    /// of the first read that returned it, whichever came first.
    fn in_place(&self) -> Option<u64> {
        match (self.acked, self.first_seen()) {
            (Some(a), Some(s)) => Some(a.min(s)),
            (a, s) => a.or(s),
        }
    }

    /// The answer of the first read that returned this write.
    fn first_seen(&self) -> Option<u64> {
        self.seen.iter().map(|&(_, done)| done).min()
    }

    /// Known, before a read sent at `before`, to have landed after `t`: sent after `t`, or
    /// returned by a read sent after `t` (and answered before `before`).
    fn landed_after(&self, t: u64, before: u64) -> bool {
        let in_place = self.in_place().is_some_and(|p| p < before);
        (in_place && self.sent > t)
            || self
                .seen
                .iter()
                .any(|&(sent, done)| sent > t && done < before)
    }
}

#[derive(Debug, Default)]
pub struct Model {
    clock: u64,
    pub blocks: Vec<Vec<Write>>,
}

/// The bytes of a block holding `value`.
pub fn pattern(value: u64) -> Bytes {
    let mut b = Vec::with_capacity(BLOCK);
    for _ in 0..BLOCK / 8 {
        b.extend_from_slice(&value.to_le_bytes());
    }
    Bytes::from(b)
}

/// The value a block holds, or why it holds none (torn, or not a pattern).
pub fn value_of(data: &[u8]) -> Result<u64, String> {
    if data.len() != BLOCK {
        return Err(format!("read {} bytes, not {BLOCK}", data.len()));
    }
    let first = u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
    match data.chunks(8).all(|w| w == first.to_le_bytes()) {
        true => Ok(first),
        false => {
            let other = data
                .chunks(8)
                .find(|w| *w != first.to_le_bytes())
                .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
            Err(format!(
                "torn block: starts with {first:#x}, also holds {other:#x?}"
            ))
        }
    }
}

impl Model {
    pub fn new(blocks: u64) -> Model {
        Model {
            clock: 0,
            blocks: vec![Vec::new(); blocks as usize],
        }
    }

    pub fn now(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// A write of `value` to `block` is sent by client `session`: returns its index for
    /// [`Model::write_done`].
    pub fn write_sent(&mut self, block: u64, value: u64, session: u8) -> usize {
        let sent = self.now();
        let writes = &mut self.blocks[block as usize];
        writes.push(Write {
            value,
            sent,
            acked: None,
            failed: false,
            failed_at: None,
            session,
            seen: Vec::new(),
        });
        writes.len() - 1
    }

    /// A node was killed in a run whose PGs may serve from one copy (`min_size` 1): a write
    /// still in flight a read returned may have been visible before it was durable (a PG
    /// serving alone does not hold its writes until they are), and be gone now; reads no
    /// longer count it as in place unless they see it again. Not called where `min_size` is 2
    /// or more: a replicated PG shows a write only once every serving copy has it durable, so a
    /// kill loses no write a read returned.
    pub fn crashed(&mut self) {
        for w in self.blocks.iter_mut().flatten() {
            if w.acked.is_none() && !w.failed {
                w.seen.clear();
            }
        }
    }

    pub fn write_done(&mut self, block: u64, i: usize, ok: bool) {
        let now = self.now();
        let w = &mut self.blocks[block as usize][i];
        match ok {
            true => w.acked = Some(now),
            false => {
                w.failed = true;
                w.failed_at = Some(now);
            }
        }
    }

    /// Checks a read of `block` sent at `sent`, answered now, that returned `value`. Zeros are
    /// the value of the block before any write (acknowledged at time 0) and of every zeroing
    /// write (trim, write-zeroes), so they may come from any of those; every other value from
    /// the one write that wrote it.
    pub fn check_read(&mut self, block: u64, sent: u64, value: u64) -> Result<(), String> {
        let done = self.now();
        let writes = &self.blocks[block as usize];
        // The write in place before this read was sent (acknowledged, or returned by an
        // earlier read) that makes `w` too old for it, if any: one known to have landed after
        // `w` was acknowledged. (Until then `w` may still land again: the client retries it.)
        // A failed one is too old once a write its client sent after it failed is in place.
        let newer = |w: &Write| {
            let other = |w2: &&Write| !std::ptr::eq(*w2, w);
            if let Some(failed) = w.failed_at {
                let later = |w2: &&Write| {
                    w2.session == w.session
                        && w2.sent > failed
                        && w2.in_place().is_some_and(|p| p < sent)
                };
                return writes.iter().filter(other).find(later);
            }
            let acked = w.acked?;
            writes
                .iter()
                .filter(other)
                .find(|w2| w2.landed_after(acked, sent))
        };
        if value == 0 {
            let initial = Write {
                value: 0,
                sent: 0,
                acked: Some(0),
                failed: false,
                failed_at: None,
                session: 0,
                seen: Vec::new(),
            };
            let zeroings = writes.iter().filter(|w| w.value == 0 && w.sent < done);
            if std::iter::once(&initial)
                .chain(zeroings)
                .any(|w| newer(w).is_none())
            {
                return Ok(());
            }
            let w2 = newer(&initial).expect("the initial zeros are superseded");
            return Err(format!(
                "block {block} read as zeros, but write {:#x} (sent at {}) was {} after every \
                 zeroing and before the read was sent (at {sent})",
                w2.value,
                w2.sent,
                w2.placed()
            ));
        }
        let Some(w) = writes.iter().find(|w| w.value == value) else {
            return Err(format!(
                "block {block} read {value:#x}, which no write of it wrote"
            ));
        };
        if w.sent > done {
            return Err(format!(
                "block {block} read {value:#x} before it was written"
            ));
        }
        if let Some(w2) = newer(w) {
            return Err(format!(
                "block {block} read {value:#x} ({}), older than write {:#x} (sent at {}, {}) \
                 in place before the read was sent (at {sent})",
                w.placed(),
                w2.value,
                w2.sent,
                w2.placed()
            ));
        }
        let w = self.blocks[block as usize]
            .iter_mut()
            .find(|w| w.value == value)
            .expect("found above");
        w.seen.push((sent, done));
        Ok(())
    }

    /// The block a write of `value` was sent to (values other than zero are unique per write).
    pub fn block_of(&self, value: u64) -> Option<u64> {
        self.blocks
            .iter()
            .position(|writes| writes.iter().any(|w| w.value == value))
            .map(|b| b as u64)
    }

    pub fn acked(&self) -> u64 {
        self.blocks
            .iter()
            .flatten()
            .filter(|w| w.acked.is_some())
            .count() as u64
    }

    pub fn failed(&self) -> u64 {
        self.blocks.iter().flatten().filter(|w| w.failed).count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_checked_against_acknowledged_writes() {
        let mut m = Model::new(1);
        let s = m.now();
        assert!(m.check_read(0, s, 0).is_ok(), "nothing written yet");
        let a = m.write_sent(0, 1, 0);
        m.write_done(0, a, true);
        let s = m.now();
        assert!(
            m.check_read(0, s, 0).is_err(),
            "zeros after an acknowledged write"
        );
        assert!(m.check_read(0, s, 1).is_ok());
        let b = m.write_sent(0, 2, 0);
        let s = m.now();
        assert!(
            m.check_read(0, s, 1).is_ok(),
            "the newer write is only in flight"
        );
        assert!(
            m.check_read(0, s, 2).is_ok(),
            "an in-flight write may be seen"
        );
        m.write_done(0, b, true);
        let s = m.now();
        assert!(
            m.check_read(0, s, 1).is_err(),
            "older than an acknowledged write"
        );
        assert!(m.check_read(0, s, 3).is_err(), "never written");
        let c = m.write_sent(0, 3, 0);
        m.write_done(0, c, false);
        let s = m.now();
        assert!(m.check_read(0, s, 2).is_ok(), "a failed write may not land");
        assert!(
            m.check_read(0, s, 3).is_ok(),
            "a failed write may have landed"
        );
        let s = m.now();
        assert!(
            m.check_read(0, s, 2).is_err(),
            "older than a failed write an earlier read returned"
        );
        // A failed write is too old once a write its client sent after it failed is in place:
        // not before, nor for another client's.
        let x = m.write_sent(0, 10, 0);
        m.write_done(0, x, false);
        let y = m.write_sent(0, 11, 1);
        m.write_done(0, y, true);
        let z = m.write_sent(0, 12, 0);
        let s = m.now();
        assert!(m.check_read(0, s, 10).is_ok(), "another client's write");
        m.write_done(0, z, true);
        let s = m.now();
        assert!(
            m.check_read(0, s, 10).is_err(),
            "its client's later write is in place"
        );
        assert!(m.check_read(0, s, 12).is_ok());
        // A write seen in flight is in place for every read sent after: older acknowledged
        // data no more. It may still land again itself (the client retries it) until it is
        // acknowledged, so a write acknowledged meanwhile does not make it too old.
        let e = m.write_sent(0, 5, 0);
        m.write_done(0, e, true);
        let f = m.write_sent(0, 6, 0);
        let s = m.now();
        assert!(
            m.check_read(0, s, 6).is_ok(),
            "an in-flight write may be seen"
        );
        assert!(
            m.check_read(0, s, 5).is_ok(),
            "by a read that overlapped the one that saw the newer write"
        );
        let s = m.now();
        assert!(
            m.check_read(0, s, 5).is_err(),
            "not by one sent after it: the in-flight write was in place"
        );
        let g = m.write_sent(0, 7, 0);
        m.write_done(0, g, true);
        let s = m.now();
        assert!(
            m.check_read(0, s, 6).is_ok(),
            "retried after the newer write"
        );
        m.write_done(0, f, true);
        let s = m.now();
        assert!(m.check_read(0, s, 6).is_ok());
        assert!(
            m.check_read(0, s, 7).is_err(),
            "a read sent after its acknowledgement returned the retried write: it landed after"
        );
        let s = m.now();
        assert!(m.check_read(0, s, 5).is_err(), "older than both, once seen");
        // A kill while a write seen in flight is not acknowledged: it may be gone.
        let h = m.write_sent(0, 8, 0);
        let s = m.now();
        assert!(m.check_read(0, s, 8).is_ok());
        m.crashed();
        let s = m.now();
        assert!(
            m.check_read(0, s, 6).is_ok(),
            "the seen write lost in a crash"
        );
        m.write_done(0, h, true);
        let s = m.now();
        assert!(m.check_read(0, s, 8).is_ok());
        // Zeroing writes: zeros may be read while one is in flight or once it is
        // acknowledged, and an older value no more after that.
        let z = m.write_sent(0, 0, 0);
        let s = m.now();
        assert!(
            m.check_read(0, s, 0).is_ok(),
            "a zeroing in flight may be seen"
        );
        assert!(m.check_read(0, s, 8).is_ok(), "or not");
        m.write_done(0, z, true);
        let s = m.now();
        assert!(m.check_read(0, s, 0).is_ok());
        assert!(
            m.check_read(0, s, 8).is_err(),
            "older than an acknowledged zeroing"
        );
        let d = m.write_sent(0, 4, 0);
        m.write_done(0, d, true);
        let s = m.now();
        assert!(
            m.check_read(0, s, 0).is_err(),
            "zeros older than an acknowledged write"
        );
    }

    /// A write in flight while an older one was acknowledged, returned by a read sent after
    /// that acknowledgement, landed after it: the older write may not come back.
    #[test]
    fn a_write_seen_after_an_acknowledgement_it_overlapped_supersedes_it() {
        let mut m = Model::new(1);
        let x = m.write_sent(0, 1, 0);
        let w = m.write_sent(0, 2, 0);
        m.write_done(0, w, true);
        let s = m.now();
        assert!(m.check_read(0, s, 1).is_ok(), "x may land after w");
        let s = m.now();
        assert!(
            m.check_read(0, s, 2).is_err(),
            "w came back after a read sent after its acknowledgement returned x"
        );
        assert!(m.check_read(0, s, 1).is_ok());
        m.write_done(0, x, true);
        // A read that overlapped the acknowledgement proves nothing about the order.
        let y = m.write_sent(0, 3, 0);
        let s = m.now();
        let v = m.write_sent(0, 4, 0);
        m.write_done(0, v, true);
        assert!(m.check_read(0, s, 3).is_ok(), "y landed after x");
        let s = m.now();
        assert!(m.check_read(0, s, 4).is_ok(), "v may have landed after y");
        m.write_done(0, y, true);
    }

    #[test]
    fn torn_blocks_are_not_values() {
        assert!(value_of(&pattern(7)).is_ok_and(|v| v == 7));
        let mut torn = pattern(7).to_vec();
        torn[4095] = 1;
        assert!(value_of(&torn).is_err());
    }
}
