//! A server: its [`Engine`] (state) and the protocols around it.
//!
//! `Osd` holds the engine (shared, reached as `self.engine`; no deref), the connections
//! to its peers, its failpoints and the state of the protocols that keep any: pending Cx
//! operations and running redistributions. Every protocol module adds its operations as an `impl Osd` block;
//! `dispatch.rs` routes each request to one of them.

use crate::cx::state::Cx;
use crate::engine::Engine;
use crate::failpoint::Failpoints;
use parking_lot::Mutex;
use plusfs_placement::ClusterMap;
use plusfs_proto::{DirObject, ROOT_INO};
use plusfs_rpc::Pool;
use plusfs_store::{commit, Batch, DirStore, StoreError};
use std::collections::HashSet;
use std::sync::Arc;
use tokio::sync::mpsc;

/// One OSD+ server.
pub struct Osd {
    /// The server's state.
    pub engine: Arc<Engine>,
    /// Connections to the other servers.
    pub peers: Pool,
    /// Steps where a fault-injection test may crash or pause this server.
    pub failpoints: Arc<Failpoints>,
    /// Directories whose redistribution runs in a background task.
    pub(crate) distributing: Mutex<HashSet<String>>,
    /// Directories whose redistribution runs now (one at a time each).
    pub(crate) turns: crate::turns::Turns,
    /// Pending Cx operations and their commitment.
    pub(crate) cx: Cx,
    /// Directory delegations granted here (`deleg`).
    pub(crate) delegs: Arc<crate::deleg::table::DelegTable>,
    /// Parents' permissions pushed by Cx coordinators for new subdirectories here.
    pub(crate) pushed_perms: crate::pushed::PermsInbox,
    /// The running migration's counters (`migrate`).
    pub(crate) migration: crate::migrate::state::Progress,
    /// Pulls of directory objects under way, one per path.
    pub(crate) pulls: crate::migrate::state::Pulls,
    /// Held while the map is fetched from (or changed at) the map service.
    /// Holds when the map service last failed to answer.
    pub(crate) map_fetch: tokio::sync::Mutex<Option<std::time::Instant>>,
    /// Whether the migration walker runs.
    pub(crate) walker_running: std::sync::atomic::AtomicBool,
    /// Inode numbers leased to client sessions for their Cx mkdirs.
    pub(crate) ino_leases: crate::cx::leases::InoLeases,
    /// Signs the capabilities and receipts of client-direct I/O (a cluster with TLS).
    pub(crate) caps: Option<plusfs_tls::CapKey>,
}

impl Osd {
    /// Opens the server's state over `store`, calling other servers through `peers`;
    /// creates `/` if this server is its home. Starts the task that finishes the
    /// redistributions reads ask for.
    pub async fn open(
        id: plusfs_proto::ServerId,
        map: ClusterMap,
        store: Arc<dyn DirStore>,
        data: Arc<plusfs_data::DataStore>,
        peers: Pool,
        failpoints: Arc<Failpoints>,
        caps: Option<plusfs_tls::CapKey>,
    ) -> Result<Arc<Osd>, StoreError> {
        let (wanted_tx, mut wanted) = mpsc::unbounded_channel();
        let engine = Arc::new(Engine::open(id, map, store, data, wanted_tx)?);
        let osd = Arc::new(Osd {
            engine,
            peers,
            failpoints,
            distributing: Mutex::default(),
            turns: Default::default(),
            cx: Cx::default(),
            delegs: Arc::default(),
            pushed_perms: Default::default(),
            migration: Default::default(),
            pulls: Default::default(),
            map_fetch: Default::default(),
            walker_running: Default::default(),
            caps,
            ino_leases: Default::default(),
        });
        osd.load_delegations()?;
        let weak = Arc::downgrade(&osd);
        tokio::spawn(async move {
            while let Some(dir) = wanted.recv().await {
                let Some(osd) = weak.upgrade() else { return };
                osd.ensure_distributing(&dir);
            }
        });
        // Only a new cluster makes `/`: a server that becomes its home later takes it over.
        let new_cluster = osd.engine.map().epoch <= 1 && !osd.engine.map().migrating();
        if new_cluster && osd.engine.map().home_of_dir("/") == id && osd.engine.store.get_dir("/")?.is_none() {
            let mut root = DirObject { incarnation: 1, ..DirObject::new(ROOT_INO, 0o755, 0, 0) };
            root.ancestry = Some(plusfs_proto::Ancestry::root(root.search_perm()));
            let mut b = Batch::new();
            b.put_dir("/", &root);
            commit(osd.engine.store.as_ref(), b).await?;
            tracing::info!("created the root directory");
        }
        Ok(osd)
    }

    /// Cross-server operations this server has not finished: open two-phase commits and
    /// pending Cx operations (zero once the cluster has settled).
    pub fn pending_ops(&self) -> usize {
        self.engine.locks.tx_count() + self.cx.gauges().0 as usize
    }
}
