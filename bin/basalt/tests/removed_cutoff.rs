//! A node removed from the cluster while it is cut off from etcd, with real processes on hosts
//! in network namespaces (`common/netns.rs`; needs root, iproute2 and nftables): etcd and two
//! storage nodes, each on a host of its own, a one-copy pool. The operator drains one node,
//! nftables then drops its traffic with etcd (it keeps running), its lease expires, and
//! `basalt node remove` forgets it. Once it reaches etcd again it learns that it was removed:
//! it registers nothing (no node record, no device record) and `basalt node` exits with an
//! error saying so. Before, it retried its registration for good, serving nothing.

mod common;

use common::netcluster::NetCluster;
use common::wait_until;
use std::time::Duration;

/// `--lease-ttl` of the nodes.
const TTL: Duration = Duration::from_secs(3);
const WAIT: Duration = Duration::from_secs(60);

#[test]
fn a_node_removed_while_cut_off_from_etcd_exits_saying_so() {
    let c = NetCluster::start(&["etcd", "n1", "n2"], TTL);
    let _a = c.start_node("n1");
    let b = c.start_node("n2");
    wait_until("two devices up", WAIT, || {
        let devs = c.devices();
        devs.len() == 2 && devs.iter().all(|d| d.up)
    });
    c.create_pool("default", 1, 8);
    let node = b.id.to_string();
    let drained = c.cli_output(&["node", "drain", &node, "--timeout", "60s"]);
    assert!(
        drained.status.success(),
        "drain: {}",
        String::from_utf8_lossy(&drained.stderr)
    );

    c.net.cut("n2", "etcd");
    let key = basalt_meta::keys::node(basalt_types::NodeId(b.id as u32));
    wait_until("n2's lease expired", WAIT, || c.etcd_get(&key).is_none());
    // Removal waits until the map has n2's device down (the leader marks it so once the
    // lease is gone); n2 runs on, cut off.
    wait_until("n2 removed", WAIT, || {
        c.cli_output(&["node", "remove", &node]).status.success()
    });
    assert!(c.net.running(&b.proc), "n2 runs on while it is cut off");
    let db = c.devices();
    assert!(db.iter().all(|d| d.node != b.id), "{db:?}");

    c.net.heal_all();
    wait_until("n2 exited", WAIT, || c.net.exit_status(&b.proc).is_some());
    let status = c.net.exit_status(&b.proc).unwrap();
    let log = c.net.log(&b.proc);
    assert!(
        !status.success() && log.contains("was removed from the cluster"),
        "{status}: {log}"
    );
    assert!(c.etcd_get(&key).is_none(), "n2 registered again");
    assert!(c.devices().iter().all(|d| d.node != b.id));
}
