//! Requests in flight, so that a node leaving the cluster finishes them before it gives up its
//! lease (`node.rs::Node::shutdown`).
//!
//! [`Tracked`] wraps the node's [`Service`] (for the TCP server and for clients in the same
//! process): every call counts as in flight from the moment it is made until its future
//! completes or is dropped. [`InFlight::wait_idle`] resolves once none is. The TCP server runs
//! each request as a task of its own, and so does [`Detached`] for clients in the same process
//! (reads excepted: they hold nothing when dropped): a request's future is dropped only once it
//! completed.
//!
//! Client I/O and replication sub-operations also note when the node began answering them
//! (after their connection's budget admitted them: `server.rs`), so that `basalt status` can
//! name a node whose requests wait long ([`InFlight::waiting`]: a member or device that does
//! not answer, an object waiting for its recovery, a node too loaded to keep up). A PG that
//! cannot serve answers `Busy` at once: its clients wait and retry, the node holds nothing.

use basalt_proto::{ErrorCode, Request, ResponseFuture, Service, WireError};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How many requests are being answered. Counted with an atomic on every request; waiters are
/// woken only when the count reaches zero (a `watch` channel woke its notifier on every change:
/// 3% of a node's CPU serving reads, perf).
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    count: AtomicU64,
    idle: Notify,
    /// When each timed request in flight arrived, by arrival number (so the first entry is
    /// the oldest).
    timed: Mutex<Timed>,
}

#[derive(Debug, Default)]
struct Timed {
    next: u64,
    arrived: BTreeMap<u64, Instant>,
}

/// Requests that have waited long, as [`InFlight::waiting`] finds them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Waiting {
    /// Timed requests in flight for at least the asked time.
    pub(crate) count: u64,
    /// How long the oldest timed request in flight has waited.
    pub(crate) oldest: Option<Duration>,
}

impl InFlight {
    /// Counts one request until the guard is dropped; a `timed` one also notes when it arrived.
    pub(crate) fn enter(self: &Arc<Self>, timed: bool) -> Guard {
        let before = self.count.fetch_add(1, Ordering::AcqRel);
        assert!(before < u64::MAX, "in-flight request count overflows");
        let key = timed.then(|| {
            let mut t = self.timed.lock();
            let key = t.next;
            t.next = key.checked_add(1).expect("request arrival numbers run out");
            t.arrived.insert(key, Instant::now());
            key
        });
        Guard(self.clone(), key)
    }

    /// The timed requests in flight for at least `at_least`, and the age of the oldest.
    pub(crate) fn waiting(&self, at_least: Duration) -> Waiting {
        let now = Instant::now();
        let t = self.timed.lock();
        let oldest = t.arrived.values().next().map(|a| now.duration_since(*a));
        // Arrival numbers follow arrival instants: the long waiters are the first entries.
        let count = t
            .arrived
            .values()
            .take_while(|a| now.duration_since(**a) >= at_least)
            .count();
        Waiting {
            count: count as u64,
            oldest,
        }
    }

    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// Waits until no request is in flight, at most `limit`. Returns whether none is.
    pub(crate) async fn wait_idle(&self, limit: Duration) -> bool {
        let idle = async {
            loop {
                // Registered before the count is read: a guard dropping the count to zero
                // after the read wakes it (`notify_waiters` reaches every future created
                // before the call, polled or not).
                let woken = self.idle.notified();
                if self.count() == 0 {
                    return;
                }
                woken.await;
            }
        };
        tokio::time::timeout(limit, idle).await.is_ok()
    }
}

/// One request in flight (and its arrival number, when timed).
pub(crate) struct Guard(Arc<InFlight>, Option<u64>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(key) = self.1 {
            let removed = self.0.timed.lock().arrived.remove(&key);
            assert!(removed.is_some(), "a timed request left no arrival behind");
        }
        // A guard is only made by `enter`, which counted it.
        let before = self.0.count.fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "in-flight request count underflows");
        if before == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// A [`Service`] whose calls count in an [`InFlight`].
pub(crate) struct Tracked {
    pub(crate) inner: Arc<dyn Service>,
    pub(crate) in_flight: Arc<InFlight>,
}

/// Whether `req` is timed in [`InFlight`]: client I/O and replication sub-operations, which
/// should take milliseconds (not peering and recovery messages, volume deletions or admin
/// requests, which may take long by nature).
fn timed(req: &Request) -> bool {
    matches!(
        req,
        Request::Read { .. }
            | Request::ReadReplica { .. }
            | Request::Write { .. }
            | Request::WriteZeroes { .. }
            | Request::Trim { .. }
            | Request::Flush { .. }
            | Request::Rep(_)
    )
}

impl Service for Tracked {
    fn call(&self, req: Request) -> ResponseFuture {
        let guard = self.in_flight.enter(timed(&req));
        let call = self.inner.call(req);
        Box::pin(async move {
            let answer = call.await;
            drop(guard);
            answer
        })
    }
}

/// Runs each call but reads as a task of its own, as the TCP server runs each request
/// (`server.rs::dispatch`), for clients in the same process ([`crate::Node::service`]): a caller
/// that drops its future (its I/O timeout, a sibling piece of a split request that failed, a
/// gateway stopping) does not cancel the request halfway. A write dropped past its PG's gate
/// would leave its in-flight entry and, on a replicated PG, the store's hold of its object in
/// place until the term ends, and a dropped [`Tracked`] guard would let a stopping node close
/// its stores under it. A read leaves nothing behind when dropped (the hold of a read repair
/// is released on drop: `pg/repair.rs::Exclusive`), so it runs in the caller's task, without
/// the task's cost (single-node `basalt up`: 0.94x the 4K reads at QD64 with a task per read).
pub(crate) struct Detached(pub(crate) Arc<dyn Service>);

impl Service for Detached {
    fn call(&self, req: Request) -> ResponseFuture {
        if matches!(req, Request::Read { .. } | Request::ReadReplica { .. }) {
            return self.0.call(req);
        }
        let task = tokio::spawn(self.0.call(req));
        Box::pin(async move {
            task.await.unwrap_or_else(|e| {
                Err(WireError::new(
                    ErrorCode::Internal,
                    format!("the request's task ended: {e}"),
                ))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Finish;
    use basalt_proto::{Response, WireError};
    use bytes::Bytes;

    /// Answers Ping only once `release` is notified.
    struct Gate {
        release: Arc<Notify>,
    }

    impl Service for Gate {
        fn call(&self, _req: Request) -> ResponseFuture {
            let release = self.release.clone();
            Box::pin(async move {
                release.notified().await;
                Ok::<_, WireError>(Response::Pong { data: Bytes::new() })
            })
        }
    }

    fn ping() -> Request {
        Request::Ping { data: Bytes::new() }
    }

    /// A tracked [`Gate`]: its release, its in-flight table and the service.
    fn gated() -> (Arc<Notify>, Arc<InFlight>, Tracked) {
        let release = Arc::new(Notify::new());
        let in_flight = Arc::new(InFlight::default());
        let svc = Tracked {
            inner: Arc::new(Gate {
                release: release.clone(),
            }),
            in_flight: in_flight.clone(),
        };
        (release, in_flight, svc)
    }

    #[tokio::test(start_paused = true)]
    async fn idle_only_once_every_call_finished_or_was_dropped() {
        let (release, in_flight, svc) = gated();
        assert!(in_flight.wait_idle(Duration::from_secs(1)).await);
        // Counted from the call, before the future is first polled.
        let first = svc.call(ping());
        let second = svc.call(ping());
        assert_eq!(in_flight.count(), 2);
        assert!(!in_flight.wait_idle(Duration::from_secs(5)).await);
        drop(second);
        assert_eq!(in_flight.count(), 1);
        let task = tokio::spawn(first);
        tokio::task::yield_now().await;
        assert!(!in_flight.wait_idle(Duration::from_secs(5)).await);
        release.notify_one();
        assert!(in_flight.wait_idle(Duration::from_secs(1)).await);
        assert!(task.await.unwrap().is_ok());
        assert_eq!(in_flight.count(), 0);
    }

    fn flush() -> Request {
        Request::Flush {
            epoch: basalt_types::Epoch(1),
        }
    }

    /// Client I/O is timed from its arrival until it is answered or dropped; other requests
    /// (here a ping) only count.
    #[tokio::test(start_paused = true)]
    async fn timed_requests_say_how_long_they_have_waited() {
        let (_release, in_flight, svc) = gated();
        let second = Duration::from_secs(1);
        assert_eq!(in_flight.waiting(second), Waiting::default());
        let ping = svc.call(ping());
        let first = svc.call(flush());
        tokio::time::advance(Duration::from_secs(3)).await;
        let later = svc.call(flush());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(in_flight.count(), 3);
        let w = in_flight.waiting(Duration::from_secs(4));
        assert_eq!((w.count, w.oldest), (1, Some(Duration::from_secs(5))));
        assert_eq!(in_flight.waiting(second).count, 2);
        drop(first);
        let w = in_flight.waiting(second);
        assert_eq!((w.count, w.oldest), (1, Some(Duration::from_secs(2))));
        drop(later);
        assert_eq!(in_flight.waiting(second), Waiting::default(), "{w:?}");
        assert_eq!(in_flight.count(), 1, "the ping still counts");
        drop(ping);
        assert_eq!(in_flight.count(), 0);
    }

    /// A caller that drops its future does not cancel a detached request: it runs to its end,
    /// counted in flight until then.
    #[tokio::test(start_paused = true)]
    async fn a_dropped_caller_does_not_cancel_a_detached_request() {
        let release = Arc::new(Notify::new());
        let finished = Arc::new(AtomicU64::new(0));
        let in_flight = Arc::new(InFlight::default());
        let svc = Detached(Arc::new(Tracked {
            inner: Arc::new(Finish {
                release: release.clone(),
                finished: finished.clone(),
            }),
            in_flight: in_flight.clone(),
        }));
        drop(svc.call(ping()));
        tokio::task::yield_now().await;
        assert_eq!(in_flight.count(), 1, "still in flight");
        assert!(!in_flight.wait_idle(Duration::from_secs(5)).await);
        release.notify_one();
        assert!(in_flight.wait_idle(Duration::from_secs(1)).await);
        assert_eq!(finished.load(Ordering::Relaxed), 1, "ran to its end");
        // Awaited, it answers as the service does.
        let answer = svc.call(ping());
        let task = tokio::spawn(answer);
        tokio::task::yield_now().await;
        release.notify_one();
        assert!(task.await.unwrap().is_ok());
        assert_eq!(finished.load(Ordering::Relaxed), 2);
    }
}
