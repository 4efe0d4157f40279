//! One test kit for both kinds of test cluster: the [`Cluster`] trait is what a test needs
//! of a running cluster (a client, its map, crashing and restarting a server), implemented
//! by the in-process [`crate::TestCluster`] (simulated network, failpoints, crashes without
//! processes) and by [`ProcCluster`] (real `plusfs server` processes over TCP and mutual TLS,
//! `kill -9`). A scenario written against the trait runs on both (see [`scenarios`]).

use plusfs_client::{Client, ClientOptions};
use plusfs_localcluster::{ClusterSettings, LocalCluster};
use plusfs_placement::{ClusterMap, HugedirSettings, SyncMode, ThresholdSetting};
use plusfs_proto::ServerId;
use std::future::Future;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Why a cluster's server could not be (re)started.
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    /// An in-process server did not open.
    #[error(transparent)]
    InProcess(#[from] plusfs_server::StartError),
    /// A server process did not start.
    #[error("server process: {0:#}")]
    Process(anyhow::Error),
}

/// What a test needs of a running cluster, whichever kind runs it.
pub trait Cluster {
    /// The cluster map its clients use.
    fn map(&self) -> ClusterMap;
    /// A new client with its own connections and options `opts`.
    fn client_with(&self, opts: ClientOptions) -> Client;
    /// A new client that retries across restarts.
    fn client(&self) -> Client {
        self.client_with(ClientOptions { retries: 5, ..Default::default() })
    }
    /// The ids of its servers.
    fn ids(&self) -> Vec<ServerId> {
        self.map().servers.iter().map(|s| s.id).collect()
    }
    /// Crashes server `id` at once: nothing is flushed (kill -9 of a process; an
    /// in-process server's runtime torn down).
    fn crash(&mut self, id: ServerId) -> impl Future<Output = ()>;
    /// Starts server `id` again from its data (a no-op if it runs).
    fn restart(&mut self, id: ServerId) -> impl Future<Output = Result<(), KitError>>;
}

impl Cluster for crate::TestCluster {
    fn map(&self) -> ClusterMap {
        crate::TestCluster::map(self).clone()
    }

    fn client_with(&self, opts: ClientOptions) -> Client {
        crate::TestCluster::client_with(self, opts)
    }

    async fn crash(&mut self, id: ServerId) {
        crate::TestCluster::crash(self, id).await
    }

    async fn restart(&mut self, id: ServerId) -> Result<(), KitError> {
        Ok(crate::TestCluster::restart(self, id).await?)
    }
}

/// The program a [`ProcCluster`] runs: where its `plusfs` binary is (a test crate names
/// the one cargo built for it).
pub trait Program {
    /// The path of the `plusfs` binary.
    fn exe() -> PathBuf;
}

/// Real `plusfs server` processes on loopback, with their data in a temporary directory
/// removed with the cluster (servers stop when it is dropped). A failing test keeps the
/// directory (its logs) when `PLUSFS_TEST_KEEP` is set.
pub struct ProcCluster<P: Program> {
    /// The local cluster (its processes, map, logs).
    pub cluster: LocalCluster,
    dir: Option<tempfile::TempDir>,
    _program: PhantomData<P>,
}

impl<P: Program> ProcCluster<P> {
    /// Starts `n` servers.
    pub fn start(n: usize) -> Self {
        Self::start_with(n, SyncMode::Os)
    }

    /// Starts `n` servers without TLS (plain TCP: tests that write raw frames).
    pub fn start_insecure(n: usize) -> Self {
        Self::start_settings(n, &ClusterSettings { insecure: true, ..Default::default() })
    }

    /// Starts `n` servers with durability `sync`.
    pub fn start_with(n: usize, sync: SyncMode) -> Self {
        Self::start_settings(n, &ClusterSettings { sync, ..Default::default() })
    }

    /// Starts `n` servers whose directories are distributed above `threshold` entries
    /// (`None`: never).
    pub fn start_hugedirs(n: usize, threshold: Option<u64>) -> Self {
        let threshold = match threshold {
            Some(t) => ThresholdSetting::Entries(t),
            None => ThresholdSetting::Word("never".into()),
        };
        let hugedirs = HugedirSettings { threshold, width: 0 };
        Self::start_settings(n, &ClusterSettings { hugedirs, ..Default::default() })
    }

    /// Starts `n` servers whose mkdir and rmdir use `protocol` (cx, 2pc, serial).
    pub fn start_protocol(n: usize, protocol: plusfs_placement::TxnProtocol) -> Self {
        let txn = plusfs_placement::TxnSettings { protocol, ..Default::default() };
        Self::start_settings(n, &ClusterSettings { txn, ..Default::default() })
    }

    /// Starts `n` servers with these `[delegations]` settings.
    pub fn start_delegations(n: usize, delegations: plusfs_placement::DelegSettings) -> Self {
        Self::start_settings(n, &ClusterSettings { delegations, ..Default::default() })
    }

    /// Starts `n` servers with `settings`.
    pub fn start_settings(n: usize, settings: &ClusterSettings) -> Self {
        Self::start_in(&std::env::temp_dir(), n, settings)
    }

    /// Starts `n` servers with their data in a new directory below `base`.
    pub fn start_in(base: &Path, n: usize, settings: &ClusterSettings) -> Self {
        let dir = tempfile::tempdir_in(base).expect("tempdir");
        let cluster = LocalCluster::up(&P::exe(), dir.path(), Some(n), settings).expect("cluster up");
        ProcCluster { cluster, dir: Some(dir), _program: PhantomData }
    }

    /// A new client with its own connections, retrying across restarts.
    pub fn client(&self) -> Client {
        Cluster::client(self)
    }

    /// Runs the `plusfs` command against this cluster; returns (exit code, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(P::exe())
            .args(args)
            .env("PLUSFS_CLUSTER", self.cluster.map_file())
            .output()
            .unwrap_or_else(|e| panic!("plusfs {args:?}: {e}"));
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Asserts `plusfs fsck` finds the namespace clean.
    pub fn assert_fsck_clean(&self) {
        let (code, out, err) = self.cli(&["fsck"]);
        assert_eq!(code, 0, "fsck failed:\n{out}\n{err}");
    }

    /// Fails if any server log has an ERROR line, except openraft's report of a vote or
    /// an append it could not send to a member that is down, not up yet or just killed,
    /// or that a member did not answer within the RPC timeout (a loaded machine applying a
    /// large batch): Raft sends it again, and a read-index round that timed out that way is
    /// asked again or the request redirected (`front.rs`), or that an append was too large
    /// for one message (`replica/src/net.rs` asks Raft to send fewer entries: openraft
    /// reports that designed retry as an error). Until server logs lost their
    /// colour codes this check matched nothing: ` ERROR ` was coloured.
    pub fn assert_no_errors_logged(&self) {
        let raft_retry = |l: &str| {
            l.contains(" openraft::")
                && (l.contains("Unreachable node")
                    || l.contains("NetworkError")
                    || l.contains("RPCError err=timeout")
                    || l.contains("payload too large")
                    || (l.contains("timeout while confirming leadership") && l.contains("when AppendEntries")))
        };
        for path in self.cluster.logs() {
            let log = std::fs::read_to_string(&path).unwrap_or_default();
            let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ") && !raft_retry(l)).collect();
            assert!(errors.is_empty(), "{} has errors:\n{}", path.display(), errors.join("\n"));
        }
    }
}

impl<P: Program> Drop for ProcCluster<P> {
    fn drop(&mut self) {
        if std::thread::panicking() && std::env::var_os("PLUSFS_TEST_KEEP").is_some() {
            if let Some(dir) = self.dir.take() {
                eprintln!("PLUSFS_TEST_KEEP: the cluster's data and logs stay in {}", dir.keep().display());
            }
        }
    }
}

impl<P: Program> Cluster for ProcCluster<P> {
    fn map(&self) -> ClusterMap {
        self.cluster.map().clone()
    }

    fn client_with(&self, opts: ClientOptions) -> Client {
        Client::new(self.cluster.map().clone(), opts)
    }

    async fn crash(&mut self, id: ServerId) {
        self.cluster.kill(id).expect("kill -9 a server");
    }

    async fn restart(&mut self, id: ServerId) -> Result<(), KitError> {
        if !self.cluster.has_exited(id).map_err(KitError::Process)? {
            return Ok(());
        }
        self.cluster.start(id).map_err(KitError::Process)?;
        self.cluster.wait_ready(std::time::Duration::from_secs(30)).map_err(KitError::Process)
    }
}

/// Scenarios written once against [`Cluster`], run by the in-process and the process tests.
pub mod scenarios {
    use super::Cluster;
    use std::time::Duration;

    /// Files and directories made on every server, a crash of the server homing one of
    /// them in the middle, a restart: everything acknowledged is there (and what was made
    /// after the restart too), and fsck finds the namespace clean. Returns how many
    /// operations were acknowledged.
    pub async fn crash_and_restart_keep_what_was_acknowledged<C: Cluster>(cluster: &mut C) -> Result<usize, String> {
        let c = cluster.client();
        let victim = *cluster.ids().last().ok_or("no servers")?;
        let mut acked = Vec::new();
        for i in 0..24 {
            let d = format!("/k{i}");
            c.mkdir(&d, 0o755).await.map_err(|e| format!("mkdir {d}: {e}"))?;
            c.create(&format!("{d}/f"), 0o644, true).await.map_err(|e| format!("create {d}/f: {e}"))?;
            acked.push(d);
        }
        let homed_on_victim = acked.iter().filter(|d| cluster.map().home_of_dir(d) == victim).count();
        if homed_on_victim == 0 {
            return Err(format!("no directory is homed on server {victim}: the crash would prove nothing"));
        }
        cluster.crash(victim).await;
        // The fault hit: a directory homed on the crashed server cannot be read now.
        let on_victim = acked.iter().find(|d| cluster.map().home_of_dir(d) == victim).expect("one");
        let impatient = cluster.client_with(plusfs_client::ClientOptions { retries: 0, ..Default::default() });
        let read = tokio::time::timeout(Duration::from_secs(5), impatient.lstat(on_victim)).await;
        if matches!(read, Ok(Ok(_))) {
            return Err(format!("{on_victim} still answers with its server {victim} crashed"));
        }
        cluster.restart(victim).await.map_err(|e| format!("restart of server {victim}: {e}"))?;
        let c = cluster.client();
        for d in &acked {
            let mut tries = 0;
            loop {
                match c.lstat(&format!("{d}/f")).await {
                    Ok(_) => break,
                    Err(_) if tries < 50 => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => return Err(format!("{d}/f acknowledged, gone after the restart: {e}")),
                }
            }
        }
        c.mkdir("/after", 0o755).await.map_err(|e| format!("mkdir after the restart: {e}"))?;
        crate::model::fsck_clean(&c).await?;
        Ok(acked.len() * 2)
    }
}
