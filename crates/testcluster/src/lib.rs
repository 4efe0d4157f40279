//! An in-process plusfs cluster for tests.
//!
//! Each server is a real [`plusfs_server::Osd`] over a real RocksDB store and data store in
//! a temporary directory, running on a runtime of its own, so a test can *crash* it (the
//! runtime is torn down mid-step, as kill -9 tears down a process: what reached the store
//! stays, nothing else does) and *restart* it from the same directory. Every call between
//! nodes (client to server, server to server) crosses a [`SimNet`] that can drop requests
//! or replies, delay, duplicate and so reorder them, and partition sets of nodes, with every
//! decision drawn from a seed. Failpoints can crash a server at a named step or pause it
//! there until the test releases it ([`TestCluster::failpoint`]). [`model`] is the reference
//! model of the namespace that the model tests (here and against real processes) check
//! clusters against.
//!
//! ```text
//! let cluster = TestCluster::start(Options { servers: 4, seed: 7, ..Options::default() }).await?;
//! let client = cluster.client();
//! let fp = cluster.failpoint(2, FailStep::CxAfterResult, FailAction::Crash);
//! ```

pub mod history;
pub mod kit;
pub mod model;
mod net;

pub use kit::{Cluster, KitError, ProcCluster, Program};
pub use net::{client_node, FateCounts, Faults, NodeId, SimNet, SimTransport, CLIENT_BASE};
pub use plusfs_server::{FailAction, FailStep, Failpoint};

use plusfs_client::{Client, ClientOptions};
use plusfs_placement::{ClusterMap, ServerEntry, SyncMode, TxnProtocol, TxnSettings};
use plusfs_proto::ServerId;
use plusfs_rpc::{Counters, Pool};
use plusfs_server::{Failpoints, Osd, ServerConfig, StartError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How to build a test cluster.
#[derive(Debug, Clone)]
pub struct Options {
    /// Number of servers.
    pub servers: usize,
    /// Seed of every fault decision.
    pub seed: u64,
    /// Protocol of mkdir/rmdir.
    pub protocol: TxnProtocol,
    /// Cx commit timeout (short, so tests settle quickly).
    pub commit_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options { servers: 4, seed: 0, protocol: TxnProtocol::default(), commit_timeout: Duration::from_millis(20) }
    }
}

/// One server slot: its settings, and its runtime and state while it runs.
struct Node {
    config: ServerConfig,
    failpoints: Arc<Failpoints>,
    running: Mutex<Option<Running>>,
    /// The store of the last instance: a restart waits until nothing holds it (RocksDB
    /// allows one open instance per directory).
    last_store: Mutex<Option<Weak<dyn plusfs_store::DirStore>>>,
    crashes: AtomicU32,
    /// A failpoint crashed the server while a restart was opening it: the restart tears the
    /// new instance down instead of putting it on the network.
    crash_requested: AtomicBool,
    /// Held by a restart from its check to its end, so two restarts never race.
    restarting: tokio::sync::Mutex<()>,
}

struct Running {
    rt: tokio::runtime::Runtime,
    osd: Weak<Osd>,
}

/// An in-process cluster (see the crate documentation).
pub struct TestCluster {
    _dir: tempfile::TempDir,
    map: ClusterMap,
    net: Arc<SimNet>,
    nodes: HashMap<ServerId, Arc<Node>>,
    clients: AtomicU32,
}

/// Longest wait for a crashed server's runtime to let go of its stores.
const TEARDOWN: Duration = Duration::from_secs(10);

impl TestCluster {
    /// Creates and starts a cluster (a fresh temporary directory per cluster).
    pub async fn start(opts: Options) -> Result<TestCluster, StartError> {
        let dir = tempfile::tempdir().map_err(|e| StartError::Store {
            path: std::env::temp_dir().display().to_string(),
            source: plusfs_store::StoreError::Engine(format!("cannot create a temporary directory: {e}")),
        })?;
        let servers = (0..opts.servers as u32).map(|id| ServerEntry::new(id, format!("sim:{id}"), 1.0)).collect();
        let txn = TxnSettings {
            protocol: opts.protocol,
            commit_timeout_ms: opts.commit_timeout.as_millis() as u64,
            ..TxnSettings::default()
        };
        let map = ClusterMap {
            epoch: 1,
            sync: SyncMode::Os,
            hugedirs: Default::default(),
            data: Default::default(),
            txn,
            delegations: Default::default(),
            replication: Default::default(),
            tls: Default::default(),
            servers,
            migration: None,
            retired: Vec::new(),
            keeper: 0,
            rebalance: Default::default(),
            retry: Default::default(),
        };
        let net = Arc::new(SimNet::new(opts.seed));
        let nodes = map
            .servers
            .iter()
            .map(|s| {
                let config = ServerConfig {
                    id: s.id,
                    map: map.clone(),
                    data_dir: dir.path().join(format!("server-{}", s.id)),
                    member: None,
                    bootstrap: false,
                    map_path: None,
                    join: false,
                    raft_listen: None,
                };
                let node = Node {
                    config,
                    failpoints: Arc::default(),
                    running: Mutex::default(),
                    last_store: Mutex::default(),
                    crashes: AtomicU32::new(0),
                    crash_requested: AtomicBool::new(false),
                    restarting: tokio::sync::Mutex::new(()),
                };
                (s.id, Arc::new(node))
            })
            .collect();
        let cluster = TestCluster { _dir: dir, map, net, nodes, clients: AtomicU32::new(0) };
        for id in cluster.ids() {
            cluster.restart(id).await?;
        }
        Ok(cluster)
    }

    /// The cluster map.
    pub fn map(&self) -> &ClusterMap {
        &self.map
    }

    /// The servers' ids.
    pub fn ids(&self) -> Vec<ServerId> {
        self.map.servers.iter().map(|s| s.id).collect()
    }

    /// The simulated network (faults, partitions, fate counters).
    pub fn net(&self) -> &Arc<SimNet> {
        &self.net
    }

    /// A new client node with default options.
    pub fn client(&self) -> Client {
        self.client_with(ClientOptions::default())
    }

    /// A new client node.
    pub fn client_with(&self, opts: ClientOptions) -> Client {
        let n = self.clients.fetch_add(1, Ordering::Relaxed);
        let counters = Arc::<Counters>::default();
        let transport = SimTransport { net: self.net.clone(), from: client_node(n), counters: counters.clone() };
        let pool =
            Pool::with_transport(Arc::new(transport), counters, opts.retries).with_backoff(Duration::from_millis(1));
        Client::with_pool(self.map.clone(), opts, Arc::new(pool))
    }

    /// The running state of server `id` (for white-box checks), if it runs.
    pub fn server(&self, id: ServerId) -> Option<Arc<Osd>> {
        let node = self.nodes.get(&id)?;
        let running = node.running.lock().expect("node lock");
        running.as_ref().and_then(|r| r.osd.upgrade())
    }

    /// How many times server `id` crashed (by [`crash`](Self::crash) or a failpoint).
    pub fn crashes(&self, id: ServerId) -> u32 {
        self.nodes.get(&id).map_or(0, |n| n.crashes.load(Ordering::Acquire))
    }

    /// Arms failpoint `step` on server `id`. With [`FailAction::Crash`] the server crashes
    /// when it reaches the step; restart it with [`restart`](Self::restart).
    pub fn failpoint(&self, id: ServerId, step: FailStep, action: FailAction) -> Arc<Failpoint> {
        self.nodes[&id].failpoints.arm(step, action)
    }

    /// Disarms failpoint `step` on server `id`.
    pub fn disarm(&self, id: ServerId, step: FailStep) {
        self.nodes[&id].failpoints.disarm(step);
    }

    /// Crashes server `id` now (a no-op if it is down) and waits until its stores are closed.
    pub async fn crash(&self, id: ServerId) {
        let node = self.nodes[&id].clone();
        if let Some(rt) = node.take_down(&self.net, false) {
            tokio::task::spawn_blocking(move || rt.shutdown_timeout(TEARDOWN)).await.expect("crash task");
        }
        if let Err(e) = node.wait_closed().await {
            panic!("server {id} did not let go of its store: {e}");
        }
    }

    /// Starts server `id` (again) from its directory; a no-op if it runs. Waits for the
    /// teardown of a crash that a failpoint started. If a failpoint crashes the server while
    /// it opens (its recovery reaches the step), it stays down and this still returns `Ok`.
    pub async fn restart(&self, id: ServerId) -> Result<(), StartError> {
        let node = self.nodes[&id].clone();
        let _one = node.restarting.lock().await;
        if node.running.lock().expect("node lock").is_some() {
            return Ok(());
        }
        node.wait_closed().await?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("sim-server-{id}"))
            .enable_all()
            .build()
            .map_err(|e| StartError::Listen { addr: format!("sim:{id}"), source: e })?;
        let (hook_node, hook_net) = (Arc::downgrade(&node), Arc::downgrade(&self.net));
        node.failpoints.on_crash(move |_| {
            if let (Some(node), Some(net)) = (hook_node.upgrade(), hook_net.upgrade()) {
                node.crash_at_failpoint(&net);
            }
        });
        let opened = open_when_unlocked(&node, &rt, &self.net).await;
        let osd = match opened {
            Ok(Ok(osd)) => osd,
            failed => {
                // A runtime cannot be dropped on an async thread.
                std::thread::spawn(move || rt.shutdown_timeout(TEARDOWN));
                return match failed {
                    Ok(Err(e)) => Err(e),
                    _ => panic!("server {id} panicked while opening"),
                };
            }
        };
        *node.last_store.lock().expect("node lock") = Some(Arc::downgrade(&osd.engine.store_handle()));
        let mut running = node.running.lock().expect("node lock");
        if node.crash_requested.swap(false, Ordering::AcqRel) {
            node.crashes.fetch_add(1, Ordering::AcqRel);
            drop(running);
            std::thread::spawn(move || rt.shutdown_timeout(TEARDOWN));
            return Ok(());
        }
        self.net.attach(id, net::Endpoint { osd: osd.clone(), rt: rt.handle().clone() });
        *running = Some(Running { rt, osd: Arc::downgrade(&osd) });
        Ok(())
    }

    /// Restarts every server that is down.
    pub async fn restart_all(&self) -> Result<(), StartError> {
        for id in self.ids() {
            self.restart(id).await?;
        }
        Ok(())
    }

    /// Waits until every server runs and none has a pending cross-server operation (Cx or
    /// 2PC), up to `wait`. True if the cluster settled.
    pub async fn settle(&self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            let servers: Vec<Arc<Osd>> = self.ids().into_iter().filter_map(|id| self.server(id)).collect();
            let pending: usize = servers.iter().map(|o| o.pending_ops()).sum();
            if servers.len() == self.nodes.len() && pending == 0 {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A name under `/` whose directory object lives on another server than `/`'s, for tests
/// of cross-server operations: (path, server of its entry, server of its object).
pub fn cross_server_name(c: &Client, prefix: &str) -> (String, ServerId, ServerId) {
    let root = c.home("/");
    (0..)
        .map(|i| format!("/{prefix}{i}"))
        .find(|p| c.home(p) != root)
        .map(|p| {
            let child = c.home(&p);
            (p, root, child)
        })
        .expect("some name lands elsewhere")
}

/// Opens `node`'s server on `rt`. An `Arc`'s strong count reaches zero before the value's
/// drop runs, so [`Node::wait_closed`] may return while the last instance's RocksDB is
/// still closing and holds its `LOCK` file: the open is then retried until the lock is
/// free (up to [`TEARDOWN`]), as a supervisor restarting a process that still exits would.
async fn open_when_unlocked(
    node: &Node,
    rt: &tokio::runtime::Runtime,
    net: &Arc<SimNet>,
) -> Result<Result<Arc<Osd>, StartError>, tokio::task::JoinError> {
    let deadline = Instant::now() + TEARDOWN;
    loop {
        let counters = Arc::<Counters>::default();
        let transport = SimTransport { net: net.clone(), from: node.config.id, counters: counters.clone() };
        let peers = Pool::with_transport(Arc::new(transport), counters, 0);
        let (config, fps) = (node.config.clone(), node.failpoints.clone());
        let opened = rt.spawn(async move { plusfs_server::open(&config, peers, fps).await }).await;
        let locked =
            matches!(&opened, Ok(Err(StartError::Store { source, .. })) if source.to_string().contains("LOCK"));
        if !locked || Instant::now() > deadline {
            return opened;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

impl Node {
    /// Takes the server off the network and out of `running`, as kill -9 would; returns its
    /// runtime, for the caller to shut down (every task dropped wherever it stands). When the
    /// server is not running and `from_failpoint` is set, it is opening: the restart tears it
    /// down.
    fn take_down(&self, net: &SimNet, from_failpoint: bool) -> Option<tokio::runtime::Runtime> {
        let mut running = self.running.lock().expect("node lock");
        net.detach(self.config.id);
        let Some(r) = running.take() else {
            if from_failpoint {
                self.crash_requested.store(true, Ordering::Release);
            }
            return None;
        };
        self.crashes.fetch_add(1, Ordering::AcqRel);
        tracing::info!(id = self.config.id, "crashing server");
        Some(r.rt)
    }

    /// The crash of a failpoint, called on the server's own runtime by the task that
    /// reached the step. A runtime cannot shut itself down, so another thread does; this
    /// worker waits for the shutdown signal, so no other task of the server runs meanwhile.
    fn crash_at_failpoint(&self, net: &SimNet) {
        let Some(rt) = self.take_down(net, true) else { return };
        let (done, signalled) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            rt.shutdown_background();
            let _ = done.send(());
        });
        let _ = signalled.recv_timeout(TEARDOWN);
    }

    /// True while the last instance's store is still open.
    fn store_open(&self) -> bool {
        self.last_store.lock().expect("node lock").as_ref().is_some_and(|w| w.strong_count() > 0)
    }

    /// Waits (up to [`TEARDOWN`]) until the last instance's store is closed.
    async fn wait_closed(&self) -> Result<(), StartError> {
        let deadline = Instant::now() + TEARDOWN;
        while self.store_open() {
            if Instant::now() > deadline {
                return Err(StartError::Store {
                    path: self.config.data_dir.display().to_string(),
                    source: plusfs_store::StoreError::Engine(format!("still open {TEARDOWN:?} after a crash")),
                });
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(())
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        // Servers hold transports that hold the network that holds the servers: break the
        // cycle by stopping every server, and let their stores close before the temporary
        // directory goes.
        let runtimes: Vec<_> = self.nodes.values().filter_map(|n| n.take_down(&self.net, false)).collect();
        let _ = std::thread::spawn(move || {
            for rt in runtimes {
                rt.shutdown_timeout(TEARDOWN);
            }
        })
        .join();
        let deadline = Instant::now() + TEARDOWN;
        while self.nodes.values().any(|n| n.store_open()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}
