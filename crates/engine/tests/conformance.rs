//! One conformance suite, run over io_uring, psync and the simulated disk.

mod common;

use basalt_engine::{EngineError, ObjectContent, PoolId, Version, VolumeId, WriteOptions};
use bytes::Bytes;
use common::{Backend, Dev, OBJ, find_aligned, oid, pattern};
use std::collections::HashMap;

const MIB: u64 = 1 << 20;

/// A version the store assigns by itself (epoch 0).
fn ver(seq: u64) -> Version {
    Version::new(0, seq)
}

fn small_dev(b: Backend) -> Dev {
    Dev::new(b, 32 * MIB, 4 * MIB)
}

async fn basic_read_write(b: Backend) {
    let dev = small_dev(b);
    let store = dev.open().await;
    assert_eq!(store.info().io_backend, b.name());
    let o = oid(1, 0);
    assert_eq!(
        store.read(o, 0, 4096).await.unwrap(),
        Bytes::from(vec![0u8; 4096])
    );
    assert!(store.object_info(o).await.unwrap().is_none());
    let data = pattern(1, 4096);
    let v = store
        .write(o, 8192, Bytes::from(data.clone()), WriteOptions::durable())
        .await
        .unwrap();
    assert_eq!(v, ver(1));
    assert_eq!(store.read(o, 8192, 4096).await.unwrap(), data);
    assert_eq!(store.read(o, 0, 4096).await.unwrap(), vec![0u8; 4096]);
    let info = store.object_info(o).await.unwrap().unwrap();
    assert_eq!((info.version, info.allocated_bytes), (ver(1), 4096));
    // Full-object write (redirect path) then a read spanning everything.
    let full = pattern(2, OBJ as usize);
    assert_eq!(
        store
            .write(o, 0, Bytes::from(full.clone()), WriteOptions::buffered())
            .await
            .unwrap(),
        ver(2)
    );
    assert_eq!(store.read(o, 0, OBJ).await.unwrap(), full);
    store.close().await.unwrap();
    store.close().await.unwrap();
    assert!(matches!(
        store.read(o, 0, 1).await,
        Err(EngineError::Closed)
    ));
    let store = dev.open().await;
    assert_eq!(store.read(o, 0, OBJ).await.unwrap(), full);
    assert_eq!(store.object_info(o).await.unwrap().unwrap().version, ver(2));
}

/// Random unaligned writes against a byte model, with reads in between and a reopen.
async fn unaligned(b: Backend) {
    let dev = small_dev(b);
    let mut store = dev.open().await;
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut x: u64 = 12345;
    let mut rnd = |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    for i in 0..300u64 {
        let idx = rnd(4);
        let off = rnd(OBJ as u64) as u32;
        let len = (rnd(3 * 4096) as u32 + 1).min(OBJ - off);
        let data = pattern(i + 100, len as usize);
        store
            .write(
                oid(2, idx),
                off,
                Bytes::from(data.clone()),
                WriteOptions {
                    durable: i % 3 == 0,
                    ..WriteOptions::default()
                },
            )
            .await
            .unwrap();
        let m = model.entry(idx).or_insert_with(|| vec![0; OBJ as usize]);
        m[off as usize..(off + len) as usize].copy_from_slice(&data);
        if i % 50 == 49 {
            store.flush().await.unwrap();
            drop(store);
            store = dev.open().await;
        }
        let roff = rnd(OBJ as u64) as u32;
        let rlen = (rnd(4 * 4096) as u32 + 1).min(OBJ - roff);
        let got = store.read(oid(2, idx), roff, rlen).await.unwrap();
        assert_eq!(
            &got[..],
            &model[&idx][roff as usize..(roff + rlen) as usize],
            "op {i}"
        );
    }
    for (idx, m) in &model {
        assert_eq!(store.read(oid(2, *idx), 0, OBJ).await.unwrap(), &m[..]);
    }
}

async fn zeroes_and_trim(b: Backend) {
    let dev = small_dev(b);
    let store = dev.open().await;
    let o = oid(3, 1);
    let data = pattern(3, OBJ as usize);
    store
        .write(o, 0, Bytes::from(data.clone()), WriteOptions::durable())
        .await
        .unwrap();
    let used_before = store.stats().used_bytes;
    assert_eq!(used_before, u64::from(OBJ));
    // Partial-block zeroes: bytes 100..5000 become zero, block 0 stays allocated.
    store
        .write_zeroes(o, 100, 4900, WriteOptions::durable())
        .await
        .unwrap();
    let mut model = data.clone();
    model[100..5000].fill(0);
    assert_eq!(store.read(o, 0, OBJ).await.unwrap(), model);
    // Whole blocks: metadata only.
    store
        .trim(o, 8192, 16384, WriteOptions::durable())
        .await
        .unwrap();
    model[8192..8192 + 16384].fill(0);
    assert_eq!(store.read(o, 0, OBJ).await.unwrap(), model);
    let info = store.object_info(o).await.unwrap().unwrap();
    assert_eq!(info.allocated_bytes, u64::from(OBJ) - 16384);
    assert_eq!(info.version, ver(3));
    // Trimming everything frees the slot; the object becomes a tombstone at the new version.
    store
        .trim(o, 0, OBJ, WriteOptions::durable())
        .await
        .unwrap();
    assert_eq!(
        store.read(o, 0, OBJ).await.unwrap(),
        vec![0u8; OBJ as usize]
    );
    let tomb = |i: Option<basalt_engine::ObjectInfo>| {
        let i = i.expect("a tombstone");
        (i.deleted, i.version, i.allocated_bytes)
    };
    assert_eq!(tomb(store.object_info(o).await.unwrap()), (true, ver(4), 0));
    store.flush().await.unwrap();
    drop(store);
    let store = dev.open().await;
    assert_eq!(tomb(store.object_info(o).await.unwrap()), (true, ver(4), 0));
    assert_eq!(store.stats().used_bytes, 0);
    assert_eq!((store.stats().objects, store.stats().tombstones), (0, 1));
    // Zeroing a missing object is a no-op.
    assert_eq!(
        store
            .write_zeroes(oid(3, 9), 0, 4096, WriteOptions::durable())
            .await
            .unwrap(),
        Version::NONE
    );
    assert!(store.object_info(oid(3, 9)).await.unwrap().is_none());
}

async fn delete_and_delete_volume(b: Backend) {
    let dev = small_dev(b);
    let store = dev.open().await;
    for i in 0..10 {
        store
            .write(
                oid(4, i),
                0,
                Bytes::from(pattern(i, 4096)),
                WriteOptions::buffered(),
            )
            .await
            .unwrap();
        store
            .write(
                oid(5, i),
                4096,
                Bytes::from(pattern(i, 4096)),
                WriteOptions::buffered(),
            )
            .await
            .unwrap();
    }
    // A delete leaves a tombstone at the next version; deleting it again moves it on.
    assert_eq!(
        store
            .delete(oid(4, 0), WriteOptions::durable())
            .await
            .unwrap(),
        ver(2)
    );
    assert_eq!(
        store
            .delete(oid(4, 0), WriteOptions::durable())
            .await
            .unwrap(),
        ver(3)
    );
    let info = store.object_info(oid(4, 0)).await.unwrap().unwrap();
    assert!(info.deleted && info.version == ver(3));
    assert_eq!(
        store.read(oid(4, 0), 0, 4096).await.unwrap(),
        vec![0u8; 4096]
    );
    assert_eq!(
        store.delete_volume(PoolId(1), VolumeId(4)).await.unwrap(),
        9
    );
    assert_eq!(
        store.delete_volume(PoolId(1), VolumeId(4)).await.unwrap(),
        0
    );
    let left = store.list_objects().await.unwrap();
    assert_eq!(left.len(), 10);
    assert!(left.iter().all(|o| o.oid.volume == VolumeId(5)));
    drop(store);
    let store = dev.open().await;
    assert_eq!(store.list_objects().await.unwrap().len(), 10);
    assert_eq!(store.stats().objects, 10);
    // Objects of a deleted volume are forgotten (no tombstones): they start again from 1.
    assert_eq!(
        store
            .write(
                oid(4, 3),
                0,
                Bytes::from_static(b"x"),
                WriteOptions::durable()
            )
            .await
            .unwrap(),
        ver(1)
    );
}

async fn versions(b: Backend) {
    let dev = small_dev(b);
    let store = dev.open().await;
    let o = oid(6, 0);
    let w = |n: u64| WriteOptions::durable().with_version(ver(n));
    assert_eq!(
        store
            .write(o, 0, Bytes::from_static(b"a"), w(10))
            .await
            .unwrap(),
        ver(10)
    );
    match store.write(o, 0, Bytes::from_static(b"b"), w(10)).await {
        Err(EngineError::StaleVersion { current, requested }) => {
            assert_eq!((current, requested), (ver(10), ver(10)))
        }
        other => panic!("expected StaleVersion, got {other:?}"),
    }
    assert!(matches!(
        store.write_zeroes(o, 0, 1, w(3)).await,
        Err(EngineError::StaleVersion { .. })
    ));
    assert_eq!(store.read(o, 0, 1).await.unwrap(), &b"a"[..]);
    assert_eq!(
        store
            .write(o, 0, Bytes::from_static(b"c"), WriteOptions::durable())
            .await
            .unwrap(),
        ver(11)
    );
    drop(store);
    let store = dev.open().await;
    assert_eq!(
        store.object_info(o).await.unwrap().unwrap().version,
        ver(11)
    );
    assert_eq!(
        store
            .write(o, 0, Bytes::from_static(b"d"), WriteOptions::durable())
            .await
            .unwrap(),
        ver(12)
    );
}

async fn out_of_range(b: Backend) {
    let dev = small_dev(b);
    let store = dev.open().await;
    let o = oid(7, 0);
    assert!(matches!(
        store.read(o, OBJ - 10, 11).await,
        Err(EngineError::InvalidArgument(_))
    ));
    assert!(matches!(
        store.read(o, OBJ, 1).await,
        Err(EngineError::InvalidArgument(_))
    ));
    let big = Bytes::from(vec![1u8; OBJ as usize + 1]);
    assert!(matches!(
        store.write(o, 0, big, WriteOptions::durable()).await,
        Err(EngineError::InvalidArgument(_))
    ));
    assert!(matches!(
        store
            .write(
                o,
                1,
                Bytes::from(vec![1u8; OBJ as usize]),
                WriteOptions::durable()
            )
            .await,
        Err(EngineError::InvalidArgument(_))
    ));
    assert!(matches!(
        store.write_zeroes(o, OBJ, 1, WriteOptions::durable()).await,
        Err(EngineError::InvalidArgument(_))
    ));
    assert!(matches!(
        store
            .write(o, 0, Bytes::new(), WriteOptions::durable())
            .await,
        Err(EngineError::InvalidArgument(_))
    ));
    assert_eq!(store.read(o, OBJ - 1, 1).await.unwrap().len(), 1);
    assert!(
        store.object_info(o).await.unwrap().is_none(),
        "failed writes change nothing"
    );
}

async fn full_device(b: Backend) {
    let dev = Dev::new(b, 16 * MIB, 4 * MIB);
    let store = dev.open().await;
    let cap = store.info().capacity_bytes / u64::from(OBJ);
    assert!(cap > 10, "capacity {cap} slots");
    for i in 0..cap {
        store
            .write(
                oid(8, i),
                0,
                Bytes::from(pattern(i, 4096)),
                WriteOptions::buffered(),
            )
            .await
            .unwrap();
    }
    assert_eq!(store.stats().free_bytes, 0);
    match store
        .write(
            oid(8, cap),
            0,
            Bytes::from_static(b"x"),
            WriteOptions::durable(),
        )
        .await
    {
        Err(EngineError::OutOfSpace { needed, free }) => {
            assert_eq!((needed, free), (u64::from(OBJ), 0))
        }
        other => panic!("expected OutOfSpace, got {other:?}"),
    }
    // Overwrites of existing objects keep working, including whole-object ones.
    store
        .write(
            oid(8, 0),
            4096,
            Bytes::from(pattern(99, 4096)),
            WriteOptions::durable(),
        )
        .await
        .unwrap();
    let full = pattern(98, OBJ as usize);
    store
        .write(
            oid(8, 1),
            0,
            Bytes::from(full.clone()),
            WriteOptions::durable(),
        )
        .await
        .unwrap();
    store
        .write(
            oid(8, 1),
            0,
            Bytes::from(full.clone()),
            WriteOptions::durable(),
        )
        .await
        .unwrap();
    assert_eq!(store.read(oid(8, 1), 0, OBJ).await.unwrap(), full);
    for i in 2..cap {
        assert_eq!(
            store.read(oid(8, i), 0, 4096).await.unwrap(),
            pattern(i, 4096),
            "object {i} intact"
        );
    }
    // Deleting frees a slot for a new object (after write-back releases it).
    store
        .delete(oid(8, 5), WriteOptions::durable())
        .await
        .unwrap();
    store
        .write(
            oid(8, cap),
            0,
            Bytes::from_static(b"new"),
            WriteOptions::durable(),
        )
        .await
        .unwrap();
    drop(store);
    let store = dev.open().await;
    assert_eq!(store.read(oid(8, cap), 0, 3).await.unwrap(), &b"new"[..]);
    assert_eq!(
        store.read(oid(8, 0), 4096, 4096).await.unwrap(),
        pattern(99, 4096)
    );
}

async fn reopen_persistence(b: Backend) {
    let dev = small_dev(b);
    let store = dev.open().await;
    for i in 0..20u64 {
        let durable = i % 2 == 0;
        store
            .write(
                oid(9, i),
                (i as u32 % 7) * 1000,
                Bytes::from(pattern(i, 5000)),
                WriteOptions {
                    durable,
                    ..WriteOptions::default()
                },
            )
            .await
            .unwrap();
    }
    store.flush().await.unwrap();
    drop(store);
    let store = dev.open().await;
    for i in 0..20u64 {
        let off = (i as u32 % 7) * 1000;
        assert_eq!(
            store.read(oid(9, i), off, 5000).await.unwrap(),
            pattern(i, 5000)
        );
    }
    assert_eq!(store.stats().objects, 20);
}

async fn concurrency(b: Backend) {
    let dev = small_dev(b);
    let store = dev.open().await;
    let mut tasks = Vec::new();
    for t in 0..16u64 {
        let s = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..40u64 {
                let o = oid(10, t);
                let data = pattern(t * 1000 + i, 4096);
                s.write(
                    o,
                    (i as u32 % 32) * 4096,
                    Bytes::from(data.clone()),
                    WriteOptions {
                        durable: i % 4 == 0,
                        ..WriteOptions::default()
                    },
                )
                .await
                .unwrap();
                assert_eq!(s.read(o, (i as u32 % 32) * 4096, 4096).await.unwrap(), data);
                // A shared object, disjoint 4 KiB stripes per task.
                let shared = pattern(t + 7, 4096);
                s.write(
                    oid(10, 999),
                    t as u32 * 4096,
                    Bytes::from(shared.clone()),
                    WriteOptions::buffered(),
                )
                .await
                .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    store.flush().await.unwrap();
    drop(store);
    let store = dev.open().await;
    for t in 0..16u64 {
        assert_eq!(
            store
                .read(oid(10, 999), t as u32 * 4096, 4096)
                .await
                .unwrap(),
            pattern(t + 7, 4096)
        );
        assert_eq!(
            store
                .object_info(oid(10, t))
                .await
                .unwrap()
                .unwrap()
                .version,
            ver(40)
        );
    }
    assert_eq!(
        store
            .object_info(oid(10, 999))
            .await
            .unwrap()
            .unwrap()
            .version,
        ver(16 * 40)
    );
}

async fn checksum_corruption(b: Backend) {
    let dev = small_dev(b);
    let store = dev.open().await;
    let bad = pattern(4242, OBJ as usize);
    store
        .write(
            oid(11, 0),
            0,
            Bytes::from(bad.clone()),
            WriteOptions::durable(),
        )
        .await
        .unwrap();
    store
        .write(
            oid(11, 1),
            0,
            Bytes::from(pattern(4343, OBJ as usize)),
            WriteOptions::durable(),
        )
        .await
        .unwrap();
    store.close().await.unwrap();
    drop(store);
    // Whole-object writes go straight to the slot, so the pattern is on the device once.
    let hits = find_aligned(&dev.raw(), &bad[..4096]);
    assert_eq!(hits.len(), 1, "pattern found at {hits:?}");
    dev.corrupt(hits[0] + 3 * 4096 + 17);
    let store = dev.open().await;
    match store.read(oid(11, 0), 3 * 4096 + 100, 10).await {
        Err(EngineError::Checksum { oid: o, offset }) => {
            assert_eq!((o, offset), (oid(11, 0), 3 * 4096))
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
    assert!(matches!(
        store.read(oid(11, 0), 0, OBJ).await,
        Err(EngineError::Checksum { .. })
    ));
    assert_eq!(
        store.read(oid(11, 0), 0, 3 * 4096).await.unwrap(),
        &bad[..3 * 4096]
    );
    assert_eq!(
        store.read(oid(11, 1), 0, OBJ).await.unwrap(),
        pattern(4343, OBJ as usize)
    );
    assert!(store.stats().checksum_errors >= 2);
    // A salvage read returns the rest of the object and names the bad block (zeros there).
    let salvage = store.read_object_salvage(oid(11, 0)).await.unwrap();
    assert_eq!(salvage.bad_blocks, vec![3]);
    let ObjectContent::Data { data, allocated } = salvage.image.content else {
        panic!("expected data, got {:?}", salvage.image);
    };
    let mut expect = bad.clone();
    expect[3 * 4096..4 * 4096].fill(0);
    assert!(data[..] == expect[..], "salvaged data differs");
    assert_eq!(allocated[0] & 0b1111, 0b1111);
    let intact = store.read_object_salvage(oid(11, 1)).await.unwrap();
    assert!(intact.bad_blocks.is_empty());
    assert_eq!(intact.image, store.read_object(oid(11, 1)).await.unwrap());
    // The same damaged block, read again and again (and by read-modify-write: a partial write
    // into it cannot merge with corrupt data, so it is refused), is one bad block.
    let before = store.stats();
    assert!(matches!(
        store.read(oid(11, 0), 3 * 4096, 4096).await,
        Err(EngineError::Checksum { .. })
    ));
    assert!(matches!(
        store
            .write(
                oid(11, 0),
                3 * 4096 + 5,
                Bytes::from_static(b"z"),
                WriteOptions::durable()
            )
            .await,
        Err(EngineError::Checksum { .. })
    ));
    let after = store.stats();
    assert_eq!(after.checksum_errors, before.checksum_errors + 2);
    assert_eq!(after.bad_blocks, 1, "one damaged block: {after:?}");
    // Overwriting the whole block repairs it.
    store
        .write(
            oid(11, 0),
            3 * 4096,
            Bytes::from(vec![5u8; 4096]),
            WriteOptions::durable(),
        )
        .await
        .unwrap();
    assert_eq!(
        store.read(oid(11, 0), 3 * 4096, 4096).await.unwrap(),
        vec![5u8; 4096]
    );
}

async fn group_commit(b: Backend) {
    let dev = small_dev(b);
    if let Some(sim) = &dev.sim {
        sim.set_flush_latency(std::time::Duration::from_micros(200));
    }
    let store = dev.open().await;
    let before = store.stats();
    let mut tasks = Vec::new();
    for t in 0..32u64 {
        let s = store.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..20u64 {
                s.write(
                    oid(12, t),
                    (i as u32) * 4096,
                    Bytes::from(pattern(i, 4096)),
                    WriteOptions::durable(),
                )
                .await
                .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let after = store.stats();
    let writes = after.writes - before.writes;
    let flushes = after.flushes - before.flushes;
    assert_eq!(writes, 640);
    assert!(
        flushes * 4 < writes,
        "{flushes} flushes ({} for write-back) for {writes} durable writes: no group commit",
        2 * (after.writeback_batches - before.writeback_batches)
    );
    // Concurrent writes share journal records, and every byte reached the device at least
    // once (the journal record; write-back adds more).
    let records = after.journal_records - before.journal_records;
    assert!(
        records > 0 && records * 2 < writes,
        "{records} journal records for {writes} concurrent writes"
    );
    let client = after.bytes_written - before.bytes_written;
    let device = after.device_bytes_written - before.device_bytes_written;
    assert_eq!(client, 640 * 4096);
    assert!(
        device > client,
        "{device} device bytes for {client} written"
    );
}

/// Durable writes one at a time: each is a journal record written durable by itself (no flush
/// after it), and each is there after a reopen; on the simulated disk, after a power loss right
/// after the last acknowledgement (a durable write hardens only itself there).
async fn lone_durable_writes(b: Backend) {
    let dev = small_dev(b);
    let store = dev.open().await;
    let before = store.stats();
    for i in 0..8u64 {
        let data = Bytes::from(pattern(i, 4096));
        store
            .write(oid(13, i), 4096, data, WriteOptions::durable())
            .await
            .unwrap();
    }
    let after = store.stats();
    assert_eq!(after.durable_records - before.durable_records, 8);
    assert_eq!(after.journal_records - before.journal_records, 8);
    let store = match &dev.sim {
        Some(sim) => {
            let image = sim.crash(5);
            store.crash();
            basalt_engine::Store::spawn_sim(&image, &dev.open_opts()).unwrap()
        }
        None => {
            drop(store);
            dev.open().await
        }
    };
    for i in 0..8u64 {
        assert_eq!(
            store.read(oid(13, i), 4096, 4096).await.unwrap(),
            pattern(i, 4096),
            "write {i}"
        );
    }
}

/// A store whose loop ended without a close (its task aborted, as a crash ends it) does not
/// report a clean close: what it acknowledged may not be durable (a node keeps its durability
/// incarnation only across clean closes). A store closed cleanly may be closed again.
#[tokio::test]
async fn only_a_close_that_finished_the_loop_is_clean() {
    let dev = Dev::new(Backend::PsyncTask, 64 << 20, 8 << 20);
    let store = dev.open().await;
    let o = oid(1, 0);
    store
        .write(
            o,
            0,
            Bytes::from(pattern(1, 4096)),
            WriteOptions::buffered(),
        )
        .await
        .unwrap();
    store.crash();
    assert!(matches!(store.close().await, Err(EngineError::Closed)));
    assert!(
        matches!(store.close().await, Err(EngineError::Closed)),
        "a second close hides the first one's failure"
    );
    drop(store);
    let store = dev.open().await;
    store.close().await.unwrap();
    store.close().await.unwrap();
}

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod uring { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Uring).await } )* }
        mod psync { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backend::Psync).await } )* }
        // The store as a task on a current-thread runtime with paused time: deterministic.
        mod sim { $( #[tokio::test(start_paused = true)] async fn $name() { super::$name(super::Backend::Sim).await } )* }
        // The store's loop as a task on the test's one thread, over a real file (as a node
        // runs it): io_uring completions through the registered eventfd, psync through Notify.
        mod uring_task { $( #[tokio::test] async fn $name() { super::$name(super::Backend::UringTask).await } )* }
        mod psync_task { $( #[tokio::test] async fn $name() { super::$name(super::Backend::PsyncTask).await } )* }
    };
}

suite!(
    basic_read_write,
    unaligned,
    zeroes_and_trim,
    delete_and_delete_volume,
    versions,
    out_of_range,
    full_device,
    reopen_persistence,
    concurrency,
    checksum_corruption,
    group_commit,
    lone_durable_writes,
);
