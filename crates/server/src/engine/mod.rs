//! The engine: one server's state and nothing else. It owns the metadata store, the busy
//! and transaction locks, the id allocators and the file-data store, and offers two kinds
//! of calls: *reads* of stored objects, and [`Engine::apply`], which makes one batch of
//! effects durable atomically. Every change a protocol makes reaches the store through
//! `apply`, so the engine is the state machine a replication log can drive. It knows
//! nothing of the network: protocols (`twopc`, `cx`, `serial`, `hugedir`, `links`, `bfo`,
//! `filedata`) hold it together with their peers.

pub(crate) mod answers;
pub(crate) mod attrs;
pub(crate) mod errors;
pub(crate) mod host;
pub(crate) mod ids;
pub(crate) mod links;
pub(crate) mod locks;
pub(crate) mod perm;
pub(crate) mod records;
pub(crate) mod subops;

use crate::metrics::Metrics;
use errors::{eio, err, OpResult};
use ids::IdAllocator;
use locks::LockTable;
use plusfs_placement::ClusterMap;
use plusfs_proto::{DirObject, Errno, Inode, ServerId, WireError};
use plusfs_store::{commit, Batch, DirStore, StoreError};
use serde::Serialize;
use std::sync::Arc;
use tokio::sync::mpsc;

/// One server's state.
pub struct Engine {
    pub id: ServerId,
    /// The cluster map, replaced when a newer epoch arrives ([`Engine::map`]).
    map_cell: parking_lot::RwLock<Arc<ClusterMap>>,
    pub store: Arc<dyn DirStore>,
    pub locks: Arc<LockTable>,
    pub metrics: Metrics,
    pub(crate) inos: IdAllocator,
    pub(crate) txids: IdAllocator,
    /// Record ids of the data store.
    pub(crate) records: IdAllocator,
    /// File data stored on this server.
    pub(crate) data: Arc<plusfs_data::DataStore>,
    /// Held (shared) by changes of the record index, (exclusively) by compaction's switch.
    pub(crate) data_gate: tokio::sync::RwLock<()>,
    /// Directories a read found half-distributed: the redistribution protocol finishes them.
    distribution_wanted: mpsc::UnboundedSender<String>,
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).expect("in-memory encoding cannot fail")
}

impl Engine {
    /// Opens the state of server `id` over `store` and `data`. Directories found to need
    /// their redistribution finished are sent to `distribution_wanted`.
    pub fn open(
        id: ServerId,
        map: ClusterMap,
        store: Arc<dyn DirStore>,
        data: Arc<plusfs_data::DataStore>,
        distribution_wanted: mpsc::UnboundedSender<String>,
    ) -> Result<Engine, StoreError> {
        Ok(Engine {
            inos: IdAllocator::load(store.as_ref(), "next_ino", id)?,
            txids: IdAllocator::load(store.as_ref(), "next_txid", id)?,
            records: IdAllocator::load(store.as_ref(), "next_record", id)?,
            id,
            map_cell: parking_lot::RwLock::new(Arc::new(map)),
            store,
            locks: Arc::default(),
            metrics: Metrics::default(),
            data,
            data_gate: tokio::sync::RwLock::new(()),
            distribution_wanted,
        })
    }

    /// The cluster map this server works with now.
    pub fn map(&self) -> Arc<ClusterMap> {
        self.map_cell.read().clone()
    }

    /// Replaces the map by `map` if it is newer; answers whether it was.
    pub(crate) fn install_map(&self, map: ClusterMap) -> bool {
        let mut cell = self.map_cell.write();
        if map.epoch <= cell.epoch {
            return false;
        }
        *cell = Arc::new(map);
        true
    }

    /// Asks the redistribution protocol to finish distributing `dir`.
    pub(crate) fn want_distribution(&self, dir: &str) {
        let _ = self.distribution_wanted.send(dir.to_string());
    }

    /// The directory object at `dir`, or the "missing directory" error.
    pub(crate) fn dir_object(&self, dir: &str) -> OpResult<DirObject> {
        self.store.get_dir(dir).map_err(eio)?.ok_or_else(|| WireError::missing_dir(dir))
    }

    pub(crate) async fn new_ino(&self) -> OpResult<u64> {
        self.inos.next(self.store.as_ref()).await.map_err(eio)
    }

    pub(crate) async fn apply(&self, b: Batch) -> OpResult<()> {
        commit(self.store.as_ref(), b).await.map_err(eio)
    }

    /// The entry `name` of `dir`, or ENOENT.
    pub(crate) fn entry(&self, d: &DirObject, p: &str, name: &str) -> OpResult<Inode> {
        self.store
            .get_entry(d.ino, name)
            .map_err(eio)?
            .ok_or_else(|| err(Errno::ENOENT, format!("'{p}' does not exist")))
    }
}
