//! The recovery throttle and the recovery rate.
//!
//! [`Throttle`] limits the recovery and backfill a local device drives as a PG primary (reading
//! its own copy or a source's, writing to members that lack objects), by two limits that apply
//! together, each per device:
//! - a **rate**: bytes moved per second (0: unlimited). An operation is charged when it is
//!   admitted (what the device's operations moved lately, or the most it may move for the
//!   first), and settled against what it moved when it ends: operations of many PGs that
//!   wait together start one after another, spaced by the rate;
//! - a **share of time**: the recovery operations may keep the device busy at most this percent
//!   of the time (a duty cycle: after an operation that took `d`, the device's recovery waits
//!   `d * (100 - share) / share` more before the next one starts; 100: unlimited). Operations
//!   of several PGs that overlap count each in full, so the share errs on the low side.
//!
//! Both are cluster-wide settings (`/basalt/settings`, `basalt config set recovery-rate|
//! recovery-share`) that every node follows ([`follow`]); a node's `Tuning` gives the defaults
//! used while a setting is unset. A change applies at once, also to operations waiting. So is
//! the backfill-full limit (`basalt config set backfill-full`): a device used past it takes
//! no more backfill (`replica.rs`).
//!
//! [`RecoveryRate`] counts what recovery and backfill moved (objects, bytes) and the rate over
//! the last [`WINDOW`], for `basalt status`.

use basalt_meta::{Catalog, ClusterSettings, WatchEvent, keys};
use basalt_types::DeviceId;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// How far back the recovery rate looks.
pub const WINDOW: Duration = Duration::from_secs(10);

/// The throttle's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Bytes per second per device (0: unlimited).
    pub bytes_per_sec: u64,
    /// Percent of a device's time (1..=100; 100: unlimited).
    pub share_percent: u8,
    /// Percent of a device's capacity past which it takes no more backfill (1..=100); absent
    /// in the reports of older nodes.
    #[serde(default = "default_backfill_full")]
    pub backfill_full_percent: u8,
}

fn default_backfill_full() -> u8 {
    Limits::default().backfill_full_percent
}

impl Limits {
    /// `settings` over `defaults` (a setting that is unset keeps the default).
    pub fn with(defaults: Limits, settings: &ClusterSettings) -> Limits {
        Limits {
            bytes_per_sec: settings
                .recovery_bytes_per_sec
                .unwrap_or(defaults.bytes_per_sec),
            share_percent: settings
                .recovery_share_percent
                .unwrap_or(defaults.share_percent)
                .clamp(1, 100),
            backfill_full_percent: settings
                .backfill_full_percent
                .unwrap_or(defaults.backfill_full_percent)
                .clamp(1, 100),
        }
    }
}

/// When a device's recovery may start its next operation, by each limit.
#[derive(Clone, Copy)]
struct Clock {
    /// Every byte admitted so far is paid for at this time (reservations included).
    rate_at: Instant,
    share_at: Instant,
    /// Bytes an operation of this device moved, on average lately (what an admission
    /// reserves once known).
    estimate: Option<u64>,
}

/// The devices' clocks, and the limits they count under.
struct Clocks {
    limits: Limits,
    /// Bumped when the limits change (and the clocks are cleared): a pass admitted before
    /// holds no reservation in the new clocks.
    era: u64,
    devices: HashMap<DeviceId, Clock>,
}

/// The per-device recovery throttle of a node.
pub struct Throttle {
    defaults: Limits,
    clocks: Mutex<Clocks>,
    /// Woken when the limits change or a reservation is given back (waiting operations look
    /// again).
    changed: Notify,
}

/// An operation [`Throttle::admit`] let start: give it back to [`Throttle::spent`] when it
/// ends, with what it moved.
#[must_use = "an admitted operation is given back with what it moved"]
pub struct Pass {
    dev: DeviceId,
    /// Bytes charged to the rate when admitted (settled against what it moved).
    reserved: u64,
    started: Instant,
    era: u64,
}

impl Throttle {
    pub fn new(defaults: Limits) -> Throttle {
        Throttle {
            defaults,
            clocks: Mutex::new(Clocks {
                limits: defaults,
                era: 0,
                devices: HashMap::new(),
            }),
            changed: Notify::new(),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.clocks.lock().limits
    }

    /// Applies the cluster's settings (over the node's defaults). Every device starts afresh
    /// under the new limits: operations waiting under the old ones go on at once.
    pub fn apply(&self, settings: &ClusterSettings) {
        let next = Limits::with(self.defaults, settings);
        let mut clocks = self.clocks.lock();
        if clocks.limits == next {
            return;
        }
        tracing::info!(
            bytes_per_sec = next.bytes_per_sec,
            share_percent = next.share_percent,
            backfill_full_percent = next.backfill_full_percent,
            "recovery throttle changed"
        );
        clocks.limits = next;
        clocks.devices.clear();
        clocks.era += 1;
        drop(clocks);
        self.changed.notify_waiters();
    }

    /// Waits until `dev`'s recovery may start another operation, which may move up to
    /// `expect` bytes. The rate is charged at once, as the device's operations moved lately
    /// (`expect` for its first one): operations of many PGs that wait together start one
    /// after another, spaced by the rate, not all at once. [`Throttle::spent`] settles the
    /// charge against what the operation moved.
    pub async fn admit(&self, dev: DeviceId, expect: u64) -> Pass {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let until = {
                let mut clocks = self.clocks.lock();
                let (era, limits) = (clocks.era, clocks.limits);
                let now = Instant::now();
                let until = clocks
                    .devices
                    .get(&dev)
                    .map(|c| c.rate_at.max(c.share_at))
                    .filter(|until| *until > now);
                match until {
                    Some(until) => until,
                    None => return start(&mut clocks, dev, expect, era, limits),
                }
            };
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(until) => {}
                _ = changed => {}
            }
        }
    }

    /// [`Throttle::admit`] without the wait: for an operation a client waits for (recovery
    /// of an object a read or write needs), which is charged like any other, so the device's
    /// other recovery waits for it.
    pub fn admit_now(&self, dev: DeviceId, expect: u64) -> Pass {
        let mut clocks = self.clocks.lock();
        let (era, limits) = (clocks.era, clocks.limits);
        start(&mut clocks, dev, expect, era, limits)
    }

    /// Ends an operation `admit` let start, which moved `bytes`: the rate is charged what it
    /// moved beyond its reservation or given back what it did not move, and the share waits
    /// after the time it kept the device busy.
    pub fn spent(&self, pass: Pass, bytes: u64) {
        let now = Instant::now();
        let busy = now - pass.started;
        let mut clocks = self.clocks.lock();
        let limits = clocks.limits;
        // A pass of older limits holds nothing in the clocks: it is charged in full.
        let reserved = if pass.era == clocks.era {
            pass.reserved
        } else {
            0
        };
        let c = clocks.devices.entry(pass.dev).or_insert(Clock {
            rate_at: pass.started,
            share_at: now,
            estimate: None,
        });
        let mut given_back = false;
        if limits.bytes_per_sec > 0 {
            // The rate counts from when the operation started: its own time is part of its
            // cost.
            if bytes >= reserved {
                c.rate_at = c.rate_at.max(pass.started) + cost(bytes - reserved, limits);
            } else {
                // Only time still ahead is given back: the past cannot be spent again (a
                // burst), whatever later operations reserved meanwhile.
                let back = cost(reserved - bytes, limits);
                c.rate_at = c.rate_at.checked_sub(back).unwrap_or(now).max(now);
                given_back = true;
            }
        }
        // Operations that moved nothing (an object the target had already, a purge) do not
        // lower what the next one reserves: that would let many start together again.
        if bytes > 0 {
            c.estimate = Some(match c.estimate {
                None => bytes,
                Some(e) => e / 4 * 3 + bytes / 4,
            });
        }
        if limits.share_percent < 100 {
            let share = u32::from(limits.share_percent);
            let idle = busy * (100 - share) / share;
            c.share_at = c.share_at.max(now) + idle;
        }
        drop(clocks);
        if given_back {
            self.changed.notify_waiters();
        }
    }
}

/// Starts an operation on `dev` now: charges the rate what it will likely move.
fn start(clocks: &mut Clocks, dev: DeviceId, expect: u64, era: u64, limits: Limits) -> Pass {
    let now = Instant::now();
    let c = clocks.devices.entry(dev).or_insert(Clock {
        rate_at: now,
        share_at: now,
        estimate: None,
    });
    let mut reserved = 0;
    if limits.bytes_per_sec > 0 {
        reserved = c.estimate.unwrap_or(expect).min(expect);
        c.rate_at = c.rate_at.max(now) + cost(reserved, limits);
    }
    Pass {
        dev,
        reserved,
        started: now,
        era,
    }
}

/// How long moving `bytes` takes at the limits' rate (which is not 0).
fn cost(bytes: u64, limits: Limits) -> Duration {
    Duration::from_secs_f64(bytes as f64 / limits.bytes_per_sec as f64)
}

/// Follows `/basalt/settings` and applies every change to `throttle` until `stop`.
pub async fn follow(catalog: Catalog, throttle: Arc<Throttle>, mut stop: watch::Receiver<bool>) {
    loop {
        // The watch starts right after the revision read before the settings: a change in
        // between is seen (again) as an event.
        let read = async {
            let revision = catalog.store().revision().await?;
            let (settings, _) = catalog.get_settings().await?;
            Ok::<_, basalt_meta::MetaError>((revision, settings))
        };
        let from = match read.await {
            Ok((revision, settings)) => {
                throttle.apply(&settings);
                Some(revision + 1)
            }
            Err(e) => {
                tracing::warn!("reading the cluster settings: {e}");
                None
            }
        };
        if let Some(from) = from
            && let Ok(mut events) = catalog.store().watch_prefix(keys::SETTINGS, from).await
        {
            loop {
                tokio::select! {
                    biased;
                    ev = events.recv() => match ev {
                        Some(WatchEvent::Put(_) | WatchEvent::Delete(_)) => {
                            match catalog.get_settings().await {
                                Ok((s, _)) => throttle.apply(&s),
                                Err(e) => {
                                    tracing::warn!("reading the cluster settings: {e}");
                                    break;
                                }
                            }
                        }
                        Some(WatchEvent::Lost(_)) | None => break,
                    },
                    _ = stop.changed() => return,
                }
            }
        }
        tokio::select! {
            biased;
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.changed() => return,
        }
    }
}

/// What recovery and backfill moved, in all and over the last [`WINDOW`].
#[derive(Default)]
pub struct RecoveryRate {
    st: Mutex<RateState>,
}

#[derive(Default)]
struct RateState {
    objects: u64,
    bytes: u64,
    /// Per second of the last [`WINDOW`]: (second since `origin`, objects, bytes).
    buckets: VecDeque<(u64, u64, u64)>,
    origin: Option<Instant>,
    /// When the current stretch of recovery began (after a [`WINDOW`] without any).
    active_since: Option<Instant>,
    last: Option<Instant>,
}

/// The recovery counters of a node, as status shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RateView {
    /// Objects recovered or backfilled since the node started.
    pub objects: u64,
    pub bytes: u64,
    /// Over the last seconds (at most [`WINDOW`]).
    pub objects_per_sec: f64,
    pub bytes_per_sec: f64,
}

/// A node's recovery, as status shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeRecovery {
    #[serde(flatten)]
    pub rate: RateView,
    /// The throttle in force on each of the node's devices.
    pub limits: Limits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            bytes_per_sec: 0,
            share_percent: 100,
            backfill_full_percent: 90,
        }
    }
}

impl RecoveryRate {
    /// Counts `objects` and `bytes` moved now.
    pub fn record(&self, objects: u64, bytes: u64) {
        let now = Instant::now();
        let mut st = self.st.lock();
        st.objects = st.objects.checked_add(objects).expect("object counter");
        st.bytes = st.bytes.checked_add(bytes).expect("byte counter");
        if st.last.is_none_or(|l| now - l >= WINDOW) {
            st.active_since = Some(now);
        }
        st.last = Some(now);
        let origin = *st.origin.get_or_insert(now);
        let sec = (now - origin).as_secs();
        match st.buckets.back_mut() {
            Some(b) if b.0 == sec => {
                b.1 += objects;
                b.2 += bytes;
            }
            _ => st.buckets.push_back((sec, objects, bytes)),
        }
        let oldest = sec.saturating_sub(WINDOW.as_secs() - 1);
        while st.buckets.front().is_some_and(|b| b.0 < oldest) {
            st.buckets.pop_front();
        }
    }

    /// Totals and the rate over the last [`WINDOW`] (over the time since recovery began, when
    /// that is shorter, but at least a second).
    pub fn view(&self) -> RateView {
        let now = Instant::now();
        let st = self.st.lock();
        let mut view = RateView {
            objects: st.objects,
            bytes: st.bytes,
            ..RateView::default()
        };
        let (Some(origin), Some(since)) = (st.origin, st.active_since) else {
            return view;
        };
        let sec = (now - origin).as_secs();
        let oldest = sec.saturating_sub(WINDOW.as_secs() - 1);
        let (mut objects, mut bytes) = (0, 0);
        for b in st.buckets.iter().filter(|b| b.0 >= oldest) {
            objects += b.1;
            bytes += b.2;
        }
        let span = (now - since).clamp(Duration::from_secs(1), WINDOW);
        view.objects_per_sec = objects as f64 / span.as_secs_f64();
        view.bytes_per_sec = bytes as f64 / span.as_secs_f64();
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEV: DeviceId = DeviceId(1);
    const MIB: u64 = 1 << 20;

    fn throttle(bytes_per_sec: u64, share_percent: u8) -> Throttle {
        Throttle::new(Limits {
            bytes_per_sec,
            share_percent,
            backfill_full_percent: 90,
        })
    }

    /// Runs `ops` operations of `bytes` that each keep the device busy `busy` (virtual time);
    /// returns how long they took in all.
    async fn run(t: &Throttle, ops: u32, bytes: u64, busy: Duration) -> Duration {
        let start = Instant::now();
        for _ in 0..ops {
            let pass = t.admit(DEV, bytes).await;
            tokio::time::sleep(busy).await;
            t.spent(pass, bytes);
        }
        // The last operation's wait counts too.
        let _ = t.admit(DEV, bytes).await;
        start.elapsed()
    }

    fn near(got: Duration, want: Duration) -> bool {
        let (g, w) = (got.as_secs_f64(), want.as_secs_f64());
        (g - w).abs() <= w * 0.02 + 0.002
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_limits_bytes_per_second() {
        let t = throttle(10 * MIB, 100);
        // 20 operations of 1 MiB at 10 MiB/s: 2 s, whatever the operations themselves take.
        let took = run(&t, 20, MIB, Duration::ZERO).await;
        assert!(near(took, Duration::from_secs(2)), "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_a_client_waits_for_starts_at_once_and_is_charged() {
        let t = throttle(10 * MIB, 100);
        let start = Instant::now();
        let first = t.admit(DEV, MIB).await;
        t.spent(first, MIB);
        let urgent = t.admit_now(DEV, MIB);
        assert_eq!(start.elapsed(), Duration::ZERO, "no wait");
        t.spent(urgent, MIB);
        // Two MiB moved at 10 MiB/s: the next ordinary operation waits 200 ms.
        let next = t.admit(DEV, MIB).await;
        assert!(
            near(start.elapsed(), Duration::from_millis(200)),
            "{:?}",
            start.elapsed()
        );
        t.spent(next, MIB);
    }

    #[tokio::test(start_paused = true)]
    async fn unlimited_never_waits() {
        let t = throttle(0, 100);
        let took = run(&t, 100, 64 * MIB, Duration::ZERO).await;
        assert_eq!(took, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn the_share_keeps_the_device_busy_at_most_that_part_of_the_time() {
        let t = throttle(0, 25);
        // Busy 100 ms per operation at 25%: each operation is followed by 300 ms idle.
        let busy = Duration::from_millis(100);
        let took = run(&t, 10, MIB, busy).await;
        assert!(near(took, Duration::from_secs(4)), "{took:?}");
        let share = (busy * 10).as_secs_f64() / took.as_secs_f64();
        assert!((share - 0.25).abs() < 0.01, "{share}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_tighter_limit_wins() {
        // 1 MiB per 10 ms busy: the rate (10 MiB/s -> 100 ms per op) is tighter than the
        // share (50% -> 10 ms idle).
        let t = throttle(10 * MIB, 50);
        let took = run(&t, 10, MIB, Duration::from_millis(10)).await;
        assert!(near(took, Duration::from_secs(1)), "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn devices_are_throttled_apart() {
        let t = throttle(MIB, 100);
        let pass = t.admit(DEV, 0).await;
        t.spent(pass, 10 * MIB);
        let start = Instant::now();
        let _ = t.admit(DeviceId(2), MIB).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        let _ = t.admit(DEV, MIB).await;
        assert!(near(start.elapsed(), Duration::from_secs(10)));
    }

    /// Runs `tasks` tasks at once, each `ops` operations that may move `expect` bytes and
    /// move `moved` (each busy `busy`); returns when each operation was admitted, in order.
    async fn run_together(
        t: &Arc<Throttle>,
        tasks: u32,
        ops: u32,
        (expect, moved): (u64, u64),
        busy: Duration,
    ) -> Vec<Duration> {
        let start = Instant::now();
        let all = (0..tasks).map(|_| {
            let t = t.clone();
            tokio::spawn(async move {
                let mut admitted = Vec::new();
                for _ in 0..ops {
                    let pass = t.admit(DEV, expect).await;
                    admitted.push(start.elapsed());
                    tokio::time::sleep(busy).await;
                    t.spent(pass, moved);
                }
                admitted
            })
        });
        let mut admitted: Vec<Duration> = futures::future::join_all(all)
            .await
            .into_iter()
            .flat_map(|task| task.unwrap())
            .collect();
        admitted.sort();
        admitted
    }

    #[tokio::test(start_paused = true)]
    async fn operations_of_many_pgs_at_once_share_the_rate() {
        // 16 PGs recovering at once, 10 operations of 1 MiB each, at 8 MiB/s: one operation
        // starts every 125 ms, not 16 together each time the clock allows one.
        let t = Arc::new(throttle(8 * MIB, 100));
        let admitted = run_together(&t, 16, 10, (MIB, MIB), Duration::from_millis(5)).await;
        for pair in admitted.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(near(gap, Duration::from_millis(125)), "{admitted:?}");
        }
        let last = *admitted.last().unwrap();
        assert!(near(last, Duration::from_millis(159 * 125)), "{last:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_reservation_is_settled_against_what_moved() {
        // Each operation may move 4 MiB but moves 64 KiB: the first reserves 4 MiB and gives
        // back what it did not move when it ends; later ones reserve what the device moved
        // lately. 64 operations of 64 KiB at 1 MiB/s: the last starts after about 4 s.
        let t = Arc::new(throttle(MIB, 100));
        let admitted = run_together(&t, 4, 16, (4 * MIB, 64 << 10), Duration::from_millis(1)).await;
        let last = *admitted.last().unwrap();
        assert!(
            last >= Duration::from_millis(3900) && last <= Duration::from_millis(4100),
            "{admitted:?}"
        );
        // Moving more than reserved is charged: one 8 MiB operation holds the next 8 s.
        let pass = t.admit(DEV, 64 << 10).await;
        t.spent(pass, 8 * MIB);
        let start = Instant::now();
        let _ = t.admit(DEV, 64 << 10).await;
        assert!(
            near(start.elapsed(), Duration::from_secs(8)),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn operations_that_move_nothing_do_not_lower_the_reservation() {
        let t = throttle(MIB, 100);
        // One operation moved 1 MiB; ten then moved nothing (objects the target had).
        let pass = t.admit(DEV, MIB).await;
        t.spent(pass, MIB);
        for _ in 0..10 {
            let pass = t.admit(DEV, MIB).await;
            t.spent(pass, 0);
        }
        // Two start together: the second waits for what the first reserved, 1 MiB at 1 MiB/s.
        let start = Instant::now();
        let first = t.admit(DEV, MIB).await;
        let _second = t.admit(DEV, MIB).await;
        assert!(
            near(start.elapsed(), Duration::from_secs(1)),
            "{:?}",
            start.elapsed()
        );
        t.spent(first, MIB);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_setting_applies_at_once_also_to_a_waiting_operation() {
        let t = Arc::new(throttle(MIB, 100));
        let pass = t.admit(DEV, 0).await;
        t.spent(pass, 100 * MIB);
        let waiter = {
            let t = t.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                let _ = t.admit(DEV, MIB).await;
                start.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Raised to 100 MiB/s (a setting over the default): the waiter goes on now.
        t.apply(&ClusterSettings {
            recovery_bytes_per_sec: Some(100 * MIB),
            ..ClusterSettings::default()
        });
        let waited = waiter.await.unwrap();
        assert!(near(waited, Duration::from_secs(1)), "{waited:?}");
        assert_eq!(t.limits().bytes_per_sec, 100 * MIB);
        assert_eq!(t.limits().share_percent, 100);
        let took = run(&t, 100, MIB, Duration::ZERO).await;
        assert!(near(took, Duration::from_secs(1)), "{took:?}");
        // Unset again: back to the node's default.
        t.apply(&ClusterSettings::default());
        assert_eq!(t.limits().bytes_per_sec, MIB);
    }

    /// A node follows the settings in the metadata store: set, changed, unset.
    #[tokio::test]
    async fn nodes_follow_the_cluster_settings() {
        let dir = tempfile::tempdir().unwrap();
        let store = basalt_meta::EmbeddedStore::open(dir.path().join("meta.redb"))
            .await
            .unwrap();
        let catalog = Catalog::new(Arc::new(store));
        let t = Arc::new(throttle(7 * MIB, 100));
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(follow(catalog.clone(), t.clone(), stop_rx));
        let wait_for = |want: Limits| {
            let t = t.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(10), async {
                    while t.limits() != want {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
                .await
                .unwrap_or_else(|_| panic!("limits never became {want:?}: {:?}", t.limits()));
            }
        };
        catalog
            .update_settings(|s| s.recovery_share_percent = Some(30))
            .await
            .unwrap();
        wait_for(Limits {
            bytes_per_sec: 7 * MIB,
            share_percent: 30,
            backfill_full_percent: 90,
        })
        .await;
        catalog
            .update_settings(|s| s.recovery_bytes_per_sec = Some(64 * MIB))
            .await
            .unwrap();
        wait_for(Limits {
            bytes_per_sec: 64 * MIB,
            share_percent: 30,
            backfill_full_percent: 90,
        })
        .await;
        catalog
            .update_settings(|s| s.backfill_full_percent = Some(75))
            .await
            .unwrap();
        wait_for(Limits {
            bytes_per_sec: 64 * MIB,
            share_percent: 30,
            backfill_full_percent: 75,
        })
        .await;
        catalog
            .update_settings(|s| *s = ClusterSettings::default())
            .await
            .unwrap();
        wait_for(Limits {
            bytes_per_sec: 7 * MIB,
            share_percent: 100,
            backfill_full_percent: 90,
        })
        .await;
        // A bad value is refused and changes nothing.
        let e = catalog
            .update_settings(|s| s.recovery_share_percent = Some(0))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("1% to 100%"), "{e}");
        assert_eq!(
            catalog.get_settings().await.unwrap().0,
            ClusterSettings::default()
        );
        stop_tx.send(true).unwrap();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_rate_is_over_the_last_seconds() {
        let r = RecoveryRate::default();
        assert_eq!(r.view(), RateView::default());
        // 4 s of 5 objects (5 MiB) per second.
        for _ in 0..4 {
            r.record(5, 5 * MIB);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let v = r.view();
        assert_eq!((v.objects, v.bytes), (20, 20 * MIB));
        assert!((v.objects_per_sec - 5.0).abs() < 0.01, "{v:?}");
        assert!((v.bytes_per_sec - 5.0 * MIB as f64).abs() < 1.0, "{v:?}");
        // Nothing for a whole window: the rate is 0, the totals stay.
        tokio::time::sleep(WINDOW).await;
        let v = r.view();
        assert_eq!(v.objects_per_sec, 0.0);
        assert_eq!(v.objects, 20);
        // A new stretch: its rate is over its own time.
        r.record(2, 0);
        tokio::time::sleep(Duration::from_secs(2)).await;
        r.record(2, 0);
        let v = r.view();
        assert!((v.objects_per_sec - 2.0).abs() < 0.01, "{v:?}");
    }
}
