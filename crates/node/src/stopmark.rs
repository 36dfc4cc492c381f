//! The clean-stop mark. A process forgets the read leases its predecessor granted
//! (`readlease.rs`), so a restarted node promises new terms only a lease length after it
//! starts: its PGs' I/O waits that long when it returns (`bench/failover.sh`). A node stopping
//! cleanly, once it grants no more, writes in its data directory until when its last grant
//! runs; the next start on the same boot of the machine takes the mark and waits only for what
//! is left of that (mostly nothing: a restart takes longer than the heartbeat grace). A start
//! that fails after taking the mark writes it back (`node.rs::Node::start`), saying when the
//! grants of the earlier processes and its own end. Without a mark (a crash) the next start
//! waits the longer of its own lease length and the bound the last start left
//! (`leasebound.rs`).
//!
//! One line of text:
//!
//! ```text
//! basalt-leases v1 boot=<boot id> until_ns=<CLOCK_BOOTTIME, ns> crc=<8 hex digits>\n
//! ```
//!
//! `boot`: `/proc/sys/kernel/random/boot_id` (the clock restarts with the machine); `until_ns`:
//! when the last grant runs out on `CLOCK_BOOTTIME` (counts through suspend, as the peers'
//! clocks do); `crc`: CRC-32C of the text before ` crc=`. Written to a temporary file, synced,
//! renamed over the mark, directory synced; taken (removed, directory synced) at the next start
//! before the node can grant anything, so a later crash of that process finds none. A mark of
//! another boot, unreadable, or failing its CRC counts as none: a whole lease length.

use std::io;
use std::path::Path;
use std::time::Duration;
use tokio::time::Instant;

const FILE: &str = "leases-ended";
const TEMP: &str = "leases-ended.tmp";
const PREFIX: &str = "basalt-leases v1";

/// Writes the mark: the last read lease this process granted runs out at `until`. Call only
/// once it grants no more (`ReadLeases::close`).
pub(crate) fn write(dir: &Path, until: Instant) -> io::Result<()> {
    let left = until.saturating_duration_since(Instant::now());
    let until_ns = boottime_ns()?.saturating_add(nanos(left));
    let body = format!("{PREFIX} boot={} until_ns={until_ns}", boot_id()?);
    replace_file(dir, FILE, TEMP, &sealed_line(&body))
}

/// `body` as one line of a mark file with its checksum: `<body> crc=<8 hex digits>\n`, the
/// CRC-32C of `body` (this mark, `incarnation.rs`, `leasebound.rs`).
pub(crate) fn sealed_line(body: &str) -> String {
    format!("{body} crc={:08x}\n", crc32c::crc32c(body.as_bytes()))
}

/// The body of a line [`sealed_line`] wrote, if it is whole and its CRC holds.
pub(crate) fn unsealed(text: &str) -> Option<&str> {
    let line = text.strip_suffix('\n')?;
    let (body, crc) = line.rsplit_once(" crc=")?;
    (u32::from_str_radix(crc, 16).ok()? == crc32c::crc32c(body.as_bytes())).then_some(body)
}

/// Writes `text` as file `name` of `dir`, durably and whole: to `temp` first, synced, renamed
/// over `name`, the directory synced.
pub(crate) fn replace_file(dir: &Path, name: &str, temp: &str, text: &str) -> io::Result<()> {
    let temp = dir.join(temp);
    std::fs::write(&temp, text)?;
    std::fs::File::open(&temp)?.sync_all()?;
    std::fs::rename(&temp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

/// Reads file `name` of `dir` and removes it, durably (`None`: there was none). A file that
/// cannot be read counts as empty, and is removed too.
pub(crate) fn take_file(dir: &Path, name: &str) -> io::Result<Option<Vec<u8>>> {
    let bytes = match std::fs::read(dir.join(name)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            tracing::warn!("reading {name}: {e}; taken as empty");
            Vec::new()
        }
    };
    std::fs::remove_file(dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(Some(bytes))
}

/// Takes the mark the last process left, if any: how long its grants may still run (`None`:
/// no usable mark, so as long as a lease can). Removes it, durably, first.
/// Fails only when the mark cannot be removed; one that cannot be read counts as none.
pub(crate) fn take(dir: &Path) -> io::Result<Option<Duration>> {
    let Some(bytes) = take_file(dir, FILE)? else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&bytes);
    let left = boot_id().ok().and_then(|boot| {
        let until_ns = parse(&text, &boot)?;
        Some(until_ns.saturating_sub(boottime_ns().ok()?))
    });
    if left.is_none() {
        tracing::warn!(
            "the clean-stop mark is unreadable or from another boot ({:?}): waiting a whole \
             lease length before promising",
            text.trim_end()
        );
    }
    Ok(left.map(Duration::from_nanos))
}

/// The `until_ns` of a mark written on boot `boot`, if it is one and its CRC holds.
fn parse(text: &str, boot: &str) -> Option<u64> {
    let rest = unsealed(text)?
        .strip_prefix(PREFIX)?
        .strip_prefix(" boot=")?;
    let (id, until) = rest.split_once(" until_ns=")?;
    (id == boot).then_some(())?;
    until.parse().ok()
}

fn boot_id() -> io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?
        .trim()
        .to_string())
}

/// `CLOCK_BOOTTIME` now, in nanoseconds.
fn boottime_ns() -> io::Result<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own and pass by pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let ns = u64::try_from(ts.tv_nsec).unwrap_or(0);
    Ok(secs.saturating_mul(1_000_000_000).saturating_add(ns))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_mark_tells_what_is_left_once_and_only_on_its_own_boot() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(take(dir.path()).unwrap(), None, "no mark");
        write(dir.path(), Instant::now() + Duration::from_secs(30)).unwrap();
        let left = take(dir.path()).unwrap().expect("the mark");
        assert!(
            left > Duration::from_secs(29) && left <= Duration::from_secs(30),
            "{left:?}"
        );
        assert_eq!(take(dir.path()).unwrap(), None, "taken once");
        write(dir.path(), Instant::now()).unwrap();
        assert_eq!(take(dir.path()).unwrap(), Some(Duration::ZERO), "run out");
        std::fs::write(dir.path().join(FILE), b"\xff\xfe garbage").unwrap();
        assert_eq!(take(dir.path()).unwrap(), None, "unreadable: none");
        assert!(!dir.path().join(FILE).exists(), "and taken");
    }

    #[test]
    fn a_mark_of_another_boot_or_with_a_bad_crc_is_none() {
        let body = format!("{PREFIX} boot=b1 until_ns=1234");
        let good = format!("{body} crc={:08x}\n", crc32c::crc32c(body.as_bytes()));
        assert_eq!(parse(&good, "b1"), Some(1234));
        assert_eq!(parse(&good, "b2"), None, "another boot");
        let torn = good.replace("1234", "1204");
        assert_eq!(parse(&torn, "b1"), None, "CRC");
        assert_eq!(parse(&good[..good.len() - 1], "b1"), None, "cut short");
        assert_eq!(parse("", "b1"), None);
    }
}
