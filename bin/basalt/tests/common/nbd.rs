//! A minimal blocking NBD client (fixed newstyle, NBD_OPT_GO, simple replies) for tests that need
//! to know exactly which writes were acknowledged.

use std::io::{Read, Write};
use std::net::TcpStream;

const NBD_OPT_GO: u32 = 7;
const NBD_REP_ACK: u32 = 1;
const NBD_REP_INFO: u32 = 3;
const NBD_CMD_READ: u16 = 0;
const NBD_CMD_WRITE: u16 = 1;
const NBD_CMD_DISC: u16 = 2;
const NBD_CMD_FLUSH: u16 = 3;
pub const NBD_CMD_FLAG_FUA: u16 = 1;

pub struct NbdClient {
    s: TcpStream,
    pub size: u64,
    cookie: u64,
}

impl NbdClient {
    /// Connects to `addr` and opens `export` with NBD_OPT_GO.
    pub fn connect(addr: &str, export: &str) -> std::io::Result<NbdClient> {
        NbdClient::over(TcpStream::connect(addr)?, export)
    }

    /// Opens `export` over a connection made elsewhere (e.g. from another network namespace).
    pub fn over(mut s: TcpStream, export: &str) -> std::io::Result<NbdClient> {
        s.set_nodelay(true)?;
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello)?;
        assert_eq!(&hello[..8], b"NBDMAGIC", "not an NBD server");
        // Client flags: FIXED_NEWSTYLE | NO_ZEROES.
        s.write_all(&3u32.to_be_bytes())?;
        let mut opt = Vec::new();
        opt.extend_from_slice(b"IHAVEOPT");
        opt.extend_from_slice(&NBD_OPT_GO.to_be_bytes());
        let data_len = 4 + export.len() + 2;
        opt.extend_from_slice(&(data_len as u32).to_be_bytes());
        opt.extend_from_slice(&(export.len() as u32).to_be_bytes());
        opt.extend_from_slice(export.as_bytes());
        opt.extend_from_slice(&0u16.to_be_bytes());
        s.write_all(&opt)?;
        let mut size = 0;
        loop {
            let mut h = [0u8; 20];
            s.read_exact(&mut h)?;
            let rtype = u32::from_be_bytes(h[12..16].try_into().unwrap());
            let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
            let mut payload = vec![0u8; len];
            s.read_exact(&mut payload)?;
            match rtype {
                NBD_REP_ACK => break,
                NBD_REP_INFO if u16::from_be_bytes([payload[0], payload[1]]) == 0 => {
                    size = u64::from_be_bytes(payload[2..10].try_into().unwrap());
                }
                NBD_REP_INFO => {}
                other => {
                    return Err(std::io::Error::other(format!(
                        "NBD_OPT_GO refused with reply type {other:#x}: {}",
                        String::from_utf8_lossy(&payload)
                    )));
                }
            }
        }
        Ok(NbdClient { s, size, cookie: 0 })
    }

    fn request(
        &mut self,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u32,
        data: &[u8],
    ) -> std::io::Result<u64> {
        self.cookie += 1;
        let mut r = Vec::with_capacity(28 + data.len());
        r.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        r.extend_from_slice(&flags.to_be_bytes());
        r.extend_from_slice(&cmd.to_be_bytes());
        r.extend_from_slice(&self.cookie.to_be_bytes());
        r.extend_from_slice(&offset.to_be_bytes());
        r.extend_from_slice(&len.to_be_bytes());
        r.extend_from_slice(data);
        self.s.write_all(&r)?;
        Ok(self.cookie)
    }

    /// Reads one simple reply; returns its error value.
    fn reply(&mut self, cookie: u64, data: &mut [u8]) -> std::io::Result<u32> {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h)?;
        assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), 0x6744_6698);
        let error = u32::from_be_bytes(h[4..8].try_into().unwrap());
        assert_eq!(u64::from_be_bytes(h[8..16].try_into().unwrap()), cookie);
        if error == 0 {
            self.s.read_exact(data)?;
        }
        Ok(error)
    }

    pub fn write(&mut self, offset: u64, data: &[u8], flags: u16) -> std::io::Result<u32> {
        let c = self.request(NBD_CMD_WRITE, flags, offset, data.len() as u32, data)?;
        self.reply(c, &mut [])
    }

    pub fn read(&mut self, offset: u64, len: u32) -> std::io::Result<Result<Vec<u8>, u32>> {
        let c = self.request(NBD_CMD_READ, 0, offset, len, &[])?;
        let mut buf = vec![0u8; len as usize];
        let e = self.reply(c, &mut buf)?;
        Ok(if e == 0 { Ok(buf) } else { Err(e) })
    }

    pub fn flush(&mut self) -> std::io::Result<u32> {
        let c = self.request(NBD_CMD_FLUSH, 0, 0, 0, &[])?;
        self.reply(c, &mut [])
    }

    pub fn disconnect(mut self) {
        let _ = self.request(NBD_CMD_DISC, 0, 0, 0, &[]);
    }
}

impl NbdClient {
    /// Sends raw bytes on the connection (for garbage tests).
    pub fn write_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.s.write_all(bytes)
    }

    pub fn trim(&mut self, offset: u64, len: u32) -> std::io::Result<u32> {
        let c = self.request(4, 0, offset, len, &[])?;
        self.reply(c, &mut [])
    }
}
