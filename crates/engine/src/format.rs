//! Formatting a device and probing it for a store.
//!
//! Format refuses a device that is not blank (`check_blank`: a known signature or any non-zero
//! byte in its first and last MiB, see [`crate::signature`]) unless forced, and preallocates a
//! device file in full (`preallocate`) so that a full host file system can never fail a write
//! later. A device file that format created is removed again if format fails.
//!
//! Order matters for crash safety: invalidate any old superblock (both copies), prepare the
//! journal and the tables, flush, and only then write the new superblock copies and flush again.
//! A format interrupted at any point leaves no valid superblock, never a half-initialised store.

use crate::buf::AlignedBuf;
use crate::engine::read_superblocks;
use crate::error::EngineError;
use crate::io::file::Dev;
use crate::io::sim::SimDisk;
use crate::layout::{BLOCK, FORMAT_VERSION, Superblock};
use crate::record::JournalHeader;
use crate::signature::{self, Content, SCAN_LEN};
use crate::{FormatOptions, StoreInfo};
use rand::RngCore;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// Formats `path` (a regular file, created if missing, or a block device). Refuses a device
/// that is not blank (see the module docs) unless `opts.force`, and a device file its file
/// system cannot preallocate unless `opts.allow_sparse`.
pub fn format(path: &Path, opts: &FormatOptions) -> Result<StoreInfo, EngineError> {
    let existed = path.exists();
    let dev = Dev::open(path, true, false)?;
    let result = format_file(&dev, path, opts);
    if result.is_err() && !existed {
        // Nothing half-made stays behind (and a tmpfs gets its space back).
        let _ = std::fs::remove_file(path);
    }
    result
}

fn format_file(dev: &Dev, path: &Path, opts: &FormatOptions) -> Result<StoreInfo, EngineError> {
    let original = dev.size()?;
    check_blank(dev, path, original, opts.force)?;
    let Some(size) = opts.size else {
        if dev.is_regular_file() {
            preallocate(dev, path, original, opts.allow_sparse)?;
        }
        return format_dev(dev, opts, random_uuid(), None);
    };
    if !dev.is_regular_file() {
        if original < size {
            return Err(EngineError::invalid(format!(
                "{} is smaller than the requested size {size}",
                path.display()
            )));
        }
        return format_dev(dev, opts, random_uuid(), None);
    }
    dev.extend(size)?;
    if let Err(e) = preallocate(dev, path, size.max(original), opts.allow_sparse) {
        // Give back what was added; the bytes that were there are untouched.
        let _ = dev.truncate(original);
        return Err(e);
    }
    format_dev(dev, opts, random_uuid(), None)
}

/// Refuses a device that is not blank, unless `force`: a Basalt store (maybe damaged) is
/// [`EngineError::AlreadyFormatted`], anything else [`EngineError::NotBlank`].
fn check_blank(dev: &Dev, path: &Path, size: u64, force: bool) -> Result<(), EngineError> {
    // The engine's own reading of the superblocks: any store, valid or not (either copy), is
    // not blank.
    match read_superblocks(dev, path) {
        Err(EngineError::NotFormatted(_)) => {}
        Err(EngineError::Io(e)) => return Err(EngineError::Io(e)),
        _ if force => {}
        _ => return Err(EngineError::AlreadyFormatted(path.to_path_buf())),
    }
    let n = SCAN_LEN.min(size) as usize;
    let mut head = AlignedBuf::zeroed(n.next_multiple_of(BLOCK as usize));
    let mut tail = AlignedBuf::zeroed(n.next_multiple_of(BLOCK as usize));
    dev.read_at(0, &mut head[..n])?;
    dev.read_at(size - n as u64, &mut tail[..n])?;
    let Some(found) = signature::scan(&head[..n], &tail[..n], size) else {
        return Ok(());
    };
    if force {
        tracing::warn!(path = %path.display(), "formatting over {found} (forced)");
        return Ok(());
    }
    Err(match found.content {
        Content::Basalt => EngineError::AlreadyFormatted(path.to_path_buf()),
        _ => EngineError::NotBlank {
            path: path.to_path_buf(),
            found: found.to_string(),
        },
    })
}

/// Formats a simulated disk (tests). The uuid comes from the disk's seed and the creation
/// time is 0, so the same seed gives the same bytes.
pub fn format_sim(disk: &SimDisk, opts: &FormatOptions) -> Result<StoreInfo, EngineError> {
    let (dev, path) = (Dev::Sim(disk.clone()), Path::new("<sim>"));
    check_blank(&dev, path, disk.size(), opts.force)?;
    format_dev(&dev, opts, disk.uuid(), Some(0))
}

/// Reads the superblock of `path` (either copy) without recovery: `None` if it is not a
/// Basalt store. A store whose superblock copies are both damaged is `Corrupt`, never `None`.
/// Fails with [`EngineError::InUse`] when another process holds the device.
pub fn probe(path: &Path) -> Result<Option<StoreInfo>, EngineError> {
    let file = Dev::open_read_only(path)?;
    let block = file.metadata()?.file_type().is_block_device();
    let dev = Dev::File {
        file: std::sync::Arc::new(file),
        direct: false,
        block,
    };
    probe_dev(&dev, path)
}

/// [`probe`] for a simulated disk.
pub fn probe_sim(disk: &SimDisk) -> Result<Option<StoreInfo>, EngineError> {
    probe_dev(&Dev::Sim(disk.clone()), Path::new("<sim>"))
}

fn probe_dev(dev: &Dev, path: &Path) -> Result<Option<StoreInfo>, EngineError> {
    match read_superblocks(dev, path) {
        Ok(s) => Ok(Some(info(&s.sb, "none", false))),
        Err(EngineError::NotFormatted(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

fn info(sb: &Superblock, backend: &'static str, direct: bool) -> StoreInfo {
    StoreInfo {
        device_id: sb.device_id,
        uuid: sb.uuid,
        object_size: sb.object_size,
        capacity_bytes: sb.capacity_bytes(),
        device_size: sb.device_size,
        journal_size: sb.journal_size,
        format_version: FORMAT_VERSION,
        io_backend: backend,
        direct_io: direct,
        replay_cut: None,
    }
}

fn random_uuid() -> [u8; 16] {
    let mut uuid = [0u8; 16];
    rand::rng().fill_bytes(&mut uuid);
    uuid
}

/// Writes a new store onto a device that `check_blank` accepted (and that `preallocate`
/// reserved, for a file). `created_secs`: the creation time to record (`None`: now).
fn format_dev(
    dev: &Dev,
    opts: &FormatOptions,
    mut uuid: [u8; 16],
    created_secs: Option<u64>,
) -> Result<StoreInfo, EngineError> {
    let size = dev.size()?;
    uuid[6] = (uuid[6] & 0x0f) | 0x40; // RFC 4122 version 4
    uuid[8] = (uuid[8] & 0x3f) | 0x80;
    let mut sb = Superblock::plan(
        uuid,
        opts.device_id,
        opts.object_size,
        size,
        opts.journal_size,
    )?;
    if let Some(t) = created_secs {
        sb.created_secs = t;
    }
    // 1. No valid superblock from here until the end (neither copy, nor an old backup at the
    //    current end of the device).
    dev.write_at(0, &AlignedBuf::zeroed(BLOCK as usize))?;
    dev.write_at(
        size / BLOCK * BLOCK - BLOCK,
        &AlignedBuf::zeroed(BLOCK as usize),
    )?;
    dev.write_at(sb.backup_offset(), &AlignedBuf::zeroed(BLOCK as usize))?;
    // 2. Journal and tables. On a regular file, really write them (zeros), so the hot
    //    path never converts unwritten extents (each conversion makes fdatasync commit the
    //    filesystem journal). Meta pages and records carry the store uuid, so stale bytes from
    //    an earlier format are never mistaken for ours; zeroing is not needed for correctness.
    if dev.is_regular_file() {
        zero_range(dev, sb.journal_offset, sb.data_offset - sb.journal_offset)?;
    }
    dev.write_at(
        sb.journal_header_offset(0),
        &AlignedBuf::zeroed(BLOCK as usize),
    )?;
    let jh = JournalHeader {
        generation: 1,
        start_offset: 0,
        start_seq: 1,
        start_prev_crc: 0,
        tables_hash: 0,
    };
    dev.write_at(sb.journal_header_offset(1), &jh.encode(&uuid))?;
    dev.sync()?;
    // 3. The superblock copies make the store valid; flush so an acknowledged format survives.
    dev.write_at(0, &AlignedBuf::copy_from(&sb.encode(false)))?;
    dev.write_at(sb.backup_offset(), &AlignedBuf::copy_from(&sb.encode(true)))?;
    dev.sync()?;
    Ok(info(&sb, "none", false))
}

fn zero_range(dev: &Dev, mut off: u64, len: u64) -> Result<(), EngineError> {
    let end = off + len;
    let chunk = AlignedBuf::zeroed(4 << 20);
    while off < end {
        let n = (end - off).min(chunk.len() as u64) as usize;
        dev.write_at(off, &chunk[..n])?;
        off += n as u64;
    }
    Ok(())
}

/// Reserves all `len` bytes of a device file on its file system (`fallocate`), so writes into
/// it never fail for lack of host space and the store's own space accounting is exact. A file
/// system that cannot (EOPNOTSUPP, e.g. ext2, NFSv3) is refused unless `allow_sparse`.
fn preallocate(dev: &Dev, path: &Path, len: u64, allow_sparse: bool) -> Result<(), EngineError> {
    let Dev::File { file, .. } = dev else {
        return Ok(());
    };
    if len == 0 {
        return Ok(());
    }
    let refuse = |reason: String| EngineError::CannotPreallocate {
        path: path.to_path_buf(),
        size: len,
        reason,
    };
    let len_i64 = i64::try_from(len).map_err(|_| refuse("size too large".into()))?;
    loop {
        // SAFETY: plain syscall on an open descriptor.
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len_i64) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => Err(refuse(format!(
                "its file system has {} free ({e}); choose a smaller device size or free space",
                free_space(file).map_or("less space".into(), |f| format!("{f} bytes"))
            ))),
            Some(libc::EOPNOTSUPP) if allow_sparse => {
                tracing::warn!(
                    path = %path.display(),
                    "the file system cannot preallocate: the device file stays sparse, and a \
                     full host file system will fail its writes (accepted with \
                     --allow-sparse-device)"
                );
                Ok(())
            }
            Some(libc::EOPNOTSUPP) => Err(refuse(
                "its file system does not support fallocate, so writes could later fail when \
                 the host file system fills up (and poison the store); put the device on a file \
                 system that can preallocate (ext4, xfs, tmpfs), or accept the risk \
                 (basalt: --allow-sparse-device)"
                    .into(),
            )),
            _ => Err(EngineError::Io(e)),
        };
    }
}

/// Bytes available to unprivileged users on the file system holding `file`.
fn free_space(file: &std::fs::File) -> Option<u64> {
    // SAFETY: fstatvfs fills the properly sized out-parameter for an open descriptor.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstatvfs(file.as_raw_fd(), &mut st) } == 0)
        .then(|| st.f_bavail as u64 * st.f_frsize as u64)
}
