//! A running hash of everything a run did: two runs of one seed must give the same hash.

/// FNV-1a over 64-bit words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trace(pub u64);

impl Default for Trace {
    fn default() -> Self {
        Trace(0xcbf2_9ce4_8422_2325)
    }
}

impl Trace {
    pub fn add(&mut self, tag: u64, vals: &[u64]) {
        if tracing_on() {
            eprintln!("trace {tag} {vals:?}");
        }
        for v in std::iter::once(tag).chain(vals.iter().copied()) {
            for b in v.to_le_bytes() {
                self.0 ^= u64::from(b);
                self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
            }
        }
    }

    pub fn add_str(&mut self, tag: u64, s: &str) {
        self.add(tag, &[s.len() as u64]);
        for chunk in s.as_bytes().chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.add(0, &[u64::from_le_bytes(w)]);
        }
    }
}

/// `CSIM_TRACE` set: every event added is printed (diff two runs to find where they part).
fn tracing_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("CSIM_TRACE").is_some())
}
