//! Several hosts on one machine, for multi-host tests: each host is a network namespace with
//! its own address on a bridge the test creates, and with nothing else (no address in the root
//! namespace, no route out). Processes run inside a host (`ip netns exec`); the test's own
//! sockets enter a host with [`Net::connect`] / [`Net::in_ns`] (a thread that joins the
//! namespace). Faults: [`Net::partition`] takes a host's link down, [`Net::cut`] drops the
//! traffic between two hosts only (nftables rules on the bridge, both directions),
//! [`Net::heal`] / [`Net::heal_all`] undo them.
//!
//! Tests run in parallel (threads of one test binary, and other test processes on the same
//! machine): every [`Net`] claims a free index by creating its bridge (`bsl<idx>br`, the
//! kernel refuses a second one of the same name); its namespaces (`bsl<idx>-<host>`), veth
//! ends (`bsl<idx>v<n>`), nftables table (`bridge bsl<idx>`) and subnet (`10.<192+idx/256>.
//! <idx%256>.0/24`) all derive from that index. Interface names stay under 16 bytes.
//!
//! Dropping a [`Net`] (also while a test panics) kills every process it started and every
//! other process left in its namespaces, then deletes the nftables table, the veth pairs, the
//! namespaces and the bridge; [`Net::leftovers`] lists what of a net still exists.
//!
//! Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN), iproute2 and nftables (`scripts/setup.sh`). When
//! the namespaces cannot be created the test fails with a message saying so: it never skips.

use std::fs::File;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How many nets may exist at once on one machine (subnets 10.192.0.0/12).
const SLOTS: u16 = 4096;

/// Serializes `ip netns add/del` within this process: `ip` mounts `/run/netns` on first use,
/// and two first uses racing can leave a namespace half made.
static NETNS_LOCK: Mutex<()> = Mutex::new(());

/// One host of a [`Net`].
#[derive(Clone, Debug)]
pub struct Host {
    pub name: String,
    /// The namespace (`ip netns exec <ns>`).
    pub ns: String,
    /// The veth end on the bridge, in the root namespace.
    pub veth: String,
    pub addr: Ipv4Addr,
}

/// A process started in a host by [`Net::spawn`]; the [`Net`] owns it (kills and reaps it on
/// drop). Its stdout and stderr go to `log`.
#[derive(Clone, Debug)]
pub struct Spawned {
    index: usize,
    pub host: String,
    pub pid: u32,
    pub log: PathBuf,
}

/// The hosts, bridge and processes of one test. See the module documentation.
pub struct Net {
    /// `bsl<idx>`: the prefix of every name this net creates.
    pub prefix: String,
    bridge: String,
    hosts: Vec<Host>,
    dir: tempfile::TempDir,
    procs: Mutex<Vec<Child>>,
    faults: Mutex<Faults>,
}

#[derive(Default)]
struct Faults {
    table: bool,
    down: Vec<String>,
    cuts: Vec<(Ipv4Addr, Ipv4Addr)>,
}

impl Net {
    /// Creates the bridge and one namespace per host (addresses `.1`, `.2`, ... in the order
    /// given). Host names: up to 8 lowercase letters or digits.
    pub fn new(hosts: &[&str]) -> Net {
        assert!(!hosts.is_empty() && hosts.len() < 200, "1..200 hosts");
        for h in hosts {
            assert!(
                !h.is_empty()
                    && h.len() <= 8
                    && h.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
                "host name {h:?}: 1 to 8 lowercase letters or digits"
            );
        }
        let (idx, bridge) = claim_bridge();
        let prefix = format!("bsl{idx:03x}");
        // Anything else under this prefix is from a run that was killed before its cleanup.
        remove_all(&prefix, true);
        let dir = tempfile::Builder::new()
            .prefix(&format!("basalt-{prefix}-"))
            .tempdir()
            .unwrap();
        let mut net = Net {
            prefix: prefix.clone(),
            bridge,
            hosts: Vec::new(),
            dir,
            procs: Mutex::new(Vec::new()),
            faults: Mutex::new(Faults::default()),
        };
        let subnet = [10, 192 + (idx >> 8) as u8, (idx & 0xff) as u8];
        for (i, name) in hosts.iter().enumerate() {
            let host = Host {
                name: name.to_string(),
                ns: format!("{prefix}-{name}"),
                veth: format!("{prefix}v{i}"),
                addr: Ipv4Addr::new(subnet[0], subnet[1], subnet[2], i as u8 + 1),
            };
            net.add_host(&host, &format!("{prefix}p{i}"));
            net.hosts.push(host);
        }
        for h in &net.hosts {
            wait_link(h, true);
        }
        for h in &net.hosts {
            for p in &net.hosts {
                if p.name != h.name {
                    net.wait_reaches(&h.name, p);
                }
            }
        }
        net
    }

    fn add_host(&self, h: &Host, peer: &str) {
        {
            let _g = NETNS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
            ip(&["netns", "add", &h.ns]);
        }
        ip(&["link", "add", &h.veth, "type", "veth", "peer", "name", peer]);
        ip(&["link", "set", peer, "netns", &h.ns]);
        no_ipv6(&h.veth);
        ip(&["link", "set", &h.veth, "master", &self.bridge, "up"]);
        let cidr = format!("{}/24", h.addr);
        ip(&["-n", &h.ns, "link", "set", peer, "name", "eth0"]);
        ip(&["-n", &h.ns, "addr", "add", &cidr, "dev", "eth0"]);
        ip(&["-n", &h.ns, "link", "set", "eth0", "up"]);
        ip(&["-n", &h.ns, "link", "set", "lo", "up"]);
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no host {name} in this net"))
    }

    pub fn addr(&self, host: &str) -> Ipv4Addr {
        self.host(host).addr
    }

    /// A directory for this net's files (process logs; tests may put data there).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `program` to run inside `host`.
    pub fn command(&self, host: &str, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.host(host).ns, program]);
        cmd
    }

    /// Runs `program args` inside `host` with a time limit; returns its output.
    pub fn run(&self, host: &str, program: &str, args: &[&str], limit: Duration) -> Output {
        let mut cmd = self.command(host, program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run ip netns exec");
        let deadline = Instant::now() + limit;
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!(
                    "{program} {args:?} in {host} did not finish in {limit:?}:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        child.wait_with_output().unwrap()
    }

    /// Starts `cmd` (from [`Net::command`]) with its output in a log file named after `label`.
    /// The net kills it on drop, if the test has not.
    pub fn spawn(&self, host: &str, label: &str, mut cmd: Command) -> Spawned {
        let log = self.dir.path().join(format!("{label}.log"));
        let file = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {label} in {host}: {e}"));
        let pid = child.id();
        let mut procs = self.procs.lock().unwrap();
        procs.push(child);
        Spawned {
            index: procs.len() - 1,
            host: host.to_string(),
            pid,
            log,
        }
    }

    /// SIGKILL, and waits for the process to be gone.
    pub fn kill(&self, p: &Spawned) {
        let mut procs = self.procs.lock().unwrap();
        let child = &mut procs[p.index];
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Whether the process still runs.
    pub fn running(&self, p: &Spawned) -> bool {
        let mut procs = self.procs.lock().unwrap();
        matches!(procs[p.index].try_wait(), Ok(None))
    }

    /// How the process exited, once it has (`None` while it runs).
    pub fn exit_status(&self, p: &Spawned) -> Option<std::process::ExitStatus> {
        let mut procs = self.procs.lock().unwrap();
        procs[p.index].try_wait().ok().flatten()
    }

    /// The process's output so far.
    pub fn log(&self, p: &Spawned) -> String {
        std::fs::read_to_string(&p.log).unwrap_or_default()
    }

    /// Waits until the process printed a line containing `needle`, and returns that line.
    /// Fails the test if the process exits first or `limit` passes.
    pub fn wait_for_line(&self, p: &Spawned, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let log = self.log(p);
            if let Some(line) = log.lines().find(|l| l.contains(needle)) {
                return line.to_string();
            }
            assert!(
                self.running(p),
                "{} exited before printing {needle:?}:\n{}",
                p.log.display(),
                tail(&log, 30)
            );
            assert!(
                Instant::now() < deadline,
                "{} did not print {needle:?} within {limit:?}:\n{}",
                p.log.display(),
                tail(&log, 30)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `f` on a thread inside `host`'s namespace: sockets it creates belong to that host
    /// (and keep working from any thread afterwards).
    pub fn in_ns<T: Send>(&self, host: &str, f: impl FnOnce() -> T + Send) -> T {
        let ns = self.host(host).ns.clone();
        std::thread::scope(|s| {
            match s
                .spawn(move || {
                    enter(&ns);
                    f()
                })
                .join()
            {
                Ok(v) => v,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Like [`Net::in_ns`], on a thread of its own that outlives the call.
    pub fn spawn_in<T: Send + 'static>(
        &self,
        host: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let ns = self.host(host).ns.clone();
        std::thread::spawn(move || {
            enter(&ns);
            f()
        })
    }

    /// A TCP connection from `host` to `addr`.
    pub fn connect(&self, host: &str, addr: SocketAddr) -> std::io::Result<TcpStream> {
        self.in_ns(host, || {
            TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        })
    }

    /// Takes `host`'s link down (its end on the bridge): it reaches no one, no one reaches it.
    pub fn partition(&self, host: &str) {
        let h = self.host(host);
        ip(&["link", "set", &h.veth, "down"]);
        self.faults.lock().unwrap().down.push(h.veth.clone());
        wait_link(h, false);
    }

    /// Brings `host`'s link up again; returns once it reaches the other hosts again (the
    /// kernel takes a moment to send on a link whose carrier came back).
    pub fn heal(&self, host: &str) {
        let h = self.host(host);
        ip(&["link", "set", &h.veth, "up"]);
        self.faults.lock().unwrap().down.retain(|v| *v != h.veth);
        wait_link(h, true);
        self.wait_reachable(host);
    }

    /// Forgets every host's unanswered address resolutions (they would retry only a second
    /// later), then waits until `host` reaches a host it is neither partitioned nor cut from.
    fn wait_reachable(&self, host: &str) {
        for h in &self.hosts {
            ip(&["-n", &h.ns, "neigh", "flush", "all"]);
        }
        let h = self.host(host);
        let faults = self.faults.lock().unwrap();
        let Some(peer) = self.hosts.iter().find(|p| {
            p.name != h.name
                && !faults.down.contains(&p.veth)
                && !faults
                    .cuts
                    .iter()
                    .any(|c| *c == (h.addr, p.addr) || *c == (p.addr, h.addr))
        }) else {
            return;
        };
        drop(faults);
        self.wait_reaches(host, peer);
    }

    /// Waits until a TCP connection from `host` to `peer` succeeds.
    fn wait_reaches(&self, host: &str, peer: &Host) {
        let listener = self.in_ns(&peer.name, || {
            std::net::TcpListener::bind(SocketAddr::new(peer.addr.into(), 0)).unwrap()
        });
        let addr = listener.local_addr().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        self.in_ns(host, || {
            while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "{host} does not reach {} although both links are up; does the host's \
                     firewall filter bridged traffic (br_netfilter with \
                     net.bridge.bridge-nf-call-iptables=1 and a FORWARD policy of DROP, as \
                     Docker sets)?",
                    peer.name
                );
            }
        });
    }

    /// Drops every packet between `a` and `b`, both directions; other traffic flows.
    pub fn cut(&self, a: &str, b: &str) {
        let (a, b) = (self.addr(a), self.addr(b));
        let mut faults = self.faults.lock().unwrap();
        let table = &self.prefix;
        let mut script = String::new();
        if !faults.table {
            script.push_str(&format!(
                "add table bridge {table}\n\
                 add chain bridge {table} cuts {{ type filter hook forward priority 0; policy accept; }}\n"
            ));
        }
        for (from, to) in [(a, b), (b, a)] {
            script.push_str(&format!(
                "add rule bridge {table} cuts ip saddr {from} ip daddr {to} drop\n"
            ));
        }
        nft(&script);
        faults.table = true;
        faults.cuts.push((a, b));
    }

    /// Undoes every fault: links up, cuts removed.
    pub fn heal_all(&self) {
        let mut faults = self.faults.lock().unwrap();
        if !faults.cuts.is_empty() {
            nft(&format!("flush chain bridge {} cuts\n", self.prefix));
            faults.cuts.clear();
        }
        let down = std::mem::take(&mut faults.down);
        drop(faults);
        for veth in down {
            ip(&["link", "set", &veth, "up"]);
            let h = self.hosts.iter().find(|h| h.veth == veth).unwrap();
            wait_link(h, true);
            self.wait_reachable(&h.name);
        }
    }

    /// Names of this net's namespaces, interfaces, nftables table and processes that still
    /// exist (empty once it was dropped).
    pub fn leftovers(prefix: &str, pids: &[u32]) -> Vec<String> {
        let mut left = Vec::new();
        left.extend(
            namespaces(prefix)
                .into_iter()
                .map(|n| format!("namespace {n}")),
        );
        left.extend(
            link_names(prefix)
                .into_iter()
                .map(|n| format!("interface {n}")),
        );
        if has_table(prefix) {
            left.push(format!("nftables table bridge {prefix}"));
        }
        for pid in pids {
            if alive(*pid) {
                left.push(format!("process {pid}"));
            }
        }
        left
    }

    /// The pids of every process in the net's namespaces (the test's and their children).
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        for h in &self.hosts {
            pids.extend(ns_pids(&h.ns));
        }
        pids
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        for child in procs.iter_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Children of those processes, or processes started with `ip netns exec` by hand.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left: Vec<u32> = self.hosts.iter().flat_map(|h| ns_pids(&h.ns)).collect();
            if left.is_empty() || Instant::now() > deadline {
                break;
            }
            for pid in left {
                // SAFETY: SIGKILL to a process in a namespace this net created.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        remove_all(&self.prefix, false);
    }
}

/// Creates a free `bsl<idx>br` bridge, trying indexes from one this process picks.
fn claim_bridge() -> (u16, String) {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = (std::process::id() as u16).wrapping_mul(97)
        ^ NEXT.fetch_add(1, Ordering::Relaxed).wrapping_mul(13);
    for k in 0..SLOTS {
        let idx = start.wrapping_add(k) % SLOTS;
        let bridge = format!("bsl{idx:03x}br");
        let out = ip_try(&["link", "add", &bridge, "type", "bridge"]);
        if out.status.success() {
            no_ipv6(&bridge);
            ip(&["link", "set", &bridge, "up"]);
            return (idx, bridge);
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("File exists"),
            "cannot create a network bridge for a multi-host test ({}): these tests need \
             root (CAP_NET_ADMIN) and iproute2 (scripts/setup.sh installs it)",
            err.trim()
        );
    }
    panic!("all {SLOTS} test network slots are taken (leftover bsl*br bridges?)");
}

/// Removes the nftables table, interfaces and namespaces named after `prefix`, and its bridge
/// too unless `keep_bridge`. Errors are reported, not raised: this runs in `drop`.
fn remove_all(prefix: &str, keep_bridge: bool) {
    if has_table(prefix) {
        let out = nft_try(&format!("delete table bridge {prefix}\n"));
        if !out.status.success() {
            eprintln!(
                "netns: deleting nftables table {prefix} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let bridge = format!("{prefix}br");
    // Veth ends first (their peers in the namespaces go with them), the bridge last.
    let mut names = link_names(prefix);
    names.sort_by_key(|n| *n == bridge);
    for name in names {
        if keep_bridge && name == bridge {
            continue;
        }
        let out = ip_try(&["link", "del", &name]);
        if !out.status.success() {
            eprintln!(
                "netns: deleting interface {name} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let _g = NETNS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for ns in namespaces(prefix) {
        let out = ip_try(&["netns", "del", &ns]);
        if !out.status.success() {
            eprintln!(
                "netns: deleting namespace {ns} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Interfaces of the root namespace whose names start with `prefix`.
fn link_names(prefix: &str) -> Vec<String> {
    ip_out(&["-o", "link", "show"])
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// Namespaces named `<prefix>-...`.
fn namespaces(prefix: &str) -> Vec<String> {
    ip_out(&["netns", "list"])
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .map(str::to_string)
        .collect()
}

fn has_table(prefix: &str) -> bool {
    nft_out("list tables")
        .lines()
        .any(|l| l.trim() == format!("table bridge {prefix}"))
}

/// Waits until both ends of `h`'s link are operationally up (or its namespace end is down).
fn wait_link(h: &Host, up: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let inner = ip_out(&["-n", &h.ns, "-o", "link", "show", "eth0"]);
        let outer = ip_out(&["-o", "link", "show", &h.veth]);
        let done = if up {
            inner.contains("state UP") && outer.contains("state UP")
        } else {
            !inner.contains("state UP")
        };
        if done {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the link of {} did not go {}: {inner} / {outer}",
            h.name,
            if up { "up" } else { "down" }
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Keeps an interface of the root namespace without an address (not even IPv6 link-local),
/// so that the root namespace cannot reach the hosts.
fn no_ipv6(dev: &str) {
    let path = format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6");
    if Path::new(&path).exists() {
        std::fs::write(&path, "1").unwrap_or_else(|e| panic!("write {path}: {e}"));
    }
}

/// Moves the calling thread into the namespace `ns`.
fn enter(ns: &str) {
    let path = format!("/var/run/netns/{ns}");
    let f = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    // SAFETY: setns on a valid namespace fd; it changes only this thread's network namespace.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(
        rc,
        0,
        "setns into {ns}: {}",
        std::io::Error::last_os_error()
    );
}

fn ns_pids(ns: &str) -> Vec<u32> {
    let out = ip_try(&["netns", "pids", ns]);
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Whether `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit(") ")
            .next()
            .is_some_and(|rest| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

fn ip_try(args: &[&str]) -> Output {
    Command::new("ip").args(args).output().unwrap_or_else(|e| {
        panic!("cannot run ip ({e}): multi-host tests need iproute2 (scripts/setup.sh)")
    })
}

fn ip(args: &[&str]) {
    let out = ip_try(args);
    assert!(
        out.status.success(),
        "ip {}: {} (multi-host tests need root: network namespaces, veth, bridges)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

fn ip_out(args: &[&str]) -> String {
    String::from_utf8_lossy(&ip_try(args).stdout).into_owned()
}

fn nft_try(script: &str) -> Output {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run nft ({e}): multi-host tests need nftables (scripts/setup.sh)")
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn nft(script: &str) {
    let out = nft_try(script);
    assert!(
        out.status.success(),
        "nft -f - failed: {}\n{script}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

fn nft_out(cmd: &str) -> String {
    match Command::new("nft").args(cmd.split(' ')).output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
        Err(_) => String::new(),
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
