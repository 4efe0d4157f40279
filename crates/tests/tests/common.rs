//! Test kit: real `plusfs server` processes on loopback, one temporary data directory each
//! cluster, and helpers that read like the story of a test.

#![allow(dead_code)]

use plusfs_client::Client;
use std::path::PathBuf;
use std::process::Command;

/// The `plusfs` binary cargo built for these tests.
pub fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_plusfs-tested"))
}

/// Runs `cmd` to its end; returns (exit code, stdout, stderr).
pub fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("run a command");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The program the process clusters run: the `plusfs` binary cargo built for these tests.
pub struct Plusfs;

impl plusfs_testcluster::Program for Plusfs {
    fn exe() -> PathBuf {
        exe()
    }
}

/// Real server processes on loopback (the test kit's process cluster, see
/// `plusfs_testcluster::kit`); servers stop when it is dropped.
pub type ProcCluster = plusfs_testcluster::ProcCluster<Plusfs>;

/// True where the user explicitly allowed tests whose prerequisite (FUSE, root) is missing
/// to be skipped (`PLUSFS_ALLOW_SKIP=1`); without it such a test fails.
#[allow(dead_code)]
pub fn skip_allowed() -> bool {
    std::env::var("PLUSFS_ALLOW_SKIP").is_ok_and(|v| v == "1")
}

/// `len` pseudo-random bytes from `seed` (the same for the same seed).
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

/// A short fingerprint of `b`, to compare large contents in assertion messages.
pub fn digest(b: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(b)
}

/// True when the error leaves the outcome unknown (the request may have been applied by a
/// server that died before answering).
pub fn outcome_unknown(e: plusfs_proto::Errno) -> bool {
    use plusfs_proto::Errno;
    matches!(e, Errno::EIO | Errno::ECONNRESET | Errno::EPROTO)
}

/// The kind of the entry at `path`, `None` if it does not exist (any other error fails).
pub async fn kind_of(c: &Client, path: &str) -> Option<plusfs_proto::FileKind> {
    match c.lstat(path).await {
        Ok(a) => Some(a.kind),
        Err(e) if e.errno == plusfs_proto::Errno::ENOENT => None,
        Err(e) => panic!("stat {path}: {e}"),
    }
}

/// Where directory `/d{i}` of a mkdir-then-rename-to-`/r{i}` workload is, checked against
/// what was acknowledged: `"d"`, `"r"`, or `None` when its mkdir was not acknowledged.
pub async fn renamed_dir_home(
    c: &Client,
    i: usize,
    mkdir_acked: bool,
    rename: Option<Result<(), plusfs_proto::Errno>>,
) -> Option<&'static str> {
    use plusfs_proto::FileKind;
    let (d, r) = (kind_of(c, &format!("/d{i}")).await, kind_of(c, &format!("/r{i}")).await);
    match rename {
        Some(Ok(())) => {
            assert_eq!((d, r), (None, Some(FileKind::Dir)), "/d{i} acknowledged renamed to /r{i}");
            Some("r")
        }
        Some(Err(e)) if !outcome_unknown(e) && mkdir_acked => {
            assert_eq!((d, r), (Some(FileKind::Dir), None), "/d{i}: rename refused with {e:?}");
            Some("d")
        }
        _ if mkdir_acked => {
            assert!(d.is_some() != r.is_some(), "/d{i} acknowledged: exactly one of d/r must exist");
            Some(if d.is_some() { "d" } else { "r" })
        }
        _ => None,
    }
}

/// Resident memory of process `pid`, in MiB.
pub fn rss_mib(pid: u32) -> u64 {
    vm_mib(pid, "VmRSS")
}

/// A memory figure of process `pid` from `/proc/PID/status` (`VmRSS`, `VmHWM`, `VmData`...),
/// in MiB.
pub fn vm_mib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find(|l| l.split(':').next() == Some(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    kib / 1024
}

/// The member serving replicated server `id`, waiting up to 10 s for one.
pub fn leader(tc: &ProcCluster, id: u32) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(m) = tc.cluster.serving_member(id).unwrap() {
            return m;
        }
        assert!(std::time::Instant::now() < deadline, "no member of server {id} serves");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Issues an identity named `name` with the `plusfs cert issue` flags `flags` into a new
/// directory below `base`; returns the directory.
pub fn issue(tc: &ProcCluster, base: &std::path::Path, name: &str, flags: &[&str]) -> PathBuf {
    let out = base.join(name);
    let mut args = vec!["cert", "issue", "--name", name, "--out", out.to_str().unwrap()];
    args.extend_from_slice(flags);
    let (code, stdout, stderr) = tc.cli(&args);
    assert_eq!(code, 0, "cert issue: {stdout}{stderr}");
    out
}
