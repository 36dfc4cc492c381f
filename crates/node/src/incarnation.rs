//! The node's durability incarnation: a number that changes whenever the node starts after a
//! stop that may have lost writes it acknowledged before they were durable.
//!
//! A PG served by one copy (a one-copy pool, or `min_size` 1 with the other members down)
//! acknowledges a write without FUA before it is durable; the client's next FLUSH makes it so
//! (`flush.rs`). A node that crashed in between and restarted under the same id has lost it,
//! and would answer that FLUSH with success. So every write's answer and every flush's answer
//! carries the incarnation (`Response::Written`, `Response::Flushed`), and the client fails a
//! flush whose node answers with another incarnation than its writes did (`client/src/flushset.rs`).
//!
//! A clean stop closes every store (written back and flushed: nothing acknowledged is lost),
//! then leaves the incarnation in the data directory; the next start takes it (removes the
//! file, durably, before the node serves) and keeps it, so a restart loses no flush; a start
//! that fails after taking it acknowledged nothing and puts it back (`Node::start`). Any other
//! start, after a crash, a kill, a store that did not close, or a mark that does not read
//! back, draws a new one. (A process killed with `kill -9` on a machine that keeps running
//! loses nothing the kernel took; counting it as a crash makes such a flush fail where it
//! need not, never succeed where it must not.)
//!
//! One line of text in file `stores-closed`:
//!
//! ```text
//! basalt-stores-closed v1 incarnation=<16 hex digits> crc=<8 hex digits>\n
//! ```
//!
//! `crc`: CRC-32C of the text before ` crc=`. Written like the clean-stop mark (`stopmark.rs`).

use crate::stopmark::{replace_file, sealed_line, take_file, unsealed};
use std::io;
use std::path::Path;

const FILE: &str = "stores-closed";
const TEMP: &str = "stores-closed.tmp";
const PREFIX: &str = "basalt-stores-closed v1 incarnation=";

/// The incarnation a clean stop left in data directory `dir` (taken: removed, durably), if
/// any that reads back; a node starting without one draws a [`fresh`] one.
pub(crate) fn take(dir: &Path) -> io::Result<Option<u64>> {
    Ok(take_file(dir, FILE)?.and_then(|bytes| parse(&String::from_utf8_lossy(&bytes))))
}

/// Leaves `incarnation` for the next start: call only once every store closed cleanly.
pub(crate) fn write(dir: &Path, incarnation: u64) -> io::Result<()> {
    let body = format!("{PREFIX}{incarnation:016x}");
    replace_file(dir, FILE, TEMP, &sealed_line(&body))
}

/// A new incarnation: never 0, unlike any earlier one.
pub(crate) fn fresh() -> u64 {
    basalt_types::unique_u64()
}

fn parse(text: &str) -> Option<u64> {
    u64::from_str_radix(unsealed(text)?.strip_prefix(PREFIX)?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_stop_keeps_the_incarnation_for_the_next_start_only() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(take(dir.path()).unwrap(), None, "no mark");
        let (first, second) = (fresh(), fresh());
        assert_ne!(first, second, "a new one each time");
        write(dir.path(), second).unwrap();
        assert_eq!(
            take(dir.path()).unwrap(),
            Some(second),
            "kept across a clean stop"
        );
        assert_eq!(take(dir.path()).unwrap(), None, "taken once");
        std::fs::write(dir.path().join(FILE), b"garbage\n").unwrap();
        assert_eq!(take(dir.path()).unwrap(), None);
        assert!(
            !dir.path().join(FILE).exists(),
            "an unreadable mark is taken too"
        );
    }

    #[test]
    fn a_damaged_mark_is_none() {
        let body = format!("{PREFIX}{:016x}", 0xabcu64);
        let good = format!("{body} crc={:08x}\n", crc32c::crc32c(body.as_bytes()));
        assert_eq!(parse(&good), Some(0xabc));
        assert_eq!(parse(&good.replace("abc", "abd")), None, "CRC");
        assert_eq!(parse(good.trim_end()), None, "torn: no newline");
    }
}
