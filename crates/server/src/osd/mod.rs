//! A server: its [`Engine`] (state) and the protocols around it.
//!
//! `Osd` holds the engine, the peers and one struct per protocol (two-phase commit, Cx,
//! huge directories, links, delegations, migration, file data, ...). Each protocol owns
//! its state and holds the engine, the peers and handles to the lower protocols it calls,
//! built in that order by [`Osd::open`]; `dispatch.rs` routes each request to one of them.

mod dispatch;

use crate::batch::Batches;
use crate::bfo::Bfo;
use crate::cx::Cx;
use crate::deleg::Delegations;
use crate::dirperms::DirPerms;
use crate::engine::Engine;
use crate::failpoint::Failpoints;
use crate::filedata::FileData;
use crate::hugedir::HugeDirs;
use crate::links::Links;
use crate::migrate::Migration;
use crate::namespace::Namespace;
use crate::peers::{LocalPeer, Peers};
use crate::serial::Serial;
use crate::twopc::TwoPhase;
use plusfs_placement::ClusterMap;
use plusfs_proto::{DirObject, ROOT_INO};
use plusfs_rpc::Pool;
use plusfs_store::{Batch, DirStore, StoreError};
use std::sync::Arc;
use tokio::sync::mpsc;

/// One OSD+ server: its engine and its protocols, each of which holds the engine, the
/// peers and handles to the (lower) protocols it calls.
pub struct Osd {
    /// The server's state.
    pub engine: Arc<Engine>,
    /// Calls to the other servers.
    pub(crate) peers: Arc<Peers>,
    /// Steps where a fault-injection test may crash or pause this server.
    pub failpoints: Arc<Failpoints>,
    pub(crate) filedata: Arc<FileData>,
    pub(crate) deleg: Arc<Delegations>,
    pub(crate) hugedirs: Arc<HugeDirs>,
    pub(crate) migrate: Arc<Migration>,
    pub(crate) twopc: Arc<TwoPhase>,
    pub(crate) namespace: Arc<Namespace>,
    pub(crate) dirperms: Arc<DirPerms>,
    pub(crate) serial: Arc<Serial>,
    pub(crate) cx: Arc<Cx>,
    pub(crate) batches: Arc<Batches>,
    pub(crate) bfo: Arc<Bfo>,
    pub(crate) quotas: Arc<crate::quota::Quotas>,
}

impl Osd {
    /// Opens the server's state over `store`, calling other servers through `pool`;
    /// creates `/` if this server is its home. Starts the task that finishes the
    /// redistributions reads ask for.
    pub async fn open(
        id: plusfs_proto::ServerId,
        map: ClusterMap,
        store: Arc<dyn DirStore>,
        data: Arc<plusfs_data::DataStore>,
        pool: Pool,
        failpoints: Arc<Failpoints>,
        caps: Option<plusfs_tls::CapKey>,
    ) -> Result<Arc<Osd>, StoreError> {
        let (wanted_tx, mut wanted) = mpsc::unbounded_channel();
        let engine = Arc::new(Engine::open(id, map, store, data, wanted_tx)?);
        let osd = Arc::new(Osd::assemble(engine, pool, failpoints, caps));
        osd.peers.serve_locally_with(Arc::downgrade(&(osd.clone() as Arc<dyn LocalPeer>)));
        osd.engine.count_usage_once().await?;
        osd.deleg.load_delegations()?;
        osd.quotas.fetch_table();
        let weak = Arc::downgrade(&osd.hugedirs);
        tokio::spawn(async move {
            while let Some(dir) = wanted.recv().await {
                let Some(hugedirs) = weak.upgrade() else { return };
                hugedirs.ensure_distributing(&dir);
            }
        });
        // Only a new cluster makes `/`: a server that becomes its home later takes it over.
        let engine = &osd.engine;
        let new_cluster = engine.map().epoch <= 1 && !engine.map().migrating();
        if new_cluster && engine.map().home_of_dir("/") == id && engine.store().get_dir("/")?.is_none() {
            let mut root = DirObject { incarnation: 1, ..DirObject::new(ROOT_INO, 0o755, 0, 0) };
            root.ancestry = Some(plusfs_proto::Ancestry::root(root.search_elem()));
            let mut b = Batch::new();
            b.put_dir("/", &root);
            engine.commit(b).await?;
            tracing::info!("created the root directory");
        }
        Ok(osd)
    }

    /// The protocols over `engine`, each given the lower ones it calls.
    fn assemble(engine: Arc<Engine>, pool: Pool, failpoints: Arc<Failpoints>, caps: Option<plusfs_tls::CapKey>) -> Osd {
        let e = || engine.clone();
        let peers = Arc::new(Peers::new(e(), pool));
        let fp = || failpoints.clone();
        let links = Arc::new(Links::new(e(), peers.clone()));
        let filedata = Arc::new(FileData::new(e(), peers.clone(), fp(), links.clone(), caps));
        let deleg = Arc::new(Delegations::new(e(), filedata.clone()));
        let hugedirs = Arc::new(HugeDirs::new(e(), peers.clone(), fp(), deleg.clone()));
        let migrate = Arc::new(Migration::new(e(), peers.clone(), fp(), filedata.clone()));
        let twopc = Arc::new(TwoPhase::new(e(), peers.clone(), fp(), filedata.clone(), links.clone(), migrate.clone()));
        let namespace = Arc::new(Namespace::new(e(), links.clone(), filedata.clone(), hugedirs.clone(), twopc.clone()));
        let dirperms = Arc::new(DirPerms::new(e(), peers.clone(), twopc.clone(), hugedirs.clone()));
        let serial = Arc::new(Serial::new(e(), dirperms.clone(), filedata.clone()));
        let cx = Arc::new(Cx::new(e(), peers.clone(), fp(), dirperms.clone(), filedata.clone()));
        let batches = Arc::new(Batches::new(
            e(),
            namespace.clone(),
            twopc.clone(),
            hugedirs.clone(),
            links.clone(),
            filedata.clone(),
        ));
        let bfo = Arc::new(Bfo::new(e(), batches.clone(), filedata.clone(), hugedirs.clone()));
        let quotas = Arc::new(crate::quota::Quotas::new(e(), peers.clone(), twopc.clone()));
        let allowances: Arc<dyn crate::engine::quota::Allowances> = quotas.clone();
        engine.set_allowances(Arc::downgrade(&allowances));
        Osd {
            engine,
            peers,
            failpoints,
            filedata,
            deleg,
            hugedirs,
            migrate,
            twopc,
            namespace,
            dirperms,
            serial,
            cx,
            batches,
            bfo,
            quotas,
        }
    }

    /// Cross-server operations this server has not finished: open two-phase commits and
    /// pending Cx operations (zero once the cluster has settled).
    pub fn pending_ops(&self) -> usize {
        self.engine.locks().tx_count() + self.cx.cx.gauges().0 as usize
    }
}
