//! [`ExportCaps`]: what one export can do, fixed when a client picks it, and the transmission
//! flags that advertise exactly that.

use crate::export::Export;
use crate::wire::tflag;

/// Capabilities of an export as seen by one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportCaps {
    pub size: u64,
    pub read_only: bool,
    pub flush: bool,
    pub fua: bool,
    pub trim: bool,
    pub write_zeroes: bool,
    pub multi_conn: bool,
    /// Largest READ/WRITE length.
    pub max_payload: u32,
}

impl ExportCaps {
    /// Asks the export; write-side features are off on a read-only export.
    pub fn of<E: Export>(export: &E, max_payload: u32) -> Self {
        let read_only = export.read_only();
        ExportCaps {
            size: export.size(),
            read_only,
            flush: export.can_flush(),
            fua: !read_only && export.can_fua(),
            trim: !read_only && export.can_trim(),
            write_zeroes: !read_only && export.can_write_zeroes(),
            multi_conn: export.can_multi_conn(),
            max_payload,
        }
    }

    /// The transmission flags: `HAS_FLAGS` always, every other flag only where honoured.
    pub fn transmission_flags(&self) -> u16 {
        let mut flags = tflag::HAS_FLAGS;
        let mut set = |on: bool, flag: u16| {
            if on {
                flags |= flag;
            }
        };
        set(self.read_only, tflag::READ_ONLY);
        set(self.flush, tflag::SEND_FLUSH);
        set(self.fua, tflag::SEND_FUA);
        set(self.trim, tflag::SEND_TRIM);
        set(self.write_zeroes, tflag::SEND_WRITE_ZEROES);
        set(self.multi_conn, tflag::CAN_MULTI_CONN);
        flags
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> ExportCaps {
        ExportCaps {
            size: 1 << 20,
            read_only: false,
            flush: true,
            fua: true,
            trim: true,
            write_zeroes: true,
            multi_conn: true,
            max_payload: 1 << 25,
        }
    }

    #[test]
    fn flags_advertise_only_what_is_honoured() {
        let all = caps().transmission_flags();
        assert_eq!(all, 0b1_0110_1101);
        let none = ExportCaps {
            flush: false,
            fua: false,
            trim: false,
            write_zeroes: false,
            multi_conn: false,
            ..caps()
        };
        assert_eq!(none.transmission_flags(), tflag::HAS_FLAGS);
        let ro = ExportCaps {
            read_only: true,
            ..none
        };
        assert_eq!(ro.transmission_flags(), tflag::HAS_FLAGS | tflag::READ_ONLY);
    }
}
