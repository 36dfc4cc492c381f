//! The wall clock the metadata layer and the leader read (`created_at` fields, down-since
//! times, the down-out rule, lease-id seeds).
//!
//! In production this is the system clock. The deterministic cluster simulator runs every node
//! on one current-thread runtime in virtual time: [`simulate`] makes this thread's wall clock a
//! fixed start plus the runtime's (virtual) elapsed time, so that runs repeat bit for bit and
//! time-based rules (down-out) follow virtual time.

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

thread_local! {
    /// `(unix seconds at start, runtime instant at start)` while simulated on this thread.
    static SIMULATED: Cell<Option<(u64, tokio::time::Instant)>> = const { Cell::new(None) };
}

/// Makes this thread's wall clock simulated from now on: `start_secs` now, advancing with
/// `tokio::time::Instant` (call it inside the simulation's runtime). `None` restores the
/// system clock.
pub fn simulate(start_secs: Option<u64>) {
    let value = start_secs.map(|s| (s, tokio::time::Instant::now()));
    SIMULATED.with(|c| c.set(value));
}

/// Whether this thread's wall clock is simulated.
pub fn is_simulated() -> bool {
    SIMULATED.with(|c| c.get().is_some())
}

/// Seconds since the Unix epoch.
pub fn unix_secs() -> u64 {
    unix_micros() / 1_000_000
}

/// Microseconds since the Unix epoch.
pub fn unix_micros() -> u64 {
    match SIMULATED.with(|c| c.get()) {
        Some((start, at)) => {
            let elapsed = u64::try_from(at.elapsed().as_micros()).unwrap_or(u64::MAX);
            start.saturating_mul(1_000_000).saturating_add(elapsed)
        }
        None => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
    }
}
