//! Media damage never silently loses acknowledged data: a damaged journal record that a later
//! record proves durable, or a damaged newest copy of a table page, makes the store refuse to
//! open (`Corrupt`); a damaged superblock copy is repaired from the other; a device whose first
//! superblock is damaged is never taken for a blank one; an older format is refused clearly; the
//! page copies of an interrupted write-back batch never count later.

mod common;

use basalt_engine::sim::SimDisk;
use basalt_engine::{
    EngineError, FormatOptions, ObjectContent, OpenOptions, Store, WriteOptions, format_sim,
    probe_sim,
};
use bytes::Bytes;
use common::{Backend, Dev, OBJ, find_aligned, oid, pattern};
use std::time::Duration;

/// Open options that never write the journal back on their own (records stay in the ring).
fn no_writeback(dev: &Dev) -> OpenOptions {
    OpenOptions {
        writeback_idle: Duration::from_secs(3600),
        ..dev.open_opts()
    }
}

fn sim(dev: &Dev) -> &SimDisk {
    dev.sim.as_ref().expect("a simulated disk")
}

/// Opening `image` must fail with `Corrupt`, naming a record proven durable; `dropped` says
/// what an open that succeeded lost silently.
fn refused_as_durable(image: &SimDisk, dropped: &str) {
    match Store::open_sim(image, &OpenOptions::default()) {
        Err(EngineError::Corrupt(why)) => assert!(why.contains("durable"), "{why}"),
        Err(e) => panic!("expected Corrupt, got {e}"),
        Ok(_) => panic!("{dropped}"),
    }
}

/// Six durable single-block writes (write `i` in PG `i`), each in its own journal record, none
/// written back; returns the crash image (everything flushed is in it).
async fn six_records() -> (Dev, SimDisk) {
    let dev = Dev::new(Backend::Sim, 64 << 20, 4 << 20);
    let store = Store::open_sim(sim(&dev), &no_writeback(&dev)).unwrap();
    for i in 0..6 {
        store
            .write(
                oid(1, i),
                0,
                Bytes::from(pattern(100 + i, 4096)),
                WriteOptions::durable().in_pg(i as u32),
            )
            .await
            .unwrap();
    }
    let image = sim(&dev).crash_image(1);
    drop(store);
    (dev, image)
}

#[tokio::test]
async fn damaged_durable_record_in_the_middle_of_the_journal_is_refused() {
    let (_dev, image) = six_records().await;
    let raw = image.read(0, image.size() as usize);
    let at = find_aligned(&raw, &pattern(102, 4096))[0];
    image.corrupt(at + 10);
    refused_as_durable(
        &image,
        "a damaged durable record was silently dropped with everything after it",
    );
}

/// The first record after the journal's start damaged (no record of its run found before the
/// break): the later ones still prove it durable. Before, the check needed a record of the run
/// before the break to tell its records from an earlier run's, and the six acknowledged
/// writes were cut silently (found by a review, 2026-11-29).
#[tokio::test]
async fn damaged_first_durable_record_is_refused() {
    let (_dev, image) = six_records().await;
    let raw = image.read(0, image.size() as usize);
    let at = find_aligned(&raw, &pattern(100, 4096))[0];
    image.corrupt(at + 10);
    refused_as_durable(
        &image,
        "a damaged durable first record was silently dropped with the rest",
    );
}

/// A record of a later run (after a reopen) damaged, later records of that run proving it
/// durable, while the newest record before the break is of the earlier run: refused too.
/// Before, only records of the run of the last record found counted as proof.
#[tokio::test]
async fn damaged_durable_record_after_a_reopen_is_refused() {
    let (_dev, image) = six_records().await;
    let store = Store::open_sim(&image, &no_writeback(&_dev)).unwrap();
    for i in 0..3 {
        store
            .write(
                oid(2, i),
                0,
                Bytes::from(pattern(200 + i, 4096)),
                WriteOptions::durable().in_pg(i as u32),
            )
            .await
            .unwrap();
    }
    let crashed = image.crash_image(3);
    drop(store);
    let raw = crashed.read(0, crashed.size() as usize);
    let at = find_aligned(&raw, &pattern(200, 4096))[0];
    crashed.corrupt(at + 10);
    refused_as_durable(
        &crashed,
        "a damaged durable record of the second run was silently dropped",
    );
}

/// A record left over from an earlier boot where the chain now ends is no torn record: six
/// writes acknowledged before any flush (every record's `durable seq` below them), record 4
/// damaged (a torn tail: 4 to 6 dropped), then one write after the reopen takes record 4's
/// number and place and is flushed. The next reopen finds the earlier boot's record 5 where
/// the new chain would continue: its link to the record before fails, so it is not this
/// chain's and nothing was cut. Before, its number alone made it a torn record, and the node
/// marked every PG of the device suspect for good (found by a review, 2026-11-29). Nor does
/// the earlier boot's record 6, numbered past the break, prove anything durable: the store
/// opens (its `durable seq` is below the earlier cut).
#[tokio::test]
async fn a_record_left_from_an_earlier_boot_is_not_a_torn_one() {
    let dev = Dev::new(Backend::Sim, 64 << 20, 4 << 20);
    let store = Store::open_sim(sim(&dev), &no_writeback(&dev)).unwrap();
    for i in 0..6 {
        let data = Bytes::from(pattern(100 + i, 4096));
        let opts = WriteOptions::buffered().in_pg(i as u32);
        store.write(oid(1, i), 0, data, opts).await.unwrap();
    }
    store.flush().await.unwrap();
    let image = sim(&dev).crash_image(1);
    drop(store);
    let raw = image.read(0, image.size() as usize);
    let at = find_aligned(&raw, &pattern(103, 4096))[0];
    image.corrupt(at + 10);
    let store = Store::open_sim(&image, &no_writeback(&dev)).unwrap();
    assert!(store.info().replay_cut.is_some(), "records 4 to 6 cut");
    for i in 3..6 {
        assert!(store.object_info(oid(1, i)).await.unwrap().is_none());
    }
    let data = Bytes::from(pattern(300, 4096));
    store
        .write(oid(3, 0), 0, data, WriteOptions::durable().in_pg(3))
        .await
        .unwrap();
    let again = image.crash_image(2);
    drop(store);
    let raw = again.read(0, again.size() as usize);
    for (i, n) in [(104, 5), (105, 6)] {
        let left = find_aligned(&raw, &pattern(i, 4096));
        assert!(
            !left.is_empty(),
            "the earlier boot's record {n} is in the ring"
        );
    }
    let store = Store::open_sim(&again, &OpenOptions::default()).unwrap();
    assert_eq!(store.info().replay_cut, None, "nothing was torn");
    assert_eq!(
        store.read(oid(3, 0), 0, 4096).await.unwrap(),
        pattern(300, 4096)
    );
}

#[tokio::test]
async fn a_torn_tail_is_still_just_cut() {
    // The last record has no later record to prove it durable: its damage looks like a torn
    // write and replay stops before it (the documented limit; replicas cover it). The store
    // says so for the replication layer: every PG (records after the broken one, dropped
    // with it, may hold writes acknowledged before its flush).
    let (_dev, image) = six_records().await;
    let intact = image.crash_image(2);
    let raw = image.read(0, image.size() as usize);
    let at = find_aligned(&raw, &pattern(105, 4096))[0];
    image.corrupt(at + 10);
    let store = Store::open_sim(&image, &OpenOptions::default()).unwrap();
    let cut = store
        .info()
        .replay_cut
        .clone()
        .expect("the cut is reported");
    assert_eq!(cut.pgs, None, "{cut:?}");
    let clean = Store::open_sim(&intact, &OpenOptions::default()).unwrap();
    assert_eq!(clean.info().replay_cut, None, "nothing was dropped");
    for i in 0..5 {
        assert_eq!(
            store.read(oid(1, i), 0, 4096).await.unwrap(),
            pattern(100 + i, 4096)
        );
    }
    assert!(store.object_info(oid(1, 5)).await.unwrap().is_none());
}

/// Finds the copy of slot-table page 0 with `generation` in a raw image.
fn page_copy(raw: &[u8], generation: u64) -> Option<u64> {
    (0..raw.len() / 4096).map(|b| b * 4096).find_map(|at| {
        let blk = &raw[at..at + 64];
        let ours = &blk[..4] == b"BMPG"
            && u64::from_le_bytes(blk[8..16].try_into().unwrap()) == 0
            && u64::from_le_bytes(blk[16..24].try_into().unwrap()) == generation;
        ours.then_some(at as u64)
    })
}

/// Writes an object, writes it back, rewrites it and writes back again: slot-table page 0 then
/// has generation 1 in one copy and 2 in the other.
async fn two_generations() -> Dev {
    let dev = Dev::new(Backend::Sim, 64 << 20, 4 << 20);
    let store = dev.open().await;
    store
        .write(
            oid(1, 0),
            0,
            Bytes::from(pattern(1, OBJ as usize)),
            WriteOptions::durable(),
        )
        .await
        .unwrap();
    store.close().await.unwrap();
    let store = dev.open().await;
    store
        .write(
            oid(1, 0),
            0,
            Bytes::from(pattern(2, 4096)),
            WriteOptions::durable(),
        )
        .await
        .unwrap();
    store.close().await.unwrap();
    dev
}

#[tokio::test]
async fn damaged_newest_table_page_is_refused_not_rolled_back() {
    let dev = two_generations().await;
    let raw = dev.raw();
    let newest = page_copy(&raw, 2).expect("generation 2 of page 0");
    assert!(page_copy(&raw, 1).is_some(), "the older copy is intact");
    dev.corrupt(newest + 300);
    match Store::open_sim(sim(&dev), &OpenOptions::default()) {
        Err(EngineError::Corrupt(why)) => assert!(why.contains("table page"), "{why}"),
        Err(e) => panic!("expected Corrupt, got {e}"),
        Ok(s) => {
            let v = s.object_info(oid(1, 0)).await.unwrap().unwrap().version;
            panic!("the store rolled back to the older page copy silently (object at {v})")
        }
    }
}

#[tokio::test]
async fn damaged_older_table_page_is_harmless() {
    let dev = two_generations().await;
    let raw = dev.raw();
    dev.corrupt(page_copy(&raw, 1).unwrap() + 300);
    let store = Store::open_sim(sim(&dev), &OpenOptions::default()).unwrap();
    let mut want = pattern(1, OBJ as usize);
    want[..4096].copy_from_slice(&pattern(2, 4096));
    assert_eq!(store.read(oid(1, 0), 0, OBJ).await.unwrap(), want);
}

/// Finds the copy of the journal header with `generation` in a raw image.
fn header_copy(raw: &[u8], generation: u64) -> Option<u64> {
    (0..raw.len() / 4096)
        .map(|b| b * 4096)
        .find(|&at| {
            &raw[at..at + 4] == b"BJHD"
                && u64::from_le_bytes(raw[at + 8..at + 16].try_into().unwrap()) == generation
        })
        .map(|at| at as u64)
}

/// The newest journal header generation in a raw image.
fn newest_header(raw: &[u8]) -> u64 {
    (0..raw.len() / 4096)
        .map(|b| b * 4096)
        .filter(|&at| &raw[at..at + 4] == b"BJHD")
        .map(|at| u64::from_le_bytes(raw[at + 8..at + 16].try_into().unwrap()))
        .max()
        .expect("a journal header")
}

/// A crash interrupts a write-back batch after its page copies are durable but before its
/// journal header is; the newest record, which that batch had written back, is then damaged
/// and cut. The next batch after recovery has the same number as the interrupted one but does
/// not rewrite the page only the cut record had changed: once its header is durable, the
/// interrupted batch's copy of that page must not count (it did before recovery erased such
/// copies: the store then refused to open, "a table page is damaged or lost"; cluster
/// simulation seed 700155).
#[tokio::test]
async fn an_interrupted_batch_does_not_count_after_a_cut_and_a_later_batch() {
    let dev = Dev::new(Backend::Sim, 64 << 20, 4 << 20);
    let disk = sim(&dev);
    let (x, y) = (oid(1, 0), oid(1, 1));
    let store = Store::open_sim(disk, &OpenOptions::default()).unwrap();
    let data = |seed| Bytes::from(pattern(seed, 4096));
    store
        .write(x, 0, data(1), WriteOptions::durable())
        .await
        .unwrap();
    store.close().await.unwrap();
    // Record 1 writes Y (slot table), record 2 deletes X (slot and tombstone tables).
    let store = Store::open_sim(disk, &no_writeback(&dev)).unwrap();
    store
        .write(y, 0, data(2), WriteOptions::durable())
        .await
        .unwrap();
    store.delete(x, WriteOptions::durable()).await.unwrap();
    let newest = basalt_engine::sim::newest_record_header(disk).expect("records");
    assert!(
        newest.entries.iter().any(|e| e.oid == x),
        "{:?}",
        newest.entries
    );
    let before = newest_header(&disk.read(0, disk.size() as usize));
    // One batch writes both records back (closing), then its header.
    store.close().await.unwrap();
    let raw = disk.read(0, disk.size() as usize);
    assert_eq!(newest_header(&raw), before + 1, "one batch on close");
    // The crash image of that batch without its header: the header copy it wrote is torn.
    disk.corrupt(header_copy(&raw, before + 1).unwrap() + 20);
    // And the delete's record is damaged: replay cuts it as a torn tail.
    disk.corrupt(newest.damageable.start + 8);
    let store = Store::open_sim(disk, &OpenOptions::default()).unwrap();
    assert!(store.info().replay_cut.is_some(), "the delete was cut");
    assert_eq!(store.read(x, 0, 4096).await.unwrap(), pattern(1, 4096));
    assert_eq!(store.read(y, 0, 4096).await.unwrap(), pattern(2, 4096));
    // The next batch (the interrupted one's number again) writes record 1 back only.
    store.close().await.unwrap();
    assert_eq!(
        newest_header(&disk.read(0, disk.size() as usize)),
        before + 1
    );
    let store = match Store::open_sim(disk, &OpenOptions::default()) {
        Ok(s) => s,
        Err(e) => panic!("the store does not open after a cut and a later batch: {e}"),
    };
    assert_eq!(store.read(x, 0, 4096).await.unwrap(), pattern(1, 4096));
    assert_eq!(store.read(y, 0, 4096).await.unwrap(), pattern(2, 4096));
    store.close().await.unwrap();
}

/// Only the batch right after the journal header loaded can have been interrupted: a table page
/// copy of a later batch proves a newer header was durable, and is gone (an old image of the
/// header restored, or media that lost it). The store refuses to open rather than erase that
/// copy as an interrupted batch's and serve the older state.
#[tokio::test]
async fn a_page_copy_newer_than_the_next_batch_is_refused() {
    let dev = Dev::new(Backend::Sim, 64 << 20, 4 << 20);
    let disk = sim(&dev);
    let data = |seed| Bytes::from(pattern(seed, 4096));
    let store = Store::open_sim(disk, &OpenOptions::default()).unwrap();
    store
        .write(oid(1, 0), 0, data(1), WriteOptions::durable())
        .await
        .unwrap();
    store.close().await.unwrap();
    let raw = disk.read(0, disk.size() as usize);
    let h0 = newest_header(&raw);
    let at0 = header_copy(&raw, h0).unwrap();
    let saved = raw[at0 as usize..at0 as usize + 4096].to_vec();
    // Batch h0+1 rewrites slot-table page 0; batch h0+2 only the PG table.
    let store = Store::open_sim(disk, &OpenOptions::default()).unwrap();
    store
        .write(oid(1, 1), 0, data(2), WriteOptions::durable())
        .await
        .unwrap();
    store.close().await.unwrap();
    let store = Store::open_sim(disk, &OpenOptions::default()).unwrap();
    let pg = basalt_engine::PgId {
        pool: basalt_engine::PoolId(1),
        pg: 3,
    };
    store
        .set_pg(pg, Some([5; basalt_engine::PG_BLOB]), true)
        .await
        .unwrap();
    store.close().await.unwrap();
    let raw = disk.read(0, disk.size() as usize);
    assert_eq!(newest_header(&raw), h0 + 2, "one batch per close");
    // Header h0+2 (written over h0's copy) replaced by the old h0; h0+1 damaged.
    disk.overwrite(at0, &saved);
    disk.corrupt(header_copy(&raw, h0 + 1).unwrap() + 20);
    match Store::open_sim(disk, &OpenOptions::default()) {
        Err(EngineError::Corrupt(why)) => assert!(why.contains("header was lost"), "{why}"),
        Err(e) => panic!("expected Corrupt, got {e}"),
        Ok(_) => panic!("opened on a journal header two batches old"),
    }
}

fn formatted() -> (SimDisk, FormatOptions) {
    let disk = SimDisk::new(32 << 20);
    let opts = FormatOptions {
        object_size: OBJ,
        ..FormatOptions::default()
    };
    format_sim(&disk, &opts).unwrap();
    (disk, opts)
}

#[tokio::test]
async fn damaged_superblock_is_repaired_from_the_backup() {
    let (disk, opts) = formatted();
    let store = Store::open_sim(&disk, &OpenOptions::default()).unwrap();
    store
        .write(
            oid(1, 1),
            0,
            Bytes::from_static(b"kept"),
            WriteOptions::durable(),
        )
        .await
        .unwrap();
    store.close().await.unwrap();
    let good = disk.read(0, 4096);
    // The magic itself is damaged: still a store (never "unformatted"), and format refuses it.
    disk.corrupt(0);
    assert!(probe_sim(&disk).unwrap().is_some());
    assert!(matches!(
        format_sim(&disk, &opts),
        Err(EngineError::AlreadyFormatted(_))
    ));
    let store = Store::open_sim(&disk, &OpenOptions::default()).unwrap();
    assert_eq!(store.read(oid(1, 1), 0, 4).await.unwrap(), &b"kept"[..]);
    store.close().await.unwrap();
    assert_eq!(disk.read(0, 4096), good, "the first copy was rewritten");
    // The backup damaged instead: repaired the same way.
    let size = disk.size();
    disk.corrupt(size - 4096 + 50);
    Store::open_sim(&disk, &OpenOptions::default())
        .unwrap()
        .close()
        .await
        .unwrap();
    let backup = disk.read(size - 4096, 4096);
    assert_eq!(&backup[..8], b"BASALTSB");
    assert_eq!(backup[..44], good[..44], "the backup was rewritten");
}

#[tokio::test]
async fn both_superblock_copies_damaged_is_corrupt_never_blank() {
    let (disk, opts) = formatted();
    let size = disk.size();
    disk.corrupt(100);
    disk.corrupt(size - 4096 + 100);
    assert!(matches!(probe_sim(&disk), Err(EngineError::Corrupt(_))));
    assert!(matches!(
        Store::open_sim(&disk, &OpenOptions::default()),
        Err(EngineError::Corrupt(_))
    ));
    assert!(matches!(
        format_sim(&disk, &opts),
        Err(EngineError::AlreadyFormatted(_))
    ));
}

#[tokio::test]
async fn an_older_format_is_refused_clearly() {
    let (disk, _) = formatted();
    // Rewrite both superblock copies as format version 1 (with valid CRCs).
    let size = disk.size();
    for at in [0, size - 4096] {
        let mut sb = disk.read(at, 4096);
        sb[8..12].copy_from_slice(&1u32.to_le_bytes());
        let crc = basalt_engine::crc32c(&sb[..4092]);
        sb[4092..].copy_from_slice(&crc.to_le_bytes());
        disk.overwrite(at, &sb);
    }
    match Store::open_sim(&disk, &OpenOptions::default()) {
        Err(EngineError::UnsupportedFormat {
            found: 1,
            supported: 2,
        }) => {}
        Err(e) => panic!("expected UnsupportedFormat, got {e}"),
        Ok(_) => panic!("a version 1 store was opened"),
    }
}

/// A block the device cannot read (a latent sector error: EIO) is a bad copy, as a block
/// failing its checksum is: a read of it fails with `Unreadable` at that block (never data,
/// never zeros), a read around it succeeds, a salvage read of the whole object names that
/// block alone (its run is read again block by block) with zeros there, a partial write into
/// it is refused; each failure counts once, and the block once among the distinct bad blocks;
/// a write over the whole block repairs it.
#[tokio::test(start_paused = true)]
async fn a_block_the_device_cannot_read_is_a_bad_copy() {
    let dev = Dev::new(Backend::Sim, 64 << 20, 4 << 20);
    let store = dev.open().await;
    let data = pattern(4545, OBJ as usize);
    store
        .write(
            oid(2, 0),
            0,
            Bytes::from(data.clone()),
            WriteOptions::durable(),
        )
        .await
        .unwrap();
    store.close().await.unwrap();
    drop(store);
    // Whole-object writes go straight to the slot, so the pattern is on the device once.
    let at = find_aligned(&dev.raw(), &data[3 * 4096..4 * 4096]);
    assert_eq!(at.len(), 1, "block found at {at:?}");
    sim(&dev).fail_reads(at[0] + 512..at[0] + 1024);
    let store = dev.open().await;
    match store.read(oid(2, 0), 3 * 4096 + 100, 10).await {
        Err(e @ EngineError::Unreadable { oid: o, offset, .. }) => {
            assert_eq!((o, offset), (oid(2, 0), 3 * 4096));
            assert!(e.is_bad_copy());
        }
        other => panic!("expected an unreadable block, got {other:?}"),
    }
    let whole = store.read(oid(2, 0), 0, OBJ).await;
    assert!(
        matches!(whole, Err(EngineError::Unreadable { offset, .. }) if offset == 3 * 4096),
        "{whole:?}"
    );
    assert_eq!(
        store.read(oid(2, 0), 0, 3 * 4096).await.unwrap(),
        &data[..3 * 4096]
    );
    assert_eq!(
        store.read(oid(2, 0), 4 * 4096, 4096).await.unwrap(),
        &data[4 * 4096..5 * 4096]
    );
    let salvage = store.read_object_salvage(oid(2, 0)).await.unwrap();
    assert_eq!(salvage.bad_blocks, vec![3]);
    let ObjectContent::Data { data: got, .. } = salvage.image.content else {
        panic!("expected data, got {:?}", salvage.image);
    };
    let mut expect = data.clone();
    expect[3 * 4096..4 * 4096].fill(0);
    assert!(got[..] == expect[..], "salvaged data differs");
    let before = store.stats();
    assert!(matches!(
        store
            .write(
                oid(2, 0),
                3 * 4096 + 5,
                Bytes::from_static(b"z"),
                WriteOptions::durable()
            )
            .await,
        Err(EngineError::Unreadable { .. })
    ));
    let after = store.stats();
    assert_eq!(after.read_errors, before.read_errors + 1, "{after:?}");
    assert_eq!(after.read_errors, 4, "one per failed read: {after:?}");
    assert_eq!(after.checksum_errors, 0, "{after:?}");
    assert_eq!(after.bad_blocks, 1, "one unreadable block: {after:?}");
    // Overwriting the whole block repairs it (the drive remaps the sector it writes).
    store
        .write(
            oid(2, 0),
            3 * 4096,
            Bytes::from(vec![5u8; 4096]),
            WriteOptions::durable(),
        )
        .await
        .unwrap();
    store.flush().await.unwrap();
    assert_eq!(
        store.read(oid(2, 0), 3 * 4096, 4096).await.unwrap(),
        vec![5u8; 4096]
    );
    store.close().await.unwrap();
    drop(store);
    let store = dev.open().await;
    assert_eq!(
        store.read(oid(2, 0), 3 * 4096, 4096).await.unwrap(),
        vec![5u8; 4096],
        "written back over the remapped sector"
    );
}
