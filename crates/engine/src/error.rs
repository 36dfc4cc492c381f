//! The engine's error type: one enum for the whole layer, each variant saying what was wrong and
//! what to do about it.

use basalt_types::{ObjectId, PgId, Version};
use std::path::PathBuf;
use thiserror::Error;

/// Every way a store operation can fail.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The caller passed something the store cannot accept (range past the object, bad option).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No free slot for a new object. Existing data is untouched; free space by deleting or
    /// trimming objects, or add a device.
    #[error(
        "out of space: need {needed} bytes, {free} bytes free; delete or trim objects, or add a device"
    )]
    OutOfSpace { needed: u64, free: u64 },
    /// A 4 KiB block read from the device does not match its stored CRC-32C. The data is not
    /// returned; repair the object from another replica.
    #[error(
        "checksum mismatch in {oid} at byte offset {offset}; the block is corrupt on disk, repair it from a replica"
    )]
    Checksum { oid: ObjectId, offset: u64 },
    /// The device failed to read a 4 KiB block of an object (an I/O error: a latent sector
    /// error, a failing drive). The data is not returned; repair the object from another
    /// replica (rewriting the block lets a drive remap a bad sector).
    #[error(
        "the device could not read {oid} at byte offset {offset} ({detail}); repair it from a replica"
    )]
    Unreadable {
        oid: ObjectId,
        offset: u64,
        detail: String,
    },
    /// A write carried a version that is not newer than the object's current version.
    #[error(
        "stale version: object is at {current}, write asked for {requested}; versions must increase"
    )]
    StaleVersion {
        current: Version,
        requested: Version,
    },
    /// A write meant to follow one version of the object found another (`WriteOptions::prior`):
    /// the write it follows failed here.
    #[error(
        "object is at {current}, not at {expected} this write follows (an earlier write to it \
         failed here); not applied"
    )]
    PriorVersion { current: Version, expected: Version },
    /// An earlier write or flush failed, so the store no longer knows what is durable. Every later
    /// read, write and flush is refused; reopen the store (recovery decides what survived).
    #[error(
        "store is poisoned by an earlier I/O failure ({0}); I/O is refused, reopen the store to recover"
    )]
    Poisoned(String),
    /// The device has no Basalt superblock; run format first.
    #[error("{0} is not a Basalt store (no superblock); format it first")]
    NotFormatted(PathBuf),
    /// The device already holds a Basalt store (maybe a damaged one); pass force to overwrite it.
    #[error(
        "{0} already holds a Basalt store (its superblock magic is there, maybe damaged); \
         refusing to format it: force the format (basalt: --force-format) only if its data is \
         not needed"
    )]
    AlreadyFormatted(PathBuf),
    /// The device holds something else (a file system, partition table, ...) or any non-zero
    /// data in the areas format checks; pass force to overwrite it.
    #[error(
        "{path} is not blank: it holds {found}; Basalt formats only devices whose first and last \
         MiB are zero. Check the path, or force the format (basalt: --force-format) to destroy \
         what it holds"
    )]
    NotBlank { path: PathBuf, found: String },
    /// Another process (or the kernel: a mount, swap, RAID, device mapper) holds the device or
    /// directory.
    #[error("{path} is in use by {holder}; two processes must never open the same store")]
    InUse { path: PathBuf, holder: String },
    /// A device file could not be preallocated on its host file system.
    #[error("cannot preallocate {size} bytes for the device file {path}: {reason}")]
    CannotPreallocate {
        path: PathBuf,
        size: u64,
        reason: String,
    },
    /// On-disk metadata is damaged in a way recovery cannot repair.
    #[error("corrupt store: {0}")]
    Corrupt(String),
    /// The device holds a Basalt store of another on-disk format version. Version 1 stores
    /// (before tombstones, PG records and epoch versions) cannot be converted in place: copy the
    /// data off with a client and reformat the device with force.
    #[error(
        "the store has on-disk format version {found}; this build reads version {supported} only (version 1 stores cannot be converted in place: copy the data off and reformat the device)"
    )]
    UnsupportedFormat { found: u32, supported: u32 },
    /// A listing of changes since `since` was asked for, but tombstones up to `tail` have been
    /// trimmed: the caller must compare full listings (backfill) instead.
    #[error(
        "log of {pg} is trimmed up to {tail}; changes since {since} cannot be listed, compare full listings instead"
    )]
    LogTrimmed {
        pg: PgId,
        since: Version,
        tail: Version,
    },
    /// The store already keeps records for as many PGs as its PG table holds.
    #[error(
        "the store holds records of {limit} PGs, its limit; spread the pools over more devices or use fewer PGs"
    )]
    TooManyPgs { limit: u64 },
    /// An operating-system I/O error.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The store was closed (or its I/O thread stopped); open it again.
    #[error("store is closed")]
    Closed,
}

impl EngineError {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        EngineError::InvalidArgument(msg.into())
    }

    /// Whether this copy of an object's data is bad (a block failed its checksum or could not
    /// be read): another replica's copy may be good, and the object can be repaired from it.
    pub fn is_bad_copy(&self) -> bool {
        matches!(
            self,
            EngineError::Checksum { .. } | EngineError::Unreadable { .. }
        )
    }

    /// A cheap copy for fanning one failure out to many waiters (`io::Error` is not `Clone`).
    pub(crate) fn duplicate(&self) -> Self {
        match self {
            EngineError::InvalidArgument(s) => EngineError::InvalidArgument(s.clone()),
            EngineError::OutOfSpace { needed, free } => EngineError::OutOfSpace {
                needed: *needed,
                free: *free,
            },
            EngineError::Checksum { oid, offset } => EngineError::Checksum {
                oid: *oid,
                offset: *offset,
            },
            EngineError::Unreadable {
                oid,
                offset,
                detail,
            } => EngineError::Unreadable {
                oid: *oid,
                offset: *offset,
                detail: detail.clone(),
            },
            EngineError::StaleVersion { current, requested } => EngineError::StaleVersion {
                current: *current,
                requested: *requested,
            },
            EngineError::PriorVersion { current, expected } => EngineError::PriorVersion {
                current: *current,
                expected: *expected,
            },
            EngineError::Poisoned(s) => EngineError::Poisoned(s.clone()),
            EngineError::NotFormatted(p) => EngineError::NotFormatted(p.clone()),
            EngineError::AlreadyFormatted(p) => EngineError::AlreadyFormatted(p.clone()),
            EngineError::NotBlank { path, found } => EngineError::NotBlank {
                path: path.clone(),
                found: found.clone(),
            },
            EngineError::InUse { path, holder } => EngineError::InUse {
                path: path.clone(),
                holder: holder.clone(),
            },
            EngineError::CannotPreallocate { path, size, reason } => {
                EngineError::CannotPreallocate {
                    path: path.clone(),
                    size: *size,
                    reason: reason.clone(),
                }
            }
            EngineError::Corrupt(s) => EngineError::Corrupt(s.clone()),
            EngineError::UnsupportedFormat { found, supported } => EngineError::UnsupportedFormat {
                found: *found,
                supported: *supported,
            },
            EngineError::TooManyPgs { limit } => EngineError::TooManyPgs { limit: *limit },
            EngineError::LogTrimmed { pg, since, tail } => EngineError::LogTrimmed {
                pg: *pg,
                since: *since,
                tail: *tail,
            },
            EngineError::Io(e) => EngineError::Io(std::io::Error::new(e.kind(), e.to_string())),
            EngineError::Closed => EngineError::Closed,
        }
    }
}
