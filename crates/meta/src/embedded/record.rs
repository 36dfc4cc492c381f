//! The value of one key in the embedded store's `kv` table (byte layout in
//! docs/design/metadata-keys.md, "Embedded store file").
//!
//! ```text
//! 0      1                 9                 17                25                33        n-4   n
//! | fmt  | create_revision | mod_revision    | version         | lease (0=none)  | value   | crc |
//! | u8=1 | i64 LE          | i64 LE          | i64 LE          | i64 LE          | bytes   | u32 |
//! ```
//! `crc` is CRC-32C (Castagnoli) of bytes `0..n-4`, little-endian.

use crate::error::MetaError;
use crate::store::{KeyValue, LeaseId, Revision};

pub(crate) const FORMAT: u8 = 1;
const HEADER: usize = 33;
const TRAILER: usize = 4;

/// The stored state of one key (the key itself is the table key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub create_revision: Revision,
    pub mod_revision: Revision,
    pub version: i64,
    pub lease: Option<LeaseId>,
    pub value: Vec<u8>,
}

impl Record {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.value.len() + TRAILER);
        out.push(FORMAT);
        out.extend_from_slice(&self.create_revision.to_le_bytes());
        out.extend_from_slice(&self.mod_revision.to_le_bytes());
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.lease.map_or(0, |l| l.0).to_le_bytes());
        out.extend_from_slice(&self.value);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    pub(crate) fn decode(key: &str, bytes: &[u8]) -> Result<Record, MetaError> {
        if bytes.len() < HEADER + TRAILER {
            return Err(MetaError::corrupt(
                key,
                format!("record of {} bytes is too short", bytes.len()),
            ));
        }
        let (body, crc) = bytes.split_at(bytes.len() - TRAILER);
        let stored = u32::from_le_bytes(crc.try_into().unwrap_or_default());
        let computed = crc32c::crc32c(body);
        if stored != computed {
            return Err(MetaError::corrupt(
                key,
                format!("checksum mismatch (stored {stored:08x}, computed {computed:08x})"),
            ));
        }
        if body[0] != FORMAT {
            return Err(MetaError::UnsupportedVersion {
                key: key.to_string(),
                found: u32::from(body[0]),
                supported: u32::from(FORMAT),
            });
        }
        let int = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&body[at..at + 8]);
            i64::from_le_bytes(b)
        };
        let lease = int(25);
        Ok(Record {
            create_revision: int(1),
            mod_revision: int(9),
            version: int(17),
            lease: (lease != 0).then_some(LeaseId(lease)),
            value: body[HEADER..].to_vec(),
        })
    }

    pub(crate) fn into_kv(self, key: &str) -> KeyValue {
        KeyValue {
            key: key.to_string(),
            value: self.value,
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            version: self.version,
            lease: self.lease,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_detects_damage() {
        let r = Record {
            create_revision: 5,
            mod_revision: 9,
            version: 3,
            lease: Some(LeaseId(77)),
            value: b"hello".to_vec(),
        };
        let mut bytes = r.encode();
        assert_eq!(bytes.len(), HEADER + 5 + TRAILER);
        assert_eq!(Record::decode("k", &bytes).expect("decode"), r);
        bytes[HEADER] ^= 1;
        assert!(matches!(
            Record::decode("k", &bytes),
            Err(MetaError::Corrupt { .. })
        ));
        assert!(matches!(
            Record::decode("k", &[1, 2, 3]),
            Err(MetaError::Corrupt { .. })
        ));
    }
}
