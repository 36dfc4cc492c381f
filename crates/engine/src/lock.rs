//! Exclusive use: two processes must never open the same store. Every device file (regular file
//! or block device) is flock'ed exclusively while open, block devices are also opened with
//! `O_EXCL` (the kernel then refuses them while mounted, used as swap, part of a RAID or device
//! mapper, or opened exclusively by someone else), and a process's data directory is locked
//! through `<dir>/basalt.lock` ([`lock_dir`]). A refusal names the holder when Linux tells:
//! the pid holding the flock (`/proc/locks`), the mount point, the kernel holder (`holders/` in
//! sysfs), or the processes that have the device open.

use crate::error::EngineError;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// An exclusive lock on a directory, held until dropped (or the process exits).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    path: PathBuf,
}

impl DirLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Locks `dir` (creating it and `<dir>/basalt.lock` if needed) for this process. Fails with
/// [`EngineError::InUse`] naming the holder when another process has it.
pub fn lock_dir(dir: &Path) -> Result<DirLock, EngineError> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("basalt.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)?;
    flock_exclusive(&file, dir)?;
    Ok(DirLock { _file: file, path })
}

/// How long a lock held by this process, or by nobody a moment later, is waited for.
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Takes an exclusive, non-blocking flock on `file`, which was opened from `path`. The lock
/// lasts as long as the open file (all its clones).
///
/// The kernel may let go of a lock a little after the last descriptor of its file closed: a
/// reference an io_uring worker held is put from a kernel work queue. So a store this process
/// closed can still hold its device for a moment (a node restarted in process then failed
/// with `InUse`): a lock held by this process, or whose holder is gone by the time it is
/// looked up, is waited for up to [`RELEASE_WAIT`]. Another process's lock is refused at once.
pub(crate) fn flock_exclusive(file: &File, path: &Path) -> Result<(), EngineError> {
    let deadline = std::time::Instant::now() + RELEASE_WAIT;
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => {
                let holder = file
                    .metadata()
                    .ok()
                    .and_then(|m| flock_holder(m.dev(), m.ino()));
                let ours = holder.is_none_or(|pid| pid == std::process::id());
                if ours && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
                return Err(EngineError::InUse {
                    path: path.to_path_buf(),
                    holder: holder.map_or_else(|| "another process".into(), describe_pid),
                });
            }
            _ => return Err(EngineError::Io(e)),
        }
    }
}

/// Whether `path` names a block device (following symlinks); false if it does not exist.
pub(crate) fn is_block_device(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

/// The error for a block device that an `O_EXCL` open found busy.
pub(crate) fn block_device_busy(path: &Path) -> EngineError {
    let holder = std::fs::metadata(path)
        .ok()
        .and_then(|m| block_holder(m.rdev()))
        .unwrap_or_else(|| {
            "the kernel or another process (mounted, swap, RAID, device mapper, or opened \
             exclusively)"
                .into()
        });
    EngineError::InUse {
        path: path.to_path_buf(),
        holder,
    }
}

fn major(dev: u64) -> u64 {
    ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0fff)
}

fn minor(dev: u64) -> u64 {
    ((dev >> 12) & 0xffff_ff00) | (dev & 0xff)
}

/// `pid N (name)` of the process holding a flock on the inode `(dev, ino)`, from /proc/locks.
fn flock_holder(dev: u64, ino: u64) -> Option<u32> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    parse_flock_holder(&locks, major(dev), minor(dev), ino)
}

/// Finds the pid of a granted FLOCK on `major:minor:ino` in the text of /proc/locks, whose lines
/// read `1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF` (device numbers in hex; waiters have
/// `->` after the ordinal).
fn parse_flock_holder(locks: &str, major: u64, minor: u64, ino: u64) -> Option<u32> {
    locks.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[1] != "FLOCK" {
            return None;
        }
        let mut id = f[5].split(':');
        let maj = u64::from_str_radix(id.next()?, 16).ok()?;
        let min = u64::from_str_radix(id.next()?, 16).ok()?;
        let i: u64 = id.next()?.parse().ok()?;
        (maj == major && min == minor && i == ino)
            .then(|| f[4].parse().ok())
            .flatten()
    })
}

fn describe_pid(pid: u32) -> String {
    match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        Ok(name) => format!("pid {pid} ({})", name.trim()),
        Err(_) => format!("pid {pid}"),
    }
}

/// Who holds block device `rdev`: a mount, a kernel holder (dm, md), a swap area, or the
/// processes that have it open.
fn block_holder(rdev: u64) -> Option<String> {
    let (maj, min) = (major(rdev), minor(rdev));
    if let Some(point) = mount_point(maj, min) {
        return Some(format!("a file system mounted at {point}"));
    }
    let holders: Vec<String> = std::fs::read_dir(format!("/sys/dev/block/{maj}:{min}/holders"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if !holders.is_empty() {
        return Some(format!("the kernel device {}", holders.join(", ")));
    }
    if is_swap(rdev) {
        return Some("the kernel (it is an active swap area)".into());
    }
    let pids = openers(rdev);
    (!pids.is_empty()).then(|| {
        pids.into_iter()
            .map(describe_pid)
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// Where the block device `maj:min` is mounted, from /proc/self/mountinfo (field 3 is the
/// device, field 5 the mount point).
fn mount_point(maj: u64, min: u64) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let dev = format!("{maj}:{min}");
    info.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 4 && f[2] == dev).then(|| f[4].to_string())
    })
}

fn is_swap(rdev: u64) -> bool {
    let Ok(swaps) = std::fs::read_to_string("/proc/swaps") else {
        return false;
    };
    swaps.lines().skip(1).any(|line| {
        line.split_whitespace()
            .next()
            .and_then(|p| std::fs::metadata(p).ok())
            .is_some_and(|m| m.file_type().is_block_device() && m.rdev() == rdev)
    })
}

/// Other processes with an open descriptor on block device `rdev` (at most 8).
fn openers(rdev: u64) -> Vec<u32> {
    let me = std::process::id();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|fd| {
                    std::fs::metadata(fd.path())
                        .is_ok_and(|m| m.file_type().is_block_device() && m.rdev() == rdev)
                })
        })
        .take(8)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flock_holder_is_found_in_proc_locks() {
        let text = "1: POSIX  ADVISORY  WRITE 77 fd:01:5678 0 EOF\n\
                    2: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF\n\
                    2: -> FLOCK  ADVISORY  WRITE 999 fd:01:5678 0 EOF\n\
                    3: FLOCK  ADVISORY  WRITE 42 08:10:99 0 EOF\n";
        assert_eq!(parse_flock_holder(text, 0xfd, 1, 5678), Some(1234));
        assert_eq!(parse_flock_holder(text, 8, 0x10, 99), Some(42));
        assert_eq!(parse_flock_holder(text, 8, 0x10, 100), None);
    }

    #[test]
    fn a_locked_directory_is_refused_naming_this_process() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock_dir(dir.path()).unwrap();
        // A second lock through another open file description conflicts even in-process.
        match lock_dir(dir.path()) {
            Err(EngineError::InUse { path, holder }) => {
                assert_eq!(path, dir.path());
                assert!(
                    holder.contains(&format!("pid {}", std::process::id())),
                    "{holder}"
                );
            }
            other => panic!("expected InUse, got {other:?}"),
        }
        drop(held);
        lock_dir(dir.path()).expect("free again once the holder is gone");
    }

    /// A lock this process lets go of a moment later (as the kernel may, after a store closed)
    /// is waited for, not refused.
    #[test]
    fn a_lock_this_process_releases_shortly_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock_dir(dir.path()).unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(held);
        });
        lock_dir(dir.path()).expect("waited for the release");
        release.join().unwrap();
    }
}
