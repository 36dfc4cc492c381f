//! Host resources for tests that need root: loop devices and mounts (detached and unmounted on
//! drop, also when the test fails), and running a `basalt` command that must fail.

use super::BASALT;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A loop device over a file (direct I/O), detached on drop.
pub struct Loop(pub String);

impl Loop {
    pub fn attach(file: &Path) -> Loop {
        let out = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(file)
            .output()
            .expect("losetup runs (util-linux)");
        assert!(
            out.status.success(),
            "losetup failed (the test needs root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Loop(String::from_utf8(out.stdout).unwrap().trim().to_string())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// A mounted file system, unmounted on drop.
pub struct Mount(pub PathBuf);

impl Mount {
    /// Mounts `source` (e.g. "tmpfs" or an image file with `-o loop`) of `fstype` on `dir`.
    /// Returns `None` only when this host does not permit mounting (not root, or in a
    /// container without the capability); the caller then skips with a message.
    pub fn new(fstype: &str, source: &Path, options: &str, dir: &Path) -> Option<Mount> {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", fstype, "-o", options])
            .arg(source)
            .arg(dir)
            .output()
            .expect("mount runs (util-linux)");
        if out.status.success() {
            return Some(Mount(dir.to_path_buf()));
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("permission denied") || err.contains("must be superuser"),
            "mount -t {fstype} failed for another reason than permissions: {err}"
        );
        None
    }

    /// Bytes in use on the mounted file system.
    pub fn used(&self) -> u64 {
        let st = statvfs(&self.0);
        (st.f_blocks - st.f_bfree) * st.f_frsize
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn statvfs(path: &Path) -> libc::statvfs {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path and a properly sized out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs");
    st
}

/// Runs `basalt <args>` (a daemon command that must refuse to start) and returns its output
/// once it exits. Fails the test if it is still running after `limit` (it started).
pub fn must_fail(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(BASALT)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn basalt");
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "basalt {args:?} kept running (it should have refused to start):\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        !out.status.success(),
        "basalt {args:?} succeeded; it should have refused"
    );
    out
}

/// `basalt up` arguments with free ports and `data` as its directory.
pub fn up_args(data: &Path) -> Vec<String> {
    vec![
        "up".into(),
        "--nbd".into(),
        "127.0.0.1:0".into(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--data".into(),
        data.display().to_string(),
    ]
}
