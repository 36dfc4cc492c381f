//! The option phase on the wire, sans-io: parsing what the client sends and encoding what the
//! server answers. The async driver that uses these is `negotiate.rs`.
//!
//! ```text
//! server greeting:  NBDMAGIC u64 | IHAVEOPT u64 | handshake flags u16
//! client flags:     u32
//! client option:    IHAVEOPT u64 | option u32 | length u32 | data
//! option reply:     0x3e889045565a9 u64 | option u32 | reply type u32 | length u32 | data
//! ```

use crate::wire::{self, MAX_STRING_LEN, OPTION_HEADER_LEN, info, rep};

/// The fixed part of a client option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len: u32,
}

impl OptionHeader {
    /// Parses the 16-byte option header; `None` when the magic is wrong (the stream cannot be
    /// trusted any more and the server closes the connection).
    pub fn parse(b: &[u8; OPTION_HEADER_LEN]) -> Option<Self> {
        let magic = u64::from_be_bytes(b[0..8].try_into().expect("8 bytes"));
        if magic != wire::IHAVEOPT {
            return None;
        }
        Some(OptionHeader {
            option: u32::from_be_bytes(b[8..12].try_into().expect("4 bytes")),
            len: u32::from_be_bytes(b[12..16].try_into().expect("4 bytes")),
        })
    }

    pub fn encode(&self) -> [u8; OPTION_HEADER_LEN] {
        let mut b = [0u8; OPTION_HEADER_LEN];
        b[0..8].copy_from_slice(&wire::IHAVEOPT.to_be_bytes());
        b[8..12].copy_from_slice(&self.option.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
        b
    }
}

/// The data of `NBD_OPT_INFO` and `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    /// The `NBD_INFO_*` items the client asked for (unknown ones included; they are ignored).
    pub items: Vec<u16>,
}

impl InfoRequest {
    /// ```text
    /// name length u32 | name | item count u16 | item u16 × count
    /// ```
    /// An error is a message for an `NBD_REP_ERR_INVALID` reply.
    pub fn parse(data: &[u8]) -> Result<Self, String> {
        if data.len() < 6 {
            return Err(format!(
                "option data is {} bytes; INFO/GO needs at least 6 (name length, item count)",
                data.len()
            ));
        }
        let name_len = u32::from_be_bytes(data[0..4].try_into().expect("4 bytes")) as usize;
        if name_len > data.len() - 6 {
            return Err(format!(
                "export name length {name_len} does not fit in {} bytes of option data",
                data.len()
            ));
        }
        let name = parse_string(&data[4..4 + name_len])?;
        let rest = &data[4 + name_len..];
        let count = u16::from_be_bytes(rest[0..2].try_into().expect("2 bytes")) as usize;
        let items = &rest[2..];
        if items.len() != count * 2 {
            return Err(format!(
                "{count} information requests need {} bytes, the option carries {}",
                count * 2,
                items.len()
            ));
        }
        let items = items
            .chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect();
        Ok(InfoRequest { name, items })
    }

    pub fn wants(&self, item: u16) -> bool {
        self.items.contains(&item)
    }

    /// Encodes the request (used by tests and the fuzz entry point to build valid streams).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(6 + self.name.len() + 2 * self.items.len());
        out.extend_from_slice(&(self.name.len() as u32).to_be_bytes());
        out.extend_from_slice(self.name.as_bytes());
        out.extend_from_slice(&(self.items.len() as u16).to_be_bytes());
        for item in &self.items {
            out.extend_from_slice(&item.to_be_bytes());
        }
        out
    }
}

/// Checks that a name or description is a valid protocol string: UTF-8, no NUL, ≤ 4096 bytes.
pub fn parse_string(b: &[u8]) -> Result<String, String> {
    if b.len() > MAX_STRING_LEN {
        return Err(format!(
            "string of {} bytes is longer than the protocol's {MAX_STRING_LEN}",
            b.len()
        ));
    }
    let s = std::str::from_utf8(b).map_err(|e| format!("string is not UTF-8: {e}"))?;
    if s.contains('\0') {
        return Err("string contains a NUL character".into());
    }
    Ok(s.to_owned())
}

/// The server's greeting: magic, `IHAVEOPT`, and the handshake flags.
pub fn put_greeting(out: &mut Vec<u8>) {
    out.extend_from_slice(&wire::NBDMAGIC.to_be_bytes());
    out.extend_from_slice(&wire::IHAVEOPT.to_be_bytes());
    let flags = wire::handshake::FIXED_NEWSTYLE | wire::handshake::NO_ZEROES;
    out.extend_from_slice(&flags.to_be_bytes());
}

/// One option reply with its data.
pub fn put_reply(out: &mut Vec<u8>, option: u32, reply: u32, data: &[u8]) {
    out.extend_from_slice(&wire::OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// An error reply carrying a human-readable message (cut to the protocol's string limit).
pub fn put_error(out: &mut Vec<u8>, option: u32, reply: u32, message: &str) {
    put_reply(out, option, reply, truncate(message).as_bytes());
}

/// `NBD_REP_SERVER`: name length u32 | name | description (free text).
pub fn put_server(out: &mut Vec<u8>, name: &str, description: &str) {
    let name = truncate(name);
    let description = truncate(description);
    let mut data = Vec::with_capacity(4 + name.len() + description.len());
    data.extend_from_slice(&(name.len() as u32).to_be_bytes());
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(description.as_bytes());
    put_reply(out, wire::opt::LIST, rep::SERVER, &data);
}

/// `NBD_REP_INFO` / `NBD_INFO_EXPORT`: type u16 | size u64 | transmission flags u16.
pub fn put_info_export(out: &mut Vec<u8>, option: u32, size: u64, flags: u16) {
    let mut data = [0u8; 12];
    data[0..2].copy_from_slice(&info::EXPORT.to_be_bytes());
    data[2..10].copy_from_slice(&size.to_be_bytes());
    data[10..12].copy_from_slice(&flags.to_be_bytes());
    put_reply(out, option, rep::INFO, &data);
}

/// `NBD_REP_INFO` / `NBD_INFO_BLOCK_SIZE`: type u16 | minimum u32 | preferred u32 | maximum u32.
pub fn put_info_block_size(out: &mut Vec<u8>, option: u32, min: u32, preferred: u32, max: u32) {
    let mut data = [0u8; 14];
    data[0..2].copy_from_slice(&info::BLOCK_SIZE.to_be_bytes());
    data[2..6].copy_from_slice(&min.to_be_bytes());
    data[6..10].copy_from_slice(&preferred.to_be_bytes());
    data[10..14].copy_from_slice(&max.to_be_bytes());
    put_reply(out, option, rep::INFO, &data);
}

/// `NBD_REP_INFO` with `NBD_INFO_NAME` or `NBD_INFO_DESCRIPTION`: type u16 | string.
pub fn put_info_string(out: &mut Vec<u8>, option: u32, item: u16, s: &str) {
    let s = truncate(s);
    let mut data = Vec::with_capacity(2 + s.len());
    data.extend_from_slice(&item.to_be_bytes());
    data.extend_from_slice(s.as_bytes());
    put_reply(out, option, rep::INFO, &data);
}

/// The answer to `NBD_OPT_EXPORT_NAME`: size u64 | transmission flags u16 | 124 zero bytes
/// (left out when both sides agreed on `NO_ZEROES`).
pub fn put_export_name_reply(out: &mut Vec<u8>, size: u64, flags: u16, no_zeroes: bool) {
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        out.extend_from_slice(&[0u8; 124]);
    }
}

fn truncate(s: &str) -> &str {
    if s.len() <= MAX_STRING_LEN {
        return s;
    }
    let mut end = MAX_STRING_LEN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::opt;

    #[test]
    fn option_header_round_trips_and_checks_magic() {
        let h = OptionHeader {
            option: opt::GO,
            len: 77,
        };
        let b = h.encode();
        assert_eq!(OptionHeader::parse(&b), Some(h));
        let mut bad = b;
        bad[0] ^= 1;
        assert_eq!(OptionHeader::parse(&bad), None);
    }

    #[test]
    fn info_request_round_trips() {
        let req = InfoRequest {
            name: "vol-é".into(),
            items: vec![info::NAME, info::BLOCK_SIZE, 999],
        };
        let data = req.encode();
        assert_eq!(data.len(), 4 + 6 + 2 + 6);
        assert_eq!(InfoRequest::parse(&data).unwrap(), req);
        assert!(req.wants(info::BLOCK_SIZE) && !req.wants(info::DESCRIPTION));
    }

    #[test]
    fn info_request_rejects_inconsistent_lengths() {
        let good = InfoRequest {
            name: "a".into(),
            items: vec![info::NAME],
        }
        .encode();
        // Too short, name longer than the data, item count not matching, trailing byte.
        assert!(InfoRequest::parse(&good[..5]).is_err());
        let mut long_name = good.clone();
        long_name[3] = 200;
        assert!(InfoRequest::parse(&long_name).is_err());
        let mut count = good.clone();
        count[6] = 2;
        assert!(InfoRequest::parse(&count).is_err());
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(InfoRequest::parse(&trailing).is_err());
        // Invalid UTF-8 and NUL in the name.
        let mut bad_utf8 = good.clone();
        bad_utf8[4] = 0xff;
        assert!(InfoRequest::parse(&bad_utf8).is_err());
        let mut nul = good;
        nul[4] = 0;
        assert!(InfoRequest::parse(&nul).is_err());
    }

    #[test]
    fn replies_have_the_documented_layout() {
        let mut out = Vec::new();
        put_info_export(&mut out, opt::GO, 0x0102_0304_0506_0708, 0x0165);
        assert_eq!(out.len(), 20 + 12);
        assert_eq!(&out[0..8], &wire::OPTION_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&out[8..12], &opt::GO.to_be_bytes());
        assert_eq!(&out[12..16], &rep::INFO.to_be_bytes());
        assert_eq!(&out[16..20], &12u32.to_be_bytes());
        assert_eq!(&out[20..22], &[0, 0]);
        assert_eq!(&out[22..30], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&out[30..32], &[0x01, 0x65]);

        out.clear();
        put_server(&mut out, "disk", "a description");
        assert_eq!(&out[16..20], &(4u32 + 4 + 13).to_be_bytes());
        assert_eq!(&out[20..24], &4u32.to_be_bytes());
        assert_eq!(&out[24..28], b"disk");
        assert_eq!(&out[28..], b"a description");

        out.clear();
        put_info_block_size(&mut out, opt::INFO, 1, 4096, 32 << 20);
        assert_eq!(&out[20..22], &info::BLOCK_SIZE.to_be_bytes());
        assert_eq!(&out[22..26], &1u32.to_be_bytes());
        assert_eq!(&out[26..30], &4096u32.to_be_bytes());
        assert_eq!(&out[30..34], &(32u32 << 20).to_be_bytes());

        out.clear();
        put_export_name_reply(&mut out, 5, 1, false);
        assert_eq!(out.len(), 8 + 2 + 124);
        out.clear();
        put_export_name_reply(&mut out, 5, 1, true);
        assert_eq!(out.len(), 10);
    }

    #[test]
    fn long_messages_are_cut_on_a_char_boundary() {
        let long = "é".repeat(MAX_STRING_LEN);
        let mut out = Vec::new();
        put_error(&mut out, opt::GO, rep::ERR_UNKNOWN, &long);
        let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        assert!(len <= MAX_STRING_LEN);
        assert!(std::str::from_utf8(&out[20..]).is_ok());
    }
}
