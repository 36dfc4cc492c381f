//! CPU use read from `/proc`, the way `shared/peers/ceph/bench.sh` does it.
//!
//! * server CPU: utime+stime of the server processes (all their threads) from `/proc/PID/stat`;
//! * client CPU: the same for the fio process (fio runs its jobs as threads, `thread=1`, and libnbd
//!   or librbd threads live inside it, so one stat line covers the whole client);
//! * machine busy: from the `cpu` line of `/proc/stat`;
//! * foreign CPU: every other user-space process (cutime/cstime included, so short-lived children of
//!   a neighbour such as a compiler are caught). A step disturbed by foreign load is repeated.
//!
//! Two [`Snapshot`]s bracket the measured window (after the warm-up); [`CpuUse::between`] turns them
//! into percent of one core and CPU-microseconds per IO.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Clock ticks per second (`getconf CLK_TCK`).
pub fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions; it only reads a constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// Fields of `/proc/PID/stat` that we use, parsed past the `(comm)` field (which may hold spaces).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: u32,
    pub comm: String,
    pub ppid: u32,
    pub utime: u64,
    pub stime: u64,
    pub cutime: u64,
    pub cstime: u64,
}

/// Parses one `/proc/PID/stat` line.
pub fn parse_proc_stat(line: &str) -> Option<ProcStat> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let pid = line[..open].trim().parse().ok()?;
    let comm = line[open + 1..close].to_string();
    let rest: Vec<&str> = line[close + 1..].split_whitespace().collect();
    // rest[0] = state (field 3); utime is field 14 -> rest[11].
    let num = |i: usize| rest.get(i).and_then(|s| s.parse::<u64>().ok());
    Some(ProcStat {
        pid,
        comm,
        ppid: num(1)? as u32,
        utime: num(11)?,
        stime: num(12)?,
        cutime: num(13)?,
        cstime: num(14)?,
    })
}

/// Parses the `cpu` line of `/proc/stat` into (busy, total) ticks.
/// Busy = user + nice + system + irq + softirq + steal; idle and iowait are not busy.
pub fn parse_sys_stat(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|s| s.parse().ok())
        .collect();
    if v.len() < 8 {
        return None;
    }
    let busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    Some((busy, busy + v[3] + v[4]))
}

/// utime+stime of one process, all threads; None if it is gone.
pub fn process_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_proc_stat(&s).map(|p| p.utime + p.stime)
}

/// Ticks of every other user-space process: pid -> (utime+stime, cutime+cstime).
/// Excluded: kernel threads (pid 2 and its children), this process and its children named in
/// `exclude` (servers, fio), and `fio`/`top` by name.
pub fn foreign_ticks(exclude: &[u32]) -> HashMap<u32, (u64, u64)> {
    let me = std::process::id();
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some(p) = parse_proc_stat(&text) else {
            continue;
        };
        if p.pid == 2 || p.ppid == 2 || p.pid == me || p.ppid == me || exclude.contains(&p.pid) {
            continue;
        }
        if p.comm == "fio" || p.comm == "top" {
            continue;
        }
        out.insert(pid, (p.utime + p.stime, p.cutime + p.cstime));
    }
    out
}

/// CPU ticks used by foreign processes between two snapshots.
///
/// Own ticks count for processes alive at the end (new ones fully). A process that exited was
/// reaped by a parent whose cutime/cstime then grew by the child's whole life; its ticks from
/// before the window (known from the first snapshot) are subtracted, so only in-window CPU counts
/// (short-lived children of a neighbour, such as compiler runs, are caught this way).
pub fn foreign_delta(before: &HashMap<u32, (u64, u64)>, after: &HashMap<u32, (u64, u64)>) -> u64 {
    let grown: u64 = after
        .iter()
        .map(|(pid, (own, kids))| {
            let (own0, kids0) = before.get(pid).copied().unwrap_or((0, 0));
            own.saturating_sub(own0) + kids.saturating_sub(kids0)
        })
        .sum();
    let gone: u64 = before
        .iter()
        .filter(|(pid, _)| !after.contains_key(pid))
        .map(|(_, (o, k))| o + k)
        .sum();
    grown.saturating_sub(gone)
}

/// CPU counters at one instant.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub at: Instant,
    pub server: u64,
    pub client: Option<u64>,
    pub sys: (u64, u64),
    pub foreign: HashMap<u32, (u64, u64)>,
}

impl Snapshot {
    /// Reads the counters now. `client` is the fio pid (may already have exited: a zombie still
    /// reports its times until it is reaped, which is why the end snapshot is taken before `wait`).
    pub fn take(server_pids: &[u32], client: Option<u32>) -> Snapshot {
        let mut exclude = server_pids.to_vec();
        exclude.extend(client);
        Snapshot {
            at: Instant::now(),
            server: server_pids.iter().filter_map(|p| process_ticks(*p)).sum(),
            client: client.and_then(process_ticks),
            sys: std::fs::read_to_string("/proc/stat")
                .ok()
                .and_then(|s| parse_sys_stat(&s))
                .unwrap_or((0, 0)),
            foreign: foreign_ticks(&exclude),
        }
    }
}

/// CPU used during a measured window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuUse {
    pub window_s: f64,
    /// Server processes, % of one core; None when no server pid is known (raw file, remote peer).
    pub server_pct: Option<f64>,
    /// fio with all its threads, % of one core.
    pub client_pct: Option<f64>,
    /// Whole machine busy, % of one core (2 cores = 200%).
    pub machine_pct: f64,
    /// Everything else on the machine, % of one core.
    pub foreign_pct: f64,
    /// Server CPU-microseconds per IO (server CPU rate / IOPS).
    pub server_us_per_io: Option<f64>,
    pub client_us_per_io: Option<f64>,
}

impl CpuUse {
    /// CPU use between two snapshots, per IO at `iops` (from fio, over the same window).
    pub fn between(a: &Snapshot, b: &Snapshot, has_server: bool, iops: f64) -> CpuUse {
        let w = b.at.duration_since(a.at).as_secs_f64().max(1e-3);
        let tck = clk_tck();
        let pct = |ticks: u64| ticks as f64 / tck / w * 100.0;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let server_pct = has_server.then(|| pct(b.server.saturating_sub(a.server)));
        let client_pct = match (a.client, b.client) {
            (Some(x), Some(y)) => Some(pct(y.saturating_sub(x))),
            _ => None,
        };
        let (busy, total) = (
            b.sys.0.saturating_sub(a.sys.0),
            b.sys.1.saturating_sub(a.sys.1),
        );
        let machine_pct = if total > 0 {
            busy as f64 / total as f64 * cores * 100.0
        } else {
            0.0
        };
        let per_io = |p: Option<f64>| p.filter(|_| iops > 0.0).map(|p| p / 100.0 / iops * 1e6);
        CpuUse {
            window_s: w,
            server_pct,
            client_pct,
            machine_pct,
            // A process can not have used more than the machine had in the window.
            foreign_pct: pct(foreign_delta(&a.foreign, &b.foreign)).min(cores * 100.0),
            server_us_per_io: per_io(server_pct),
            client_us_per_io: per_io(client_pct),
        }
    }
}

/// Percent of one core that `pids` used over `window`.
pub fn pids_pct(pids: &[u32], window: Duration) -> f64 {
    let a: u64 = pids.iter().filter_map(|p| process_ticks(*p)).sum();
    std::thread::sleep(window);
    let b: u64 = pids.iter().filter_map(|p| process_ticks(*p)).sum();
    b.saturating_sub(a) as f64 / clk_tck() / window.as_secs_f64() * 100.0
}

/// Percent of one core used by foreign processes over `window`.
pub fn foreign_pct(exclude: &[u32], window: Duration) -> f64 {
    let a = foreign_ticks(exclude);
    std::thread::sleep(window);
    let b = foreign_ticks(exclude);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    (foreign_delta(&a, &b) as f64 / clk_tck() / window.as_secs_f64() * 100.0).min(cores * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_line_with_spaces_in_comm() {
        let line =
            "4242 (tokio rt (w)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 3 4 20 0 9 0 1000 1 1";
        let p = parse_proc_stat(line).expect("parses");
        assert_eq!((p.pid, p.ppid, p.comm.as_str()), (4242, 1, "tokio rt (w)"));
        assert_eq!((p.utime, p.stime, p.cutime, p.cstime), (250, 75, 3, 4));
        assert!(parse_proc_stat("garbage").is_none());
    }

    #[test]
    fn sys_stat_busy_excludes_idle_and_iowait() {
        let text = "cpu  100 10 50 1000 40 5 5 2 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        assert_eq!(parse_sys_stat(text), Some((172, 1212)));
    }

    #[test]
    fn our_own_process_is_visible() {
        assert!(process_ticks(std::process::id()).is_some());
        assert!(process_ticks(u32::MAX - 1).is_none());
    }

    #[test]
    fn foreign_delta_counts_only_in_window_cpu() {
        // pid 1 ran 5 ticks; pid 3 is new (7); pid 2 (5 ticks before) exited and was reaped by
        // pid 1, whose cutime grew by 8: 3 of those ticks were in the window.
        let a = HashMap::from([(1, (10, 0)), (2, (5, 0))]);
        let b = HashMap::from([(1, (15, 8)), (3, (7, 0))]);
        assert_eq!(foreign_delta(&a, &b), 5 + 8 + 7 - 5);
        // A neighbour that only exits: nothing is counted.
        let c = HashMap::from([(1, (10, 0))]);
        assert_eq!(foreign_delta(&a, &c), 0);
    }
}
