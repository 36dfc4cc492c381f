//! What a member persists about a PG, in the store's PG record (96 bytes, written in journal
//! order with the data it describes): the last interval it was activated in that served I/O,
//! the last it was activated in at all, how far it is known complete, and its backfill state.
//!
//! ```text
//!  0  8  les: epoch of the last interval this member was activated in with the PG active
//!        (at least min_size members serving; 0: never)
//!  8 16  last complete: every object whose authoritative version is at or below this is
//!        current here (epoch u64, seq u64)
//! 24  1  flags: bit 0 = a backfill is in progress on this member; bit 1 = suspect: the
//!        store dropped journal records of this PG as a torn tail when it last opened, so it
//!        may lack writes it acknowledged (kept until it holds every authoritative version
//!        again: activated with nothing missing, or recovered, by a primary that queried it
//!        since it opened)
//! 25  7  zero
//! 32 20  backfill cursor: objects up to and including it are current (pool u32, volume u64,
//!        index u64)
//! 52  1  1 = the cursor is set; 0 = nothing copied yet
//! 53  3  zero
//! 56 16  backfill term: the term (interval u64, round u64) of the primary that runs it; a
//!        primary of another term starts the backfill over
//! 72  8  activated: epoch of the last interval this member was activated in, one below
//!        min_size included (0 in records written before this field: read as `les`)
//! 80 16  zero
//! ```
//!
//! An interval below `min_size` serves no I/O, so its peering's decisions are not final: it
//! raises `activated` (the floor of the member's promises after a restart) but not `les` or
//! `last_complete`, which make later peerings trust what the member holds (`authority.rs`).
//! A backfill that completes in such an interval does raise both on its target
//! (`backfill.rs`), to the interval, which the history does not record: a later peering then
//! trusts the target's copies from before it (rule 2) and takes it as a source; witnesses of
//! the history's intervals are counted without it (`peering.rs::complete_after`). A known gap
//! (docs/design/failure-model.md).

use basalt_engine::PG_BLOB;
use basalt_types::{Epoch, ObjectId, PoolId, Term, Version, VolumeId};
use serde::{Deserialize, Serialize};

/// A member's persisted knowledge of one PG.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MemberInfo {
    pub les: Epoch,
    pub last_complete: Version,
    pub backfill: Option<Backfill>,
    /// The last interval this member was activated in, below `min_size` or not (>= `les`).
    #[serde(default)]
    pub activated: Epoch,
    /// The store may lack writes of this PG it acknowledged (a journal tail dropped at open,
    /// `basalt_engine::ReplayCut`): what it lacks proves nothing (`authority.rs`).
    #[serde(default)]
    pub suspect: bool,
}

/// A backfill in progress on a member that joined the up set without the PG's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Backfill {
    pub term: Term,
    /// Objects up to and including this one are current (None: none yet).
    pub cursor: Option<ObjectId>,
}

const FLAG_BACKFILL: u8 = 1;
const FLAG_SUSPECT: u8 = 2;

impl MemberInfo {
    pub fn encode(&self) -> [u8; PG_BLOB] {
        let mut b = [0u8; PG_BLOB];
        b[0..8].copy_from_slice(&self.les.0.to_le_bytes());
        b[8..16].copy_from_slice(&self.last_complete.epoch.to_le_bytes());
        b[16..24].copy_from_slice(&self.last_complete.seq.to_le_bytes());
        if self.suspect {
            b[24] |= FLAG_SUSPECT;
        }
        if let Some(bf) = &self.backfill {
            b[24] |= FLAG_BACKFILL;
            if let Some(c) = bf.cursor {
                b[32..36].copy_from_slice(&c.pool.0.to_le_bytes());
                b[36..44].copy_from_slice(&c.volume.0.to_le_bytes());
                b[44..52].copy_from_slice(&c.index.to_le_bytes());
                b[52] = 1;
            }
            b[56..64].copy_from_slice(&bf.term.interval.0.to_le_bytes());
            b[64..72].copy_from_slice(&bf.term.round.to_le_bytes());
        }
        b[72..80].copy_from_slice(&self.activated.0.to_le_bytes());
        b
    }

    /// The newest interval this member was activated in: no primary of an older one may use it.
    pub fn promised_floor(&self) -> Epoch {
        self.les.max(self.activated)
    }

    pub fn decode(b: &[u8; PG_BLOB]) -> MemberInfo {
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let backfill = (b[24] & FLAG_BACKFILL != 0).then(|| Backfill {
            term: Term::new(Epoch(u64_at(56)), u64_at(64)),
            cursor: (b[52] == 1)
                .then(|| ObjectId::new(PoolId(u32_at(32)), VolumeId(u64_at(36)), u64_at(44))),
        });
        let les = Epoch(u64_at(0));
        MemberInfo {
            les,
            last_complete: Version::new(u64_at(8), u64_at(16)),
            backfill,
            activated: les.max(Epoch(u64_at(72))),
            suspect: b[24] & FLAG_SUSPECT != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let oid = ObjectId::new(PoolId(3), VolumeId(u64::MAX), 7);
        for info in [
            MemberInfo::default(),
            MemberInfo {
                les: Epoch(9),
                last_complete: Version::new(8, 77),
                backfill: None,
                activated: Epoch(9),
                suspect: false,
            },
            MemberInfo {
                les: Epoch(9),
                last_complete: Version::new(8, 77),
                backfill: None,
                activated: Epoch(14),
                suspect: true,
            },
            MemberInfo {
                les: Epoch(9),
                last_complete: Version::NONE,
                backfill: Some(Backfill {
                    term: Term::new(Epoch(12), 3),
                    cursor: None,
                }),
                activated: Epoch(12),
                suspect: false,
            },
            MemberInfo {
                les: Epoch(1),
                last_complete: Version::new(1, 1),
                backfill: Some(Backfill {
                    term: Term::new(Epoch(12), u64::MAX),
                    cursor: Some(oid),
                }),
                activated: Epoch(12),
                suspect: true,
            },
        ] {
            assert_eq!(MemberInfo::decode(&info.encode()), info);
        }
        // A PG never set reads as nothing known.
        assert_eq!(MemberInfo::decode(&[0; PG_BLOB]), MemberInfo::default());
        // A record written before `activated` existed reads it as `les`.
        let mut old = MemberInfo {
            les: Epoch(7),
            last_complete: Version::new(7, 3),
            backfill: None,
            activated: Epoch(7),
            suspect: false,
        }
        .encode();
        old[72..80].fill(0);
        assert_eq!(MemberInfo::decode(&old).activated, Epoch(7));
    }
}
