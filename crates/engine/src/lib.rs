//! The per-device store: objects addressed by [`ObjectId`] with per-object versions, CRC-32C on
//! every 4 KiB block, crash-atomic writes of any size up to the object size, and durable acks
//! with group commit. One store owns one file or block device and one I/O thread (or, on a
//! simulated disk, one task on the current tokio runtime: [`Store::spawn_sim`], the
//! deterministic simulation of docs/design/simulation.md).
//!
//! # Flow of a write
//! 1. [`Store::write`] sends the request to the store's I/O loop and awaits the reply.
//! 2. The thread applies it to the in-memory index in arrival order per object
//!    (`engine/write.rs`): a whole-object write goes to a fresh slot (redirect-on-write); a
//!    smaller one becomes 4 KiB blocks (read-modify-write of partial blocks) kept in the cache.
//! 3. Concurrent operations are batched into one journal record (`engine/journal.rs`): one
//!    vectored write, then one flush shared by every durable writer (group commit). Acks go out
//!    in journal order: non-durable ones once the record is written, durable ones after the flush.
//! 4. Later, write-back (`engine/writeback.rs`) copies journaled blocks into their slots,
//!    rewrites the touched slot-table pages, flushes, and only then frees the journal space.
//! 5. On open, recovery (`engine/recover.rs`) loads the slot table and replays the journal,
//!    dropping the first record that is not entirely on disk and everything after it.
//!
//! # Flow of a read
//! `engine/read.rs`: each block comes from the cache, or from its slot on disk, where its CRC
//! is verified; a mismatch is [`EngineError::Checksum`], never data.
//!
//! Start here: [`Store`] (`store.rs`), then `engine/mod.rs` (the I/O thread's loop), and the
//! on-disk format in `docs/design/on-disk-format.md`. Device I/O backends are in [`io`]
//! (io_uring, psync, and the simulated disk of the deterministic simulation).

mod alloc;
mod buf;
mod clock;
mod codec;
mod crc;
#[cfg(test)]
mod decode_fuzz;
mod engine;
mod error;
mod format;
mod hash;
mod io;
mod layout;
mod lock;
mod meta;
mod pages;
mod pgtable;
mod record;
pub mod signature;
mod store;
mod tombs;

pub use basalt_types::{DeviceId, ObjectId, PgId, PoolId, Version, VolumeId};
use bytes::Bytes;
pub use crc::crc32c;
pub use error::EngineError;
pub use format::{format, format_sim, probe, probe_sim};
pub use io::sim;
pub use layout::{FORMAT_VERSION, PG_BLOB, device_size_for};
pub use lock::{DirLock, lock_dir};
use std::collections::BTreeSet;
pub use store::{Pending, Store};

use std::time::Duration;

/// Which I/O backend to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoMode {
    /// `BASALT_IO=uring|psync` if set, else io_uring if it can be set up, else psync.
    #[default]
    Auto,
    /// io_uring (fails to open if unavailable).
    Uring,
    /// pread/pwrite on a worker pool.
    Psync,
}

/// How to format a device.
#[derive(Clone, Debug)]
pub struct FormatOptions {
    pub device_id: DeviceId,
    /// Object size: a power of two from 4 KiB to 4 MiB.
    pub object_size: u32,
    /// Create or extend a regular file to this size; `None` = its existing size (block device).
    pub size: Option<u64>,
    /// Journal size in bytes; `None` = 1/32 of the device, between 16 MiB and 1 GiB.
    pub journal_size: Option<u64>,
    /// Format even a device that is not blank: one holding a Basalt store (maybe damaged), a
    /// file system, partition table, ... or any non-zero byte in its first or last MiB.
    pub force: bool,
    /// Accept a device file its file system cannot preallocate (it stays sparse: a full host
    /// file system then fails writes, which poisons the store).
    pub allow_sparse: bool,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            device_id: DeviceId(0),
            object_size: basalt_types::DEFAULT_OBJECT_SIZE,
            size: None,
            journal_size: None,
            force: false,
            allow_sparse: false,
        }
    }
}

/// How to open a store.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub io: IoMode,
    /// Open with O_DIRECT (falls back to buffered I/O where the filesystem refuses it).
    pub direct_io: bool,
    /// Worker threads of the psync backend.
    pub psync_threads: usize,
    /// Write back journaled data after the store has seen no writes for this long.
    pub writeback_idle: Duration,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            io: IoMode::Auto,
            direct_io: true,
            psync_threads: 8,
            writeback_idle: Duration::from_millis(2),
        }
    }
}

/// Options of one write-class operation (write, write-zeroes, trim, delete, install).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteOptions {
    /// Acknowledge only once the write is on stable storage. Non-durable writes are
    /// acknowledged once written and become durable at the next flush.
    pub durable: bool,
    /// The object's new version; `None` = the current version's [`Version::next`]. `Some(v)`
    /// must be newer than the current version (tombstones included), else
    /// [`EngineError::StaleVersion`]. Ignored by install (which sets any version).
    pub version: Option<Version>,
    /// The placement group of the object, within its pool. An object keeps its PG for life;
    /// listings and the log are per PG.
    pub pg: u32,
    /// Hold the write invisible: reads of the object wait until [`Store::commit`] (the primary
    /// of a replicated PG commits once every replica has the write durable).
    pub pending: bool,
    /// Apply only onto this version of the object (tombstones included; `Version::NONE`: the
    /// object does not exist), else [`EngineError::PriorVersion`]. Checked when the write is
    /// applied, after every earlier operation on the object: a replicated write sent while an
    /// earlier one to its object was in flight is not applied where the earlier one failed.
    /// A version the object reached here without a record (a write-zeroes or delete that
    /// changed nothing: the object had no live data) counts as its current one for this
    /// check. Ignored by install.
    pub prior: Option<Version>,
    /// Install and purge only: refuse ([`EngineError::StaleVersion`]) when the object's
    /// current version is above this one and above the version the operation would leave (the
    /// image's; none for a purge): it would roll back, or remove, a write made since. A
    /// replica sets it to the start of the sender's term: an install of that term sent before
    /// a write of the same term must not land after it (`node/src/pg/replica.rs`).
    pub keep_since: Option<Version>,
}

impl Default for WriteOptions {
    /// Durable, next version, PG 0, visible at once.
    fn default() -> Self {
        WriteOptions {
            durable: true,
            version: None,
            pg: 0,
            pending: false,
            prior: None,
            keep_since: None,
        }
    }
}

impl WriteOptions {
    pub fn durable() -> Self {
        WriteOptions::default()
    }
    pub fn buffered() -> Self {
        WriteOptions {
            durable: false,
            ..WriteOptions::default()
        }
    }
    pub fn with_version(self, v: Version) -> Self {
        WriteOptions {
            version: Some(v),
            ..self
        }
    }
    pub fn in_pg(self, pg: u32) -> Self {
        WriteOptions { pg, ..self }
    }
    pub fn held(self) -> Self {
        WriteOptions {
            pending: true,
            ..self
        }
    }
    /// Applied only onto `prior` ([`WriteOptions::prior`]).
    pub fn after(self, prior: Version) -> Self {
        WriteOptions {
            prior: Some(prior),
            ..self
        }
    }
    /// An install or purge that leaves versions above `since` alone
    /// ([`WriteOptions::keep_since`]).
    pub fn keeping_since(self, since: Version) -> Self {
        WriteOptions {
            keep_since: Some(since),
            ..self
        }
    }
}

/// Identity and geometry of a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreInfo {
    pub device_id: DeviceId,
    pub uuid: [u8; 16],
    pub object_size: u32,
    /// Bytes available for objects (slots x object size).
    pub capacity_bytes: u64,
    pub device_size: u64,
    pub journal_size: u64,
    pub format_version: u32,
    /// "io_uring", "psync", "sim", or "none" for [`probe`].
    pub io_backend: &'static str,
    /// Whether O_DIRECT is in use.
    pub direct_io: bool,
    /// Journal records the last open dropped as a torn tail (`None`: none was found).
    pub replay_cut: Option<ReplayCut>,
}

/// Journal records replay dropped at open although their header was on disk: the chain broke at
/// a record whose data (or header) does not verify, or a whole-object write's data is not in
/// its slot. Usually a write that never completed (a torn tail, never acknowledged); but damage
/// to the newest records looks the same to the journal alone, and then they may have been
/// acknowledged. A replicated layer must not take this store's lacking those writes as proof
/// that they were never acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayCut {
    /// The first dropped record.
    pub seq: u64,
    /// The placement groups (pool, PG number) of every entry of the dropped records, when
    /// they are all known (records whose data is not in their slots); `None` when the chain
    /// broke at a damaged record (the records after it, dropped too, are not read): any PG
    /// may have lost writes.
    pub pgs: Option<BTreeSet<(PoolId, u32)>>,
}

impl StoreInfo {
    /// The uuid as 32 hex digits in the usual 8-4-4-4-12 grouping.
    pub fn uuid_string(&self) -> String {
        let h: String = self.uuid.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "{}-{}-{}-{}-{}",
            &h[..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..]
        )
    }
}

/// Counters and space figures of an open store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub objects: u64,
    /// Deleted objects whose version is kept (see [`Store::delete`]).
    pub tombstones: u64,
    /// Reads waiting for held writes of their object to be committed.
    pub held_reads: u64,
    pub journal_used: u64,
    pub journal_size: u64,
    pub reads: u64,
    pub writes: u64,
    /// Device flushes (fdatasync) issued, including write-back's.
    pub flushes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Bytes written to the device (journal, slots, slot table), for write amplification.
    pub device_bytes_written: u64,
    /// Reads (and read-modify-write reads) that failed their checksum.
    pub checksum_errors: u64,
    /// Device reads of object data that failed with an I/O error (`EngineError::Unreadable`;
    /// read-modify-write reads too).
    pub read_errors: u64,
    /// Distinct blocks behind those failures (a block read again and again counts once): what
    /// a node judges the device's health by (`--checksum-error-limit`).
    pub bad_blocks: u64,
    pub writeback_batches: u64,
    /// Journal records written (group commit shares one record among concurrent writes).
    pub journal_records: u64,
    /// Of those, records written durable by themselves (`RWF_DSYNC`: a lone durable write,
    /// no flush after it).
    pub durable_records: u64,
    /// Device reads and writes completed, and the microseconds they took in sum (submission
    /// to completion); the mean latency over an interval is the quotient of the differences.
    pub ios_done: u64,
    pub io_micros: u64,
    /// Device flushes (fdatasync) completed, and the microseconds they took in sum.
    pub flushes_done: u64,
    pub flush_micros: u64,
    /// How long the oldest device request in flight has waited ([`Store::oldest_io_age`]).
    pub oldest_io_age: Option<Duration>,
}

/// What the store knows about one object (a live object or a tombstone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub oid: ObjectId,
    pub pg: u32,
    pub version: Version,
    /// A tombstone: the object was deleted (or trimmed empty) at `version`.
    pub deleted: bool,
    /// Bytes in allocated 4 KiB blocks (trimmed and never-written blocks do not count).
    pub allocated_bytes: u64,
}

/// One entry of a PG's log: the newest change of one object (`deleted`: it is a tombstone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogEntry {
    pub version: Version,
    pub oid: ObjectId,
    pub deleted: bool,
}

/// What the store holds of one PG.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgInfo {
    pub pg: PgId,
    /// Live objects.
    pub objects: u64,
    pub tombstones: u64,
    /// The newest version in the PG's log.
    pub last_version: Version,
    /// Changes up to this version may have been trimmed from the log.
    pub log_tail: Version,
    /// The user's per-PG state ([`Store::set_pg`]); zeros if never set.
    pub blob: [u8; PG_BLOB],
    /// Whether the PG has a record (set by [`Store::set_pg`] or a log trim).
    pub has_record: bool,
}

/// An object's whole content at one version, as recovery moves it between stores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectContent {
    /// The store knows nothing of the object.
    Absent,
    /// Deleted at the image's version.
    Tombstone,
    /// `data` is the whole object (object-size bytes; unallocated blocks read as zeros);
    /// `allocated` has one bit per 4 KiB block (bit b of word b/64).
    Data { data: Bytes, allocated: Vec<u64> },
}

/// An object and its version, read atomically ([`Store::read_object`]) or installed as is
/// ([`Store::install`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectImage {
    pub version: Version,
    pub content: ObjectContent,
}

/// What [`Store::read_object_salvage`] could read of an object: its image with every block
/// that failed its checksum or could not be read as zeros, and those blocks (indexes of 4 KiB blocks,
/// ascending). Copies of one version from several devices can be merged block by block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Salvage {
    pub image: ObjectImage,
    pub bad_blocks: Vec<u32>,
}
