//! Versions an object reached here without a record of them: a write-zeroes or delete that
//! changed nothing (the object had no live data: `write.rs::noop`), or a tombstone the full
//! tombstone table forgot (`write.rs::reserve_tomb`). A write that follows such a version
//! (`WriteOptions::prior`) applies onto the copy as if the object were at it: the copy's content
//! is what that version left. In memory only, and bounded: a follower is sent while the write it
//! follows is in flight, so only recent versions matter; one forgotten here refuses its follower
//! (the primary's term ends and the client retries), never lets a wrong one through. Each
//! version is kept with the one the object was left at (its record's): it counts only while the
//! object is still there.

use crate::hash::FxHashMap;
use basalt_types::{ObjectId, Version};

/// Versions kept per generation; two generations are searched.
const KEPT: usize = 16384;

#[derive(Default)]
pub(crate) struct Unrecorded {
    new: FxHashMap<ObjectId, (Version, Version)>,
    old: FxHashMap<ObjectId, (Version, Version)>,
}

impl Unrecorded {
    /// `oid` reached `version` here, recorded as `left` (its current version from then on).
    pub fn note(&mut self, oid: ObjectId, version: Version, left: Version) {
        if self.new.len() >= KEPT {
            self.old = std::mem::take(&mut self.new);
        }
        self.new.insert(oid, (version, left));
    }

    /// Whether `oid`, now at `current`, reached `version` here without a record of it.
    pub fn reached(&self, oid: &ObjectId, version: Version, current: Version) -> bool {
        let at = Some(&(version, current));
        self.new.get(oid) == at || self.old.get(oid) == at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_types::{PoolId, VolumeId};

    #[test]
    fn keeps_the_recent_versions_while_the_object_stays_and_forgets_older_generations() {
        let oid = |i| ObjectId::new(PoolId(1), VolumeId(1), i);
        let mut u = Unrecorded::default();
        let none = Version::NONE;
        u.note(oid(0), Version::new(1, 1), none);
        assert!(u.reached(&oid(0), Version::new(1, 1), none));
        assert!(!u.reached(&oid(0), Version::new(1, 2), none));
        assert!(!u.reached(&oid(1), Version::new(1, 1), none));
        assert!(
            !u.reached(&oid(0), Version::new(1, 1), Version::new(1, 3)),
            "the object changed since"
        );
        for i in 1..=KEPT as u64 {
            u.note(oid(i), Version::new(1, i), none);
        }
        assert!(
            u.reached(&oid(0), Version::new(1, 1), none),
            "one generation back"
        );
        for i in 0..KEPT as u64 {
            u.note(oid(i + 100_000), Version::new(2, i), none);
        }
        assert!(
            !u.reached(&oid(0), Version::new(1, 1), none),
            "two generations back"
        );
        assert!(u.reached(&oid(100_000), Version::new(2, 0), none));
    }
}
