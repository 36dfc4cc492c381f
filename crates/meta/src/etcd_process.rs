//! [`EtcdProcess`]: a real single-member etcd as a child process on loopback. Used by
//! `basalt up --etcd` and by every test that needs etcd.
//!
//! The child gets free ports (bound to port 0 by the OS, then handed over), its own data dir
//! (a temporary one unless given) and a log file in that dir. [`EtcdProcess::start`] returns
//! once etcd answers requests. Dropping the handle kills the child (SIGKILL) and reaps it;
//! [`EtcdProcess::kill`] does the same on demand for crash tests, [`EtcdProcess::stop`] stops it
//! cleanly (SIGTERM), and [`EtcdProcess::restart`] starts it again on the same ports and data.
//! With [`EtcdOptions::stop_with_parent`] the child also gets SIGTERM when the process that
//! started it dies, however it dies (`basalt up --nodes`).

use crate::error::MetaError;
use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The largest request the child etcd accepts by default. Cluster maps do not need it (they are
/// published in transactions of at most 1 MiB, within etcd's own 1.5 MiB default); it leaves
/// room for other large values.
pub const MAX_REQUEST_BYTES: usize = 16 << 20;

/// etcd's own default request limit (`--max-request-bytes`).
pub const ETCD_DEFAULT_REQUEST_BYTES: usize = 1_572_864;

/// How long etcd may take to answer after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start etcd.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    /// The etcd binary (default `etcd`, found on `PATH`).
    pub binary: PathBuf,
    /// Where etcd keeps its data. `None`: a temporary directory, deleted on drop.
    pub data_dir: Option<PathBuf>,
    /// Client port on 127.0.0.1; 0 = a free one.
    pub client_port: u16,
    /// etcd's `--max-request-bytes`.
    pub max_request_bytes: usize,
    /// Have the kernel send etcd SIGTERM when the thread that starts it exits
    /// (`PR_SET_PDEATHSIG`): start it from a thread that lives as long as the process (the
    /// main thread), so that a killed parent leaves no etcd behind.
    pub stop_with_parent: bool,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            binary: PathBuf::from("etcd"),
            data_dir: None,
            client_port: 0,
            max_request_bytes: MAX_REQUEST_BYTES,
            stop_with_parent: false,
        }
    }
}

/// A running etcd child process.
#[derive(Debug)]
pub struct EtcdProcess {
    child: Option<Child>,
    binary: PathBuf,
    data_dir: PathBuf,
    /// Keeps a temporary data dir alive; deleted after the child is killed.
    _temp: Option<tempfile::TempDir>,
    client_port: u16,
    peer_port: u16,
    max_request_bytes: usize,
    stop_with_parent: bool,
}

impl EtcdProcess {
    /// Starts etcd with a temporary data dir on free ports and waits until it answers.
    pub async fn start() -> Result<EtcdProcess, MetaError> {
        EtcdProcess::start_with(EtcdOptions::default()).await
    }

    pub async fn start_with(options: EtcdOptions) -> Result<EtcdProcess, MetaError> {
        let (temp, data_dir) = match &options.data_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                (None, dir.clone())
            }
            None => {
                let t = tempfile::Builder::new().prefix("basalt-etcd-").tempdir()?;
                let p = t.path().to_path_buf();
                (Some(t), p)
            }
        };
        let client_port = match options.client_port {
            0 => free_port()?,
            p => p,
        };
        let mut etcd = EtcdProcess {
            child: None,
            binary: options.binary,
            data_dir,
            _temp: temp,
            client_port,
            peer_port: free_port()?,
            max_request_bytes: options.max_request_bytes,
            stop_with_parent: options.stop_with_parent,
        };
        // A free port can be taken by someone else before etcd binds it: try other ports.
        let mut attempts = 0;
        loop {
            attempts += 1;
            match etcd.launch().await {
                Ok(()) => return Ok(etcd),
                Err(e) if attempts < 3 && options.client_port == 0 && etcd.child.is_none() => {
                    tracing::debug!("etcd did not start ({e}); retrying on other ports");
                    etcd.client_port = free_port()?;
                    etcd.peer_port = free_port()?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The client URL, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The child's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills etcd with SIGKILL (no clean shutdown) and reaps it.
    pub fn kill(&mut self) -> Result<(), MetaError> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Stops etcd cleanly: SIGTERM, then SIGKILL if it has not exited within `limit`.
    pub async fn stop(&mut self, limit: Duration) -> Result<(), MetaError> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        let pid = libc::pid_t::try_from(child.id()).expect("pids fit in pid_t");
        // SAFETY: kill(2) on our own child, which has not been reaped (we hold its handle).
        if unsafe { libc::kill(pid, libc::SIGTERM) } == 0 {
            let deadline = Instant::now() + limit;
            while Instant::now() < deadline {
                if child.try_wait()?.is_some() {
                    self.child = None;
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.kill()
    }

    /// Starts etcd again on the same ports and data dir (after [`EtcdProcess::kill`]).
    pub async fn restart(&mut self) -> Result<(), MetaError> {
        self.kill()?;
        self.launch().await
    }

    async fn launch(&mut self) -> Result<(), MetaError> {
        let log_path = self.data_dir.join("etcd.log");
        let log = File::options().create(true).append(true).open(&log_path)?;
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let name = "basalt";
        let mut command = Command::new(&self.binary);
        if self.stop_with_parent {
            stop_with_parent(&mut command);
        }
        let child = command
            .arg(format!("--name={name}"))
            .arg(format!(
                "--data-dir={}",
                self.data_dir.join("data").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster={name}={peer}"))
            .arg("--initial-cluster-state=new")
            .arg(format!("--max-request-bytes={}", self.max_request_bytes))
            // Keep the history bounded (watchers more than this far behind get Lost and
            // re-list); a map publication adds only the chunks that changed.
            .arg("--auto-compaction-mode=revision")
            .arg("--auto-compaction-retention=10000")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| {
                MetaError::EtcdStart(format!(
                    "running '{}' failed: {e}; install etcd (Debian: apt-get install etcd-server)",
                    self.binary.display()
                ))
            })?;
        self.child = Some(child);
        self.wait_ready(&log_path).await
    }

    /// Polls until etcd answers a request, the child exits, or the deadline passes.
    async fn wait_ready(&mut self, log_path: &Path) -> Result<(), MetaError> {
        let deadline = Instant::now() + START_TIMEOUT;
        let endpoint = self.endpoint();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                return Err(MetaError::EtcdStart(format!(
                    "etcd exited with {status} before answering; its log ({}) ends with:\n{}",
                    log_path.display(),
                    log_tail(log_path)
                )));
            }
            let probe = tokio::time::timeout(Duration::from_secs(2), async {
                let mut client = etcd_client::Client::connect([endpoint.as_str()], None).await?;
                client.status().await
            })
            .await;
            if let Ok(Ok(_)) = probe {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill()?;
                return Err(MetaError::EtcdStart(format!(
                    "etcd did not answer on {endpoint} within {START_TIMEOUT:?}; its log ({}) \
                     ends with:\n{}",
                    log_path.display(),
                    log_tail(log_path)
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        if let Err(e) = self.kill() {
            tracing::warn!("killing etcd (pid {:?}) failed: {e}", self.pid());
        }
    }
}

/// The child gets SIGTERM when the thread that spawned it exits (`PR_SET_PDEATHSIG`), and does
/// not start at all if that parent is already gone by the time it runs.
fn stop_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid before the fork; between fork and exec only async-signal-safe calls
    // (prctl, getppid) that touch no memory shared with the parent.
    let parent = unsafe { libc::getpid() };
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(std::io::Error::other(
                    "the parent exited before etcd started",
                ));
            }
            Ok(())
        });
    }
}

/// A port the OS says is free now. (Another process could take it before etcd binds it; etcd
/// then exits and start reports it with the log.)
fn free_port() -> Result<u16, MetaError> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
