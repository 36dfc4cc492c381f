//! Seams for the deterministic cluster simulator (feature `sim`; the harness is
//! `tests/sim_cluster/`, the design docs/design/simulation.md, "Cluster simulation").
//!
//! The simulator runs whole clusters on one current-thread tokio runtime in paused (virtual)
//! time: every node's stores on simulated disks (`Store::spawn_sim`), the embedded metadata
//! store in memory with inline calls (`EmbeddedStore::in_memory`), and nodes and clients
//! connected by [`SimNet`], an in-memory network with seeded delays, connection breaks and
//! partitions. What it adds to the production code:
//!
//! - [`SimNet`]: links between node services (a [`basalt_link::Connector`] per node, and
//!   [`SimNet::client_port`] for a client), FIFO per link like a TCP connection;
//! - [`SimMeta`]: a node's handle on the metadata store, which a partition cuts off and a
//!   kill makes dead;
//! - `Node::start_sim` (a node over already open stores, no directory, no listener) and
//!   `Node::kill` (kill -9: tasks dropped, stores stopped at once).

mod meta;
mod net;

pub use meta::SimMeta;
pub use net::{Host, NetStats, SimNet};

/// A small seeded generator (SplitMix64): the network draws its delays from it.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next() % (hi - lo + 1)
    }
}
