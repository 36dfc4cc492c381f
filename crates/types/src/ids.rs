//! Typed identifiers. Each is a thin newtype so that a pool id cannot be passed where a volume id
//! is expected.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($inner:ty), $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id_type!(
    /// A pool: a protection scheme, a placement-group count and an object size.
    PoolId(u32), "pool."
);
id_type!(
    /// A volume (block device image). Unique in the cluster, never reused.
    VolumeId(u64), "vol."
);
id_type!(
    /// A storage node (one `basalt node` process).
    NodeId(u32), "node."
);
id_type!(
    /// A device (one store on one drive or file). Unique in the cluster.
    DeviceId(u32), "dev."
);
id_type!(
    /// The cluster-map epoch. Strictly increases with every published map; every data-path
    /// operation carries the epoch its sender used, and a node refuses stale ones.
    Epoch(u64), "e"
);

impl Epoch {
    /// The epoch that follows this one.
    pub fn next(self) -> Epoch {
        Epoch(self.0 + 1)
    }
}

/// The version of one change to an object (Ceph's "eversion"): the epoch of the placement-group
/// interval whose primary made the change, and a sequence number that primary assigned, strictly
/// increasing within its PG and interval. Ordered by epoch, then sequence, so a change made after
/// a failover (a later interval) is always newer than any change made before it, and two
/// primaries can never hand out the same version. `Version::NONE` (0.0) is "never written".
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Version {
    pub epoch: u64,
    pub seq: u64,
}

impl Version {
    /// The version of an object that has never been written.
    pub const NONE: Version = Version { epoch: 0, seq: 0 };

    pub const fn new(epoch: u64, seq: u64) -> Version {
        Version { epoch, seq }
    }

    /// The next version in the same interval.
    pub fn next(self) -> Version {
        Version {
            epoch: self.epoch,
            seq: self.seq.checked_add(1).expect("version sequence overflow"),
        }
    }

    pub fn is_none(self) -> bool {
        self == Version::NONE
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}", self.epoch, self.seq)
    }
}

/// A PG primary's term: the interval it serves and its peering round within that interval (a
/// primary peers again, in a new round, when a member fails a sub-operation). Members promise
/// terms and apply sub-operations of exactly the term they were activated in, so a primary of an
/// older term (or an older round of the same interval) gets no more acknowledgements. Ordered by
/// interval, then round.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Term {
    pub interval: Epoch,
    pub round: u64,
}

impl Term {
    /// Bits of a version's sequence number that count writes within one round; the round takes
    /// the bits above. So every round's versions are newer than every earlier round's, and a
    /// version is never handed out twice, even for a write an earlier round rolled back.
    pub const ROUND_SHIFT: u32 = 40;
    /// The largest round (above it the sequence number would not fit).
    pub const MAX_ROUND: u64 = (1 << (64 - Term::ROUND_SHIFT)) - 1;
    /// Writes one round can version.
    pub const WRITES_PER_ROUND: u64 = (1 << Term::ROUND_SHIFT) - 1;

    pub const fn new(interval: Epoch, round: u64) -> Term {
        Term { interval, round }
    }

    /// The version of the `n`-th write (from 1) of this term; `None` past the round's range or
    /// the largest round.
    pub fn version(self, n: u64) -> Option<Version> {
        if self.round > Term::MAX_ROUND || n > Term::WRITES_PER_ROUND {
            return None;
        }
        Some(Version::new(
            self.interval.0,
            (self.round << Term::ROUND_SHIFT) | n,
        ))
    }

    /// The version just below every write of this term (above every earlier term's): what
    /// peering decided before the term began.
    pub fn before(self) -> Version {
        Version::new(
            self.interval.0,
            self.round.min(Term::MAX_ROUND) << Term::ROUND_SHIFT,
        )
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}.{}", self.interval.0, self.round)
    }
}

/// A placement group: objects of one pool hash into `pg_count` groups, each mapped to an ordered
/// device set (first = primary).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct PgId {
    pub pool: PoolId,
    pub pg: u32,
}

impl fmt::Display for PgId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pg.{}.{}", self.pool.0, self.pg)
    }
}

/// An object: the `index`-th object-size piece of `volume` in `pool`.
///
/// Objects are the unit of placement (object -> PG -> devices), of versioning and of crash
/// atomicity (a write of any size up to the object size is all-or-nothing).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ObjectId {
    pub pool: PoolId,
    pub volume: VolumeId,
    pub index: u64,
}

impl ObjectId {
    pub fn new(pool: PoolId, volume: VolumeId, index: u64) -> Self {
        ObjectId {
            pool,
            volume,
            index,
        }
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "obj.{}.{}.{}", self.pool.0, self.volume.0, self.index)
    }
}

/// A random number, never 0, unlike any this function returned before in this process or
/// another: the OS's randomness (the random keys of std's hasher), the wall clock in
/// nanoseconds, the process id and a counter mixed. Ids of clients, incarnations of nodes: not
/// secret, only distinct.
pub fn unique_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let count = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut random = std::collections::hash_map::RandomState::new().build_hasher();
    random.write_u64(nanos ^ (u64::from(std::process::id()) << 40) ^ count.rotate_right(12));
    random.finish().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_rounds_version_above_earlier_ones() {
        let t0 = Term::new(Epoch(7), 0);
        let t1 = Term::new(Epoch(7), 1);
        let last_of_t0 = t0.version(Term::WRITES_PER_ROUND).unwrap();
        assert!(t1.version(1).unwrap() > last_of_t0);
        assert!(t0.version(1).unwrap() > Version::new(6, u64::MAX));
        assert!(Term::new(Epoch(8), 0).version(1).unwrap() > t1.version(5).unwrap());
        assert_eq!(t0.version(Term::WRITES_PER_ROUND + 1), None);
        assert_eq!(Term::new(Epoch(7), Term::MAX_ROUND + 1).version(1), None);
        let top = Term::new(Epoch(7), Term::MAX_ROUND).version(Term::WRITES_PER_ROUND);
        assert_eq!(top, Some(Version::new(7, u64::MAX)));
        // `before`: above every earlier round's writes, below every one of its own.
        assert!(t1.before() > last_of_t0);
        assert!(t1.before() < t1.version(1).unwrap());
        assert_eq!(t1.before(), t1.version(0).unwrap());
        assert!(t0.before() > Version::new(6, u64::MAX));
    }

    #[test]
    fn display_is_stable() {
        let oid = ObjectId::new(PoolId(1), VolumeId(7), 42);
        assert_eq!(oid.to_string(), "obj.1.7.42");
        assert_eq!(
            PgId {
                pool: PoolId(2),
                pg: 9
            }
            .to_string(),
            "pg.2.9"
        );
        assert_eq!(Epoch(5).next(), Epoch(6));
        assert_eq!(Version::NONE.next(), Version::new(0, 1));
        assert!(
            Version::new(2, 1) > Version::new(1, 900),
            "a later interval is newer"
        );
        assert_eq!(Version::new(3, 7).to_string(), "v3.7");
    }

    #[test]
    fn unique_numbers_differ_and_are_never_zero() {
        let seen: std::collections::BTreeSet<u64> = (0..10_000).map(|_| unique_u64()).collect();
        assert_eq!(seen.len(), 10_000);
        assert!(!seen.contains(&0));
    }
}
