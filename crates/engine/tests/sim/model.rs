//! The reference model: one object's bytes, allocated blocks, version and whether it is a
//! tombstone, and the history of states it goes through as its operations apply in arrival
//! order. Versions are `Version { epoch: 0, seq }`: the model keeps `seq`.

pub const BLK: usize = 4096;

/// What an operation does to an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    Write {
        off: usize,
        data: Vec<u8>,
    },
    /// Write-zeroes; `trim` says which entry point was used (same semantics).
    Zero {
        off: usize,
        len: usize,
        trim: bool,
    },
    Delete,
}

impl OpKind {
    pub fn code(&self) -> u64 {
        match self {
            OpKind::Write { .. } => 1,
            OpKind::Zero { trim: false, .. } => 2,
            OpKind::Zero { trim: true, .. } => 3,
            OpKind::Delete => 4,
        }
    }

    pub fn range(&self) -> (usize, usize) {
        match self {
            OpKind::Write { off, data } => (*off, data.len()),
            OpKind::Zero { off, len, .. } => (*off, *len),
            OpKind::Delete => (0, 0),
        }
    }

    pub fn short(&self) -> String {
        match self {
            OpKind::Write { off, data } => format!("W{off}+{}", data.len()),
            OpKind::Zero { off, len, trim } => {
                format!("{}{off}+{len}", if *trim { "T" } else { "Z" })
            }
            OpKind::Delete => "D".into(),
        }
    }
}

/// One object's model state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjState {
    pub data: Vec<u8>,
    pub alloc: Vec<bool>,
    /// 0: never written (unknown to the store).
    pub version: u64,
    /// A tombstone: deleted, its version kept so a re-created object is newer.
    pub deleted: bool,
}

impl ObjState {
    pub fn empty(size: usize) -> ObjState {
        ObjState {
            data: vec![0; size],
            alloc: vec![false; size / BLK],
            version: 0,
            deleted: false,
        }
    }

    /// The tombstone a delete at `version` leaves.
    fn tombstone(&self, version: u64) -> ObjState {
        ObjState {
            version,
            deleted: true,
            ..ObjState::empty(self.data.len())
        }
    }

    pub fn exists(&self) -> bool {
        self.version > 0 && !self.deleted
    }

    /// Applies `op` with an optional explicit version. Returns the new state and the version
    /// the store answers, or `None` when the store must refuse it as stale (no effect).
    pub fn apply(&self, op: &OpKind, explicit: Option<u64>) -> (ObjState, Option<u64>) {
        if explicit.is_some_and(|v| v <= self.version) {
            return (self.clone(), None);
        }
        let next = explicit.unwrap_or(self.version + 1);
        let mut s = self.clone();
        match op {
            OpKind::Write { off, data } => {
                s.data[*off..off + data.len()].copy_from_slice(data);
                for b in off / BLK..=(off + data.len() - 1) / BLK {
                    s.alloc[b] = true;
                }
                s.version = next;
                s.deleted = false;
                (s, Some(next))
            }
            OpKind::Zero { off, len, .. } => {
                if !s.exists() {
                    // Zeroing an object that does not exist (or is deleted) changes nothing;
                    // answers its current version.
                    return (s, Some(self.version));
                }
                s.data[*off..off + len].fill(0);
                for b in off / BLK..=(off + len - 1) / BLK {
                    if b * BLK >= *off && (b + 1) * BLK <= off + len {
                        s.alloc[b] = false;
                    }
                }
                s.version = next;
                if !s.alloc.iter().any(|a| *a) {
                    // Nothing allocated is left: the object becomes a tombstone.
                    return (self.tombstone(next), Some(next));
                }
                (s, Some(next))
            }
            // Deleting an object the store never knew changes nothing; a tombstone gets a new
            // version.
            OpKind::Delete if self.version == 0 => (s, Some(0)),
            OpKind::Delete => (self.tombstone(next), Some(next)),
        }
    }
}

/// What a recovered (or live) store shows for one object: each 4 KiB block's data or the error
/// reading it, the version (0 = absent) and whether it is a tombstone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub blocks: Vec<Result<Vec<u8>, String>>,
    pub version: u64,
    pub deleted: bool,
}

impl Observed {
    pub fn errors(&self) -> usize {
        self.blocks.iter().filter(|b| b.is_err()).count()
    }

    /// Does the observed object equal `s`, blocks that could not be read aside?
    pub fn matches(&self, s: &ObjState) -> bool {
        self.version == s.version
            && self.deleted == s.deleted
            && self.blocks.iter().enumerate().all(|(i, b)| {
                b.as_ref().is_err() || b.as_deref() == Ok(&s.data[i * BLK..(i + 1) * BLK])
            })
    }

    /// Two observations agree where both could be read.
    pub fn agrees(&self, other: &Observed) -> bool {
        self.version == other.version
            && self.deleted == other.deleted
            && self
                .blocks
                .iter()
                .zip(&other.blocks)
                .all(|(a, b)| a.is_err() || b.is_err() || a == b)
    }
}

/// The states one object goes through: `states[k]` is the object after its first `k`
/// operations in arrival order (refused ones change nothing).
pub struct History {
    pub states: Vec<ObjState>,
}

impl History {
    pub fn new(size: usize) -> History {
        History {
            states: vec![ObjState::empty(size)],
        }
    }

    pub fn last(&self) -> &ObjState {
        self.states.last().expect("never empty")
    }

    /// Appends the state after `op`; returns the version the store must answer (`None`:
    /// stale).
    pub fn push(&mut self, op: &OpKind, explicit: Option<u64>) -> Option<u64> {
        let (next, reply) = self.last().apply(op, explicit);
        self.states.push(next);
        reply
    }

    /// For failure messages: the states with the observed version and the blocks that differ
    /// from each.
    pub fn explain(&self, obs: &Observed) -> String {
        let mut out = Vec::new();
        for (k, st) in self.states.iter().enumerate() {
            if st.version != obs.version {
                continue;
            }
            let bad: Vec<usize> = obs
                .blocks
                .iter()
                .enumerate()
                .filter(|(i, b)| {
                    b.as_deref()
                        .is_ok_and(|d| d != &st.data[i * BLK..(i + 1) * BLK])
                })
                .map(|(i, _)| i)
                .collect();
            out.push(format!("state {k}: blocks {bad:?} differ"));
        }
        let errs: Vec<usize> = (0..obs.blocks.len())
            .filter(|&i| obs.blocks[i].is_err())
            .collect();
        format!("{}; unreadable blocks {errs:?}", out.join(", "))
    }

    /// The highest `k >= must` whose state `obs` matches.
    pub fn matching_prefix(&self, obs: &Observed, must: usize) -> Option<usize> {
        (must..self.states.len())
            .rev()
            .find(|&k| obs.matches(&self.states[k]))
    }
}
