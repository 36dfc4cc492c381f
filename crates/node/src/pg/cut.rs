//! Marking what a journal tail its store dropped (`basalt_engine::ReplayCut`) may have lost,
//! durably, as soon as the store is open ([`mark`]: `devices.rs` right after the open, again at
//! `Pgs::load`; nothing is marked twice): the store erased the dropped records when it opened,
//! so a node that stopped before the marks were written (say it could not reach the metadata
//! store, or bind its address) would forget the cut.
//!
//! - A PG the cut names (or every PG, when it names none) that has a record on the device is
//!   marked **suspect** in it (`info.rs`): it may lack writes it acknowledged.
//! - A PG it holds **no record of** may have lost its first record on this device (an
//!   activation it acknowledged) with every write after it; it would answer peering as a
//!   device that never took part (`les` 0), which is proof that the intervals it was a member
//!   of never went active (`authority.rs`): an acknowledged write rolled back. When the cut
//!   names its PGs, each of them without a record gets a suspect record; when it does not
//!   (the chain broke at a damaged record and what followed was not read), the device keeps a
//!   **note**: every PG it has no record of starts suspect, after a restart too, until its
//!   first record (written when a primary activates it) says otherwise.
//!
//! The note lives in the store's PG table under the reserved PG [`NOTE_PG`] (pool 0, which no
//! pool has: pool ids start at 1), so it stays with the device and is checksummed with the
//! table:
//!
//! ```text
//!  0  8  magic "BSLTNOTE"
//!  8  1  version (1)
//!  9  1  flags: bit 0 = a PG without a record on this device is suspect
//! 10  6  zero
//! 16  8  the first journal record the store dropped when the note was written
//! 24 72  zero
//! ```
//!
//! The note is never removed: a PG first placed on the device later starts suspect too, which
//! costs nothing but its power as a witness until its first activation with nothing missing.

use super::info::MemberInfo;
use basalt_engine::{EngineError, PG_BLOB, ReplayCut, Store};
use basalt_types::{PgId, PoolId};
use std::collections::BTreeSet;

/// Persists the marks the cut of `store`'s last open asks for (none without a cut); returns
/// whether the device's note makes PGs without a record suspect.
pub(crate) async fn mark(store: &Store) -> Result<bool, EngineError> {
    let dev = store.info().device_id;
    let cut = store.info().replay_cut.clone();
    let mut recorded = BTreeSet::new();
    let mut noted = false;
    for p in store.pgs().await? {
        if !p.has_record {
            continue;
        }
        if p.pg == NOTE_PG {
            noted = Note::decode(&p.blob)
                .ok_or_else(|| {
                    EngineError::Corrupt(format!(
                        "device {dev}: the device note (PG record {NOTE_PG}) is not in a \
                         format this build knows"
                    ))
                })?
                .unknown_suspect;
            continue;
        }
        recorded.insert(p.pg);
        let mut info = MemberInfo::decode(&p.blob);
        let hit = cut.as_ref().is_some_and(|c| {
            c.pgs
                .as_ref()
                .is_none_or(|pgs| pgs.contains(&(p.pg.pool, p.pg.pg)))
        });
        if hit && !info.suspect {
            info.suspect = true;
            store.set_pg(p.pg, Some(info.encode()), true).await?;
            tracing::warn!(pg = %p.pg, device = %dev, "the store dropped journal records of this PG as a torn tail: suspect until a peering brings it up to date (what it lacks proves nothing)");
        }
    }
    let Some(cut) = &cut else { return Ok(noted) };
    match unrecorded(cut, &recorded) {
        Unrecorded::Mark(pgs) => {
            for pg in pgs {
                let info = MemberInfo {
                    suspect: true,
                    ..MemberInfo::default()
                };
                store.set_pg(pg, Some(info.encode()), true).await?;
                tracing::warn!(%pg, device = %dev, "the store dropped journal records of this PG, which it holds no other record of, as a torn tail: suspect until a peering brings it up to date");
            }
        }
        Unrecorded::All if !noted => {
            let n = Note {
                unknown_suspect: true,
                cut_seq: cut.seq,
            };
            store.set_pg(NOTE_PG, Some(n.encode()), true).await?;
            tracing::warn!(device = %dev, "the store dropped journal records it could not read as a torn tail: every PG this device holds no record of is suspect from now on");
            noted = true;
        }
        Unrecorded::All => {}
    }
    Ok(noted)
}

/// The reserved PG whose record is the device note.
pub(crate) const NOTE_PG: PgId = PgId {
    pool: PoolId(0),
    pg: 0,
};

const MAGIC: &[u8; 8] = b"BSLTNOTE";
const VERSION: u8 = 1;
const FLAG_UNKNOWN_SUSPECT: u8 = 1;

/// The device note.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Note {
    /// PGs without a record on the device are suspect.
    pub unknown_suspect: bool,
    /// The first journal record dropped by the cut that wrote the note.
    pub cut_seq: u64,
}

impl Note {
    pub fn encode(&self) -> [u8; PG_BLOB] {
        let mut b = [0u8; PG_BLOB];
        b[0..8].copy_from_slice(MAGIC);
        b[8] = VERSION;
        if self.unknown_suspect {
            b[9] |= FLAG_UNKNOWN_SUSPECT;
        }
        b[16..24].copy_from_slice(&self.cut_seq.to_le_bytes());
        b
    }

    /// The note in `b`; `None` when `b` is not one (a format this build does not know is
    /// refused by the caller: it cannot tell what the device must remember).
    pub fn decode(b: &[u8; PG_BLOB]) -> Option<Note> {
        if &b[0..8] != MAGIC || b[8] != VERSION {
            return None;
        }
        Some(Note {
            unknown_suspect: b[9] & FLAG_UNKNOWN_SUSPECT != 0,
            cut_seq: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
        })
    }
}

/// What a cut asks of the PGs a device holds no record of.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unrecorded {
    /// These PGs get a suspect record.
    Mark(Vec<PgId>),
    /// Every PG without a record is suspect (the device note).
    All,
}

/// The PGs of `cut` that `recorded` (PGs with a record on the device) lacks.
pub(crate) fn unrecorded(cut: &ReplayCut, recorded: &BTreeSet<PgId>) -> Unrecorded {
    let Some(pgs) = &cut.pgs else {
        return Unrecorded::All;
    };
    Unrecorded::Mark(
        pgs.iter()
            .map(|&(pool, pg)| PgId { pool, pg })
            .filter(|p| *p != NOTE_PG && !recorded.contains(p))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(pool: u32, pg: u32) -> PgId {
        PgId {
            pool: PoolId(pool),
            pg,
        }
    }

    #[test]
    fn a_note_round_trips_and_nothing_else_reads_as_one() {
        let n = Note {
            unknown_suspect: true,
            cut_seq: 0x1234_5678_9abc,
        };
        assert_eq!(Note::decode(&n.encode()), Some(n));
        assert_eq!(Note::decode(&[0; PG_BLOB]), None);
        let mut other = n.encode();
        other[8] = VERSION + 1;
        assert_eq!(Note::decode(&other), None);
    }

    #[test]
    fn only_pgs_without_a_record_are_marked_and_an_unknown_cut_marks_all() {
        let cut = ReplayCut {
            seq: 9,
            pgs: Some([(PoolId(1), 3), (PoolId(1), 5), (PoolId(2), 0)].into()),
        };
        let recorded: BTreeSet<PgId> = [pg(1, 3), pg(1, 4)].into();
        assert_eq!(
            unrecorded(&cut, &recorded),
            Unrecorded::Mark(vec![pg(1, 5), pg(2, 0)])
        );
        let all = ReplayCut { seq: 9, pgs: None };
        assert_eq!(unrecorded(&all, &recorded), Unrecorded::All);
    }
}

#[cfg(test)]
#[path = "cut_tests.rs"]
mod load_tests;
