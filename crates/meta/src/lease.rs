//! [`KeepAlive`]: keeps a lease alive in the background and says when it was lost.

use crate::error::MetaError;
use crate::store::{LeaseId, MetaStore};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Renews a lease every third of its TTL until dropped. If the store says the lease is gone,
/// or renewals keep failing for a whole TTL (the store must have expired it by then), the lease
/// counts as lost: [`KeepAlive::lost`] resolves and renewals stop.
#[derive(Debug)]
pub struct KeepAlive {
    lease: LeaseId,
    store: Arc<dyn MetaStore>,
    lost: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl KeepAlive {
    pub fn spawn(store: Arc<dyn MetaStore>, lease: LeaseId, ttl: Duration) -> KeepAlive {
        let (tx, lost) = watch::channel(false);
        let task = tokio::spawn(renew(store.clone(), lease, ttl, tx));
        KeepAlive {
            lease,
            store,
            lost,
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

async fn renew(
    store: Arc<dyn MetaStore>,
    lease: LeaseId,
    ttl: Duration,
    lost: watch::Sender<bool>,
) {
    let period = (ttl / 3).max(Duration::from_millis(100));
    let mut last_ok = Instant::now();
    loop {
        tokio::time::sleep(period).await;
        match store.keep_alive(lease).await {
            Ok(()) => last_ok = Instant::now(),
            Err(MetaError::LeaseNotFound(_)) => {
                tracing::warn!(%lease, "lease lost");
                lost.send_replace(true);
                return;
            }
            Err(e) if last_ok.elapsed() >= ttl => {
                tracing::warn!(%lease, "lease presumed lost: no renewal for {ttl:?}: {e}");
                lost.send_replace(true);
                return;
            }
            Err(e) => tracing::debug!(%lease, "lease renewal failed, will retry: {e}"),
        }
    }
}
