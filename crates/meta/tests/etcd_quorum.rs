//! A watch on an etcd member that lost its cluster's leader (cut off from its peers, still
//! reachable by clients) must end, not go silent: that member hears of no change any more,
//! and a node whose map watch stayed open there would stay on its old map for good while its
//! lease, renewed through other members, kept it serving (found by a review, 2026-11-29).
//! `EtcdStore` asks etcd to cancel watches (and refuse requests) on a member without a
//! leader (`with_require_leader`); the watcher then sees `Lost`, re-lists and watches again.
//!
//! Three real etcd members (Debian's etcd-server) on loopback; the two peers of the watched
//! member are frozen with SIGSTOP, which leaves it without a leader as a cut would.

use anyhow::{Context, Result, bail};
use basalt_meta::{EtcdStore, MetaStore, WatchEvent};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The members, killed (and continued first, if frozen) when dropped.
struct Members(Vec<Child>);

impl Drop for Members {
    fn drop(&mut self) {
        for child in &mut self.0 {
            signal(child, libc::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: plain kill(2) on a child this test started and has not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, sig) };
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts a three-member cluster; returns the members and their client URLs.
fn start(dir: &std::path::Path) -> Result<(Members, Vec<String>)> {
    let ports: Vec<(u16, u16)> = (0..3)
        .map(|_| Ok((free_port()?, free_port()?)))
        .collect::<Result<_>>()?;
    let initial: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
        .collect();
    let mut members = Members(Vec::new());
    let mut clients = Vec::new();
    for (i, (client, peer)) in ports.iter().enumerate() {
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.join(format!("m{i}.log")))?;
        let child = Command::new("etcd")
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(dir.join(format!("m{i}")))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "basalt-quorum-test"])
            .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting etcd (Debian package etcd-server)")?;
        members.0.push(child);
        clients.push(client_url);
    }
    Ok((members, clients))
}

/// Connects to `endpoint` once the cluster answers writes there.
async fn connect(endpoint: &str) -> Result<EtcdStore> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let tried = async {
            let store = EtcdStore::connect(&[endpoint], "/quorum-test").await?;
            store.put("/ready", b"1".to_vec(), None).await?;
            anyhow::Ok(store)
        };
        match tried.await {
            Ok(store) => return Ok(store),
            Err(e) if tokio::time::Instant::now() > deadline => {
                return Err(e.context("the etcd cluster never answered"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_member_that_lost_its_leader_ends() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (members, clients) = start(dir.path())?;
    let watched = connect(&clients[0]).await?;
    let other = connect(&clients[1]).await?;
    let from = watched.revision().await? + 1;
    let mut watch = watched.watch_prefix("/w/", from).await?;
    // The watch works: a change made through another member arrives.
    other.put("/w/a", b"1".to_vec(), None).await?;
    match tokio::time::timeout(Duration::from_secs(30), watch.recv()).await {
        Ok(Some(WatchEvent::Put(kv))) if kv.value == b"1" => {}
        got => bail!("the first change did not arrive: {got:?}"),
    }
    // Member 0 keeps running and reachable, its two peers freeze: it has no leader.
    for child in &members.0[1..] {
        signal(child, libc::SIGSTOP);
    }
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match watch.recv().await {
                Some(WatchEvent::Lost(why)) => return Some(why),
                None => return None,
                Some(_) => continue,
            }
        }
    })
    .await;
    match ended {
        Ok(Some(why)) => assert!(!why.is_empty()),
        Ok(None) => bail!("the watch channel closed without saying it was lost"),
        Err(_) => bail!("the watch on a member without a leader stayed open, silent, for 30 s"),
    }
    drop(members);
    Ok(())
}
