//! One seed's configuration, drawn swarm-style: each seed its own cluster shape, workload mix,
//! network and fault mix.

use std::time::Duration;

/// SplitMix64: every random choice of the harness comes from one of these.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x005e_edc1_u64.rotate_left(40))
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next() % (hi - lo + 1)
    }

    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.range(0, items.len() as u64 - 1) as usize]
    }

    pub fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }

    /// A generator of its own, for one part of the run (so that parts do not shift each
    /// other's draws).
    pub fn fork(&mut self) -> Rng {
        Rng(self.next())
    }
}

/// Which faults a seed injects.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// kill -9 of a node (its disks lose what was not flushed), restarted later.
    pub kills: bool,
    /// Node-to-node and client-to-node partitions (one way or both), healed later.
    pub partitions: bool,
    /// A node cut off from the metadata store for a while.
    pub meta_cuts: bool,
    /// Connections reset.
    pub breaks: bool,
    /// Devices marked out and in, nodes added.
    pub map_changes: bool,
    /// Media corruption: a bit flipped in a block of client data in one disk's slots (while
    /// another disk holds that data intact), to be served from another copy and repaired.
    pub media: bool,
    /// With `media`: a killed node's disk loses power with a bit flipped in the newest record of
    /// its journal (its store drops the record as a torn tail on restart, though its writes
    /// may have been acknowledged), while another disk holds those writes.
    pub journal_tail: bool,
    /// A node stopped cleanly (SIGTERM) and started again soon after (within
    /// `workload::STOP_GAP`), as in a rolling restart.
    pub stops: bool,
    /// With `kills`: a killed node's drive dies while it is down; the operator marks it out and
    /// the node comes back with a blank drive in its place (once per run).
    pub replacements: bool,
    /// A node partitioned from every other host (both ways) whose map watch lags meanwhile
    /// (it installs no newer map, though it keeps its lease in the metadata store), and the
    /// gateway beside it cut off from the metadata store: the others fail it over while it
    /// still believes it serves (what the read leases of failure-model.md rules 9 and 13 are
    /// for). Healed later.
    pub lags: bool,
    /// With `media`: half of the media faults make a sector of a block of client data
    /// unreadable (a latent sector error: reads of it fail with `EIO` until it is written
    /// over) instead of flipping a bit in it.
    pub read_faults: bool,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub seed: u64,
    pub nodes: u32,
    pub devices_per_node: u32,
    pub replicas: u8,
    pub min_size: u8,
    pub pg_count: u32,
    pub object_size: u32,
    /// 4 KiB blocks of the volume the clients use (few: writes to one block meet).
    pub blocks: u64,
    pub clients: u32,
    pub ops_per_client: u32,
    /// Share of reads among operations.
    pub reads: f64,
    /// Share of the other operations that zero a range instead of writing a block: a trim or
    /// a write-zeroes of one to three blocks or of a whole object (which leaves a tombstone).
    pub zeroes: f64,
    /// Pause between a client's operations.
    pub think: (u64, u64),
    /// Network delay per message, microseconds.
    pub net_delay: (u64, u64),
    /// Disk latency, microseconds (write; reads and flushes derive from it).
    pub disk_latency: (u64, u64),
    pub faults: Faults,
    /// Pause between two faults, milliseconds.
    pub fault_every: (u64, u64),
    /// How long a fault lasts (a node stays dead, a partition holds), milliseconds.
    pub fault_length: (u64, u64),
    /// Nodes that may be dead or cut off at once.
    pub max_down: u32,
    pub lease_ttl: Duration,
    pub down_out: Duration,
    /// How long each store waits for writes to stop before writing its journal back (longer
    /// keeps more records in the journal, for `journal_tail` to damage).
    pub writeback_idle: Duration,
    /// How long each node takes to act on a new map (`Tuning::map_lag`): its PGs' work of the
    /// older map meets the newer one.
    pub map_lag: Duration,
    /// The clients read first from the copies of this many nodes (the first ones;
    /// `Cluster::read_near`, as a gateway in a node's process does), each a serving member
    /// answering from its own copy when it may (`ReadReplica`): 0, 1 or every node.
    pub near_reads: u32,
    /// One more client runs on the first node's host, as a gateway beside the node: it reads
    /// that node's copies first, reaches the metadata store through the host (cut off with
    /// the node) and the other nodes over the host's network (partitioned with it).
    pub gateway: bool,
}

impl Config {
    /// The configuration of `seed`. `faults`: whether the seed may inject faults at all.
    pub fn draw(seed: u64, faults: bool) -> Config {
        let with_faults = faults;
        let mut r = Rng::new(seed);
        let nodes = r.range(3, 5) as u32;
        let replicas = r.range(2, 3.min(u64::from(nodes))) as u8;
        let min_size = if replicas == 3 {
            r.pick(&[2u8, 2, 3])
        } else {
            r.pick(&[1u8, 2, 2])
        };
        let faults = match faults {
            false => Faults::default(),
            true => Faults {
                kills: r.chance(0.6),
                partitions: r.chance(0.5),
                meta_cuts: r.chance(0.25),
                breaks: r.chance(0.4),
                map_changes: r.chance(0.35),
                media: false,
                journal_tail: false,
                stops: false,
                replacements: false,
                read_faults: false,
                lags: false,
            },
        };
        let net_lo = r.pick(&[0u64, 50, 200, 1000]);
        let disk_lo = r.pick(&[0u64, 20, 100, 1000]);
        let mut cfg = Config {
            seed,
            nodes,
            devices_per_node: r.range(1, 2) as u32,
            replicas,
            min_size,
            pg_count: r.pick(&[4u32, 8, 16]),
            object_size: r.pick(&[16u32 << 10, 64 << 10]),
            blocks: r.pick(&[4u64, 16, 64]),
            clients: r.range(1, 4) as u32,
            ops_per_client: r.range(20, 80) as u32,
            reads: r.pick(&[0.2, 0.4, 0.6]),
            zeroes: 0.0,
            think: r.pick(&[(0u64, 0u64), (0, 20), (10, 300)]),
            net_delay: (net_lo, net_lo * r.range(1, 5) + r.range(0, 500)),
            disk_latency: (disk_lo, disk_lo * r.range(1, 4) + r.range(0, 300)),
            faults,
            fault_every: r.pick(&[(200u64, 2000u64), (1000, 6000)]),
            fault_length: r.pick(&[(500u64, 4000u64), (2000, 15000)]),
            max_down: if replicas == 3 {
                r.range(1, 2) as u32
            } else {
                1
            },
            lease_ttl: Duration::from_secs(r.range(2, 4)),
            down_out: Duration::from_secs(r.pick(&[10u64, 30, 600])),
            writeback_idle: Duration::from_millis(2),
            map_lag: Duration::ZERO,
            near_reads: 0,
            gateway: false,
        };
        // Drawn last, so that the seeds' other draws stay what they were before media faults.
        // Not with `min_size` 1: a PG may then take writes on one copy alone, so a flipped bit
        // in it plus any node fault is a double failure that no replication survives.
        cfg.faults.media = with_faults && r.chance(0.4) && min_size > 1;
        cfg.faults.journal_tail = cfg.faults.media && r.chance(0.5);
        if cfg.faults.journal_tail {
            cfg.writeback_idle = Duration::from_millis(r.pick(&[2u64, 100, 2000]));
        }
        // Drawn after everything else for the same reason; a seed without them keeps its client
        // schedule too (the clients draw nothing more).
        if r.chance(0.5) {
            cfg.zeroes = r.pick(&[0.1, 0.25]);
        }
        // Last again, for the same reason.
        cfg.faults.stops = with_faults && r.chance(0.4);
        cfg.map_lag = Duration::from_millis(r.pick(&[0u64, 0, 2, 20]));
        // Last again. Not with `min_size` 1: an interval served by the dead drive alone took
        // writes no other copy holds.
        cfg.faults.replacements = cfg.faults.kills && min_size > 1 && r.chance(0.4);
        // Last again.
        cfg.faults.read_faults = cfg.faults.media && r.chance(0.5);
        // Last again.
        cfg.near_reads = r.pick(&[0, 1, nodes]);
        // Last again.
        cfg.gateway = r.chance(0.5);
        cfg.faults.lags = with_faults && r.chance(0.4);
        cfg
    }
}
