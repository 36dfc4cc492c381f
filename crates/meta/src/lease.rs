//! [`KeepAlive`]: keeps a lease alive in the background, says until when the store surely keeps
//! it, and says when it was lost.

use crate::error::MetaError;
use crate::store::{LeaseId, MetaStore};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Renews a lease every third of its TTL until dropped. If the store says the lease is gone,
/// or renewals keep failing for a whole TTL (the store must have expired it by then), the lease
/// counts as lost: [`KeepAlive::lost`] resolves and renewals stop.
///
/// [`KeepAlive::confirmed`] tells when the request of the last successful grant or renewal was
/// sent: the store received it later, so (by its own clock, which runs at the rate of ours) it
/// keeps the lease at least until that instant plus the TTL. Times are monotonic
/// ([`tokio::time::Instant`]).
#[derive(Debug)]
pub struct KeepAlive {
    lease: LeaseId,
    store: Arc<dyn MetaStore>,
    lost: watch::Receiver<bool>,
    confirmed: watch::Receiver<Instant>,
    task: JoinHandle<()>,
}

impl KeepAlive {
    /// Keeps `lease` alive, counting its grant as confirmed now.
    pub fn spawn(store: Arc<dyn MetaStore>, lease: LeaseId, ttl: Duration) -> KeepAlive {
        KeepAlive::spawn_granted(store, lease, ttl, Instant::now())
    }

    /// Keeps `lease` alive; `granted` is when the request that granted it was sent.
    pub fn spawn_granted(
        store: Arc<dyn MetaStore>,
        lease: LeaseId,
        ttl: Duration,
        granted: Instant,
    ) -> KeepAlive {
        let (lost_tx, lost) = watch::channel(false);
        let (confirmed_tx, confirmed) = watch::channel(granted);
        let task = tokio::spawn(renew(store.clone(), lease, ttl, lost_tx, confirmed_tx));
        KeepAlive {
            lease,
            store,
            lost,
            confirmed,
            task,
        }
    }

    pub fn lease(&self) -> LeaseId {
        self.lease
    }

    /// Whether the lease is known to be gone.
    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Resolves once the lease is lost.
    pub async fn lost(&self) {
        let mut rx = self.lost.clone();
        // An error means the renewing task ended without a verdict: treat as lost.
        let _ = rx.wait_for(|lost| *lost).await;
    }

    /// When the request of the last successful grant or renewal was sent; changes with every
    /// renewal.
    pub fn confirmed(&self) -> watch::Receiver<Instant> {
        self.confirmed.clone()
    }

    /// Stops renewing and revokes the lease now (its keys vanish at once).
    pub async fn revoke(self) -> Result<(), MetaError> {
        self.task.abort();
        self.store.revoke_lease(self.lease).await
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        // The lease then expires by its TTL.
        self.task.abort();
    }
}

/// Renews every `ttl / 3` (one attempt at a time, each given that long to answer) until the
/// lease is gone or no renewal succeeded for a whole `ttl`.
async fn renew(
    store: Arc<dyn MetaStore>,
    lease: LeaseId,
    ttl: Duration,
    lost: watch::Sender<bool>,
    confirmed: watch::Sender<Instant>,
) {
    let period = (ttl / 3).max(Duration::from_millis(100));
    let mut last_ok = *confirmed.borrow();
    let mut next = last_ok + period;
    loop {
        tokio::time::sleep_until(next).await;
        let sent = Instant::now();
        next = sent + period;
        let answer = tokio::time::timeout(period, store.keep_alive(lease)).await;
        let expired = last_ok.elapsed() >= ttl;
        let verdict = match answer {
            Ok(Ok(())) => {
                last_ok = sent;
                confirmed.send_replace(sent);
                continue;
            }
            Ok(Err(MetaError::LeaseNotFound(_))) => "the store says it is gone".to_string(),
            Ok(Err(e)) if expired => format!("no renewal for {ttl:?}: {e}"),
            Err(_) if expired => format!("no renewal for {ttl:?}: the store did not answer"),
            Ok(Err(e)) => {
                tracing::debug!(%lease, "lease renewal failed, will retry: {e}");
                continue;
            }
            Err(_) => {
                tracing::debug!(%lease, "lease renewal got no answer within {period:?}; retrying");
                continue;
            }
        };
        tracing::warn!(%lease, "lease lost: {verdict}");
        lost.send_replace(true);
        return;
    }
}
