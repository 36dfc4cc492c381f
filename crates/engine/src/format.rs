//! Formatting a device and probing it for a store.
//!
//! Order matters for crash safety: invalidate any old superblock, prepare journal and slot
//! table, flush, and only then write the new superblock and flush again. A format interrupted
//! at any point leaves no valid superblock, never a half-initialised store.

use crate::buf::AlignedBuf;
use crate::engine::recover_superblock;
use crate::error::EngineError;
use crate::io::file::Dev;
use crate::io::sim::SimDisk;
use crate::layout::{BLOCK, FORMAT_VERSION, Superblock};
use crate::record::JournalHeader;
use crate::{FormatOptions, StoreInfo};
use rand::RngCore;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Formats `path` (a regular file, created if missing, or a block device). Refuses a device
/// that already holds a Basalt store unless `opts.force`.
pub fn format(path: &Path, opts: &FormatOptions) -> Result<StoreInfo, EngineError> {
    let dev = Dev::open(path, true, false)?;
    if let Some(size) = opts.size {
        if dev.is_regular_file() {
            dev.extend(size)?;
        } else if dev.size()? < size {
            return Err(EngineError::invalid(format!(
                "{} is smaller than the requested size {size}",
                path.display()
            )));
        }
    }
    let mut uuid = [0u8; 16];
    rand::rng().fill_bytes(&mut uuid);
    format_dev(&dev, path, opts, uuid, None)
}

/// Formats a simulated disk (tests). The uuid comes from the disk's seed and the creation
/// time is 0, so the same seed gives the same bytes.
pub fn format_sim(disk: &SimDisk, opts: &FormatOptions) -> Result<StoreInfo, EngineError> {
    let dev = Dev::Sim(disk.clone());
    format_dev(&dev, Path::new("<sim>"), opts, disk.uuid(), Some(0))
}

/// Reads the superblock of `path` without recovery: `None` if it is not a Basalt store.
pub fn probe(path: &Path) -> Result<Option<StoreInfo>, EngineError> {
    let file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; BLOCK as usize];
    let n = std::os::unix::fs::FileExt::read_at(&file, &mut buf, 0)?;
    if n < buf.len() {
        return Ok(None);
    }
    Ok(Superblock::decode(&buf)?.map(|sb| info(&sb, "none", false)))
}

/// [`probe`] for a simulated disk.
pub fn probe_sim(disk: &SimDisk) -> Result<Option<StoreInfo>, EngineError> {
    let buf = disk.read(0, BLOCK as usize);
    Ok(Superblock::decode(&buf)?.map(|sb| info(&sb, "none", false)))
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
    }
}

fn format_dev(
    dev: &Dev,
    path: &Path,
    opts: &FormatOptions,
    mut uuid: [u8; 16],
    created_secs: Option<u64>,
) -> Result<StoreInfo, EngineError> {
    let size = dev.size()?;
    match recover_superblock(dev, path) {
        Ok(_) | Err(EngineError::Corrupt(_)) if !opts.force => {
            return Err(EngineError::AlreadyFormatted(path.to_path_buf()));
        }
        _ => {}
    }
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
    // 1. No valid superblock from here until the end.
    dev.write_at(0, &AlignedBuf::zeroed(BLOCK as usize))?;
    // 2. Journal and slot table. On a regular file, really write them (zeros), so the hot
    //    path never converts unwritten extents (each conversion makes fdatasync commit the
    //    filesystem journal). Meta pages and records carry the store uuid, so stale bytes from
    //    an earlier format are never mistaken for ours; zeroing is not needed for correctness.
    if dev.is_regular_file() {
        zero_range(dev, sb.journal_offset, sb.data_offset - sb.journal_offset)?;
        preallocate(dev, sb.data_offset, sb.capacity_bytes())?;
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
    };
    dev.write_at(sb.journal_header_offset(1), &jh.encode(&uuid))?;
    dev.sync()?;
    // 3. The superblock makes the store valid; flush so an acknowledged format survives.
    dev.write_at(0, &sb.encode())?;
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

/// Reserves the data area of a regular file so that writes into it never fail for lack of
/// filesystem space (the store's own space accounting is then exact).
fn preallocate(dev: &Dev, off: u64, len: u64) -> Result<(), EngineError> {
    if let Dev::File { file, .. } = dev {
        // SAFETY: plain syscall on an open descriptor.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, off as i64, len as i64) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
                return Err(EngineError::Io(e));
            }
        }
    }
    Ok(())
}
