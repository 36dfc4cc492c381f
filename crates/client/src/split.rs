//! Cutting a volume byte range into per-object pieces.

/// One object's share of a volume byte range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Object index within the volume.
    pub index: u64,
    /// Offset inside the object.
    pub offset: u32,
    /// Length inside the object (> 0).
    pub len: u32,
    /// Offset of this piece from the start of the whole range.
    pub range_offset: u64,
}

/// Splits `[offset, offset + len)` into pieces no larger than `object_size`, in order.
/// `object_size` must be a power of two.
pub fn split(offset: u64, len: u64, object_size: u32) -> impl Iterator<Item = Piece> {
    debug_assert!(object_size.is_power_of_two());
    let os = object_size as u64;
    let end = offset + len;
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let index = pos / os;
        let in_obj = pos % os;
        let take = (os - in_obj).min(end - pos);
        let piece = Piece {
            index,
            offset: in_obj as u32,
            len: take as u32,
            range_offset: pos - offset,
        };
        pos += take;
        Some(piece)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn examples() {
        let p: Vec<_> = split(0, 4096, 131072).collect();
        assert_eq!(
            p,
            vec![Piece {
                index: 0,
                offset: 0,
                len: 4096,
                range_offset: 0
            }]
        );
        let p: Vec<_> = split(131072 - 100, 300, 131072).collect();
        assert_eq!(
            p,
            vec![
                Piece {
                    index: 0,
                    offset: 131072 - 100,
                    len: 100,
                    range_offset: 0
                },
                Piece {
                    index: 1,
                    offset: 0,
                    len: 200,
                    range_offset: 100
                },
            ]
        );
        assert_eq!(split(5, 0, 4096).count(), 0);
    }

    proptest! {
        #[test]
        fn pieces_tile_the_range(offset in 0u64..1 << 40, len in 0u64..1 << 22, shift in 12u32..23) {
            let os = 1u32 << shift;
            let mut next = offset;
            let mut covered = 0u64;
            for p in split(offset, len, os) {
                prop_assert!(p.len > 0);
                prop_assert!(p.offset as u64 + p.len as u64 <= os as u64);
                prop_assert_eq!(p.index * os as u64 + p.offset as u64, next);
                prop_assert_eq!(p.range_offset, covered);
                next += p.len as u64;
                covered += p.len as u64;
            }
            prop_assert_eq!(covered, len);
        }
    }
}
