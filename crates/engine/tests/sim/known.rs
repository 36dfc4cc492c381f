//! Engine bugs the simulator found that are not fixed yet (docs/design/simulation.md, "Known
//! engine bugs"). By default the harness steers around each one so the suite stays green;
//! `SIM_KNOWN_BUGS=<name>[,<name>...]` (or `all`) lets the seeds reach them again, and the
//! ignored `known_bug_*` tests replay one seed of each.

/// Which known bugs the seeds may reach.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KnownBugs {
    /// "media-loss": a bit flip on a crash image whose journal holds records (in the slot of a
    /// recent whole-object write, or in a record) makes recovery cut the journal there; a flip
    /// in the newest journal header makes it start from the older one and replay stale records.
    /// Acknowledged durable writes vanish without an error, deleted objects come back, objects
    /// show states that never existed. Steered around by flipping bits only in slots, and only
    /// on an image whose journal write-back has emptied.
    pub media_loss: bool,
}

impl KnownBugs {
    /// From `SIM_KNOWN_BUGS`.
    pub fn from_env() -> KnownBugs {
        let v = std::env::var("SIM_KNOWN_BUGS").unwrap_or_default();
        let on = |name: &str| v.split(',').any(|x| x.trim() == name || x.trim() == "all");
        KnownBugs {
            media_loss: on("media-loss"),
        }
    }
}
