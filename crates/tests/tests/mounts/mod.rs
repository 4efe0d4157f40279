//! Test kit for FUSE mounts: whether FUSE is usable here, a mount of a test cluster that
//! is unmounted when dropped, and a shell helper.

#![allow(dead_code)]

pub mod tar_kill;

use crate::common::{self, exe, ProcCluster};
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Whether /dev/fuse is usable; where it is not, fails unless skipping was allowed.
pub fn fuse_available() -> bool {
    let ok = Path::new("/dev/fuse").exists() && fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").is_ok();
    if !ok {
        // A machine without FUSE must say so explicitly; otherwise the suite fails here
        // rather than passing without having tested the mount.
        assert!(
            common::skip_allowed(),
            "/dev/fuse is missing or not usable here: the FUSE tests cannot run (set PLUSFS_ALLOW_SKIP=1 to skip them)"
        );
        println!("SKIPPED (PLUSFS_ALLOW_SKIP): /dev/fuse is missing or not usable here; the FUSE tests did not run");
    }
    ok
}

/// A mount of `cluster` that is unmounted when dropped.
pub struct Mount {
    dir: tempfile::TempDir,
    /// Process id of the mount's daemon.
    pub pid: u32,
}

impl Mount {
    pub fn new(cluster: &ProcCluster) -> Mount {
        Mount::with_options(cluster, &[])
    }

    /// A mount with `plusfs mount -o` options.
    pub fn with_options(cluster: &ProcCluster, options: &[&str]) -> Mount {
        Mount::with_identity(cluster, options, None)
    }

    /// A mount with `plusfs mount -o` options presenting the identity in directory
    /// `identity` (`PLUSFS_IDENTITY`), or the cluster's admin identity for `None`.
    pub fn with_identity(cluster: &ProcCluster, options: &[&str], identity: Option<&Path>) -> Mount {
        let dir = tempfile::tempdir().unwrap();
        // Reachable by other users (the temporary directory is private to root).
        fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let mut args = vec!["mount", dir.path().to_str().unwrap()];
        // The mount's log beside the servers' (kept with them: PLUSFS_TEST_KEEP).
        let n = std::fs::read_dir(cluster.cluster.data()).map(|d| d.count()).unwrap_or(0);
        let log = cluster.cluster.data().join(format!("mount-{n}.log"));
        let log = format!("log={}", log.display());
        // Options every mount of a test run gets (`PLUSFS_TEST_MOUNT_OPTIONS`, e.g. `uring`
        // to run a FUSE suite over io_uring: `scripts/fuse_uring_suite.sh`).
        let extra = std::env::var("PLUSFS_TEST_MOUNT_OPTIONS").unwrap_or_default();
        let extra = extra.split(',').filter(|o| !o.is_empty());
        let options: Vec<&str> = options.iter().copied().chain(extra).chain([log.as_str()]).collect();
        let joined = options.join(",");
        if !options.is_empty() {
            args.extend(["-o", &joined]);
        }
        let mut cmd = Command::new(exe());
        cmd.args(&args).env("PLUSFS_CLUSTER", cluster.cluster.map_file());
        if let Some(id) = identity {
            cmd.env("PLUSFS_IDENTITY", id);
        }
        let (code, out, err) = common::run(&mut cmd);
        assert_eq!(code, 0, "mount failed: {out}{err}");
        let pid = out.rsplit("process ").next().and_then(|t| t.trim().trim_end_matches(')').parse().ok());
        Mount { dir, pid: pid.unwrap_or_else(|| panic!("no process id in `{out}`")) }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The mount's control file (`plusfs mount --stats`).
    pub fn stats(&self) -> String {
        fs::read_to_string(self.path().join(".plusfs-stats")).expect("read the mount's stats")
    }

    /// (delegations held, operations queued under them), from the control file.
    pub fn delegations(&self) -> (u64, u64) {
        let stats = self.stats();
        let line = stats.lines().find(|l| l.starts_with("delegations held ")).expect("delegation line");
        let words: Vec<&str> = line.split_whitespace().collect();
        (words[2].parse().unwrap(), words[4].parse().unwrap())
    }

    /// (calls, errors) of FUSE operation `op`, from the control file.
    pub fn op_counts(&self, op: &str) -> (u64, u64) {
        let stats = self.stats();
        let Some(line) = stats.lines().find(|l| l.split_whitespace().next() == Some(op)) else { return (0, 0) };
        let words: Vec<&str> = line.split_whitespace().collect();
        (words[1].parse().unwrap(), words[2].parse().unwrap())
    }

    /// (answers given the delegation TTL, names and inodes invalidated), from the control
    /// file's kernel cache line.
    pub fn kernel_cache(&self) -> (u64, u64) {
        let stats = self.stats();
        let line = stats.lines().find(|l| l.starts_with("kernel cache ")).expect("kernel cache line");
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!((words[4], words[6]), ("given", "invalidated"), "{line}");
        (words[5].parse().unwrap(), words[7].parse().unwrap())
    }

    /// Operations written back from this mount's delegations and applied by the servers.
    pub fn delegated_written(&self) -> u64 {
        let stats = self.stats();
        let line = stats.lines().find(|l| l.starts_with("delegations held ")).expect("delegation line");
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words.get(5), Some(&"written"), "{line}");
        words[6].parse().unwrap()
    }

    /// (bytes written, bytes read, capabilities received) by the mount's client-direct
    /// I/O, from the control file.
    pub fn direct_io(&self) -> (u64, u64, u64) {
        let stats = self.stats();
        let line = stats.lines().find(|l| l.starts_with("direct io ")).expect("direct io line");
        let words: Vec<&str> = line.split_whitespace().collect();
        (words[3].parse().unwrap(), words[5].parse().unwrap(), words[7].parse().unwrap())
    }

    /// Puts the mount's queued delegated work on the servers (`plusfs mount --sync`).
    pub fn sync(&self) {
        let out = Command::new(exe()).args(["mount", "--sync"]).arg(self.path()).output().expect("mount --sync");
        assert!(out.status.success(), "mount --sync: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Sends `signal` to the mount's daemon.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a process this test started.
        assert_eq!(unsafe { libc::kill(self.pid as i32, signal) }, 0, "signal {signal} to the mount");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if !mounted(self.dir.path()) {
            return;
        }
        let _ = Command::new(exe()).arg("umount").arg(self.dir.path()).status();
        if mounted(self.dir.path()) {
            // A daemon that was killed leaves its mount point behind.
            let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while mounted(self.dir.path()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether `p` is a mount point now.
pub fn mounted(p: &Path) -> bool {
    let p = p.to_string_lossy().to_string();
    fs::read_to_string("/proc/mounts").unwrap_or_default().lines().any(|l| l.split(' ').nth(1) == Some(&p))
}

/// Runs `cmd` with `sh` as user `uid` (group `uid`, supplementary `groups`); returns
/// whether it succeeded, its output and its error output.
pub fn as_user(uid: u32, groups: &[u32], cmd: &str) -> (bool, String, String) {
    let groups = if groups.is_empty() {
        "--clear-groups".to_string()
    } else {
        format!("--groups={}", groups.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
    };
    let out = Command::new("setpriv")
        .args([format!("--reuid={uid}"), format!("--regid={uid}"), groups])
        .args(["sh", "-c", cmd])
        .output()
        .expect("setpriv");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// Runs `cmd` with `sh -c`; fails the test if it fails. Returns its output.
pub fn sh(cmd: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(cmd).output().expect("run sh");
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Delegation counters summed over the servers of `cluster` (`plusfs cluster status`):
/// (flushes, recalls, revoked).
pub fn deleg_counters(cluster: &ProcCluster) -> (u64, u64, u64) {
    let (code, out, err) = cluster.cli(&["cluster", "status"]);
    assert_eq!(code, 0, "cluster status: {err}");
    let mut sums = (0, 0, 0);
    for l in out.lines().filter(|l| l.contains(" delegations: ")) {
        let field = |k: &str| -> u64 {
            l.split_whitespace().find_map(|w| w.strip_prefix(k)).and_then(|v| v.parse().ok()).unwrap_or(0)
        };
        sums.0 += field("flushes=");
        sums.1 += field("recalls=");
        sums.2 += field("revoked=");
    }
    sums
}

/// Sets, reads (size query and value), lists, refuses to create again and removes a
/// `user.` extended attribute of `file` through the kernel's xattr system calls.
pub fn xattr_round_trip(file: &str) {
    let f = std::ffi::CString::new(file).unwrap();
    let name = std::ffi::CString::new("user.k").unwrap();
    let mut buf = [0u8; 64];
    // SAFETY: valid C strings and a buffer of the length passed.
    unsafe {
        assert_eq!(libc::setxattr(f.as_ptr(), name.as_ptr(), b"v1".as_ptr().cast(), 2, 0), 0);
        assert_eq!(libc::getxattr(f.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0), 2, "size query");
        assert_eq!(libc::getxattr(f.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()), 2);
        assert_eq!(&buf[..2], b"v1");
        let n = libc::listxattr(f.as_ptr(), buf.as_mut_ptr().cast(), buf.len());
        assert_eq!(&buf[..n as usize], b"user.k\0");
        assert_eq!(libc::setxattr(f.as_ptr(), name.as_ptr(), b"x".as_ptr().cast(), 1, libc::XATTR_CREATE), -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EEXIST));
        assert_eq!(libc::removexattr(f.as_ptr(), name.as_ptr()), 0);
        assert_eq!(libc::getxattr(f.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()), -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ENODATA));
    }
}
