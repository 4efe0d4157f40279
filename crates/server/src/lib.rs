//! The plusfs OSD+ server.
//!
//! A server stores the directory objects that placement assigns to it, serves the
//! operations on them, and coordinates or takes part in two-phase commits for operations
//! that span servers. [`run`] takes a bound listener and a shutdown signal, so tests and
//! the CLI start servers the same way.

mod backoff;
mod batch;
mod bfo;
mod budget;
mod cx;
mod deleg;
mod dirperms;

mod endpoint;
pub mod engine;
pub mod exporter;
mod failpoint;
mod filedata;
mod front;
mod hugedir;
mod links;
mod member;
mod metrics;
mod migrate;
mod namespace;
mod net;
mod once;
mod osd;
mod peers;
mod pushed;
mod quota;
mod replica_data;
pub mod security;
mod serial;
mod space;
#[cfg(test)]
mod testkit;
mod turns;
mod twopc;

pub use failpoint::{FailAction, FailStep, Failpoint, Failpoints};
pub use front::{Front, Member};
pub use osd::Osd;
pub use plusfs_rpc::Pool;

use plusfs_placement::ClusterMap;
use plusfs_proto::ServerId;
use plusfs_store::{DirStore, RocksStore};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Settings of one server process.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// This server's id in the cluster map.
    pub id: ServerId,
    /// The cluster map.
    pub map: ClusterMap,
    /// Directory holding this server's store.
    pub data_dir: PathBuf,
    /// For a replicated slot: which of its members this process is.
    pub member: Option<u64>,
    /// Create the slot's replica group (a new cluster's first start; its lowest member
    /// does it). A group that exists stays as it is.
    pub bootstrap: bool,
    /// The cluster map's file, re-read for certificate revocations (none: never re-read).
    pub map_path: Option<PathBuf>,
    /// The server is not in the map yet: it starts, then `plusfs cluster add` puts it in
    /// (it serves nothing until the map service's new map names it).
    pub join: bool,
    /// Where a member binds its Raft listener (none: its `raft` address in the map).
    pub raft_listen: Option<String>,
}

impl ServerConfig {
    /// This server's entry in the map (a joining server: an entry of weight 0 until the
    /// map service adds it).
    fn entry(&self) -> Result<plusfs_placement::ServerEntry, StartError> {
        match self.map.server(self.id) {
            Some(e) => Ok(e.clone()),
            None if self.join => Ok(plusfs_placement::ServerEntry::new(self.id, String::new(), 0.0)),
            None => Err(StartError::UnknownId(self.id)),
        }
    }
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("server id {0} is not in the cluster map")]
    UnknownId(ServerId),
    #[error("cannot open store in {path}: {source}")]
    Store { path: String, source: plusfs_store::StoreError },
    #[error("cannot open the data store in {path}: {source}")]
    Data { path: String, source: plusfs_data::DataError },
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error("server {server} has no member {member} in the cluster map")]
    UnknownMember { server: ServerId, member: u64 },
    #[error("server {0} is replicated: start it as one of its members (--member)")]
    MemberNeeded(ServerId),
    #[error("replica group of server {server}: {source}")]
    Group { server: ServerId, source: plusfs_replica::GroupError },
    #[error("TLS: {0}")]
    Tls(#[from] plusfs_tls::CertError),
    #[error("cannot make the data directory {path} private: {source}")]
    Private { path: String, source: std::io::Error },
    #[error(transparent)]
    Failpoint(#[from] failpoint::UnknownFailpoint),
}

/// How a server process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// Asked to stop.
    Stopped,
    /// This member led its slot and no longer does (why): its in-memory state may be
    /// behind the new leader's, so the process starts afresh as a follower.
    Deposed(String),
}

/// Opens a server's stores, recovers unfinished transactions and Cx operations, resumes
/// redistributions and starts its background tasks. Calls to other servers go through
/// `peers`. The returned server answers [`Osd::handle`]; [`run`] puts it on the network.
pub async fn open(config: &ServerConfig, peers: Pool, failpoints: Arc<Failpoints>) -> Result<Arc<Osd>, StartError> {
    config.entry()?;
    let store = open_store(config)?;
    let data = open_data(config, false)?;
    open_over(config, store, data, peers, failpoints).await
}

fn store_error(config: &ServerConfig) -> impl Fn(plusfs_store::StoreError) -> StartError + '_ {
    move |source| StartError::Store { path: config.data_dir.display().to_string(), source }
}

fn open_store(config: &ServerConfig) -> Result<Arc<RocksStore>, StartError> {
    let always = config.map.sync == plusfs_placement::SyncMode::Always;
    Ok(Arc::new(RocksStore::open(&config.data_dir.join("store"), always).map_err(store_error(config))?))
}

/// The server's data store (`replica`: one member's copy of a replicated slot's).
fn open_data(config: &ServerConfig, replica: bool) -> Result<Arc<plusfs_data::DataStore>, StartError> {
    let data_dir = config.data_dir.join("data");
    let data_opts = plusfs_data::DataOptions {
        // A replica group's member fdatasyncs its appends whatever `sync` says: its store
        // may make an apply durable (a memtable flush) before the OS writes the bytes it
        // refers to back, and the log that carried them is then not replayed.
        sync: config.map.sync == plusfs_placement::SyncMode::Always || replica,
        reserve_bytes: config.map.data.reserve_bytes,
        segment_bytes: config.map.data.segment_bytes,
        replica,
    };
    let data = plusfs_data::DataStore::open(&data_dir, data_opts)
        .map_err(|e| StartError::Data { path: data_dir.display().to_string(), source: e })?;
    Ok(Arc::new(data))
}

/// [`open`] over opened stores (a replicated one, once this member leads).
async fn open_over(
    config: &ServerConfig,
    store: Arc<RocksStore>,
    data: Arc<plusfs_data::DataStore>,
    peers: Pool,
    failpoints: Arc<Failpoints>,
) -> Result<Arc<Osd>, StartError> {
    let store_err = store_error(config);
    let store: Arc<dyn DirStore> = store;
    let caps = match (&config.map.tls.ca, &config.map.tls.server_identity) {
        (Some(_), Some(dir)) => Some(plusfs_tls::CapKey::from_identity(dir)?),
        _ => None,
    };
    let osd =
        Osd::open(config.id, config.map.clone(), store, data, peers, failpoints, caps).await.map_err(&store_err)?;
    osd.twopc.recover().await.map_err(&store_err)?;
    osd.cx.start_cx();
    osd.cx.recover_cx().map_err(&store_err)?;
    osd.hugedirs.resume_distributions().map_err(&store_err)?;
    osd.migrate.resume_shard_moves().map_err(&store_err)?;
    osd.migrate.join_map().await;
    osd.filedata.spawn_compactor();
    Ok(osd)
}

/// Opens the server (see [`open`]; peers over TCP, failpoints from `PLUSFS_FAILPOINT`) and
/// serves `listener` until `shutdown` is true. A member of a replicated slot (see
/// [`member::run`]) serves only while it leads.
pub async fn run(
    config: ServerConfig,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
) -> Result<Exit, StartError> {
    let entry = config.entry()?;
    failpoint::process_failpoint()?;
    private_data_dir(&config.data_dir)?;
    let security = secure(&config)?;
    if !entry.members.is_empty() {
        return member::run(config, listener, security, shutdown).await;
    }
    let peers = Pool::new(&config.map, 2, 0);
    let osd = open(&config, peers, Arc::default()).await?;
    tracing::info!(id = config.id, addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), tls = security.is_some(), "server ready");
    let store = osd.engine.store_handle();
    let space = space::Space::new(
        config.data_dir.clone(),
        config.map.data.reserve_bytes,
        Box::new(move || store.upkeep_room()),
    );
    let store = osd.engine.store_handle();
    let front = Front::serving(osd, Arc::new(space));
    front.keep_space(store);
    let metrics = endpoint::start(entry.metrics.as_deref(), &front).await;
    net::serve(listener, front, security, shutdown).await;
    if let Some(m) = metrics {
        m.abort();
    }
    tracing::info!(id = config.id, "server stopped");
    Ok(Exit::Stopped)
}

/// The server's TLS end, if the cluster uses TLS; this process then presents the server
/// identity to its peers too.
fn secure(config: &ServerConfig) -> Result<Option<Arc<security::Security>>, StartError> {
    let security = security::Security::from_map(&config.map, config.map_path.as_deref())?;
    if let (Some(_), Some(dir)) = (&security, &config.map.tls.server_identity) {
        plusfs_rpc::set_process_identity(dir.clone());
    }
    let security = security.map(Arc::new);
    if let Some(s) = &security {
        s.watch();
    }
    Ok(security)
}

/// Makes the server's data directory private (0700, made if missing): every user's file
/// contents and metadata live below it, so no other local account may walk into it, also
/// in a cluster made before directories were private. (`plusfs server` also makes what it
/// creates private: umask 077.)
fn private_data_dir(dir: &Path) -> Result<(), StartError> {
    use std::os::unix::fs::PermissionsExt;
    let private = |source| StartError::Private { path: dir.display().to_string(), source };
    std::fs::create_dir_all(dir).map_err(private)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(private)
}

/// Binds the address the cluster map gives server `id` (its member `member`'s, if given).
pub async fn bind(map: &ClusterMap, id: ServerId, member: Option<u64>) -> Result<TcpListener, StartError> {
    let entry = map.server(id).ok_or(StartError::UnknownId(id))?;
    let addr = match member {
        Some(m) => entry.member(m).ok_or(StartError::UnknownMember { server: id, member: m })?.address.clone(),
        None => entry.address.clone(),
    };
    TcpListener::bind(&addr).await.map_err(|source| StartError::Listen { addr, source })
}
