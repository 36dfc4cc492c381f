//! The read-lease bound: how long, counted from any later start of the node, the read leases
//! its earlier processes granted may still run. A clean stop says exactly until when
//! (`stopmark.rs`); a crash says nothing, so the next process waits. Waiting its *own* lease
//! length is not enough when the process that crashed ran with a longer heartbeat grace (an
//! operator shortened `--heartbeat-grace` across the restart): its peers may still hold its
//! leases, and a new term promised meanwhile could serve a read that misses a write the new
//! primary acknowledged (failure-model.md, rule 9).
//!
//! So every start writes, durably and before the process can grant anything, the longest it
//! or any earlier process may have granted for, counted from any later start: its own lease
//! length, or what it waits for earlier grants itself if that is longer (an earlier process's
//! grants end within that of this start, so within it of every later one). A start after a
//! crash waits the longer of its lease length and this bound.
//!
//! One line of text in file `lease-bound`:
//!
//! ```text
//! basalt-lease-bound v1 ns=<nanoseconds> crc=<8 hex digits>\n
//! ```
//!
//! `crc`: CRC-32C of the text before ` crc=`. Written like the clean-stop mark. A file that
//! does not read back counts as none (the start waits its own lease length, as before the
//! bound existed) and says so.

use crate::stopmark::{replace_file, sealed_line, unsealed};
use std::io;
use std::path::Path;
use std::time::Duration;

const FILE: &str = "lease-bound";
const TEMP: &str = "lease-bound.tmp";
const PREFIX: &str = "basalt-lease-bound v1 ns=";

/// The bound the last start left in data directory `dir` (`None`: none, or none that reads
/// back).
pub(crate) fn read(dir: &Path) -> io::Result<Option<Duration>> {
    let bytes = match std::fs::read(dir.join(FILE)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let text = String::from_utf8_lossy(&bytes);
    let bound = parse(&text);
    if bound.is_none() {
        tracing::warn!(
            "the read-lease bound does not read back ({:?}): waiting this process's own lease \
             length after a crash",
            text.trim_end()
        );
    }
    Ok(bound.map(Duration::from_nanos))
}

/// Writes `bound`, durably, over the one there.
pub(crate) fn write(dir: &Path, bound: Duration) -> io::Result<()> {
    let ns = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
    replace_file(dir, FILE, TEMP, &sealed_line(&format!("{PREFIX}{ns}")))
}

fn parse(text: &str) -> Option<u64> {
    unsealed(text)?.strip_prefix(PREFIX)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_reads_back_until_replaced() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None, "none written");
        write(dir.path(), Duration::from_millis(8500)).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(Duration::from_millis(8500)));
        assert_eq!(
            read(dir.path()).unwrap(),
            Some(Duration::from_millis(8500)),
            "reading does not take it"
        );
        write(dir.path(), Duration::from_secs(2)).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(Duration::from_secs(2)));
    }

    #[test]
    fn a_damaged_bound_is_none() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), Duration::from_secs(9)).unwrap();
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        std::fs::write(dir.path().join(FILE), text.replace("ns=9", "ns=1")).unwrap();
        assert_eq!(read(dir.path()).unwrap(), None, "CRC fails");
        std::fs::write(dir.path().join(FILE), "basalt-lease-bound v1 ns=").unwrap();
        assert_eq!(read(dir.path()).unwrap(), None, "torn");
    }
}
