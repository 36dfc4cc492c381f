//! Delivering watch events with the same "fell behind" rule in every backend.
//!
//! Each watch has a bounded channel of [`WATCH_BUFFER`] events. Events are offered without
//! waiting; when the channel is full the watcher has fallen behind: it is closed with a
//! [`WatchEvent::Lost`] that the receiver reads after the events already buffered, so it never
//! sees a gap, only an explicit end.

use crate::error::MetaError;
use crate::store::{WATCH_BUFFER, WatchEvent, WatchReceiver};
use std::time::Duration;
use tokio::sync::mpsc::{self, error::TrySendError};

/// The retry policy of the loops that follow a prefix (list, then watch until the watch is
/// lost): after an error wait 100 ms, doubling up to 5 s; after a clean round, start over.
pub(crate) struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Backoff(Duration::from_millis(100))
    }
}

impl Backoff {
    /// Accounts for one round of following `what`; false when the receiver of `tx` is gone
    /// (while waiting, too): the loop should end.
    pub(crate) async fn after<T>(
        &mut self,
        round: Result<(), MetaError>,
        what: &str,
        tx: &mpsc::Sender<T>,
    ) -> bool {
        match round {
            Ok(()) => *self = Backoff::default(),
            Err(e) => {
                tracing::warn!("following {what}: {e}; retrying in {:?}", self.0);
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep(self.0) => {}
                    _ = tx.closed() => return false,
                }
                self.0 = (self.0 * 2).min(Duration::from_secs(5));
            }
        }
        !tx.is_closed()
    }
}

/// The sending side of one watch.
#[derive(Debug)]
pub(crate) struct WatchSender {
    tx: Option<mpsc::Sender<WatchEvent>>,
}

/// Whether the watch still wants events after an offer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Delivery {
    Open,
    /// The receiver was dropped or the watcher was closed (fell behind): stop sending.
    Closed,
}

pub(crate) fn channel() -> (WatchSender, WatchReceiver) {
    let (tx, rx) = mpsc::channel(WATCH_BUFFER);
    (WatchSender { tx: Some(tx) }, rx)
}

impl WatchSender {
    /// Offers one event without waiting. A full channel closes the watch with `Lost`.
    pub(crate) fn offer(&mut self, event: WatchEvent) -> Delivery {
        let Some(tx) = &self.tx else {
            return Delivery::Closed;
        };
        match tx.try_send(event) {
            Ok(()) => Delivery::Open,
            Err(TrySendError::Closed(_)) => {
                self.tx = None;
                Delivery::Closed
            }
            Err(TrySendError::Full(_)) => {
                self.close(format!(
                    "the watcher fell more than {WATCH_BUFFER} events behind; re-list and watch \
                     again from the listing's revision + 1"
                ));
                Delivery::Closed
            }
        }
    }

    /// Ends the watch with `Lost(reason)`, delivered after the events already buffered.
    pub(crate) fn close(&mut self, reason: String) {
        let Some(tx) = self.tx.take() else { return };
        match tx.try_send(WatchEvent::Lost(reason)) {
            Ok(()) | Err(TrySendError::Closed(_)) => {}
            Err(TrySendError::Full(event)) => {
                // Wait for room in the background; ends early if the receiver goes away.
                // Outside a runtime the receiver sees the channel close instead.
                if let Ok(handle) = tokio::runtime::Handle::try_current() {
                    handle.spawn(async move {
                        let _ = tx.send(event).await;
                    });
                }
            }
        }
    }

    /// Whether the receiver is gone (or the watch was closed).
    pub(crate) fn is_closed(&self) -> bool {
        self.tx.as_ref().is_none_or(|tx| tx.is_closed())
    }

    /// Resolves when the receiver is dropped.
    pub(crate) async fn closed(&self) {
        if let Some(tx) = &self.tx {
            tx.closed().await;
        }
    }
}
