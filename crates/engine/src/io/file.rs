//! Opening a regular file or block device, its size, and blocking positional I/O used by
//! format, probe and recovery (before the I/O thread starts).

use super::sim::SimDisk;
use crate::error::EngineError;
use crate::lock;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

/// An open device: a file or block device, or a simulated disk.
#[derive(Clone)]
pub(crate) enum Dev {
    File {
        file: Arc<File>,
        direct: bool,
        block: bool,
    },
    Sim(SimDisk),
}

const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// An open error: a busy block device (O_EXCL) names its holder.
fn open_error(path: &Path, block: bool, e: io::Error) -> EngineError {
    if block && e.raw_os_error() == Some(libc::EBUSY) {
        lock::block_device_busy(path)
    } else {
        EngineError::Io(e)
    }
}

impl Dev {
    /// Opens `path` read-write, with O_DIRECT if the filesystem supports it, for this process
    /// alone: a block device with O_EXCL, and every device with an exclusive flock (see
    /// [`crate::lock`]). Another holder is [`EngineError::InUse`].
    pub fn open(path: &Path, create: bool, direct: bool) -> Result<Dev, EngineError> {
        let block = lock::is_block_device(path);
        let excl = if block { libc::O_EXCL } else { 0 };
        let open = |flags: i32| {
            OpenOptions::new()
                .read(true)
                .write(true)
                // O_CREAT with O_EXCL would refuse the existing device node.
                .create(create && !block)
                .truncate(false)
                .custom_flags(flags | excl)
                .open(path)
        };
        let opened = if direct {
            match open(libc::O_DIRECT) {
                Ok(f) => Ok((f, true)),
                // tmpfs and some FUSE filesystems refuse O_DIRECT; buffered I/O plus fdatasync
                // is still durable, only slower.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::warn!(
                        path = %path.display(),
                        "the file system refuses O_DIRECT: using buffered I/O with fdatasync"
                    );
                    open(0).map(|f| (f, false))
                }
                Err(e) => Err(e),
            }
        } else {
            open(0).map(|f| (f, false))
        };
        let (file, direct) = opened.map_err(|e| open_error(path, block, e))?;
        lock::flock_exclusive(&file, path)?;
        let block = file.metadata()?.file_type().is_block_device();
        Ok(Dev::File {
            file: Arc::new(file),
            direct,
            block,
        })
    }

    /// Opens `path` read-only, exclusively like [`Dev::open`] (the lock ends with the file).
    pub fn open_read_only(path: &Path) -> Result<File, EngineError> {
        let block = lock::is_block_device(path);
        let excl = if block { libc::O_EXCL } else { 0 };
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(excl)
            .open(path)
            .map_err(|e| open_error(path, block, e))?;
        lock::flock_exclusive(&file, path)?;
        Ok(file)
    }

    /// A random number for identities (the journal's boot id): drawn from the simulated disk's
    /// seed in the simulation, so a seed replays exactly.
    pub fn random_u64(&self) -> u64 {
        match self {
            Dev::File { .. } => rand::random(),
            Dev::Sim(d) => d.random_u64(),
        }
    }

    pub fn size(&self) -> io::Result<u64> {
        match self {
            Dev::File {
                file, block: false, ..
            } => Ok(file.metadata()?.len()),
            Dev::File {
                file, block: true, ..
            } => {
                let mut size: u64 = 0;
                // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
                let rc = unsafe {
                    libc::ioctl(
                        std::os::fd::AsRawFd::as_raw_fd(&**file),
                        BLKGETSIZE64,
                        &mut size,
                    )
                };
                if rc < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(size)
                }
            }
            Dev::Sim(s) => Ok(s.size()),
        }
    }

    pub fn is_regular_file(&self) -> bool {
        matches!(self, Dev::File { block: false, .. })
    }

    /// Grows a regular file to `size` bytes (never shrinks).
    pub fn extend(&self, size: u64) -> io::Result<()> {
        match self {
            Dev::File {
                file, block: false, ..
            } if file.metadata()?.len() < size => file.set_len(size),
            _ => Ok(()),
        }
    }

    /// Cuts a regular file back to `size` bytes (undoing an [`Dev::extend`]).
    pub fn truncate(&self, size: u64) -> io::Result<()> {
        match self {
            Dev::File {
                file, block: false, ..
            } => file.set_len(size),
            _ => Ok(()),
        }
    }

    /// `buf` must be 4 KiB aligned with a 4 KiB multiple length (O_DIRECT).
    pub fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        match self {
            Dev::File { file, .. } => file.read_exact_at(buf, off),
            Dev::Sim(s) => s.read_into(off, buf),
        }
    }

    pub fn write_at(&self, off: u64, buf: &[u8]) -> io::Result<()> {
        match self {
            Dev::File { file, .. } => file.write_all_at(buf, off),
            Dev::Sim(s) => s.write(off, buf),
        }
    }

    pub fn sync(&self) -> io::Result<()> {
        match self {
            Dev::File { file, .. } => file.sync_data(),
            Dev::Sim(s) => s.flush(),
        }
    }
}
