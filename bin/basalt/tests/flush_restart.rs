//! `--durability flush` across node restarts, with real processes on hosts in network
//! namespaces (`common/netns.rs`; needs root, iproute2 and nftables): etcd, a `basalt nbd`
//! gateway and one storage node, each on a host of its own, pool `default` with one copy (its
//! writes are acknowledged before they are durable: they owe a FLUSH). The NBD client is the
//! test's own (`common/nbd.rs`), so it knows which writes were acknowledged and what each
//! FLUSH answered.
//!
//! A FLUSH covers the writes acknowledged before it: it succeeds after the node stopped
//! cleanly and started again (its stores closed, nothing lost: the same incarnation), also
//! when a start failed in between; it fails with `EIO` once after the node was killed
//! (SIGKILL) and started again (a new incarnation: what it held unflushed may be gone;
//! `node/src/incarnation.rs`, `client/src/flushset.rs`); FUA writes owe it nothing.

mod common;

use common::nbd::NBD_CMD_FLAG_FUA;
use common::netcluster::{NetCluster, NodeProc};
use common::upcluster::pgs_clean;
use common::wait_until;
use std::time::Duration;

const PGS: u32 = 8;
/// `--lease-ttl` of the node.
const TTL: Duration = Duration::from_secs(3);
/// `--io-timeout` of the gateway: far longer than a node restart.
const IO_TIMEOUT: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(60);
const EIO: u32 = 5;
const BLOCK: usize = 4096;

fn clean(c: &NetCluster) -> bool {
    let out = c.cli_output(&["status", "--json"]);
    out.status.success() && pgs_clean(&serde_json::from_slice(&out.stdout).unwrap(), PGS)
}

/// Starts the node on `n1` again (the same device and data directory) and waits until it
/// serves every PG.
fn restart(c: &NetCluster) -> NodeProc {
    let node = c.start_node("n1");
    wait_until("every PG clean again", WAIT, || clean(c));
    node
}

/// SIGTERM: the node leaves cleanly (closes its stores); waits until it has exited.
fn stop_cleanly(c: &NetCluster, node: &NodeProc) {
    // SAFETY: a signal to a child process this test started and has not reaped.
    unsafe { libc::kill(node.proc.pid as i32, libc::SIGTERM) };
    wait_until("the node to exit", WAIT, || !c.net.running(&node.proc));
    let status = c.net.exit_status(&node.proc).expect("exited");
    assert!(status.success(), "{status:?}:\n{}", c.net.log(&node.proc));
}

#[test]
fn a_flush_fails_once_after_a_node_crash_and_succeeds_after_a_clean_restart() {
    let c = NetCluster::start(&["etcd", "gw", "n1"], TTL);
    let node = c.start_node("n1");
    wait_until("the device up", WAIT, || c.devices().iter().any(|d| d.up));
    c.create_pool("default", 1, PGS);
    c.cli(&["volume", "create", "v", "--size", "16MiB"]);
    wait_until("every PG clean", WAIT, || clean(&c));
    let gw = c.start_gateway_with("gw", IO_TIMEOUT, &["--durability", "flush"]);
    let mut nbd = c.nbd("gw", &gw, "v");
    let block = |b: u8| vec![b; BLOCK];

    // A clean stop closes the stores: what the node acknowledged is durable, the FLUSH after
    // its restart succeeds.
    assert_eq!(nbd.write(0, &block(1), 0).unwrap(), 0);
    stop_cleanly(&c, &node);
    let node = restart(&c);
    assert_eq!(
        nbd.flush().unwrap(),
        0,
        "a FLUSH after a clean restart failed:\n{}",
        c.net.log(&gw.proc)
    );

    // A start that fails once it took the mark (its listen address is not on its host)
    // acknowledged nothing: it puts the mark back, and the FLUSH after the next start, which
    // keeps the incarnation, succeeds.
    assert_eq!(nbd.write(3 * BLOCK as u64, &block(4), 0).unwrap(), 0);
    stop_cleanly(&c, &node);
    let elsewhere = format!("{}:0", c.net.addr("gw"));
    let log = c.node_start_fails("n1", &elsewhere);
    assert!(log.contains("cannot listen on"), "{log}");
    assert!(
        c.net.dir().join("node-n1/stores-closed").exists(),
        "the failed start did not put the stores-closed mark back"
    );
    let node = restart(&c);
    assert_eq!(
        nbd.flush().unwrap(),
        0,
        "a FLUSH after a failed start and a clean restart failed:\n{}",
        c.net.log(&gw.proc)
    );

    // Killed: the node's unflushed writes may be lost. The FLUSH that covers the one it
    // acknowledged fails; the next FLUSH covers nothing lost and succeeds.
    assert_eq!(nbd.write(BLOCK as u64, &block(2), 0).unwrap(), 0);
    c.net.kill(&node.proc);
    let node = restart(&c);
    assert_eq!(
        nbd.flush().unwrap(),
        EIO,
        "a FLUSH after a crash succeeded: it covered a write the node may have lost"
    );
    assert_eq!(nbd.flush().unwrap(), 0, "the loss was reported twice");

    // A FUA write is durable when acknowledged: it owes no FLUSH, a crash loses nothing.
    assert_eq!(
        nbd.write(2 * BLOCK as u64, &block(3), NBD_CMD_FLAG_FUA)
            .unwrap(),
        0
    );
    c.net.kill(&node.proc);
    let _node = restart(&c);
    assert_eq!(
        nbd.flush().unwrap(),
        0,
        "a FLUSH after FUA writes only failed"
    );
    assert_eq!(
        nbd.read(2 * BLOCK as u64, BLOCK as u32).unwrap(),
        Ok(block(3))
    );
    assert_eq!(nbd.read(0, BLOCK as u32).unwrap(), Ok(block(1)));
    nbd.disconnect();
}
