//! The engine's loop, two ways:
//!
//! - [`Engine::run`]: the store's I/O thread in production. Takes messages from the handles,
//!   makes progress, hands requests to the backend and sleeps in the backend's poll when
//!   nothing is left to do (until a completion, a message or the write-back timer).
//! - [`Engine::drive`]: the same loop as a task on a tokio runtime: one non-blocking
//!   [`Engine::step`] at a time, and when idle it awaits a message (a tokio `Notify`), the
//!   backend's completions (io_uring's registered eventfd, readable through the runtime's
//!   reactor) or next completion time (the simulated disk), or the write-back timer, on the
//!   runtime's clock. A node runs its stores this way, on the thread that serves its network
//!   (run to completion: a request crosses no thread). On a current-thread runtime with
//!   paused time over a simulated disk the store is deterministic (the simulation).

use super::Engine;
use crate::error::EngineError;
use crate::io::IoDone;
use std::os::fd::OwnedFd;
use std::time::Duration;
use tokio::io::unix::AsyncFd;

/// What one step of the loop found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The store is closed and drained: stop.
    Finished,
    /// Work was done; step again soon.
    Busy,
    /// Nothing to do until a message, a completion or the write-back timer.
    Idle,
}

impl Engine {
    /// The I/O thread's loop. Returns when the store is closed and drained.
    pub fn run(mut self) {
        let mut done: Vec<IoDone> = Vec::new();
        let mut busy = true;
        loop {
            let got = self.drain_messages();
            let more = self.pump();
            if self.finished() {
                break;
            }
            let wait = if got == 0 && !busy && !more {
                self.waker.set_sleeping();
                if self.rx.is_empty() {
                    Some(self.timer())
                } else {
                    None
                }
            } else {
                None
            };
            self.be.poll(&mut done, wait);
            self.waker.clear_sleeping();
            busy = !done.is_empty() || got > 0;
            for d in done.drain(..) {
                self.complete(d);
            }
        }
        self.answer_close();
    }

    /// One iteration of the loop that never blocks: messages, progress, completions.
    pub fn step(&mut self, done: &mut Vec<IoDone>) -> Step {
        let got = self.drain_messages();
        let more = self.pump();
        if self.finished() {
            return Step::Finished;
        }
        self.be.poll(done, None);
        let busy = got > 0 || more || !done.is_empty();
        for d in done.drain(..) {
            self.complete(d);
        }
        if busy { Step::Busy } else { Step::Idle }
    }

    /// The loop as a task: steps while there is work (yielding to other tasks in between),
    /// and when idle waits for a message, the backend's next completion or the write-back
    /// timer. Returns when the store is closed and drained.
    pub async fn drive(mut self) {
        let completions = self.be.completion_fd().map(|fd| {
            // SAFETY: the AsyncFd owns `fd` (a descriptor of its own for the backend's
            // eventfd), so it stays open and the same for the AsyncFd's whole life.
            unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
                .expect("the completion eventfd registers with the runtime's reactor")
        });
        let mut done: Vec<IoDone> = Vec::new();
        // One timer for the loop's life, moved rather than made anew at each idle: a new timer
        // (or one moved earlier than the runtime's next wake-up) makes tokio wake its own
        // driver with an eventfd write, a system call and an extra pass of the reactor per
        // idle, that is per request at low queue depth (perf: every `write` system call of a
        // node serving QD1 writes). Moved later, it does not.
        // A timer that fired stays ready until it is moved: a deadline that has passed.
        let mut timer = Box::pin(tokio::time::sleep_until(tokio::time::Instant::now()));
        loop {
            match self.step(&mut done) {
                Step::Finished => break,
                Step::Busy => Requeue(false).await,
                Step::Idle => self.idle(completions.as_ref(), timer.as_mut()).await,
            }
        }
        self.answer_close();
    }

    async fn idle(
        &mut self,
        completions: Option<&AsyncFd<OwnedFd>>,
        mut timer: std::pin::Pin<&mut tokio::time::Sleep>,
    ) {
        let waker = self.waker.clone();
        waker.set_sleeping();
        if !self.rx.is_empty() || self.be.has_completions() {
            waker.clear_sleeping();
            return;
        }
        let now = self.clock.now();
        let deadline = [self.timer().map(|d| now + d), self.be.next_event()]
            .into_iter()
            .flatten()
            .min();
        if let Some(t) = deadline.map(tokio::time::Instant::from_std)
            && timer.deadline() != t
        {
            timer.as_mut().reset(t);
        }
        let sleep = async {
            match deadline {
                Some(_) => (&mut timer).await,
                None => std::future::pending().await,
            }
        };
        let io = async {
            match completions {
                Some(fd) => completed(fd).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = waker.notified() => {}
            _ = io => {}
            _ = sleep => {}
        }
        waker.clear_sleeping();
    }

    /// How long to sleep: until the idle write-back is due, or until woken.
    pub(super) fn timer(&self) -> Option<Duration> {
        if self.poisoned.is_none() && !self.jr.recs.is_empty() && !self.wb.active() {
            let since = self.clock.since(self.last_write);
            return Some(
                self.cfg
                    .writeback_idle
                    .saturating_sub(since)
                    .max(Duration::from_micros(100)),
            );
        }
        None
    }

    fn drain_messages(&mut self) -> usize {
        let mut n = 0;
        while n < 1024 {
            let msg = match self.rx.try_recv() {
                Ok(m) => m,
                Err(crossbeam_channel::TryRecvError::Empty) => break,
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    self.closing = true;
                    break;
                }
            };
            n += 1;
            self.handle(msg);
        }
        n
    }

    /// True when closing and nothing is left in flight.
    fn finished(&self) -> bool {
        if !self.closing || self.ios.len() > 0 || !self.blocked.is_empty() || self.reads.len() > 0 {
            return false;
        }
        if self.poisoned.is_some() {
            return true;
        }
        self.jr.open.is_none() && self.jr.recs.is_empty() && !self.wb.active()
    }

    /// Answers every `close` once the loop has stopped.
    fn answer_close(&mut self) {
        for tx in self.close_replies.drain(..) {
            let res = match &self.poisoned {
                Some(p) => Err(EngineError::Poisoned(p.clone())),
                None => Ok(()),
            };
            let _ = tx.send(res);
        }
    }
}

/// Waits until the ring signalled a completion since the last wait. The eventfd's counter is
/// never read: the ring writes it for every completion it posts, each write is a new
/// edge-triggered readiness event, and the readiness seen here is cleared before the caller
/// collects completions, so one posted after that wakes the next wait (no completion is
/// slept through, and no `read` system call is spent per wake-up).
async fn completed(fd: &AsyncFd<OwnedFd>) {
    match fd.readable().await {
        Ok(mut guard) => guard.clear_ready(),
        // The runtime is shutting down (its reactor is gone): the task is dropped soon.
        Err(_) => std::future::pending().await,
    }
}

/// Lets the runtime's other ready tasks run, then goes on: the task wakes itself and goes to the
/// back of the runtime's queue. `tokio::task::yield_now` instead defers the wake-up until the
/// runtime has polled its reactor, a zero-timeout `epoll_wait` after every busy step of the
/// loop (one per request at low queue depth); the reactor is polled anyway once the queue is
/// empty or every few dozen tasks.
struct Requeue(bool);

impl std::future::Future for Requeue {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}
