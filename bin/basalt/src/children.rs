//! Child processes of `basalt up --nodes`: started so that they die with `up` however it dies,
//! watched while they run (an exit is logged, `up` keeps running), stopped cleanly (SIGTERM,
//! then SIGKILL after a limit).

use std::process::ExitStatus;
use std::time::Duration;
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// A running child, watched by a task that reaps it.
pub struct Supervised {
    pub name: String,
    pub pid: u32,
    /// Its stdout, when piped and not yet taken.
    stdout: Option<ChildStdout>,
    stop: Option<oneshot::Sender<Duration>>,
    exited: watch::Receiver<Option<ExitStatus>>,
    task: JoinHandle<()>,
}

/// Starts `command` as a child that gets SIGTERM when the thread that starts it exits
/// (`PR_SET_PDEATHSIG`). Call it from the main thread, which lives as long as the process: then
/// a `kill -9` of this process stops the child too. A child whose parent is already gone by the
/// time it runs does not start.
pub fn spawn(name: &str, mut command: Command) -> std::io::Result<Supervised> {
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
                    "the parent exited before the child ran",
                ));
            }
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    let pid = child.id().expect("a child that was just spawned has a pid");
    let stdout = child.stdout.take();
    let (stop_tx, stop_rx) = oneshot::channel();
    let (exited_tx, exited) = watch::channel(None);
    let task = tokio::spawn(watch_child(name.to_string(), child, stop_rx, exited_tx));
    Ok(Supervised {
        name: name.to_string(),
        pid,
        stdout,
        stop: Some(stop_tx),
        exited,
        task,
    })
}

impl Supervised {
    /// How the child ended, once it has (and was reaped).
    pub fn exit_status(&self) -> Option<ExitStatus> {
        *self.exited.borrow()
    }

    /// Resolves once the child has exited (and was reaped).
    pub async fn exited(&self) {
        let mut rx = self.exited.clone();
        let _ = rx.wait_for(Option::is_some).await;
    }

    /// The child's stdout, if it was piped (once).
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.stdout.take()
    }

    /// Asks the child to stop (SIGTERM; SIGKILL if it is still running after `limit`) without
    /// waiting; [`Supervised::wait`] waits.
    pub fn request_stop(&mut self, limit: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(limit);
        }
    }

    /// Waits until the child has exited and was reaped.
    pub async fn wait(self) -> Option<ExitStatus> {
        let _ = self.task.await;
        *self.exited.borrow()
    }
}

async fn watch_child(
    name: String,
    mut child: Child,
    stop: oneshot::Receiver<Duration>,
    exited: watch::Sender<Option<ExitStatus>>,
) {
    let pid = child.id().unwrap_or(0);
    let status = tokio::select! {
        status = child.wait() => {
            let status = status.ok();
            tracing::warn!("{name} (pid {pid}) exited: {}", describe(status));
            status
        }
        limit = stop => match limit {
            Ok(limit) => terminate(&name, &mut child, limit).await,
            // The handle was dropped without a stop: stop anyway.
            Err(_) => terminate(&name, &mut child, Duration::from_secs(5)).await,
        },
    };
    exited.send_replace(status);
}

/// SIGTERM, then SIGKILL once `limit` has passed.
async fn terminate(name: &str, child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    if let Some(pid) = child.id() {
        let pid = libc::pid_t::try_from(pid).expect("pids fit in pid_t");
        // SAFETY: kill(2) on our own child, not yet reaped (`id` is Some until it is).
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    match tokio::time::timeout(limit, child.wait()).await {
        Ok(status) => status.ok(),
        Err(_) => {
            tracing::warn!("{name} did not stop within {limit:?} of SIGTERM; killing it");
            let _ = child.start_kill();
            child.wait().await.ok()
        }
    }
}

/// "exit status 0", "signal 9 (SIGKILL)", ...
pub fn describe(status: Option<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        None => "unknown status".into(),
        Some(s) => match (s.code(), s.signal()) {
            (Some(code), _) => format!("exit status {code}"),
            (None, Some(libc::SIGKILL)) => "killed by signal 9 (SIGKILL)".into(),
            (None, Some(libc::SIGTERM)) => "stopped by signal 15 (SIGTERM)".into(),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            (None, None) => s.to_string(),
        },
    }
}
