//! Where the store reads the time: the OS clock on the I/O thread, or the tokio runtime's clock
//! when the engine runs as a task (simulation). Every time read of the engine and of the
//! simulated disk goes through [`Clock`], so a simulation on a runtime with paused time is
//! driven by virtual time only.

use std::time::{Duration, Instant};

/// A source of the current time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Clock {
    /// `std::time::Instant::now()`: the I/O thread of a store in production.
    Os,
    /// `tokio::time::Instant::now()`: virtual time when the runtime's clock is paused (the
    /// deterministic simulation), the OS clock otherwise.
    Runtime,
}

impl Clock {
    pub fn now(self) -> Instant {
        match self {
            Clock::Os => Instant::now(),
            Clock::Runtime => tokio::time::Instant::now().into_std(),
        }
    }

    /// Time passed since `t` (zero if `t` is in the future).
    pub fn since(self, t: Instant) -> Duration {
        self.now().saturating_duration_since(t)
    }
}
