//! The embedded store's watchers and its bounded, in-memory event history.

use crate::store::{Revision, WatchEvent, WatchReceiver};
use crate::watch::{self, Delivery, WatchSender};
use std::collections::VecDeque;

/// The history keeps at most this many revisions...
const HISTORY_REVISIONS: usize = 10_000;
/// ...and at most about this many bytes of keys and values.
const HISTORY_BYTES: usize = 64 << 20;

struct Watcher {
    prefix: String,
    from: Revision,
    tx: WatchSender,
}

/// Watchers plus the recent history they can start from.
pub(crate) struct Hub {
    watchers: Vec<Watcher>,
    history: VecDeque<(Revision, Vec<WatchEvent>)>,
    history_bytes: usize,
    /// The oldest revision a watch may start from (history is complete from here on).
    first_watchable: Revision,
}

impl Hub {
    pub(crate) fn new(first_watchable: Revision) -> Hub {
        Hub {
            watchers: Vec::new(),
            history: VecDeque::new(),
            history_bytes: 0,
            first_watchable,
        }
    }

    /// Hands the events of revision `rev` to the watchers and keeps them in the history.
    pub(crate) fn publish(&mut self, rev: Revision, events: Vec<WatchEvent>) {
        self.watchers.retain_mut(|w| {
            if rev < w.from {
                return !w.tx.is_closed();
            }
            events
                .iter()
                .filter(|e| event_key(e).starts_with(&w.prefix))
                .all(|e| w.tx.offer(e.clone()) == Delivery::Open)
        });
        self.history_bytes += events.iter().map(event_size).sum::<usize>();
        self.history.push_back((rev, events));
        while self.history.len() > HISTORY_REVISIONS || self.history_bytes > HISTORY_BYTES {
            let Some((old_rev, old)) = self.history.pop_front() else {
                break;
            };
            self.history_bytes -= old.iter().map(event_size).sum::<usize>();
            self.first_watchable = old_rev + 1;
        }
    }

    /// Starts a watch on `prefix` from revision `from` (0 = after `current`): replays the
    /// history from there, then follows new changes.
    pub(crate) fn subscribe(
        &mut self,
        prefix: &str,
        from: Revision,
        current: Revision,
    ) -> WatchReceiver {
        let (mut tx, rx) = watch::channel();
        let from = if from <= 0 { current + 1 } else { from };
        if from < self.first_watchable {
            tx.close(format!(
                "revision {from} is no longer available (history starts at revision {}); \
                 re-list and watch again from the listing's revision + 1",
                self.first_watchable
            ));
            return rx;
        }
        for (_, events) in self.history.iter().filter(|(rev, _)| *rev >= from) {
            for e in events.iter().filter(|e| event_key(e).starts_with(prefix)) {
                if tx.offer(e.clone()) == Delivery::Closed {
                    return rx;
                }
            }
        }
        self.watchers.retain(|w| !w.tx.is_closed());
        self.watchers.push(Watcher {
            prefix: prefix.to_string(),
            from,
            tx,
        });
        rx
    }
}

fn event_key(e: &WatchEvent) -> &str {
    match e {
        WatchEvent::Put(kv) | WatchEvent::Delete(kv) => &kv.key,
        WatchEvent::Lost(_) => "",
    }
}

fn event_size(e: &WatchEvent) -> usize {
    match e {
        WatchEvent::Put(kv) | WatchEvent::Delete(kv) => kv.key.len() + kv.value.len() + 64,
        WatchEvent::Lost(r) => r.len(),
    }
}
