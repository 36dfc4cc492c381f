//! What a device already holds: known on-disk signatures (file systems, partition tables, volume
//! managers, encryption, RAID, swap, a Basalt store) or any other non-zero data, found in its
//! first and last MiB. Format uses it to refuse anything but a blank device (see
//! `format.rs::check_blank`); the functions here are pure, over byte slices.
//!
//! Offsets follow the formats' specifications (and libblkid, which knows them all):
//! ext2/3/4 superblock magic at 1080, XFS at 0, btrfs at 64 KiB + 64, swap at page size - 10,
//! LUKS at 0, LVM2 label in one of the first four sectors, Linux RAID (md) superblocks at 0,
//! 4 KiB (metadata 1.1, 1.2) and near the end (0.90, 1.0), ZFS uberblocks in the labels at both
//! ends, GPT headers at 512 (or 4096) and in the last sector, the MBR boot signature at 510.

use std::fmt;

/// How many bytes of the start and of the end of a device [`scan`] looks at.
pub const SCAN_LEN: u64 = 1 << 20;

/// The kinds of content [`scan`] recognises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Content {
    /// A Basalt store, maybe damaged: its superblock magic at offset 0 or in the last 4 KiB.
    Basalt,
    /// An ext2, ext3 or ext4 file system (the number).
    Ext(u8),
    Xfs,
    Btrfs,
    Zfs,
    Ntfs,
    Exfat,
    Fat,
    Iso9660,
    Swap,
    Luks,
    Lvm2,
    MdRaid,
    Gpt,
    Mbr,
    /// Bytes that are not zero, in no format this module knows.
    Data,
}

impl fmt::Display for Content {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Content::Basalt => f.write_str("a Basalt store (possibly damaged)"),
            Content::Ext(n) => write!(f, "an ext{n} file system"),
            Content::Xfs => f.write_str("an XFS file system"),
            Content::Btrfs => f.write_str("a btrfs file system"),
            Content::Zfs => f.write_str("a ZFS pool member"),
            Content::Ntfs => f.write_str("an NTFS file system"),
            Content::Exfat => f.write_str("an exFAT file system"),
            Content::Fat => f.write_str("a FAT file system"),
            Content::Iso9660 => f.write_str("an ISO 9660 file system"),
            Content::Swap => f.write_str("a swap area"),
            Content::Luks => f.write_str("a LUKS encrypted volume"),
            Content::Lvm2 => f.write_str("an LVM2 physical volume"),
            Content::MdRaid => f.write_str("a Linux RAID (md) member"),
            Content::Gpt => f.write_str("a GPT partition table"),
            Content::Mbr => f.write_str("an MBR (DOS) partition table"),
            Content::Data => f.write_str("non-zero data"),
        }
    }
}

/// What [`scan`] found, and the device offset of the signature (or of the first non-zero byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    pub content: Content,
    pub offset: u64,
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at byte {})", self.content, self.offset)
    }
}

/// The part of a device [`scan`] is given: its first bytes and its last bytes.
#[derive(Clone, Copy)]
struct Ends<'a> {
    head: &'a [u8],
    tail: &'a [u8],
    size: u64,
}

impl<'a> Ends<'a> {
    /// `len` bytes at device offset `off`, if they lie in the head or in the tail.
    fn at(&self, off: u64, len: usize) -> Option<&'a [u8]> {
        let end = off.checked_add(len as u64)?;
        if end <= self.head.len() as u64 {
            return Some(&self.head[off as usize..end as usize]);
        }
        let tail_start = self.size.checked_sub(self.tail.len() as u64)?;
        if off >= tail_start && end <= self.size {
            let i = (off - tail_start) as usize;
            return Some(&self.tail[i..i + len]);
        }
        None
    }

    fn has(&self, off: u64, magic: &[u8]) -> bool {
        self.at(off, magic.len()) == Some(magic)
    }

    fn le16(&self, off: u64) -> Option<u16> {
        self.at(off, 2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }

    fn le32(&self, off: u64) -> Option<u32> {
        self.at(off, 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }
}

/// Scans a device of `size` bytes given its first bytes (`head`, device offsets `[0,
/// head.len())`) and its last bytes (`tail`, `[size - tail.len(), size)`); callers pass
/// [`SCAN_LEN`] of each, or the whole device when it is smaller. Returns the first known
/// signature (a Basalt store first), else the first non-zero byte, else `None`: blank.
pub fn scan(head: &[u8], tail: &[u8], size: u64) -> Option<Found> {
    let d = Ends { head, tail, size };
    let found = |content, offset| Some(Found { content, offset });
    if let Some(off) = basalt(&d) {
        return found(Content::Basalt, off);
    }
    let detectors: [Detector; 6] = [
        containers,
        ext,
        other_file_systems,
        swap,
        raid_at_end,
        partition_tables,
    ];
    if let Some((content, offset)) = detectors.iter().find_map(|f| f(&d)) {
        return found(content, offset);
    }
    if let Some(i) = head.iter().position(|&b| b != 0) {
        return found(Content::Data, i as u64);
    }
    let tail_start = size.saturating_sub(tail.len() as u64);
    let i = tail.iter().position(|&b| b != 0)?;
    found(Content::Data, tail_start + i as u64)
}

/// Looks for one family of signatures: what it found and where.
type Detector = fn(&Ends) -> Option<(Content, u64)>;

const BASALT_MAGIC: &[u8] = b"BASALTSB";
const BLOCK: u64 = 4096;

/// The Basalt superblock magic at 0, or at the start of the last 4 KiB (or of the last whole
/// 4 KiB block, where a backup superblock goes).
fn basalt(d: &Ends) -> Option<u64> {
    let last = d.size.checked_sub(BLOCK);
    let last_aligned = (d.size / BLOCK * BLOCK).checked_sub(BLOCK);
    [Some(0), last, last_aligned]
        .into_iter()
        .flatten()
        .find(|&off| d.has(off, BASALT_MAGIC))
}

/// Encryption and volume managers at the very start.
fn containers(d: &Ends) -> Option<(Content, u64)> {
    if d.has(0, b"LUKS\xba\xbe") {
        return Some((Content::Luks, 0));
    }
    for sector in 0..4u64 {
        let off = sector * 512;
        if d.has(off, b"LABELONE") && d.has(off + 24, b"LVM2 001") {
            return Some((Content::Lvm2, off));
        }
    }
    // md metadata 1.1 (at 0) and 1.2 (at 4 KiB): magic 0xa92b4efc, major version 1.
    for off in [0, 4096] {
        if d.le32(off) == Some(MD_MAGIC) && d.le32(off + 4) == Some(1) {
            return Some((Content::MdRaid, off));
        }
    }
    None
}

const MD_MAGIC: u32 = 0xa92b_4efc;

/// ext2/3/4: the superblock at 1024 with magic 0xEF53 at +0x38; features tell the versions
/// apart the way libblkid does.
fn ext(d: &Ends) -> Option<(Content, u64)> {
    const SB: u64 = 1024;
    if d.le16(SB + 0x38) != Some(0xEF53) {
        return None;
    }
    let compat = d.le32(SB + 0x5C)?;
    let incompat = d.le32(SB + 0x60)?;
    let ro_compat = d.le32(SB + 0x64)?;
    // Features beyond ext3's (incompat filetype, recover, meta_bg; ro_compat sparse_super,
    // large_file, btree_dir): extents, 64bit, flex_bg, huge_file, metadata_csum, ...
    let ext4 = incompat & !0x0016 != 0 || ro_compat & !0x0007 != 0;
    let version = match () {
        _ if ext4 => 4,
        _ if compat & 0x0004 != 0 => 3, // has_journal
        _ => 2,
    };
    Some((Content::Ext(version), SB + 0x38))
}

fn other_file_systems(d: &Ends) -> Option<(Content, u64)> {
    let magics: [(u64, &[u8], Content); 5] = [
        (0, b"XFSB", Content::Xfs),
        (0x1_0040, b"_BHRfS_M", Content::Btrfs),
        (3, b"NTFS    ", Content::Ntfs),
        (3, b"EXFAT   ", Content::Exfat),
        (0x8001, b"CD001", Content::Iso9660),
    ];
    if let Some((off, _, c)) = magics.iter().find(|(off, m, _)| d.has(*off, m)) {
        return Some((*c, *off));
    }
    if d.has(510, b"\x55\xaa") {
        for off in [54, 82] {
            if d.has(off, b"FAT") {
                return Some((Content::Fat, off));
            }
        }
    }
    zfs(d)
}

/// ZFS keeps four 256 KiB labels, two at each end; each holds an array of uberblocks (magic
/// 0x00bab10c, either byte order) from 128 KiB on, in slots of at least 1 KiB.
fn zfs(d: &Ends) -> Option<(Content, u64)> {
    const LABEL: u64 = 256 << 10;
    let aligned = d.size / LABEL * LABEL;
    let labels = [
        Some(0),
        Some(LABEL),
        aligned.checked_sub(2 * LABEL),
        aligned.checked_sub(LABEL),
    ];
    let magic_le = 0x00ba_b10c_u64.to_le_bytes();
    let magic_be = 0x00ba_b10c_u64.to_be_bytes();
    for label in labels.into_iter().flatten() {
        for slot in 0..128 {
            let off = label + (128 << 10) + slot * 1024;
            if d.has(off, &magic_le) || d.has(off, &magic_be) {
                return Some((Content::Zfs, off));
            }
        }
    }
    None
}

/// The swap signature ends the first page, whatever the page size was.
fn swap(d: &Ends) -> Option<(Content, u64)> {
    for page in [4096u64, 8192, 16384, 32768, 65536] {
        let off = page - 10;
        if d.has(off, b"SWAPSPACE2") || d.has(off, b"SWAP-SPACE") {
            return Some((Content::Swap, off));
        }
    }
    None
}

/// md metadata 0.90 (64 KiB-aligned, 64 KiB before the end) and 1.0 (8 KiB before the end,
/// 4 KiB-aligned).
fn raid_at_end(d: &Ends) -> Option<(Content, u64)> {
    let v090 = (d.size & !0xFFFF).checked_sub(0x1_0000);
    let v10 = d.size.checked_sub(8192).map(|o| o & !4095);
    [v090, v10]
        .into_iter()
        .flatten()
        .find(|&off| d.le32(off) == Some(MD_MAGIC))
        .map(|off| (Content::MdRaid, off))
}

/// GPT (primary header at LBA 1 for 512- or 4096-byte sectors, backup in the last sector),
/// then a plain MBR (the boot signature 0x55AA at 510).
fn partition_tables(d: &Ends) -> Option<(Content, u64)> {
    let backup = d.size.checked_sub(512);
    let gpt = [Some(512), Some(4096), backup]
        .into_iter()
        .flatten()
        .find(|&off| d.has(off, b"EFI PART"));
    if let Some(off) = gpt {
        return Some((Content::Gpt, off));
    }
    d.has(510, b"\x55\xaa").then_some((Content::Mbr, 510))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device image of `size` bytes, zero but for `excerpt` at `offset`; returns what `scan`
    /// finds in its first and last MiB.
    fn scan_with(size: u64, offset: u64, excerpt: &[u8]) -> Option<Found> {
        let mut dev = vec![0u8; size as usize];
        dev[offset as usize..offset as usize + excerpt.len()].copy_from_slice(excerpt);
        let n = SCAN_LEN.min(size) as usize;
        scan(&dev[..n], &dev[size as usize - n..], size)
    }

    macro_rules! fixture {
        ($name:literal) => {
            include_bytes!(concat!("../testdata/signatures/", $name, ".bin"))
        };
    }

    /// Real signatures (testdata/signatures/README.md says where each comes from), each at its
    /// original offset in a device of its original size.
    #[test]
    fn real_signatures_are_recognised() {
        const MIB: u64 = 1 << 20;
        let cases: [(&[u8], u64, u64, Content); 14] = [
            (fixture!("ext2"), 8 * MIB, 1024, Content::Ext(2)),
            (fixture!("ext3"), 8 * MIB, 1024, Content::Ext(3)),
            (fixture!("ext4"), 8 * MIB, 1024, Content::Ext(4)),
            (fixture!("xfs"), 16 * MIB, 0, Content::Xfs),
            (fixture!("btrfs"), 16 * MIB, 65536, Content::Btrfs),
            (fixture!("swap"), 2 * MIB + 256 * 1024, 0, Content::Swap),
            (fixture!("lvm2"), 2 * MIB, 512, Content::Lvm2),
            (fixture!("luks1"), 2 * MIB, 0, Content::Luks),
            (fixture!("luks2"), 2 * MIB, 0, Content::Luks),
            (fixture!("mdraid-1.2"), 10 * MIB, 4096, Content::MdRaid),
            (
                fixture!("mdraid-0.90"),
                10 * MIB,
                10 * MIB - 65536,
                Content::MdRaid,
            ),
            (fixture!("gpt"), 10 * MIB, 0, Content::Gpt),
            (fixture!("mbr"), 8 * MIB, 0, Content::Mbr),
            (fixture!("zfs"), 64 * MIB + 512 * 1024, 138240, Content::Zfs),
        ];
        for (bytes, size, offset, want) in cases {
            let got = scan_with(size, offset, bytes).expect("something is found");
            assert_eq!(
                got.content, want,
                "excerpt at {offset} in {size} bytes: {got}"
            );
        }
    }

    #[test]
    fn a_blank_device_is_blank_and_any_byte_in_the_scanned_ends_is_data() {
        let size = 8u64 << 20;
        assert_eq!(scan_with(size, 0, &[]), None);
        for at in [0, 4095, SCAN_LEN - 1, size - SCAN_LEN, size - 1] {
            let got = scan_with(size, at, &[1]);
            assert_eq!(
                got,
                Some(Found {
                    content: Content::Data,
                    offset: at
                })
            );
        }
        // The middle of the device is not scanned (the docs say so).
        assert_eq!(scan_with(size, size / 2, &[1]), None);
        // A device smaller than two scans: head and tail overlap.
        assert_eq!(
            scan_with(4096, 100, &[7]).map(|f| f.offset),
            Some(100),
            "small device"
        );
    }

    #[test]
    fn a_basalt_store_is_recognised_by_either_superblock_even_when_damaged() {
        let size = 64u64 << 20;
        let disk = crate::sim::SimDisk::new(size);
        let opts = crate::FormatOptions {
            device_id: basalt_types::DeviceId(3),
            ..crate::FormatOptions::default()
        };
        crate::format_sim(&disk, &opts).unwrap();
        let sb = disk.read(0, 4096);
        let got = scan_with(size, 0, &sb).unwrap();
        assert_eq!((got.content, got.offset), (Content::Basalt, 0));
        // A backup superblock in the last 4 KiB, or in the last whole block of an odd size.
        let got = scan_with(size, size - 4096, &sb).unwrap();
        assert_eq!((got.content, got.offset), (Content::Basalt, size - 4096));
        let odd = size + 1000;
        let got = scan_with(odd, size - 4096, &sb).unwrap();
        assert_eq!(got.content, Content::Basalt);
        // Damaged magic: still not blank.
        let mut damaged = sb.clone();
        damaged[..8].fill(0);
        assert_eq!(
            scan_with(size, 0, &damaged).map(|f| f.content),
            Some(Content::Data)
        );
    }
}
