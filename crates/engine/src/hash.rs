//! A fast, non-cryptographic hasher for the I/O thread's maps keyed by object id (the FxHash
//! scheme: rotate, xor, multiply per word). The keys are not chosen by an attacker who could
//! gain from collisions: object ids come from the node, which already authorised the request.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` using [`FxHasher`].
pub(crate) type FxHashMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

const SEED: u64 = 0xf135_7aea_2e62_a9c5;

#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash ^ word).wrapping_mul(SEED).rotate_left(20);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(last));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // hashbrown takes the bucket from the low bits and a tag from the top 7: one more
        // multiply spreads every input bit over both.
        (self.hash ^ (self.hash >> 29)).wrapping_mul(SEED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_types::{ObjectId, PoolId, VolumeId};
    use std::collections::HashSet;
    use std::hash::{BuildHasher, Hash};

    fn h<T: Hash>(v: &T) -> u64 {
        BuildHasherDefault::<FxHasher>::default().hash_one(v)
    }

    /// Sequential object ids (the common case: one volume's objects) spread over buckets and
    /// tags; equal keys hash equally.
    #[test]
    fn sequential_ids_spread() {
        let ids: Vec<ObjectId> = (0..4096)
            .map(|i| ObjectId::new(PoolId(1), VolumeId(7), i))
            .collect();
        assert_eq!(h(&ids[5]), h(&ObjectId::new(PoolId(1), VolumeId(7), 5)));
        let low: HashSet<u64> = ids.iter().map(|o| h(o) & 4095).collect();
        let tags: HashSet<u64> = ids.iter().map(|o| h(o) >> 57).collect();
        assert!(
            low.len() > 2400,
            "only {} of 4096 low-bit buckets used",
            low.len()
        );
        assert_eq!(tags.len(), 128, "top-7-bit tags not all used");
        let mut m: FxHashMap<ObjectId, u64> = FxHashMap::default();
        for (i, o) in ids.iter().enumerate() {
            m.insert(*o, i as u64);
        }
        assert_eq!(m[&ids[4000]], 4000);
    }
}
