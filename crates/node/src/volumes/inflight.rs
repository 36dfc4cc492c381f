//! [`Inflight`]: the writes admitted and not yet finished, so that a volume delete (or the
//! collector) can wait for every write admitted under an older view of the volumes without
//! stopping new ones.
//!
//! Two counters and a phase, as in sleepable RCU: a write counts itself in the counter of the
//! current phase (checking, after counting, that the phase did not move; else it counts again),
//! and only then reads the view. [`Inflight::drain`] flips the phase and waits for the old
//! phase's counter to reach zero. A write that read the view before a change counted itself
//! before the flip that follows the change, so the drain waits for it; a write that counts
//! itself after the flip reads the view after the change. Drains run one at a time.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use tokio::sync::{Mutex, Notify};

#[derive(Debug, Default)]
pub(crate) struct Inflight {
    phase: AtomicUsize,
    counts: [AtomicU64; 2],
    /// Woken when the counter of a phase that is no longer current reaches zero.
    drained: Notify,
    drains: Mutex<()>,
}

/// A write in flight; finished when dropped.
#[derive(Debug)]
#[must_use = "the write counts in flight only while this lives"]
pub(crate) struct Admitted<'a> {
    inflight: &'a Inflight,
    phase: usize,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.inflight.exit(self.phase);
    }
}

impl Inflight {
    /// Counts a write in; read the view only after this.
    pub(crate) fn enter(&self) -> Admitted<'_> {
        self.enter_from(self.phase.load(SeqCst))
    }

    /// [`Inflight::enter`] from the phase the caller read (possibly long ago: a task can be
    /// descheduled between reading the phase and counting itself in).
    fn enter_from(&self, mut phase: usize) -> Admitted<'_> {
        loop {
            self.counts[phase]
                .fetch_add(1, SeqCst)
                .checked_add(1)
                .expect("writes in flight overflow");
            let now = self.phase.load(SeqCst);
            if now == phase {
                return Admitted {
                    inflight: self,
                    phase,
                };
            }
            self.exit(phase);
            phase = now;
        }
    }

    fn exit(&self, phase: usize) {
        let before = self.counts[phase].fetch_sub(1, SeqCst);
        assert!(before > 0, "a write left that never entered");
        if before == 1 && self.phase.load(SeqCst) != phase {
            self.drained.notify_one();
        }
    }

    /// Returns once every write counted in before this call has finished. Writes counted in
    /// meanwhile are not waited for.
    pub(crate) async fn drain(&self) {
        let _one_at_a_time = self.drains.lock().await;
        let old = self.phase.load(SeqCst);
        self.phase.store(1 - old, SeqCst);
        loop {
            let notified = self.drained.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.counts[old].load(SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Writes in flight (both phases), for tests.
    #[cfg(test)]
    pub(crate) fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(SeqCst)).sum()
    }

    /// The current phase, for tests (a drain flips it when it starts).
    #[cfg(test)]
    pub(crate) fn phase(&self) -> usize {
        self.phase.load(SeqCst)
    }

    /// A write that read the phase `phase` earlier counts itself in now (tests).
    #[cfg(test)]
    pub(crate) fn enter_late(&self, phase: usize) -> Admitted<'_> {
        self.enter_from(phase)
    }
}
