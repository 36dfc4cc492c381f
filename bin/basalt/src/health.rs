//! What `basalt status` concludes from the map and the nodes: placement groups counted by state,
//! and the cluster's health (ok, warn, error) with a reason for each problem. Pure: the unit
//! tests below feed it hand-made maps. The JSON is documented in docs/design/status.md.

use basalt_placement::{ClusterMap, PgMap, PoolMap};
use serde::Serialize;

/// Placement groups by state. A PG counts in every state that applies to it (a PG can be
/// degraded and remapped at once); `active_clean` ones are in no other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PgCounts {
    pub total: usize,
    /// At least `min_size` copies are served (an up member of the acting set holds each).
    pub active: usize,
    /// Served by as many copies as the pool keeps, where placement wants them.
    pub active_clean: usize,
    /// Served by fewer copies than the pool keeps (but at least one).
    pub degraded: usize,
    /// Served by fewer copies than the pool's `min_size` (but at least one): writes to it are
    /// refused.
    pub below_min_size: usize,
    /// No up device holds its data: its I/O waits, then fails.
    pub unavailable: usize,
    /// Its data is not (yet) where placement wants it (acting set != up set).
    pub remapped: usize,
}

impl PgCounts {
    /// The PGs of one pool in `map`.
    pub fn of_pool(pool: &PoolMap, map: &ClusterMap) -> PgCounts {
        let mut c = PgCounts::default();
        for pg in &pool.pgs {
            c.count(pool, pg, map);
        }
        c
    }

    fn count(&mut self, pool: &PoolMap, pg: &PgMap, map: &ClusterMap) {
        let serving = map.serving(pg).count();
        let replicas = usize::from(pool.replicas);
        let min_size = usize::from(pool.min_size.max(1));
        let remapped = pg.acting != pg.up;
        self.total += 1;
        self.active += usize::from(serving >= min_size);
        self.active_clean += usize::from(serving >= replicas && !remapped);
        self.degraded += usize::from(serving > 0 && serving < replicas);
        self.below_min_size += usize::from(serving > 0 && serving < min_size);
        self.unavailable += usize::from(serving == 0);
        self.remapped += usize::from(remapped);
    }

    pub fn add(&mut self, o: &PgCounts) {
        self.total += o.total;
        self.active += o.active;
        self.active_clean += o.active_clean;
        self.degraded += o.degraded;
        self.below_min_size += o.below_min_size;
        self.unavailable += o.unavailable;
        self.remapped += o.remapped;
    }
}

/// How the cluster is, worst first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Ok,
    Warn,
    Error,
}

/// One problem.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reason {
    pub severity: Severity,
    /// A stable name for scripts, e.g. `nodes_down`, `pgs_unavailable`.
    pub check: &'static str,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Health {
    /// The worst severity among the reasons (`ok` without any).
    pub status: Severity,
    /// Errors first.
    pub reasons: Vec<Reason>,
}

/// What health is judged from.
#[derive(Debug, Default)]
pub struct Facts {
    pub epoch: u64,
    /// Every known node, and how it is: `(name, state)`.
    pub nodes: Vec<(String, NodeState)>,
    pub devices: usize,
    pub devices_down: Vec<u32>,
    pub devices_out: Vec<u32>,
    pub pgs: PgCounts,
    /// `(device, checksum errors)` for devices that reported some.
    pub checksum_errors: Vec<(u32, u64)>,
    /// `(device, failed reads)` for devices that reported some (I/O errors reading data).
    pub read_errors: Vec<(u32, u64)>,
    /// `(device, milliseconds)` for devices whose oldest I/O in flight has waited at least
    /// [`SLOW_IO_MS`].
    pub stalled_io: Vec<(u32, u64)>,
    /// `(node, requests, oldest ms)` for nodes with client I/O or replication sub-operations
    /// in flight for [`basalt_node::SLOW_REQUEST`] or longer.
    pub slow_requests: Vec<(u32, u64, u64)>,
    /// `(device, why)` for devices their node found faulty (down until an operator clears it).
    pub faulty: Vec<(u32, String)>,
    /// Devices an operator declared lost (`basalt device lost`).
    pub lost: Vec<u32>,
    /// Objects no good copy of was found (every copy fails its checksum).
    pub unfound_objects: u64,
    /// Devices much slower than their peers (`slow.rs`).
    pub slow_devices: Vec<crate::slow::SlowDevice>,
    /// `(device, PGs)` for devices with PGs marked suspect (a journal tail dropped at open).
    pub suspect: Vec<(u32, u64)>,
    /// `(device, percent used)` of every device whose node reported it.
    pub used: Vec<(u32, u64)>,
    /// Placement groups whose backfill stopped at a target used past the backfill-full limit.
    pub backfill_toofull: usize,
    /// Maintenance: no device goes out for being down (`basalt config set noout on`).
    pub noout: bool,
}

/// A device used this much (percent) is a warning (`devices_nearfull`), as in Ceph.
pub const NEARFULL_PERCENT: u64 = 85;
/// A device used this much (percent) is an error (`devices_full`): writes of new data to its
/// placement groups will soon fail with `ENOSPC`.
pub const FULL_PERCENT: u64 = 95;

/// An I/O that has waited this long (ms) makes a device a health warning (`device_stalled`).
pub const SLOW_IO_MS: u64 = 1000;

/// A node's state in `basalt status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Registered under its lease and answering.
    Up,
    /// Registered, answering, but refusing data-path requests: it cannot confirm its lease.
    Fenced,
    /// Registered, but it did not answer a status request.
    Unreachable,
    /// Not registered: stopped, crashed or cut off longer than its lease.
    Down,
}

impl Health {
    pub fn judge(f: &Facts) -> Health {
        let mut reasons = Vec::new();
        let mut add = |severity, check, message: String| {
            reasons.push(Reason {
                severity,
                check,
                message,
            });
        };
        if f.epoch == 0 {
            add(
                Severity::Error,
                "no_map",
                "no cluster map has been published yet (no node has led)".into(),
            );
        }
        let with = |state: NodeState| -> Vec<&str> {
            f.nodes
                .iter()
                .filter(|(_, s)| *s == state)
                .map(|(n, _)| n.as_str())
                .collect()
        };
        let (down, fenced, unreachable) = (
            with(NodeState::Down),
            with(NodeState::Fenced),
            with(NodeState::Unreachable),
        );
        if !f.nodes.is_empty() && with(NodeState::Up).is_empty() {
            add(Severity::Error, "no_node_up", "no node is up".into());
        }
        let pgs = &f.pgs;
        if pgs.unavailable > 0 {
            add(
                Severity::Error,
                "pgs_unavailable",
                format!(
                    "{} of {} placement groups unavailable: no up device holds their data; \
                     their I/O waits, then fails",
                    pgs.unavailable, pgs.total
                ),
            );
        }
        if f.unfound_objects > 0 {
            add(
                Severity::Error,
                "objects_unfound",
                format!(
                    "{} object(s) unfound: every copy fails its checksum; their reads and writes \
                     fail (`basalt pg list --problems` names their PGs and objects; `basalt pg \
                     mark-unfound-lost POOL PG` gives them up once no device that could hold a \
                     good copy will return; a PG below its pool's min_size gives up nothing \
                     until `basalt pool set POOL --min-size` lets it serve)",
                    f.unfound_objects
                ),
            );
        }
        if pgs.below_min_size > 0 {
            add(
                Severity::Error,
                "pgs_below_min_size",
                format!(
                    "{} placement groups served by fewer copies than their pool's min_size: \
                     writes to them are refused",
                    pgs.below_min_size
                ),
            );
        }
        if !down.is_empty() {
            add(
                Severity::Warn,
                "nodes_down",
                format!(
                    "{} of {} nodes down: {} (a host gone for good: `basalt node remove ID` once \
                     its devices are out and its data rebuilt)",
                    down.len(),
                    f.nodes.len(),
                    down.join(", ")
                ),
            );
        }
        for n in fenced {
            add(
                Severity::Warn,
                "nodes_fenced",
                format!("{n} is fenced: it cannot confirm its lease and acknowledges no I/O"),
            );
        }
        for n in unreachable {
            add(
                Severity::Warn,
                "nodes_unreachable",
                format!("{n} is registered but did not answer"),
            );
        }
        if !f.devices_down.is_empty() {
            add(
                Severity::Warn,
                "devices_down",
                format!(
                    "{} of {} devices down: {}",
                    f.devices_down.len(),
                    f.devices,
                    devices(&f.devices_down)
                ),
            );
        }
        space(f, &mut add);
        if f.noout {
            add(
                Severity::Warn,
                "noout",
                "noout is set: devices down past the down-out interval stay in and their data \
                 is not rebuilt elsewhere (`basalt config unset noout` after the maintenance)"
                    .into(),
            );
        }
        if !f.devices_out.is_empty() {
            add(
                Severity::Warn,
                "devices_out",
                format!(
                    "{} of {} devices out (they get no new data): {}",
                    f.devices_out.len(),
                    f.devices,
                    devices(&f.devices_out)
                ),
            );
        }
        if pgs.degraded > 0 {
            add(
                Severity::Warn,
                "pgs_degraded",
                format!(
                    "{} of {} placement groups degraded: served by fewer copies than their \
                     pool keeps",
                    pgs.degraded, pgs.total
                ),
            );
        }
        if pgs.remapped > 0 {
            add(
                Severity::Warn,
                "pgs_remapped",
                format!(
                    "{} of {} placement groups remapped: their data is not where placement \
                     wants it",
                    pgs.remapped, pgs.total
                ),
            );
        }
        for (d, n) in &f.checksum_errors {
            add(
                Severity::Warn,
                "checksum_errors",
                format!("dev.{d} returned {n} blocks that failed their checksum"),
            );
        }
        for (d, n) in &f.read_errors {
            add(
                Severity::Warn,
                "read_errors",
                format!(
                    "dev.{d} failed {n} reads of data (I/O errors: bad sectors or a failing \
                     drive); copies are repaired from other replicas where one is good"
                ),
            );
        }
        for (d, why) in &f.faulty {
            add(
                Severity::Warn,
                "device_faulty",
                format!(
                    "dev.{d} is faulty ({why}): it stays down until `basalt device clear-fault \
                     {d}` (replace or check the drive first; a drive gone for good: take it off \
                     its node, `basalt device out {d}`, then `basalt device remove {d}` once \
                     every PG is clean)"
                ),
            );
        }
        for d in &f.lost {
            add(
                Severity::Warn,
                "device_lost",
                format!(
                    "dev.{d} was declared lost: it stays down and out; take it off its node \
                     and run `basalt device remove {d}` once every PG is clean"
                ),
            );
        }
        for (d, n) in &f.suspect {
            add(
                Severity::Warn,
                "device_suspect",
                format!(
                    "dev.{d}: {n} PG(s) may lack writes it acknowledged (its store dropped \
                     journal records as a torn tail when it started: a write that never \
                     completed, or damage to its newest records); their next peering \
                     recovers them from the other copies"
                ),
            );
        }
        for (d, ms) in &f.stalled_io {
            add(
                Severity::Warn,
                "device_stalled",
                format!(
                    "dev.{d}: an I/O has waited {:.1} s (the device may hang; its node reports \
                     it down past its --device-stall-timeout)",
                    *ms as f64 / 1000.0
                ),
            );
        }
        for (n, count, ms) in &f.slow_requests {
            add(
                Severity::Warn,
                "slow_requests",
                format!(
                    "node.{n}: {count} client request(s) or replication sub-operation(s) in \
                     flight for {} s or more, the oldest for {:.1} s (waiting on a member or \
                     device that does not answer, or on an object's recovery; see the other \
                     reasons)",
                    basalt_node::SLOW_REQUEST.as_secs(),
                    *ms as f64 / 1000.0
                ),
            );
        }
        for d in &f.slow_devices {
            let than = match d.peers_ms {
                Some(m) => format!(
                    "{:.0}x the {m:.1} ms of its class's other devices",
                    d.io_ms / m
                ),
                None => "and it has no peers of its class".into(),
            };
            add(
                Severity::Warn,
                "device_slow",
                format!(
                    "dev.{} is slow: {:.1} ms per I/O over the last 10 s, {than}; every PG it \
                     serves waits for it (`basalt device out {}` moves its data off)",
                    d.id, d.io_ms, d.id
                ),
            );
        }
        reasons.sort_by_key(|r| std::cmp::Reverse(r.severity));
        Health {
            status: reasons.first().map_or(Severity::Ok, |r| r.severity),
            reasons,
        }
    }
}

/// The checks of used space: devices nearly full or full, and backfills stopped by one.
fn space(f: &Facts, add: &mut impl FnMut(Severity, &'static str, String)) {
    let at = |least: u64, below: u64| -> Vec<String> {
        f.used
            .iter()
            .filter(|(_, p)| (least..below).contains(p))
            .map(|(d, p)| format!("dev.{d} {p}%"))
            .collect()
    };
    let full = at(FULL_PERCENT, u64::MAX);
    if !full.is_empty() {
        add(
            Severity::Error,
            "devices_full",
            format!(
                "{} device(s) at least {FULL_PERCENT}% used: {} (new data written to their \
                 placement groups will soon fail with ENOSPC; free space or add devices)",
                full.len(),
                full.join(", ")
            ),
        );
    }
    let near = at(NEARFULL_PERCENT, FULL_PERCENT);
    if !near.is_empty() {
        add(
            Severity::Warn,
            "devices_nearfull",
            format!(
                "{} device(s) at least {NEARFULL_PERCENT}% used: {}",
                near.len(),
                near.join(", ")
            ),
        );
    }
    if f.backfill_toofull > 0 {
        add(
            Severity::Warn,
            "pgs_backfill_toofull",
            format!(
                "{} placement groups cannot move: a device they move to is used past the \
                 backfill-full limit (`basalt config get`); they stay on their old devices \
                 (add devices, free space, or raise it with `basalt config set backfill-full`)",
                f.backfill_toofull
            ),
        );
    }
}

fn devices(ids: &[u32]) -> String {
    let names: Vec<String> = ids.iter().map(|d| format!("dev.{d}")).collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use basalt_placement::{DeviceInfo, NodeInfo, PgMap};
    use basalt_types::{DeviceId, Epoch, FailureDomain, NodeId, PoolId};

    /// Three devices on three nodes; a pool of `replicas` copies whose PGs are given as
    /// (up, acting) device lists.
    fn map(replicas: u8, min_size: u8, pgs: &[(&[u32], &[u32])], down: &[u32]) -> ClusterMap {
        let mut m = ClusterMap {
            epoch: Epoch(5),
            ..ClusterMap::default()
        };
        for d in 1..=3u32 {
            let mut info = DeviceInfo::new(NodeId(d), "ssd", 1, 131_072);
            info.up = !down.contains(&d);
            m.devices.insert(DeviceId(d), info);
            m.nodes.insert(
                NodeId(d),
                NodeInfo {
                    addr: format!("127.0.0.1:{d}"),
                },
            );
        }
        let ids = |v: &[u32]| v.iter().map(|d| DeviceId(*d)).collect::<Vec<_>>();
        let pool = PoolMap {
            pg_count: pgs.len() as u32,
            replicas,
            min_size,
            object_size: 131_072,
            failure_domain: FailureDomain::Host,
            device_class: None,
            pgs: pgs
                .iter()
                .map(|(up, acting)| PgMap {
                    up: ids(up),
                    acting: ids(acting),
                    since: Epoch(1),
                })
                .collect(),
        };
        m.pools.insert(PoolId(1), pool);
        m
    }

    fn counts(m: &ClusterMap) -> PgCounts {
        PgCounts::of_pool(&m.pools[&PoolId(1)], m)
    }

    #[test]
    fn pgs_are_counted_by_every_state_that_applies() {
        let pgs: &[(&[u32], &[u32])] = &[
            (&[1, 2, 3], &[1, 2, 3]), // clean
            (&[1, 2, 3], &[3, 2, 1]), // remapped: acting differs from up
            (&[1, 2, 3], &[1, 2]),    // degraded and remapped
            (&[2, 3, 1], &[2, 3, 1]), // device 3 down: degraded
            (&[3, 1, 2], &[3]),       // only device 3, down: unavailable
        ];
        let c = counts(&map(3, 2, pgs, &[3]));
        assert_eq!(
            c,
            PgCounts {
                total: 5,
                active: 4,
                active_clean: 0,
                degraded: 4,
                below_min_size: 0,
                unavailable: 1,
                remapped: 3,
            }
        );
        let c = counts(&map(3, 2, pgs, &[]));
        assert_eq!((c.active_clean, c.degraded, c.unavailable), (2, 2, 0));
        assert_eq!((c.active, c.below_min_size), (4, 1));
        let mut sum = c;
        sum.add(&c);
        assert_eq!((sum.total, sum.degraded, sum.remapped), (10, 4, 6));
    }

    #[test]
    fn one_copy_pools_are_clean_or_unavailable() {
        let pgs: &[(&[u32], &[u32])] = &[(&[1], &[1]), (&[2], &[2]), (&[3], &[3])];
        let c = counts(&map(1, 1, pgs, &[2]));
        assert_eq!((c.active_clean, c.unavailable, c.degraded), (2, 1, 0));
        assert_eq!(c.below_min_size, 0);
    }

    fn facts(pgs: PgCounts) -> Facts {
        Facts {
            epoch: 3,
            nodes: vec![
                ("node.1".into(), NodeState::Up),
                ("node.2".into(), NodeState::Up),
            ],
            devices: 2,
            pgs,
            ..Facts::default()
        }
    }

    #[test]
    fn a_clean_cluster_is_ok() {
        let h = Health::judge(&facts(PgCounts {
            total: 8,
            active: 8,
            active_clean: 8,
            ..PgCounts::default()
        }));
        assert_eq!(h.status, Severity::Ok);
        assert!(h.reasons.is_empty(), "{h:?}");
    }

    #[test]
    fn a_down_node_warns_and_unavailable_data_is_an_error() {
        let mut f = facts(PgCounts {
            total: 8,
            active: 8,
            active_clean: 6,
            degraded: 2,
            ..PgCounts::default()
        });
        f.nodes[1].1 = NodeState::Down;
        f.devices_down = vec![2];
        let h = Health::judge(&f);
        assert_eq!(h.status, Severity::Warn);
        let checks: Vec<&str> = h.reasons.iter().map(|r| r.check).collect();
        assert_eq!(checks, ["nodes_down", "devices_down", "pgs_degraded"]);
        assert!(h.reasons[0].message.contains("1 of 2 nodes down: node.2"));

        f.pgs.unavailable = 1;
        let h = Health::judge(&f);
        assert_eq!(h.status, Severity::Error);
        assert_eq!(h.reasons[0].check, "pgs_unavailable", "errors come first");
        f.unfound_objects = 2;
        let h = Health::judge(&f);
        assert_eq!(h.reasons[1].check, "objects_unfound");
        assert!(h.reasons[1].message.starts_with("2 object(s) unfound"));
    }

    #[test]
    fn full_devices_are_an_error_nearly_full_ones_and_stopped_backfills_warn() {
        let mut f = facts(PgCounts::default());
        f.used = vec![(1, 50), (2, 84), (3, 85), (4, 94), (5, 95), (6, 100)];
        let h = Health::judge(&f);
        let checks: Vec<&str> = h.reasons.iter().map(|r| r.check).collect();
        assert_eq!(checks, ["devices_full", "devices_nearfull"]);
        assert_eq!(h.status, Severity::Error);
        assert!(
            h.reasons[0]
                .message
                .starts_with("2 device(s) at least 95% used: dev.5 95%, dev.6 100%"),
            "{}",
            h.reasons[0].message
        );
        assert_eq!(
            h.reasons[1].message,
            "2 device(s) at least 85% used: dev.3 85%, dev.4 94%"
        );
        f.used = vec![(1, 50)];
        f.backfill_toofull = 3;
        let h = Health::judge(&f);
        assert_eq!(h.status, Severity::Warn);
        assert_eq!(h.reasons[0].check, "pgs_backfill_toofull");
        assert!(
            h.reasons[0]
                .message
                .starts_with("3 placement groups cannot move")
        );
    }

    #[test]
    fn fenced_unreachable_out_and_checksum_errors_warn_and_no_map_is_an_error() {
        let mut f = facts(PgCounts::default());
        f.nodes[0].1 = NodeState::Fenced;
        f.nodes[1].1 = NodeState::Unreachable;
        f.devices_out = vec![1];
        f.noout = true;
        f.checksum_errors = vec![(2, 3)];
        f.read_errors = vec![(2, 1)];
        f.stalled_io = vec![(3, 12_345)];
        f.slow_requests = vec![(2, 7, 6_500)];
        f.faulty = vec![(4, "its store is poisoned".into())];
        f.lost = vec![6];
        f.suspect = vec![(5, 2)];
        let h = Health::judge(&f);
        let checks: Vec<&str> = h.reasons.iter().map(|r| r.check).collect();
        assert_eq!(
            checks,
            [
                "no_node_up",
                "nodes_fenced",
                "nodes_unreachable",
                "noout",
                "devices_out",
                "checksum_errors",
                "read_errors",
                "device_faulty",
                "device_lost",
                "device_suspect",
                "device_stalled",
                "slow_requests"
            ]
        );
        assert_eq!(
            h.reasons[11].message,
            "node.2: 7 client request(s) or replication sub-operation(s) in flight for 5 s or \
             more, the oldest for 6.5 s (waiting on a member or device that does not answer, \
             or on an object's recovery; see the other reasons)"
        );
        assert!(
            h.reasons[6]
                .message
                .starts_with("dev.2 failed 1 reads of data"),
            "{}",
            h.reasons[6].message
        );
        assert!(
            h.reasons[8].message.starts_with("dev.6 was declared lost"),
            "{}",
            h.reasons[8].message
        );
        assert!(
            h.reasons[9]
                .message
                .starts_with("dev.5: 2 PG(s) may lack writes"),
            "{}",
            h.reasons[9].message
        );
        assert_eq!(
            h.reasons[7].message,
            "dev.4 is faulty (its store is poisoned): it stays down until `basalt device \
             clear-fault 4` (replace or check the drive first; a drive gone for good: take it \
             off its node, `basalt device out 4`, then `basalt device remove 4` once every PG \
             is clean)"
        );
        assert_eq!(
            h.reasons[10].message,
            "dev.3: an I/O has waited 12.3 s (the device may hang; its node reports it down \
             past its --device-stall-timeout)"
        );
        assert_eq!(h.status, Severity::Error);
        f.epoch = 0;
        assert_eq!(Health::judge(&f).reasons[0].check, "no_map");
    }

    #[test]
    fn a_slow_device_warns_naming_it_and_its_peers() {
        let mut f = facts(PgCounts {
            total: 1,
            active: 1,
            active_clean: 1,
            ..PgCounts::default()
        });
        f.slow_devices = vec![
            crate::slow::SlowDevice {
                id: 2,
                io_ms: 412.34,
                peers_ms: Some(1.5),
            },
            crate::slow::SlowDevice {
                id: 5,
                io_ms: 1500.0,
                peers_ms: None,
            },
        ];
        let h = Health::judge(&f);
        assert_eq!(h.status, Severity::Warn);
        assert_eq!(h.reasons.len(), 2, "{h:?}");
        assert_eq!(h.reasons[0].check, "device_slow");
        assert_eq!(
            h.reasons[0].message,
            "dev.2 is slow: 412.3 ms per I/O over the last 10 s, 275x the 1.5 ms of its \
             class's other devices; every PG it serves waits for it (`basalt device out 2` \
             moves its data off)"
        );
        assert!(
            h.reasons[1].message.starts_with(
                "dev.5 is slow: 1500.0 ms per I/O over the last 10 s, and it has no peers"
            ),
            "{}",
            h.reasons[1].message
        );
    }
}
