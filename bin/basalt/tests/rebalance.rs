//! Growing and reshaping a cluster under I/O, with real processes (`basalt up --nodes`, its
//! etcd, `basalt node` children, the NBD gateway) while fio (`verify=crc32c`) and the checking
//! writer (every acknowledged write read back at the end) run through the gateway:
//! - a 4th node joins (`basalt node --join`): PGs move to it by backfill, the former members
//!   keep their copies until the PG is complete on its new set, then forget them; the moved
//!   copies serve once an original node is killed;
//! - a device of a host with two devices is marked out, then in again (failure domain host),
//!   and the same on one host with three devices and failure domain device (replicas 2);
//! - `basalt status` shows degraded objects, a recovery rate and a time left while a returning
//!   node is recovered under a throttle set with `basalt config set`, then nothing degraded.

mod common;

use common::upcluster::UpCluster;
use common::upio::{WAIT, fio_verify, io_across, kill_and_wait_down, nbd, writer_objects};
use common::wait_until;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// One PG of the default pool in `basalt pg list`.
#[derive(Clone, Debug, PartialEq)]
struct Pg {
    up: Vec<u64>,
    acting: Vec<u64>,
}

impl Pg {
    fn remapped(&self) -> bool {
        self.up != self.acting
    }

    /// Acting members placement moves the PG away from.
    fn leaving(&self) -> Vec<u64> {
        let up: BTreeSet<u64> = self.up.iter().copied().collect();
        self.acting
            .iter()
            .copied()
            .filter(|d| !up.contains(d))
            .collect()
    }
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap())
        .collect()
}

fn pgs(c: &UpCluster) -> Vec<Pg> {
    c.up.cli_json(&["pg", "list", "--pool", "default"])
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Pg {
            up: ids(&p["up"]),
            acting: ids(&p["acting"]),
        })
        .collect()
}

/// Objects device `dev` holds of each PG of the default pool (`basalt device pgs`).
fn held(c: &UpCluster, dev: u64) -> BTreeMap<u32, u64> {
    c.up.cli_json(&["device", "pgs", &dev.to_string()])
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["pg"]["pool"].as_u64() == Some(u64::from(c.pool.0)))
        .map(|h| {
            (
                h["pg"]["pg"].as_u64().unwrap() as u32,
                h["objects"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn device_record(c: &UpCluster, dev: u64) -> Value {
    c.devices()
        .into_iter()
        .find(|d| d["id"].as_u64() == Some(dev))
        .expect("the device is listed")
}

/// The node owning each device.
fn hosts(c: &UpCluster) -> BTreeMap<u64, u64> {
    c.nodes
        .iter()
        .flat_map(|n| n.devices.iter().map(|d| (*d, n.id)))
        .collect()
}

#[test]
fn a_node_added_during_fio_takes_pgs_and_old_copies_go_only_once_the_new_ones_are_complete() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = common::upio::start(dir.path(), 3, &[]);
    let objects = writer_objects(&c, |_| true);
    let old: Vec<u64> = c.nodes.iter().map(|n| n.device).collect();
    // Backfill slow enough (per primary device) that PGs are seen while they move.
    c.up.cli_json(&["config", "set", "recovery-rate", "2MiB"]);
    let mut checked = 0;
    let mut new_device = 0;
    let run = io_across(&mut c, objects, |c| {
        let at = Instant::now();
        let id = c.join();
        new_device = c.node(id).device;
        checked = watch_moves(c, &old, new_device);
        at
    });
    let common::upio::Run { log, mut nbd, .. } = run;
    eprintln!("checked {checked} PG copies on former members while their PG was being moved");
    assert!(checked > 0, "no PG was seen while it moved");
    log.verify(&mut nbd, c.object_size);
    c.wait_clean(WAIT);
    c.up.cli_json(&["config", "unset", "recovery-rate"]);

    // The new node holds PGs and is the primary of some.
    let after = pgs(&c);
    let on_new: Vec<usize> = (0..after.len())
        .filter(|i| after[*i].acting.contains(&new_device))
        .collect();
    assert!(!on_new.is_empty(), "no PG moved to the new device");
    assert!(
        after.iter().any(|p| p.acting[0] == new_device),
        "the new device is the primary of no PG"
    );
    let mine = held(&c, new_device);
    assert!(
        on_new
            .iter()
            .any(|i| mine.get(&(*i as u32)).is_some_and(|n| *n > 0)),
        "the new device holds no object: {mine:?}"
    );
    // The former members forget what moved off them.
    for dev in &old {
        let gone: Vec<u32> = (0..after.len() as u32)
            .filter(|i| !after[*i as usize].acting.contains(dev))
            .collect();
        wait_until("former members to forget moved PGs", WAIT, || {
            let h = held(&c, *dev);
            gone.iter().all(|pg| h.get(pg).copied().unwrap_or(0) == 0)
        });
    }

    // An original node dies: the moved copies serve what it held.
    let victim = c
        .nodes
        .iter()
        .map(|n| n.id)
        .filter(|id| Some(*id) != c.leader())
        .find(|id| {
            let d = c.node(*id).device;
            after
                .iter()
                .any(|p| p.acting.contains(&d) && p.acting.contains(&new_device))
        })
        .expect("an original node sharing PGs with the new one");
    kill_and_wait_down(&mut c, victim);
    fio_verify(&c);
    log.verify(&mut nbd, c.object_size);
    nbd.disconnect();
    c.stop();
}

/// Samples the map and what the former members hold until every PG is clean with some PG on
/// `new_device`. Whenever a PG is seen remapped before and after a sample with the same acting
/// set, each leaving member must still hold every object it held of the PG before the node
/// joined. Returns how many such copies were checked.
fn watch_moves(c: &UpCluster, old: &[u64], new_device: u64) -> usize {
    let before_join: BTreeMap<u64, BTreeMap<u32, u64>> =
        old.iter().map(|d| (*d, held(c, *d))).collect();
    let mut checked = 0;
    let deadline = Instant::now() + WAIT * 3;
    loop {
        let first = pgs(c);
        let now: BTreeMap<u64, BTreeMap<u32, u64>> =
            old.iter().map(|d| (*d, held(c, *d))).collect();
        let second = pgs(c);
        for (i, (a, b)) in first.iter().zip(&second).enumerate() {
            if !(a.remapped() && a == b) {
                continue;
            }
            for dev in a.leaving() {
                let pg = i as u32;
                let had = before_join[&dev].get(&pg).copied().unwrap_or(0);
                if had == 0 {
                    continue;
                }
                let has = now[&dev].get(&pg).copied().unwrap_or(0);
                assert!(
                    has >= had,
                    "PG {pg} is still being moved ({a:?}) but device {dev} holds {has} of its \
                     {had} objects"
                );
                checked += 1;
            }
        }
        if second.iter().any(|p| p.acting.contains(&new_device)) && c.all_clean() {
            return checked;
        }
        if Instant::now() > deadline {
            let problems = c.up.cli(&["pg", "list", "--problems"]);
            let status = c.up.cli(&["status", "--json"]);
            let status: Value = serde_json::from_slice(&status.stdout).unwrap_or_default();
            let unclean: Vec<&Value> = status["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n["status"]["pgs"].as_array())
                .flatten()
                .filter(|p| p["clean"] != true)
                .collect();
            panic!(
                "PGs still moving:\n{}\nunclean reports: {unclean:?}\nstatus pgs: {}\n{}",
                String::from_utf8_lossy(&problems.stdout),
                status["pgs"],
                c.logs()
            );
        }
    }
}

/// Marks `dev` out under I/O, waits until no PG is placed on it or served from it, checks
/// the copies are spread as the failure domain says; then marks it in and waits until PGs are
/// back on it. Every acknowledged write reads back after each step.
fn out_and_in(c: &mut UpCluster, dev: u64, copies_on_distinct_hosts: bool) {
    let objects = writer_objects(c, |_| true);
    let before = pgs(c);
    assert!(before.iter().any(|p| p.acting.contains(&dev)));
    let run = io_across(c, objects, |c| {
        let at = Instant::now();
        c.up.cli_json(&["device", "out", &dev.to_string()]);
        wait_until("the device out with no PG left", WAIT * 3, || {
            let d = device_record(c, dev);
            d["acting_pgs"] == 0 && d["up_pgs"] == 0
        });
        at
    });
    let common::upio::Run { log, mut nbd, .. } = run;
    c.wait_clean(WAIT);
    log.verify(&mut nbd, c.object_size);
    fio_verify(c);
    let hosts = hosts(c);
    for p in pgs(c) {
        assert!(!p.acting.contains(&dev), "{p:?}");
        let distinct: BTreeSet<u64> = if copies_on_distinct_hosts {
            p.acting.iter().map(|d| hosts[d]).collect()
        } else {
            p.acting.iter().copied().collect()
        };
        assert_eq!(
            distinct.len(),
            p.acting.len(),
            "copies share a domain: {p:?}"
        );
    }
    wait_until("the out device to forget its PGs", WAIT, || {
        held(c, dev).values().all(|n| *n == 0)
    });
    // With it out, the other device of its host is the last place for some copies: marking
    // it out too is refused (copies would share a host, or have nowhere to go).
    let sibling = c
        .nodes
        .iter()
        .find(|n| n.devices.contains(&dev))
        .and_then(|n| n.devices.iter().find(|d| **d != dev))
        .copied()
        .expect("a host with two devices or more");
    let refused = c.up.cli(&["device", "out", &sibling.to_string()]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("nothing was marked out"),
        "{err}"
    );
    assert!(device_record(c, sibling)["out"].is_null());
    // Out and empty, but its node still serves it: it may not be forgotten.
    let refused = c.up.cli(&["device", "remove", &dev.to_string()]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("it is up"),
        "{err}"
    );

    c.up.cli_json(&["device", "in", &dev.to_string()]);
    wait_until("PGs back on the device", WAIT * 3, || {
        device_record(c, dev)["acting_pgs"].as_u64().unwrap() > 0 && c.all_clean()
    });
    assert!(held(c, dev).values().any(|n| *n > 0), "nothing moved back");
    // A device no node found faulty has no fault to clear; the command leaves it as it is.
    let rec = c.up.cli_json(&["device", "clear-fault", &dev.to_string()]);
    assert!(rec["fault"].is_null() && rec["state"] == "up", "{rec}");
    log.verify(&mut nbd, c.object_size);
    fio_verify(c);
    nbd.disconnect();
}

#[test]
fn a_device_out_on_a_host_with_two_devices_moves_its_pgs_and_back_when_in() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = common::upio::start(dir.path(), 3, &["--devices-per-node", "2"]);
    assert!(c.nodes.iter().all(|n| n.devices.len() == 2));
    // Draining a whole node would leave two hosts for three copies: refused, saying why, and
    // nothing is marked out.
    let node = c.nodes[1].id.to_string();
    let refused = c.up.cli(&["node", "drain", &node]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && err.contains("with 2 hosts to use")
            && err.contains("would keep copies on the same host"),
        "{err}"
    );
    for d in &c.nodes[1].devices {
        assert!(device_record(&c, *d)["out"].is_null());
    }
    let dev = c.nodes[1].devices[1];
    out_and_in(&mut c, dev, true);
    c.stop();
}

#[test]
fn a_device_out_on_one_host_with_failure_domain_device_keeps_two_copies() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = common::upio::start(
        dir.path(),
        1,
        &[
            "--devices-per-node",
            "3",
            "--failure-domain",
            "device",
            "--replicas",
            "2",
        ],
    );
    let pool = c.up.cli_json(&["pool", "info", "default"]);
    assert_eq!(pool["replicas"], 2, "{pool}");
    assert_eq!(pool["failure_domain"], "device", "{pool}");
    let dev = c.nodes[0].devices[0];
    out_and_in(&mut c, dev, false);
    c.stop();
}

fn status(c: &UpCluster) -> Value {
    c.up.cli_json(&["status"])
}

#[test]
fn status_shows_degraded_objects_a_rate_and_time_left_while_a_node_is_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = common::upio::start(dir.path(), 3, &[]);
    let s = status(&c);
    assert_eq!(s["recovery"]["degraded_objects"], 0, "{}", s["recovery"]);
    assert_eq!(s["recovery"]["rate_limit"], Value::Null);
    // Recovery at 256 KiB/s per device: slow enough to watch.
    c.up.cli_json(&["config", "set", "recovery-rate", "256KiB"]);
    let got = c.up.cli_json(&["config", "get"]);
    assert_eq!(got["recovery_rate"], 256 << 10, "{got}");
    let victim = c
        .nodes
        .iter()
        .map(|n| n.id)
        .find(|id| Some(*id) != c.leader())
        .unwrap();
    kill_and_wait_down(&mut c, victim);
    // Writes while it is away: every object fio touches is missing on it when it returns.
    let mut nbd = nbd(&c);
    let block = vec![0x5a; c.object_size as usize];
    for o in 0..64 {
        assert_eq!(nbd.write(o * c.object_size, &block, 0).unwrap(), 0);
    }
    c.restart(victim);
    let mut seen = Value::Null;
    wait_until(
        "status to show degraded objects, a rate and a time left",
        WAIT,
        || {
            let r = status(&c)["recovery"].clone();
            let ok = r["degraded_objects"].as_u64().unwrap() > 0
                && r["objects_per_sec"].as_f64().unwrap() > 0.0
                && r["eta_secs"].as_u64().is_some();
            if ok {
                seen = r;
            }
            ok
        },
    );
    eprintln!("recovery while the node returns: {seen}");
    assert_eq!(seen["rate_limit"], 256 << 10, "{seen}");
    let text = c.up.cli(&["status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("recovery: "), "{text}");
    // Throttle lifted: recovery finishes, nothing is degraded any more.
    c.up.cli_json(&["config", "unset", "recovery-rate"]);
    c.wait_clean(WAIT);
    wait_until("nothing degraded", WAIT, || {
        let r = status(&c)["recovery"].clone();
        r["degraded_objects"] == 0 && r["misplaced_objects"] == 0
    });
    for o in 0..64 {
        let got = nbd.read(o * c.object_size, c.object_size as u32).unwrap();
        assert!(got.as_ref() == Ok(&block), "object {o} reads back wrong");
    }
    nbd.disconnect();
    c.stop();
}
