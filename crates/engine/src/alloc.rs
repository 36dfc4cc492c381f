//! Allocation of slots and of tombstone records, without scanning the whole device.
//!
//! [`FreeBits`] is a two-level bitmap of free indices: a summary word per 64 bitmap words, so
//! finding a free index from a cursor touches at most a few words of each level (next-fit keeps
//! objects written one after another in consecutive slots).
//!
//! [`SlotAlloc`] adds the slot life cycle: a slot is FREE (allocatable), CLAIMED (used by a live
//! object) or in LIMBO (released by a live object, but the release is not yet written back to
//! the slot table; it must not be reused before, or a crash could replay old records onto new
//! data). Every transition is checked: a wrong one is a bug that would corrupt data, so it stops
//! the store (`assert!`, kept in release builds).

/// Free indices in a two-level bitmap.
#[derive(Clone, Debug)]
pub(crate) struct FreeBits {
    /// Bit i of word w: index 64w + i is free.
    words: Vec<u64>,
    /// Bit j of summary word s: words[64s + j] has a free bit.
    summary: Vec<u64>,
    len: u64,
    free: u64,
    cursor: u64,
}

impl FreeBits {
    /// `len` indices, all free.
    pub fn all_free(len: u64) -> FreeBits {
        let nwords = len.div_ceil(64) as usize;
        let mut words = vec![u64::MAX; nwords];
        if !len.is_multiple_of(64)
            && let Some(last) = words.last_mut()
        {
            *last = (1u64 << (len % 64)) - 1;
        }
        let mut f = FreeBits {
            summary: vec![0; nwords.div_ceil(64)],
            words,
            len,
            free: len,
            cursor: 0,
        };
        for w in 0..nwords {
            f.sync_summary(w);
        }
        f
    }

    pub fn free(&self) -> u64 {
        self.free
    }

    pub fn is_free(&self, i: u64) -> bool {
        self.words[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    fn sync_summary(&mut self, w: usize) {
        let bit = 1u64 << (w % 64);
        if self.words[w] != 0 {
            self.summary[w / 64] |= bit;
        } else {
            self.summary[w / 64] &= !bit;
        }
    }

    /// Marks `i` used. It must be free.
    pub fn take_at(&mut self, i: u64) {
        assert!(i < self.len && self.is_free(i), "index {i} is not free");
        let w = (i / 64) as usize;
        self.words[w] &= !(1 << (i % 64));
        self.sync_summary(w);
        self.free -= 1;
    }

    /// Marks `i` free. It must be used.
    pub fn put(&mut self, i: u64) {
        assert!(
            i < self.len && !self.is_free(i),
            "index {i} is already free"
        );
        let w = (i / 64) as usize;
        self.words[w] |= 1 << (i % 64);
        self.sync_summary(w);
        self.free += 1;
    }

    /// Takes the first free index at or after the cursor (wrapping), next-fit.
    pub fn take(&mut self) -> Option<u64> {
        if self.free == 0 {
            return None;
        }
        let i = self
            .find_from(self.cursor)
            .or_else(|| self.find_from(0))
            .expect("free count says an index is free");
        self.take_at(i);
        self.cursor = i + 1;
        Some(i)
    }

    /// The first free index >= `from`.
    fn find_from(&self, from: u64) -> Option<u64> {
        if from >= self.len {
            return None;
        }
        let w = (from / 64) as usize;
        let masked = self.words[w] & (u64::MAX << (from % 64));
        if masked != 0 {
            return Some(w as u64 * 64 + u64::from(masked.trailing_zeros()));
        }
        // Next word with a free bit, through the summary.
        let start = w + 1;
        let mut s = start / 64;
        let mut mask = if start.is_multiple_of(64) {
            u64::MAX
        } else {
            u64::MAX << (start % 64)
        };
        while s < self.summary.len() {
            let bits = self.summary[s] & mask;
            if bits != 0 {
                let word = s * 64 + bits.trailing_zeros() as usize;
                let b = self.words[word].trailing_zeros();
                return Some(word as u64 * 64 + u64::from(b));
            }
            s += 1;
            mask = u64::MAX;
        }
        None
    }
}

const FREE: u8 = 0;
const CLAIMED: u8 = 1;
const LIMBO: u8 = 2;

/// The slot allocator (see the module doc for the life cycle).
pub(crate) struct SlotAlloc {
    state: Vec<u8>,
    bits: FreeBits,
    pub claimed: u64,
    pub limbo: u64,
}

impl SlotAlloc {
    pub fn new(slots: u32) -> SlotAlloc {
        SlotAlloc {
            state: vec![FREE; slots as usize],
            bits: FreeBits::all_free(u64::from(slots)),
            claimed: 0,
            limbo: 0,
        }
    }

    pub fn free(&self) -> u64 {
        self.bits.free()
    }

    /// Takes a free slot.
    pub fn take(&mut self) -> Option<u32> {
        let s = self.bits.take()? as u32;
        assert_eq!(self.state[s as usize], FREE, "slot {s} handed out twice");
        self.state[s as usize] = CLAIMED;
        self.claimed += 1;
        Some(s)
    }

    /// A live object stopped using `s`.
    pub fn release(&mut self, s: u32) {
        assert_eq!(
            self.state[s as usize], CLAIMED,
            "slot {s} released but not claimed"
        );
        self.state[s as usize] = LIMBO;
        self.claimed -= 1;
        self.limbo += 1;
    }

    /// The slot table durably records `s` as free: it may be reused.
    pub fn written_back_free(&mut self, s: u32) {
        assert_eq!(
            self.state[s as usize], LIMBO,
            "slot {s} freed by write-back but not in limbo"
        );
        self.state[s as usize] = FREE;
        self.limbo -= 1;
        self.bits.put(u64::from(s));
    }

    /// Rebuilds the allocator after recovery.
    pub fn rebuild(
        slots: u32,
        claimed: impl Fn(u32) -> bool,
        limbo: impl Fn(u32) -> bool,
    ) -> SlotAlloc {
        let mut a = SlotAlloc::new(slots);
        for s in 0..slots {
            if claimed(s) {
                a.state[s as usize] = CLAIMED;
                a.claimed += 1;
                a.bits.take_at(u64::from(s));
            } else if limbo(s) {
                a.state[s as usize] = LIMBO;
                a.limbo += 1;
                a.bits.take_at(u64::from(s));
            }
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_bits_next_fit_wraps_and_counts() {
        let mut f = FreeBits::all_free(200);
        assert_eq!(f.free(), 200);
        let got: Vec<u64> = (0..130).map(|_| f.take().unwrap()).collect();
        assert_eq!(got, (0..130).collect::<Vec<_>>());
        f.put(5);
        f.put(129);
        // Next-fit: continues after 129, then wraps.
        assert_eq!(f.take(), Some(130));
        for _ in 131..200 {
            f.take().unwrap();
        }
        assert_eq!(f.take(), Some(5));
        assert_eq!(f.take(), Some(129));
        assert_eq!(f.take(), None);
        assert_eq!(f.free(), 0);
    }

    #[test]
    fn free_bits_finds_across_summary_words() {
        // 64 * 64 * 3 indices: three summary words.
        let n = 64 * 64 * 3;
        let mut f = FreeBits::all_free(n);
        for i in 0..n {
            f.take_at(i);
        }
        f.put(n - 1);
        assert_eq!(f.take(), Some(n - 1));
        f.put(7);
        assert_eq!(f.take(), Some(7), "wraps to the start");
    }

    #[test]
    #[should_panic(expected = "already free")]
    fn double_free_stops() {
        let mut f = FreeBits::all_free(10);
        f.put(3);
    }

    #[test]
    fn slot_life_cycle() {
        let mut a = SlotAlloc::new(4);
        let s = a.take().unwrap();
        a.release(s);
        assert_eq!((a.claimed, a.limbo, a.free()), (0, 1, 3));
        let others: Vec<u32> = (0..3).map(|_| a.take().unwrap()).collect();
        assert!(!others.contains(&s), "a slot in limbo is not reused");
        assert_eq!(a.take(), None);
        a.written_back_free(s);
        assert_eq!(a.take(), Some(s));
        let r = SlotAlloc::rebuild(4, |s| s == 1, |s| s == 2);
        assert_eq!((r.claimed, r.limbo, r.free()), (1, 1, 2));
    }

    #[test]
    #[should_panic(expected = "not claimed")]
    fn releasing_a_free_slot_stops() {
        let mut a = SlotAlloc::new(4);
        a.release(2);
    }
}
