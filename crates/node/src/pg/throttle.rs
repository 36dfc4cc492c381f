//! The recovery throttle and the recovery rate.
//!
//! [`Throttle`] limits the recovery and backfill a local device drives as a PG primary (reading
//! its own copy or a source's, writing to members that lack objects), by two limits that apply
//! together, each per device:
//! - a **rate**: bytes moved per second (0: unlimited);
//! - a **share of time**: the recovery operations may keep the device busy at most this percent
//!   of the time (a duty cycle: after an operation that took `d`, the device's recovery waits
//!   `d * (100 - share) / share` more before the next one starts; 100: unlimited). Operations
//!   of several PGs that overlap count each in full, so the share errs on the low side.
//!
//! Both are cluster-wide settings (`/basalt/settings`, `basalt config set recovery-rate|
//! recovery-share`) that every node follows ([`follow`]); a node's `Tuning` gives the defaults
//! used while a setting is unset. A change applies at once, also to operations waiting.
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
        }
    }
}

/// When a device's recovery may start its next operation, by each limit.
#[derive(Clone, Copy)]
struct Clock {
    rate_at: Instant,
    share_at: Instant,
}

/// The per-device recovery throttle of a node.
pub struct Throttle {
    defaults: Limits,
    limits: Mutex<Limits>,
    clocks: Mutex<HashMap<DeviceId, Clock>>,
    /// Woken when the limits change (waiting operations look again).
    changed: Notify,
}

impl Throttle {
    pub fn new(defaults: Limits) -> Throttle {
        Throttle {
            defaults,
            limits: Mutex::new(defaults),
            clocks: Mutex::new(HashMap::new()),
            changed: Notify::new(),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        *self.limits.lock()
    }

    /// Applies the cluster's settings (over the node's defaults). Every device starts afresh
    /// under the new limits: operations waiting under the old ones go on at once.
    pub fn apply(&self, settings: &ClusterSettings) {
        let next = Limits::with(self.defaults, settings);
        let mut limits = self.limits.lock();
        if *limits == next {
            return;
        }
        tracing::info!(
            bytes_per_sec = next.bytes_per_sec,
            share_percent = next.share_percent,
            "recovery throttle changed"
        );
        *limits = next;
        drop(limits);
        self.clocks.lock().clear();
        self.changed.notify_waiters();
    }

    /// Waits until `dev`'s recovery may start another operation.
    pub async fn admit(&self, dev: DeviceId) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let until = match self.clocks.lock().get(&dev) {
                Some(c) => c.rate_at.max(c.share_at),
                None => return,
            };
            if until <= Instant::now() {
                return;
            }
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(until) => {}
                _ = changed => {}
            }
        }
    }

    /// Records an operation of `dev`'s recovery that moved `bytes` and kept the device busy
    /// for `busy`: the next one waits as the limits say.
    pub fn spent(&self, dev: DeviceId, bytes: u64, busy: Duration) {
        let limits = self.limits();
        let now = Instant::now();
        // The rate counts from when the operation started: its own time is part of its cost.
        let started = now.checked_sub(busy).unwrap_or(now);
        let mut clocks = self.clocks.lock();
        let c = clocks.entry(dev).or_insert(Clock {
            rate_at: started,
            share_at: now,
        });
        if limits.bytes_per_sec > 0 {
            let cost = Duration::from_secs_f64(bytes as f64 / limits.bytes_per_sec as f64);
            c.rate_at = c.rate_at.max(started) + cost;
        }
        if limits.share_percent < 100 {
            let share = u32::from(limits.share_percent);
            let idle = busy * (100 - share) / share;
            c.share_at = c.share_at.max(now) + idle;
        }
    }
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
        })
    }

    /// Runs `ops` operations of `bytes` that each keep the device busy `busy` (virtual time);
    /// returns how long they took in all.
    async fn run(t: &Throttle, ops: u32, bytes: u64, busy: Duration) -> Duration {
        let start = Instant::now();
        for _ in 0..ops {
            t.admit(DEV).await;
            tokio::time::sleep(busy).await;
            t.spent(DEV, bytes, busy);
        }
        // The last operation's wait counts too.
        t.admit(DEV).await;
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
        t.spent(DEV, 10 * MIB, Duration::ZERO);
        let start = Instant::now();
        t.admit(DeviceId(2)).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        t.admit(DEV).await;
        assert!(near(start.elapsed(), Duration::from_secs(10)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_setting_applies_at_once_also_to_a_waiting_operation() {
        let t = Arc::new(throttle(MIB, 100));
        t.spent(DEV, 100 * MIB, Duration::ZERO);
        let waiter = {
            let t = t.clone();
            tokio::spawn(async move {
                let start = Instant::now();
                t.admit(DEV).await;
                start.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Raised to 100 MiB/s (a setting over the default): the waiter goes on now.
        t.apply(&ClusterSettings {
            recovery_bytes_per_sec: Some(100 * MIB),
            recovery_share_percent: None,
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
        })
        .await;
        catalog
            .update_settings(|s| s.recovery_bytes_per_sec = Some(64 * MIB))
            .await
            .unwrap();
        wait_for(Limits {
            bytes_per_sec: 64 * MIB,
            share_percent: 30,
        })
        .await;
        catalog
            .update_settings(|s| *s = ClusterSettings::default())
            .await
            .unwrap();
        wait_for(Limits {
            bytes_per_sec: 7 * MIB,
            share_percent: 100,
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
