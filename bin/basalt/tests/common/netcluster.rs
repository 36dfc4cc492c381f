//! A Basalt cluster spread over the hosts of a [`Net`]: etcd on the first host (listening on
//! its bridge address), `basalt node` processes on others (each listening on its host's
//! address, port 0, its advertised address read back from its output), `basalt nbd`
//! gateways, the CLI, and what the tests observe in etcd: who leads, which lease holds a
//! node's record, and when etcd expires a lease ([`LeaseClock`]).
//!
//! The CLI and the test's etcd client run on the etcd host, so faults between other hosts and
//! etcd never hide what etcd says.

use super::BASALT;
use super::nbd::NbdClient;
use super::netns::{Net, Spawned};
use serde_json::Value;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// etcd's client port on its host (every host has its own port space).
const ETCD_PORT: u16 = 2379;

/// How long processes get to start.
const START: Duration = Duration::from_secs(60);

pub struct NetCluster {
    pub net: Net,
    /// The host etcd runs on (the first host).
    pub etcd_host: String,
    pub etcd_url: String,
    pub etcd: Spawned,
    /// `--lease-ttl` of every node.
    pub ttl: Duration,
}

/// A `basalt node` process.
#[derive(Clone, Debug)]
pub struct NodeProc {
    pub host: String,
    pub proc: Spawned,
    pub id: u64,
    /// The address it advertises (its host's address and the port it got).
    pub addr: SocketAddr,
    pub device: PathBuf,
}

/// A `basalt nbd` gateway process.
#[derive(Clone, Debug)]
pub struct Gateway {
    pub host: String,
    pub proc: Spawned,
    pub addr: SocketAddr,
}

/// A device as `basalt device list` shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Device {
    pub id: u64,
    pub node: u64,
    pub up: bool,
}

impl NetCluster {
    /// Creates the net and starts etcd on its first host.
    pub fn start(hosts: &[&str], ttl: Duration) -> NetCluster {
        let net = Net::new(hosts);
        let etcd_host = hosts[0].to_string();
        let ip = net.addr(&etcd_host);
        let client = format!("http://{ip}:{ETCD_PORT}");
        let peer = "http://127.0.0.1:2380";
        let data = net.dir().join("etcd");
        let mut cmd = net.command(&etcd_host, "etcd");
        cmd.arg("--name=basalt")
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=basalt={peer}"))
            .arg("--initial-cluster-state=new")
            .arg(format!(
                "--max-request-bytes={}",
                basalt_meta::ETCD_DEFAULT_REQUEST_BYTES
            ));
        let etcd = net.spawn(&etcd_host, "etcd", cmd);
        let c = NetCluster {
            net,
            etcd_host,
            etcd_url: client,
            etcd,
            ttl,
        };
        c.wait_for_etcd();
        c
    }

    fn wait_for_etcd(&self) {
        let deadline = Instant::now() + START;
        loop {
            let ok = self.etcd_client(|mut c| async move { c.status().await.is_ok() });
            if ok == Some(true) {
                return;
            }
            assert!(
                self.net.running(&self.etcd),
                "etcd exited:\n{}",
                self.net.log(&self.etcd)
            );
            assert!(
                Instant::now() < deadline,
                "etcd did not answer within {START:?}:\n{}",
                self.net.log(&self.etcd)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `f` with an etcd client on the etcd host, on a runtime of its own there.
    /// `None`: etcd did not accept a connection within 5 s.
    pub fn etcd_client<T, F, Fut>(&self, f: F) -> Option<T>
    where
        T: Send,
        F: FnOnce(etcd_client::Client) -> Fut + Send,
        Fut: Future<Output = T>,
    {
        let url = self.etcd_url.clone();
        self.net.in_ns(&self.etcd_host, move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let connect = etcd_client::Client::connect([url.as_str()], None);
                match tokio::time::timeout(Duration::from_secs(5), connect).await {
                    Ok(Ok(c)) => Some(f(c).await),
                    _ => None,
                }
            })
        })
    }

    /// A key's value and lease, as etcd has it now (`None`: no such key).
    pub fn etcd_get(&self, key: &str) -> Option<(Vec<u8>, i64)> {
        let key = key.to_string();
        self.etcd_client(|mut c| async move {
            let resp = c.get(key, None).await.expect("etcd get");
            resp.kvs()
                .first()
                .map(|kv| (kv.value().to_vec(), kv.lease()))
        })
        .expect("etcd answers")
    }

    /// The lease holding node `id`'s record.
    pub fn node_lease(&self, id: u64) -> Option<i64> {
        let key = basalt_meta::keys::node(basalt_types::NodeId(id as u32));
        self.etcd_get(&key).map(|(_, lease)| lease)
    }

    /// The address of the node that leads now (from the leader record, `<id>@<addr>`).
    pub fn leader_addr(&self) -> Option<SocketAddr> {
        let (value, _) = self.etcd_get(basalt_meta::keys::LEADER)?;
        let record: Value = serde_json::from_slice(&value).ok()?;
        record["name"].as_str()?.split('@').nth(1)?.parse().ok()
    }

    /// Runs `basalt <args> --etcd <url>` on the etcd host.
    pub fn cli_output(&self, args: &[&str]) -> Output {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--etcd", &self.etcd_url]);
        self.net
            .run(&self.etcd_host, BASALT, &all, Duration::from_secs(60))
    }

    /// Runs a CLI command with `--json` that must succeed; returns its output.
    pub fn cli(&self, args: &[&str]) -> Value {
        let mut all: Vec<&str> = args.to_vec();
        all.push("--json");
        let out = self.cli_output(&all);
        assert!(
            out.status.success(),
            "basalt {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON output")
    }

    /// `basalt pool create NAME --replicas R --pgs P`; returns the pool as the CLI shows it.
    pub fn create_pool(&self, name: &str, replicas: u8, pgs: u32) -> Value {
        let (replicas, pgs) = (replicas.to_string(), pgs.to_string());
        self.cli(&[
            "pool",
            "create",
            name,
            "--replicas",
            &replicas,
            "--pgs",
            &pgs,
        ])
    }

    /// Hosts `etcd`, `gw` and `n1`..`n3`, a node on each `n` host (lease `ttl`), pool `default`
    /// with 3 copies (`min_size` 2) and `pgs` PGs, volume `v` of `size`; returns once every PG
    /// is clean.
    pub fn start_three(ttl: Duration, pgs: u32, size: &str) -> (NetCluster, [NodeProc; 3]) {
        let c = NetCluster::start(&["etcd", "gw", "n1", "n2", "n3"], ttl);
        let nodes = ["n1", "n2", "n3"].map(|h| c.start_node(h));
        super::wait_until("three devices up", START, || {
            let devs = c.devices();
            devs.len() == 3 && devs.iter().all(|d| d.up)
        });
        let pool = c.create_pool("default", 3, pgs);
        assert_eq!(pool["min_size"], 2, "{pool}");
        c.cli(&["volume", "create", "v", "--size", size]);
        super::wait_until("every PG clean", START, || c.all_clean(pgs));
        (c, nodes)
    }

    /// Starts `basalt node` on `host` with a 256 MiB device file; returns once it registered.
    pub fn start_node(&self, host: &str) -> NodeProc {
        self.start_node_with(host, &[])
    }

    /// [`NetCluster::start_node`] with more `basalt node` arguments.
    pub fn start_node_with(&self, host: &str, extra: &[&str]) -> NodeProc {
        let listen = format!("{}:0", self.net.addr(host));
        let (cmd, device) = self.node_command(host, &listen, extra);
        let proc = self
            .net
            .spawn(host, &self.fresh_label(&format!("node-{host}")), cmd);
        // "node node.3 serving on 10.192.4.3:41234"
        let line = self.net.wait_for_line(&proc, "serving on", START);
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "serving").unwrap();
        let id = words[at - 1].trim_start_matches("node.").parse().unwrap();
        let addr: SocketAddr = words[at + 2].parse().unwrap();
        assert_eq!(addr.ip(), self.net.addr(host), "advertised address");
        NodeProc {
            host: host.to_string(),
            proc,
            id,
            addr,
            device,
        }
    }

    /// The `basalt node` command of `host` (its device file and data directory), listening on
    /// `listen`; and the device file.
    fn node_command(&self, host: &str, listen: &str, extra: &[&str]) -> (Command, PathBuf) {
        let device = self.net.dir().join(format!("dev-{host}.img"));
        let spec = format!("{}:256MiB", device.display());
        let ttl = format!("{}ms", self.ttl.as_millis());
        let mut cmd = self.net.command(host, BASALT);
        cmd.args(["node", "--etcd", &self.etcd_url, "--listen", listen])
            .args(["--device", &spec, "--lease-ttl", &ttl])
            .args(extra)
            .arg("--data")
            .arg(self.net.dir().join(format!("node-{host}")))
            .env("RUST_LOG", "info");
        (cmd, device)
    }

    /// Runs the node of `host` listening on `listen`, an address it cannot bind (one of
    /// another host): it opens its devices, then fails to start. Returns its log once it
    /// exited with an error.
    pub fn node_start_fails(&self, host: &str, listen: &str) -> String {
        let (cmd, _) = self.node_command(host, listen, &[]);
        let proc = self
            .net
            .spawn(host, &self.fresh_label(&format!("node-{host}")), cmd);
        super::wait_until("the failing node to exit", START, || {
            !self.net.running(&proc)
        });
        let log = self.net.log(&proc);
        let status = self.net.exit_status(&proc).expect("exited");
        assert!(!status.success(), "the node started:\n{log}");
        log
    }

    /// `label`, or `label.2`, `label.3`, ... : the first with no log yet, so that a process
    /// started again on a host reads only its own output.
    fn fresh_label(&self, label: &str) -> String {
        (1..)
            .map(|i| match i {
                1 => label.to_string(),
                i => format!("{label}.{i}"),
            })
            .find(|l| !self.net.dir().join(format!("{l}.log")).exists())
            .expect("a free label")
    }

    /// Starts `basalt nbd` on `host` (listening on the host's address, port 0).
    pub fn start_gateway(&self, host: &str, io_timeout: Duration) -> Gateway {
        self.start_gateway_with(host, io_timeout, &[])
    }

    /// [`NetCluster::start_gateway`] with more `basalt nbd` arguments.
    pub fn start_gateway_with(&self, host: &str, io_timeout: Duration, extra: &[&str]) -> Gateway {
        let listen = format!("{}:0", self.net.addr(host));
        let timeout = format!("{}ms", io_timeout.as_millis());
        let mut cmd = self.net.command(host, BASALT);
        cmd.args(["nbd", "--etcd", &self.etcd_url, "--listen", &listen])
            .args(["--io-timeout", &timeout])
            .args(extra)
            .env("RUST_LOG", "info");
        let proc = self
            .net
            .spawn(host, &self.fresh_label(&format!("gateway-{host}")), cmd);
        // "serving volumes over NBD on 10.192.4.2:40000 (nbd://...)"
        let line = self.net.wait_for_line(&proc, "over NBD on", START);
        let addr = line
            .split_whitespace()
            .skip_while(|w| *w != "on")
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        Gateway {
            host: host.to_string(),
            proc,
            addr,
        }
    }

    /// An NBD connection from `host` to the gateway, opening `export`.
    pub fn nbd(&self, host: &str, gw: &Gateway, export: &str) -> NbdClient {
        let s = self
            .net
            .connect(host, gw.addr)
            .expect("connect to the gateway");
        // A gateway that never answers fails the test instead of hanging it (its own I/O
        // timeout is far shorter in every test).
        s.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
        NbdClient::over(s, export).expect("NBD handshake")
    }

    /// `fio` run on `host` against `uri`; must succeed.
    pub fn fio<S: AsRef<str>>(&self, host: &str, args: &[S]) -> String {
        let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        let out = self.net.run(host, "fio", &args, Duration::from_secs(300));
        assert!(
            out.status.success(),
            "fio {args:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn devices(&self) -> Vec<Device> {
        self.cli(&["device", "list"])
            .as_array()
            .unwrap()
            .iter()
            .map(|d| Device {
                id: d["id"].as_u64().unwrap(),
                node: d["node"].as_u64().unwrap(),
                up: d["up"].as_bool().unwrap(),
            })
            .collect()
    }

    /// Whether `basalt status` says every PG (`pg_count` in all) is active and clean.
    pub fn all_clean(&self, pg_count: u32) -> bool {
        let out = self.cli_output(&["status", "--json"]);
        out.status.success()
            && super::upcluster::pgs_clean(&serde_json::from_slice(&out.stdout).unwrap(), pg_count)
    }

    /// The device of node `node` (each test node has one).
    pub fn device_of(&self, node: &NodeProc) -> Device {
        self.devices()
            .into_iter()
            .find(|d| d.node == node.id)
            .expect("the node's device is registered")
    }

    /// Waits until `cond` holds for `device`'s state.
    pub fn wait_device(&self, node: &NodeProc, what: &str, up: bool, limit: Duration) {
        super::wait_until(what, limit, || self.device_of(node).up == up);
    }

    /// The acting primary device of every PG of `pool` (0: none).
    pub fn pg_primaries(&self, pool: &str) -> Vec<u64> {
        self.cli(&["pg", "list", "--pool", pool])
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["acting"][0].as_u64().unwrap_or(0))
            .collect()
    }

    /// Watches the remaining time of `lease` from now on (see [`LeaseClock`]).
    pub fn lease_clock(&self, lease: i64) -> LeaseClock {
        let stop = Arc::new(AtomicBool::new(false));
        let url = self.etcd_url.clone();
        let flag = stop.clone();
        let thread = self.net.spawn_in(&self.etcd_host, move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(sample_lease(url, lease, flag))
        });
        LeaseClock {
            stop,
            thread: Some(thread),
        }
    }
}

/// One answer to etcd's LeaseTimeToLive: the remaining whole seconds (`-1`: the lease is
/// gone), between `sent` and `got`.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub sent: Instant,
    pub got: Instant,
    pub ttl: i64,
}

/// Asks etcd for a lease's remaining time every few milliseconds, until the lease is gone
/// (or [`LeaseClock::finish`]). etcd answers `floor(expiry - now)` in whole seconds, so the
/// instant the answer drops from `k` to `k - 1` pins its expiry to within the sampling
/// interval: [`LeaseClock::expiry`].
pub struct LeaseClock {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<Sample>>>,
}

impl LeaseClock {
    /// Waits until etcd says the lease is gone (or `limit`), and returns every sample.
    pub fn finish(mut self, limit: Duration) -> Vec<Sample> {
        let thread = self.thread.take().unwrap();
        let deadline = Instant::now() + limit;
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stop.store(true, Ordering::Relaxed);
        thread.join().expect("the lease clock panicked")
    }

    /// The interval `[earliest, latest)` in which etcd's expiry of the lease lies, from the
    /// last drop of the remaining seconds before the lease was gone (a renewal in between
    /// would have raised them again). `None` if the samples do not show one.
    pub fn expiry(samples: &[Sample]) -> Option<(Instant, Instant)> {
        let gone = samples.iter().position(|s| s.ttl < 0)?;
        let live = &samples[..gone];
        let j = (1..live.len())
            .rev()
            .find(|&j| live[j].ttl < live[j - 1].ttl)?;
        let (a, b) = (live[j - 1], live[j]);
        assert!(
            live[j..].iter().all(|s| s.ttl == b.ttl) && a.ttl == b.ttl + 1,
            "the lease's remaining time did not fall one second at a time: {:?}",
            &live[j - 1..]
        );
        let k = Duration::from_secs(a.ttl as u64);
        Some((a.sent + k, (b.got + k).min(samples[gone].got)))
    }
}

impl Drop for LeaseClock {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

async fn sample_lease(url: String, lease: i64, stop: Arc<AtomicBool>) -> Vec<Sample> {
    let mut client = etcd_client::Client::connect([url.as_str()], None)
        .await
        .expect("connect to etcd");
    let mut samples = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        let answer = client.lease_time_to_live(lease, None).await;
        let got = Instant::now();
        let ttl = match answer {
            Ok(r) => r.ttl(),
            Err(e) if e.to_string().contains("not found") => -1,
            Err(e) => panic!("etcd LeaseTimeToLive: {e}"),
        };
        samples.push(Sample { sent, got, ttl });
        if ttl < 0 {
            break;
        }
        // Pacing, so that etcd and the nodes keep their CPU share on a small machine.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    samples
}

/// fio through the gateway at `addr` (volume `v`): 16 MiB of random writes of the sizes
/// `bssplit`, QD8, from `seed`, each block checked with crc32c once written (or only checked,
/// `verify_only`).
pub fn fio_args(addr: SocketAddr, bssplit: &str, seed: u64, verify_only: bool) -> Vec<String> {
    let mut args: Vec<String> = [
        "--name=net",
        "--ioengine=nbd",
        "--rw=randwrite",
        "--iodepth=8",
        "--size=16m",
        "--verify=crc32c",
    ]
    .map(String::from)
    .to_vec();
    args.push(format!("--bssplit={bssplit}"));
    args.push(format!("--randseed={seed}"));
    args.push(format!("--uri=nbd://{addr}/v"));
    if verify_only {
        args.push("--verify_only".into());
    }
    args
}
