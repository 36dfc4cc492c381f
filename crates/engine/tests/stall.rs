//! A device that hangs (requests taken and never completed, no error) shows as the age of the
//! store's oldest request in flight (`Store::oldest_io_age`), for writes, flushes and reads,
//! with the I/O loop as a task (virtual time: deterministic) and on its own thread; the age is
//! `None` again once the device completes what it held.

use basalt_engine::sim::SimDisk;
use basalt_engine::{
    DeviceId, FormatOptions, ObjectId, OpenOptions, PoolId, Store, VolumeId, WriteOptions,
    format_sim,
};
use bytes::Bytes;
use std::future::Future;
use std::task::Poll;
use std::time::Duration;

const OBJ: u32 = 128 * 1024;

fn disk() -> SimDisk {
    let disk = SimDisk::new(64 << 20);
    let opts = FormatOptions {
        device_id: DeviceId(3),
        object_size: OBJ,
        journal_size: Some(4 << 20),
        ..FormatOptions::default()
    };
    format_sim(&disk, &opts).unwrap();
    disk
}

fn oid(i: u64) -> ObjectId {
    ObjectId::new(PoolId(1), VolumeId(1), i)
}

fn data(byte: u8) -> Bytes {
    Bytes::from(vec![byte; OBJ as usize])
}

/// Ends the disk's stall when dropped: a failing test then fails instead of hanging where the
/// store's last handle waits for its I/O loop to drain.
struct Unstall(SimDisk);

impl Drop for Unstall {
    fn drop(&mut self) {
        self.0.stall(false);
    }
}

/// Whether `f` is still waiting (polls it once).
async fn waiting<F: Future + Unpin>(f: &mut F) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(std::pin::Pin::new(&mut *f).poll(cx).is_pending())).await
}

/// Waits (on `tokio` time: virtual when paused) until `cond` holds, at most `limit`.
async fn until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {limit:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The loop as a task over virtual time: the age follows the clock while the disk holds a
/// write (with its flush), then a read, and is `None` once they complete.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_oldest_io_age_grows_while_the_disk_hangs_and_is_none_after() {
    let disk = disk();
    let store = Store::spawn_sim(&disk, &OpenOptions::default()).unwrap();
    let _unstall = Unstall(disk.clone());
    assert_eq!(store.oldest_io_age(), None, "nothing in flight after open");

    disk.stall(true);
    let mut write = store.submit_write(oid(1), 0, data(7), WriteOptions::durable());
    until("the write is in flight", Duration::from_secs(1), || {
        store.oldest_io_age().is_some()
    })
    .await;
    let first = store.oldest_io_age().unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let age = store.oldest_io_age().expect("still in flight");
    assert!(
        age >= first + Duration::from_secs(30),
        "the age follows the clock: {first:?} then {age:?}"
    );
    assert_eq!(store.stats().oldest_io_age, Some(age));
    assert!(waiting(&mut write).await, "a hung disk completes nothing");

    disk.stall(false);
    write.await.expect("the write completes once the disk does");
    until("nothing in flight", Duration::from_secs(5), || {
        store.oldest_io_age().is_none()
    })
    .await;

    // A buffered write, a flush behind it and a read (the whole-object write went to its
    // slot: read from the disk).
    disk.stall(true);
    let mut buffered = store.submit_write(oid(2), 0, data(8), WriteOptions::buffered());
    let mut flush = store.submit_flush();
    let mut read = store.submit_read(oid(1), 0, OBJ);
    until("the read is in flight", Duration::from_secs(1), || {
        store.oldest_io_age().is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let age = store.oldest_io_age().expect("still in flight");
    assert!(age >= Duration::from_secs(12), "{age:?}");
    assert!(waiting(&mut read).await, "the read hangs");
    assert!(waiting(&mut buffered).await, "the buffered write hangs");
    assert!(waiting(&mut flush).await, "the flush hangs");
    disk.stall(false);
    assert_eq!(read.await.unwrap(), data(7));
    buffered.await.unwrap();
    flush.await.unwrap();
    assert_eq!(store.read(oid(2), 0, OBJ).await.unwrap(), data(8));
    until("nothing in flight", Duration::from_secs(5), || {
        store.oldest_io_age().is_none()
    })
    .await;
    store.close().await.unwrap();
}

/// The loop on its own thread (the OS clock): the same age, read from another thread while
/// the I/O thread sleeps waiting for a completion that does not come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_io_age_of_a_store_on_its_own_thread() {
    let disk = disk();
    let store = Store::open_sim(&disk, &OpenOptions::default()).unwrap();
    let _unstall = Unstall(disk.clone());
    assert_eq!(store.oldest_io_age(), None);
    disk.stall(true);
    let mut write = store.submit_write(oid(2), 0, data(9), WriteOptions::durable());
    until(
        "the write has waited 200 ms",
        Duration::from_secs(20),
        || store.oldest_io_age() >= Some(Duration::from_millis(200)),
    )
    .await;
    assert!(waiting(&mut write).await, "a hung disk completes nothing");
    disk.stall(false);
    write.await.expect("the write completes once the disk does");
    until("nothing in flight", Duration::from_secs(20), || {
        store.oldest_io_age().is_none()
    })
    .await;
    assert_eq!(store.read(oid(2), 0, OBJ).await.unwrap(), data(9));
    store.close().await.unwrap();
}

/// Completed requests count their time on the device (virtual time here: exact): a write held
/// 30 s by the disk and a read held 12 s add at least that much to the sums of their kind, and
/// a flush nothing held stays fast.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn completed_requests_count_their_time_on_the_device() {
    let disk = disk();
    let store = Store::spawn_sim(&disk, &OpenOptions::default()).unwrap();
    let _unstall = Unstall(disk.clone());
    let before = store.stats();

    disk.stall(true);
    let write = store.submit_write(oid(1), 0, data(7), WriteOptions::buffered());
    until("the write is in flight", Duration::from_secs(1), || {
        store.oldest_io_age().is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    disk.stall(false);
    write.await.unwrap();
    until("nothing in flight", Duration::from_secs(5), || {
        store.oldest_io_age().is_none()
    })
    .await;
    let written = store.stats();
    let ios = written.ios_done - before.ios_done;
    assert!(ios >= 1, "the write completed on the device");
    assert!(
        written.io_micros - before.io_micros >= 30_000_000,
        "{ios} requests took {} µs in sum",
        written.io_micros - before.io_micros
    );

    store.flush().await.unwrap();
    let flushed = store.stats();
    assert!(
        flushed.flushes_done > written.flushes_done,
        "a flush completed"
    );
    let flush_micros = flushed.flush_micros - written.flush_micros;
    assert!(
        flush_micros < 1_000_000,
        "an unheld flush took {flush_micros} µs"
    );

    disk.stall(true);
    let read = store.submit_read(oid(1), 0, OBJ);
    until("the read is in flight", Duration::from_secs(1), || {
        store.oldest_io_age().is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    disk.stall(false);
    assert_eq!(read.await.unwrap(), data(7));
    let read_done = store.stats();
    assert!(read_done.ios_done > flushed.ios_done, "the read completed");
    assert!(
        read_done.io_micros - flushed.io_micros >= 12_000_000,
        "the read took {} µs",
        read_done.io_micros - flushed.io_micros
    );
    store.close().await.unwrap();
}

/// A settle answers only once every write submitted before it was applied: here a partial
/// write still waiting for the old block it merges with, on a disk that hangs. (A member that
/// promises a newer term settles before it reports what it holds: a write of the older term
/// applied after that report would land behind the new primary's back. Before, it flushed,
/// which covers only what was applied, and answered at once.) A plain flush still answers
/// without waiting: the write was not acknowledged.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_settle_waits_for_a_write_still_waiting_for_its_old_block() {
    let disk = disk();
    let store = Store::spawn_sim(&disk, &OpenOptions::default()).unwrap();
    let _unstall = Unstall(disk.clone());
    let first = store
        .write(oid(1), 0, data(7), WriteOptions::durable())
        .await
        .unwrap();
    disk.stall(true);
    let partial = Bytes::from_static(b"partial");
    let mut write = store.submit_write(oid(1), 100, partial, WriteOptions::buffered());
    let mut settle = store.submit_settle();
    let mut flush = store.submit_flush();
    // Answered after the store took the write, the settle and the flush.
    store.object_info(oid(2)).await.unwrap();
    assert!(
        waiting(&mut write).await,
        "the old block was read on a hung disk"
    );
    assert!(
        waiting(&mut settle).await,
        "the settle answered before the write it follows was applied"
    );
    assert!(!waiting(&mut flush).await, "the flush waited");
    disk.stall(false);
    settle.await.unwrap();
    let info = store.object_info(oid(1)).await.unwrap().unwrap();
    assert_ne!(info.version, first, "settled without the write");
    assert_eq!(write.await.unwrap(), info.version);
    store.close().await.unwrap();
}
