//! The device requests in flight (handed to the backend, not completed): their contexts by
//! token, and the submission instant of the oldest, published for [`Store::oldest_io_age`]. A
//! device that stops completing requests (a firmware stall, a dead path) returns no error; it
//! shows only as an oldest request whose age keeps growing, which the node turns into a device
//! fault (`crates/node/src/faults.rs`).
//!
//! Requests are linked in submission order, which is time order (the engine's clock is
//! monotonic), so the oldest is the head of the list: inserting and removing are O(1) whatever
//! order the device completes them in.
//!
//! [`Store::oldest_io_age`]: crate::Store::oldest_io_age

use super::{IoCtx, Slab};
use crate::clock::Clock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

struct Entry {
    ctx: IoCtx,
    /// When the request was handed to the backend.
    at: Instant,
    prev: Option<usize>,
    next: Option<usize>,
}

/// The in-flight requests, keyed by the token the backend hands back.
pub(crate) struct InFlight {
    slab: Slab<Entry>,
    head: Option<usize>,
    tail: Option<usize>,
}

impl InFlight {
    pub fn new() -> InFlight {
        InFlight {
            slab: Slab::new(),
            head: None,
            tail: None,
        }
    }

    /// Adds a request submitted at `at` (no earlier than any request before it); returns its
    /// token and whether it became the oldest (nothing else was in flight).
    pub fn insert(&mut self, ctx: IoCtx, at: Instant) -> (usize, bool) {
        let prev = self.tail;
        let i = self.slab.insert(Entry {
            ctx,
            at,
            prev,
            next: None,
        });
        match prev {
            Some(t) => self.entry(t).next = Some(i),
            None => self.head = Some(i),
        }
        self.tail = Some(i);
        (i, prev.is_none())
    }

    /// Removes a completed request; returns its context, when it was submitted and whether it
    /// was the oldest.
    pub fn remove(&mut self, token: usize) -> Option<(IoCtx, Instant, bool)> {
        let e = self.slab.remove(token)?;
        match e.prev {
            Some(p) => self.entry(p).next = e.next,
            None => self.head = e.next,
        }
        match e.next {
            Some(n) => self.entry(n).prev = e.prev,
            None => self.tail = e.prev,
        }
        Some((e.ctx, e.at, e.prev.is_none()))
    }

    /// When the oldest request in flight was submitted.
    pub fn oldest(&self) -> Option<Instant> {
        self.head.and_then(|h| self.slab.get(h)).map(|e| e.at)
    }

    pub fn len(&self) -> usize {
        self.slab.len()
    }

    fn entry(&mut self, i: usize) -> &mut Entry {
        self.slab
            .get_mut(i)
            .expect("a linked in-flight request is in the slab")
    }
}

/// The submission instant of the oldest request in flight, shared with the handles: one atomic
/// the I/O loop stores when the oldest changes, read with the loop's clock by
/// [`IoAge::age`] (so a stalled loop, asleep while nothing completes, needs to do nothing).
pub(crate) struct IoAge {
    clock: Clock,
    /// Instants are stored as nanoseconds after this one, plus one (0: nothing in flight).
    origin: Instant,
    oldest: AtomicU64,
}

impl Default for IoAge {
    fn default() -> Self {
        IoAge::new(Clock::Os)
    }
}

impl IoAge {
    pub fn new(clock: Clock) -> IoAge {
        IoAge {
            clock,
            origin: clock.now(),
            oldest: AtomicU64::new(0),
        }
    }

    /// Publishes the submission instant of the oldest request in flight (`None`: none).
    pub fn set(&self, oldest: Option<Instant>) {
        let v = oldest.map_or(0, |t| {
            let nanos = t.saturating_duration_since(self.origin).as_nanos();
            u64::try_from(nanos).unwrap_or(u64::MAX - 1) + 1
        });
        self.oldest.store(v, Ordering::Release);
    }

    /// How long the oldest request in flight has waited, if one is in flight.
    pub fn age(&self) -> Option<Duration> {
        match self.oldest.load(Ordering::Acquire) {
            0 => None,
            v => Some(self.clock.since(self.origin + Duration::from_nanos(v - 1))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn the_oldest_is_the_earliest_submitted_still_in_flight_in_any_completion_order() {
        let base = Instant::now();
        let mut f = InFlight::new();
        assert_eq!(f.oldest(), None);
        let (a, first) = f.insert(IoCtx::WriteBack, at(base, 1));
        assert!(first);
        let (b, first) = f.insert(IoCtx::WriteBack, at(base, 2));
        assert!(!first);
        let (c, _) = f.insert(IoCtx::WriteBack, at(base, 3));
        assert_eq!(f.oldest(), Some(at(base, 1)));
        // The middle one completes first: the oldest stays.
        assert!(!f.remove(b).unwrap().2);
        assert_eq!(f.oldest(), Some(at(base, 1)));
        assert!(f.remove(b).is_none(), "removed once");
        let (_, submitted, oldest) = f.remove(a).unwrap();
        assert!(oldest, "the oldest completed");
        assert_eq!(submitted, at(base, 1), "its submission instant comes back");
        assert_eq!(f.oldest(), Some(at(base, 3)));
        // A slot freed by `b` is reused at the tail, not at its old place.
        let (d, _) = f.insert(IoCtx::WriteBack, at(base, 4));
        assert_eq!(f.len(), 2);
        assert!(f.remove(c).unwrap().2);
        assert_eq!(f.oldest(), Some(at(base, 4)));
        assert!(f.remove(d).unwrap().2);
        assert_eq!((f.oldest(), f.len()), (None, 0));
        let (_, first) = f.insert(IoCtx::WriteBack, at(base, 5));
        assert!(first, "the list is empty again");
        assert_eq!(f.oldest(), Some(at(base, 5)));
    }

    #[test]
    fn the_published_age_is_read_on_the_clock_and_none_when_idle() {
        let now = Instant::now();
        let age = IoAge {
            clock: Clock::Os,
            origin: now - Duration::from_secs(10),
            oldest: AtomicU64::new(0),
        };
        assert_eq!(age.age(), None);
        let then = now - Duration::from_secs(3);
        age.set(Some(then));
        let got = age.age().expect("an I/O in flight");
        assert!(got >= Duration::from_secs(3), "{got:?}");
        age.set(None);
        assert_eq!(age.age(), None);
    }
}
