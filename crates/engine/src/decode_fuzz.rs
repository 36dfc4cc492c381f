//! Fuzz-style tests of every on-disk decoder: random bytes and single/multi-byte mutations of
//! valid encodings must never panic, and mutations of checksummed data must be rejected.

use crate::buf::AlignedBuf;
use crate::layout::{NO_SLOT, Superblock};
use crate::meta::SlotTable;
use crate::pgtable::PgTable;
use crate::record::{
    Bounds, Entry, EntryKind, Item, JournalHeader, REC_HEADER_FIXED, RecordPlace,
    decode_record_header, encode_record_header, peek_record,
};
use crate::tombs::TombTable;
use basalt_types::{DeviceId, ObjectId, PoolId, Version, VolumeId};

const BOUNDS: Bounds = Bounds {
    blocks: 32,
    slots: 100,
    tombs: 100,
    pgs: 16,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn mutate(rng: &mut StdRng, src: &[u8]) -> AlignedBuf {
    let mut b = AlignedBuf::copy_from(src);
    for _ in 0..rng.random_range(1..4) {
        let at = rng.random_range(0..src.len());
        b[at] ^= 1 << rng.random_range(0..8);
    }
    b
}

fn random_block(rng: &mut StdRng, len: usize) -> AlignedBuf {
    let mut b = AlignedBuf::zeroed(len);
    rng.fill(&mut b[..]);
    b
}

#[test]
fn record_decoder_never_panics() {
    let mut rng = StdRng::seed_from_u64(1);
    let uuid = [4u8; 16];
    let oid = ObjectId::new(PoolId(3), VolumeId(4), 5);
    let entries: Vec<Entry> = (0..40u64)
        .map(|i| Entry {
            slot: (i % 7) as u32,
            old_slot: if i % 3 == 0 { 2 } else { NO_SLOT },
            tomb: if i % 3 == 2 { (i % 5) as u32 } else { NO_SLOT },
            ..Entry::new(
                oid,
                (i % 4) as u32,
                Version::new(2, i + 1),
                match i % 3 {
                    0 => EntryKind::Full {
                        crcs: vec![7u32; 32].into(),
                        alloc: (i % 2 == 0).then(|| vec![0xffu64].into()),
                    },
                    1 => EntryKind::Write(vec![Item {
                        block: 3,
                        data: true,
                        crc: 9,
                    }]),
                    _ => EntryKind::Delete,
                },
            )
        })
        .collect();
    let place = RecordPlace {
        seq: 10,
        durable_seq: 9,
        prev_crc: 8,
        boot: 7,
    };
    let (valid, _) = encode_record_header(&uuid, place, &entries);
    assert!(decode_record_header(&valid, &uuid, BOUNDS).is_some());
    for _ in 0..3_000 {
        let m = mutate(&mut rng, &valid);
        // Mutations inside the used part of the header must be caught by the CRC.
        let decoded = decode_record_header(&m, &uuid, BOUNDS);
        if m[..] != valid[..] && decoded.is_some() {
            let used = REC_HEADER_FIXED + entries.iter().map(Entry::encoded_len).sum::<usize>();
            let changed = (0..valid.len()).find(|&i| m[i] != valid[i]).unwrap();
            assert!(changed >= used, "mutation at {changed} accepted");
        }
        let _ = peek_record(&m, &uuid);
        let n = 4096 * rng.random_range(1..3);
        let r = random_block(&mut rng, n);
        assert!(decode_record_header(&r, &uuid, BOUNDS).is_none());
        // Random bytes behind a plausible prefix.
        let mut p = random_block(&mut rng, 8192);
        p[..64].copy_from_slice(&valid[..64]);
        let _ = decode_record_header(&p, &uuid, BOUNDS);
        let _ = decode_record_header(&p[..rng.random_range(0..8192)], &uuid, BOUNDS);
    }
}

#[test]
fn superblock_and_journal_header_decoders_never_panic() {
    let mut rng = StdRng::seed_from_u64(2);
    let sb = Superblock::plan([1; 16], DeviceId(2), 131072, 64 << 20, None).unwrap();
    let enc = sb.encode(false);
    let jh = JournalHeader {
        generation: 5,
        start_offset: 4096,
        start_seq: 3,
        start_prev_crc: 1,
        tables_hash: 99,
    }
    .encode(&[1; 16]);
    for _ in 0..3_000 {
        let m = mutate(&mut rng, &enc);
        if let Ok(Some(d)) = Superblock::decode(&m) {
            assert!(m[..4092] == enc[..4092] && d == sb);
        }
        let _ = Superblock::decode(&random_block(&mut rng, 4096));
        let _ = Superblock::decode(&m[..rng.random_range(0..4096)]);
        let mj = mutate(&mut rng, &jh);
        if JournalHeader::decode(&mj, &[1; 16]).is_some() {
            assert_eq!(mj[..4092], jh[..4092]);
        }
        let _ = JournalHeader::decode(&mj[..rng.random_range(0..4096)], &[1; 16]);
    }
}

#[test]
fn table_page_loaders_never_panic() {
    let mut rng = StdRng::seed_from_u64(3);
    let sb = Superblock::plan([1; 16], DeviceId(2), 131072, 64 << 20, Some(4 << 20)).unwrap();
    let mut t = SlotTable::new(&sb);
    t.claim(
        1,
        ObjectId::new(PoolId(1), VolumeId(1), 1),
        5,
        Version::new(3, 4),
        4,
    );
    t.set_block(1, 2, Some(77));
    let pages = [
        t.encode_page(0, 2, 2, &sb.uuid),
        TombTable::new(&sb).encode_page(0, 2, 2, &sb.uuid),
        PgTable::new(&sb).encode_page(0, 2, 2, &sb.uuid),
    ];
    for _ in 0..1_000 {
        for page in &pages {
            let a = mutate(&mut rng, page);
            let b = random_block(&mut rng, page.len());
            let cut = &a[..rng.random_range(0..a.len())];
            let mut u = SlotTable::new(&sb);
            let _ = u.load_page(0, [&a, &b], &sb.uuid, 5);
            let _ = u.load_page(0, [&b, cut], &sb.uuid, 5);
            let mut v = TombTable::new(&sb);
            let _ = v.load_page(0, [&a, &b], &sb.uuid, 5);
            let _ = v.load_page(0, [&b, cut], &sb.uuid, 5);
            let mut w = PgTable::new(&sb);
            let _ = w.load_page(0, [&a, &b], &sb.uuid, 5);
            let _ = w.load_page(0, [&b, cut], &sb.uuid, 5);
        }
    }
}
