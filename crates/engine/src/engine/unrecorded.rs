//! Versions an object reached here without a record of them: a write-zeroes or delete that
//! changed nothing (the object had no live data: `write.rs::noop`), or a tombstone the full
//! tombstone table forgot (`write.rs::reserve_tomb`). A write that follows such a version
//! (`WriteOptions::prior`) applies onto the copy as if the object were at it: the copy's content
//! is what that version left. In memory only, and bounded: a follower is sent while the write it
//! follows is in flight, so only recent versions matter; one forgotten here refuses its follower
//! (the primary's term ends and the client retries), never lets a wrong one through.

use crate::hash::FxHashMap;
use basalt_types::{ObjectId, Version};

/// Versions kept per generation; two generations are searched.
const KEPT: usize = 16384;

#[derive(Default)]
pub(crate) struct Unrecorded {
    new: FxHashMap<ObjectId, Version>,
    old: FxHashMap<ObjectId, Version>,
}

impl Unrecorded {
    pub fn note(&mut self, oid: ObjectId, version: Version) {
        if self.new.len() >= KEPT {
            self.old = std::mem::take(&mut self.new);
        }
        self.new.insert(oid, version);
    }

    /// Whether `oid` reached `version` here without a record of it.
    pub fn reached(&self, oid: &ObjectId, version: Version) -> bool {
        self.new.get(oid) == Some(&version) || self.old.get(oid) == Some(&version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_types::{PoolId, VolumeId};

    #[test]
    fn keeps_the_recent_versions_and_forgets_older_generations() {
        let oid = |i| ObjectId::new(PoolId(1), VolumeId(1), i);
        let mut u = Unrecorded::default();
        u.note(oid(0), Version::new(1, 1));
        assert!(u.reached(&oid(0), Version::new(1, 1)));
        assert!(!u.reached(&oid(0), Version::new(1, 2)));
        assert!(!u.reached(&oid(1), Version::new(1, 1)));
        for i in 1..=KEPT as u64 {
            u.note(oid(i), Version::new(1, i));
        }
        assert!(
            u.reached(&oid(0), Version::new(1, 1)),
            "one generation back"
        );
        for i in 0..KEPT as u64 {
            u.note(oid(i + 100_000), Version::new(2, i));
        }
        assert!(
            !u.reached(&oid(0), Version::new(1, 1)),
            "two generations back"
        );
        assert!(u.reached(&oid(100_000), Version::new(2, 0)));
    }
}
