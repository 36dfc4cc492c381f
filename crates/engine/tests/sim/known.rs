//! Engine bugs the simulator found that are not fixed yet (docs/design/simulation.md, "Known
//! engine bugs"). By default the harness steers around each one so the suite stays green;
//! `SIM_KNOWN_BUGS=<name>[,<name>...]` (or `all`) lets the seeds reach them again, and the
//! ignored `known_bug_*` tests replay one seed of each.

/// Which known bugs the seeds may reach.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KnownBugs {
    /// "same-record": a whole-object write and later operations on the same object in one
    /// journal record. Both bugs found there are fixed (`verify_tail` and `full_data_done`);
    /// the steering stays only because "excused-cut" relies on the same barrier.
    pub same_record: bool,
    /// "excused-cut": `verify_tail` excuses blocks of a whole-object write that later records
    /// rewrote, also when it then cuts those records itself (their own whole-object data is not
    /// on disk). It keeps the first record although its data is not on disk either: after the
    /// crash the object reads as checksum errors. Steered around by keeping the barrier of a
    /// whole-object write until it is durable (a flush follows a non-durable one).
    pub excused_cut: bool,
    /// "media-loss": a bit flip on a crash image whose journal holds records (in the slot of a
    /// recent whole-object write, or in a record) makes recovery cut the journal there; a flip
    /// in the newest journal header makes it start from the older one and replay stale records.
    /// Acknowledged durable writes vanish without an error, deleted objects come back, objects
    /// show states that never existed. Steered around by flipping bits only in slots, and only
    /// on an image whose journal write-back has emptied.
    pub media_loss: bool,
    /// "meta-rollback": a bit flip in the newest copy of a slot-table page makes recovery use
    /// the older copy: objects lose acknowledged writes or show states that never existed.
    /// Steered around by not flipping bits in slot-table pages (read errors there are fine).
    pub meta_rollback: bool,
}

impl KnownBugs {
    /// From `SIM_KNOWN_BUGS`.
    pub fn from_env() -> KnownBugs {
        let v = std::env::var("SIM_KNOWN_BUGS").unwrap_or_default();
        let on = |name: &str| v.split(',').any(|x| x.trim() == name || x.trim() == "all");
        KnownBugs {
            same_record: on("same-record"),
            excused_cut: on("excused-cut"),
            media_loss: on("media-loss"),
            meta_rollback: on("meta-rollback"),
        }
    }
}
