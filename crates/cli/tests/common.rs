//! Test kit: real `plusfs server` processes on loopback, one temporary data directory each
//! cluster, and helpers that read like the story of a test.

#![allow(dead_code)]

use plusfs_client::{Client, ClientOptions};
use plusfs_localcluster::{ClusterSettings, LocalCluster};
use plusfs_placement::{HugedirSettings, SyncMode, ThresholdSetting};
use std::path::PathBuf;
use std::process::Command;

/// The `plusfs` binary cargo built for these tests.
pub fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_plusfs"))
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

/// A running test cluster; servers stop when it is dropped.
pub struct TestCluster {
    pub cluster: LocalCluster,
    _dir: tempfile::TempDir,
}

impl TestCluster {
    /// Starts `n` servers.
    pub fn start(n: usize) -> TestCluster {
        Self::start_with(n, SyncMode::Os)
    }

    /// Starts `n` servers without TLS (plain TCP: tests that write raw frames).
    pub fn start_insecure(n: usize) -> TestCluster {
        Self::start_settings(n, &ClusterSettings { insecure: true, ..Default::default() })
    }

    pub fn start_with(n: usize, sync: SyncMode) -> TestCluster {
        Self::start_settings(n, &ClusterSettings { sync, ..Default::default() })
    }

    /// Starts `n` servers whose directories are distributed above `threshold` entries
    /// (`None`: never).
    pub fn start_hugedirs(n: usize, threshold: Option<u64>) -> TestCluster {
        let threshold = match threshold {
            Some(t) => ThresholdSetting::Entries(t),
            None => ThresholdSetting::Word("never".into()),
        };
        let hugedirs = HugedirSettings { threshold, width: 0 };
        Self::start_settings(n, &ClusterSettings { hugedirs, ..Default::default() })
    }

    /// Starts `n` servers whose mkdir and rmdir use `protocol` (cx, 2pc, serial).
    pub fn start_protocol(n: usize, protocol: plusfs_placement::TxnProtocol) -> TestCluster {
        let txn = plusfs_placement::TxnSettings { protocol, ..Default::default() };
        Self::start_settings(n, &ClusterSettings { txn, ..Default::default() })
    }

    /// Starts `n` servers with these `[delegations]` settings.
    pub fn start_delegations(n: usize, delegations: plusfs_placement::DelegSettings) -> TestCluster {
        Self::start_settings(n, &ClusterSettings { delegations, ..Default::default() })
    }

    pub fn start_settings(n: usize, settings: &ClusterSettings) -> TestCluster {
        Self::start_in(&std::env::temp_dir(), n, settings)
    }

    /// Starts `n` servers with their data in a new directory below `base`.
    pub fn start_in(base: &std::path::Path, n: usize, settings: &ClusterSettings) -> TestCluster {
        let dir = tempfile::tempdir_in(base).expect("tempdir");
        let cluster = LocalCluster::up(&exe(), dir.path(), Some(n), settings).expect("cluster up");
        TestCluster { cluster, _dir: dir }
    }

    /// A new client with its own connections.
    pub fn client(&self) -> Client {
        Client::new(self.cluster.map().clone(), ClientOptions { retries: 5, ..Default::default() })
    }

    /// Runs the `plusfs` CLI against this cluster; returns (exit code, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (i32, String, String) {
        run(Command::new(exe()).args(args).env("PLUSFS_CLUSTER", self.cluster.map_file()))
    }

    /// Asserts `plusfs fsck` finds the namespace clean.
    pub fn assert_fsck_clean(&self) {
        let (code, out, err) = self.cli(&["fsck"]);
        assert_eq!(code, 0, "fsck failed:\n{out}\n{err}");
    }

    /// Fails if any server log has an ERROR line.
    pub fn assert_no_errors_logged(&self) {
        for path in self.cluster.logs() {
            let log = std::fs::read_to_string(&path).unwrap_or_default();
            let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
            assert!(errors.is_empty(), "{} has errors:\n{}", path.display(), errors.join("\n"));
        }
    }
}

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
