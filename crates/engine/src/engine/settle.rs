//! Flushes that settle: a settle (`Store::settle`) answers only once every operation
//! submitted before it has been applied (or failed), and is then durable like any barrier.
//! An operation may still wait in the store when the settle arrives, not yet applied: for the
//! old blocks a partial write merges with (read-modify-write), for room in the open journal
//! batch, for a free slot write-back is about to release (`write.rs`). A barrier (a plain
//! flush) covers only what was applied, so such a write could land after it answered.
//!
//! The node relies on it: a member that promises a newer term settles before it reports what
//! it holds (`node/src/pg/replica.rs`, the peering query), and a write of the older term still
//! waiting here would otherwise land after the new primary compared versions: a write it
//! rolled back elsewhere, kept on this copy at the version it reported without it. (A client's
//! FLUSH needs no more than a barrier: what waits was not acknowledged.)
//!
//! Operations are numbered as they arrive (`WriteOp::seq`); a settle remembers the next number
//! and waits until no waiting operation has a lower one. Queues are per object and in arrival
//! order, so the oldest waiting operation of an object is at the front of its queue.

use super::{Engine, Waiter, WriteOp};
use crate::error::EngineError;
use std::collections::VecDeque;

/// Settles waiting for the operations before them, in arrival order.
#[derive(Default)]
pub(crate) struct Settling {
    /// The number the next operation gets.
    next: u64,
    /// Each settle with the number of the first operation after it.
    flushes: VecDeque<(u64, Waiter)>,
}

impl Engine {
    /// Numbers an arriving operation.
    pub(crate) fn number(&mut self, op: &mut WriteOp) {
        op.seq = self.settle.next;
        self.settle.next = self.settle.next.checked_add(1).expect("operation numbers");
    }

    /// A settle: a barrier now if nothing waits, else once what waits was applied.
    pub(crate) fn settled_flush(&mut self, w: Waiter) {
        if self.blocked.is_empty() && self.settle.flushes.is_empty() {
            self.add_barrier(w);
        } else {
            self.settle.flushes.push_back((self.settle.next, w));
        }
    }

    /// Turns into barriers the settles whose earlier operations were all applied.
    pub(crate) fn release_settled(&mut self) {
        if self.settle.flushes.is_empty() {
            return;
        }
        let oldest = self
            .blocked
            .values()
            .filter_map(|b| b.ops.front().map(|op| op.seq))
            .min();
        while let Some((after, _)) = self.settle.flushes.front() {
            if oldest.is_some_and(|o| o < *after) {
                return;
            }
            let (_, w) = self.settle.flushes.pop_front().expect("checked");
            self.add_barrier(w);
        }
    }

    /// Fails every waiting settle (a poisoned store).
    pub(crate) fn fail_settling(&mut self, e: &EngineError) {
        for (_, w) in self.settle.flushes.drain(..) {
            w.reply.err(e.duplicate());
        }
    }
}
