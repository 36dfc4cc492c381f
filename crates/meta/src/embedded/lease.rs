//! The embedded store's leases: in memory, expired by a timer task. Deadlines are on tokio's
//! monotonic clock (the real one in production; the paused one in tests with paused time, so
//! leases expire in step with the timers of the code under test).
//!
//! A lease that expires or is revoked deletes its keys in one change (one revision), exactly
//! as etcd does, so watchers see one Delete per key. Leases are not persisted: they end with
//! the process (see the module docs of [`super`]).

use super::Inner;
use crate::error::MetaError;
use crate::store::{LeaseId, ttl_secs};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

struct LeaseEntry {
    ttl: Duration,
    deadline: Instant,
    keys: BTreeSet<String>,
}

pub(crate) struct Leases {
    map: BTreeMap<LeaseId, LeaseEntry>,
    next: i64,
}

impl Leases {
    pub(crate) fn new() -> Leases {
        // Ids differ between runs, so a stale id from an earlier run never names a new lease.
        // (A simulated clock starts at the same instant in every run: the same ids.)
        let seed = (crate::clock::unix_micros() & 0x3fff_ffff_ffff_ffff) as i64;
        Leases {
            map: BTreeMap::new(),
            next: seed.max(1),
        }
    }

    /// A lease exists and has not reached its deadline.
    pub(crate) fn alive(&self, id: LeaseId) -> bool {
        self.map
            .get(&id)
            .is_some_and(|l| l.deadline > Instant::now())
    }

    pub(crate) fn grant(&mut self, ttl: Duration) -> LeaseId {
        let id = LeaseId(self.next);
        self.next += 1;
        let ttl = Duration::from_secs(ttl_secs(ttl) as u64);
        self.map.insert(
            id,
            LeaseEntry {
                ttl,
                deadline: Instant::now() + ttl,
                keys: BTreeSet::new(),
            },
        );
        id
    }

    pub(crate) fn keep_alive(&mut self, id: LeaseId) -> Result<(), MetaError> {
        let now = Instant::now();
        match self.map.get_mut(&id) {
            Some(l) if l.deadline > now => {
                l.deadline = now + l.ttl;
                Ok(())
            }
            _ => Err(MetaError::LeaseNotFound(id)),
        }
    }

    /// Records which keys are attached to which lease after a committed change.
    pub(crate) fn apply_moves(&mut self, moves: Vec<(String, Option<LeaseId>, Option<LeaseId>)>) {
        for (key, old, new) in moves {
            if let Some(l) = old.and_then(|id| self.map.get_mut(&id)) {
                l.keys.remove(&key);
            }
            if let Some(l) = new.and_then(|id| self.map.get_mut(&id)) {
                l.keys.insert(key);
            }
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.map.values().map(|l| l.deadline).min()
    }

    fn due(&self, now: Instant) -> Vec<LeaseId> {
        self.map
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(id, _)| *id)
            .collect()
    }
}

impl Inner {
    /// Removes a lease and deletes its keys in one change. Returns whether the lease existed.
    pub(crate) fn remove_lease(&self, id: LeaseId) -> Result<bool, MetaError> {
        let mut st = self.state.lock();
        let Some(entry) = st.leases.map.remove(&id) else {
            return Ok(false);
        };
        if !entry.keys.is_empty() {
            self.write_locked(&mut st, |ctx| {
                for key in &entry.keys {
                    ctx.delete(key)?;
                }
                Ok(())
            })?;
        }
        Ok(true)
    }

    fn expire_due(&self) -> Result<(), MetaError> {
        let due = self.state.lock().leases.due(Instant::now());
        for id in due {
            tracing::debug!(%id, "lease expired");
            self.remove_lease(id)?;
        }
        Ok(())
    }

    fn next_lease_deadline(&self) -> Option<Instant> {
        self.state.lock().leases.next_deadline()
    }
}

/// Runs until the store is dropped: sleeps until the earliest lease deadline (or a wake-up),
/// then expires what is due.
pub(crate) fn spawn_expiry(inner: Weak<Inner>, wake: Arc<Notify>) {
    tokio::spawn(async move {
        loop {
            // Hold the store only briefly, so dropping every handle closes the file.
            let next = match inner.upgrade() {
                Some(strong) => strong.next_lease_deadline(),
                None => return,
            };
            match next {
                Some(at) => {
                    tokio::select! {
                        biased;
                        _ = tokio::time::sleep_until(at) => {}
                        _ = wake.notified() => {}
                    }
                }
                None => wake.notified().await,
            }
            let Some(strong) = inner.upgrade() else {
                return;
            };
            let res = match strong.inline {
                true => Ok(strong.expire_due()),
                false => tokio::task::spawn_blocking(move || strong.expire_due()).await,
            };
            match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!("expiring leases failed: {e}; retrying in a second");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => tracing::warn!("lease expiry task failed: {e}"),
            }
        }
    });
}
