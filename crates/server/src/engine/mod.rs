//! The engine: one server's state and nothing else. It owns the metadata store, the busy
//! and transaction locks, the id allocators and the file-data store, and offers two kinds
//! of calls: *reads* of stored objects, and [`Engine::apply`], which makes one batch of
//! effects durable atomically. Every change a protocol makes reaches the store through
//! `apply`, so the engine is the state machine a replication log can drive. It knows
//! nothing of the network: protocols (`twopc`, `cx`, `serial`, `hugedir`, `links`, `bfo`,
//! `filedata`) hold it together with their peers.

pub(crate) mod attrs;
pub(crate) mod call;
pub(crate) mod errors;
pub(crate) mod host;
pub(crate) mod ids;
pub(crate) mod links;
pub(crate) mod locks;
pub(crate) mod logrec;
pub(crate) mod perm;
pub(crate) mod quota;
pub(crate) mod records;
pub(crate) mod subops;
pub(crate) mod xattrs;

use crate::engine::errors::OpError;
use crate::metrics::Metrics;
use errors::{eio, err, OpResult};
use ids::IdAllocator;
use locks::LockTable;
use plusfs_placement::ClusterMap;
use plusfs_proto::{DirObject, Errno, Inode, ServerId};
use plusfs_store::{commit, Batch, DirStore, StoreError, StoreRead};
use serde::Serialize;
use std::sync::Arc;
use tokio::sync::mpsc;

/// One server's state. Its fields are private: protocols read through [`Engine::store`]
/// (a read-only view) and change state only through [`Engine::apply`].
pub struct Engine {
    id: ServerId,
    /// The cluster map, replaced when a newer epoch arrives ([`Engine::map`]).
    map_cell: parking_lot::RwLock<Arc<ClusterMap>>,
    store: Arc<dyn DirStore>,
    locks: Arc<LockTable>,
    metrics: Metrics,
    inos: IdAllocator,
    txids: IdAllocator,
    /// Record ids of the data store.
    records: IdAllocator,
    /// File data stored on this server.
    data: Arc<plusfs_data::DataStore>,
    /// Held (shared) by changes of the record index, (exclusively) by compaction's switch.
    data_gate: tokio::sync::RwLock<()>,
    /// Directories a read found half-distributed: the redistribution protocol finishes them.
    distribution_wanted: mpsc::UnboundedSender<String>,
    /// The quotas kept here (the quota table, see [`quota`]).
    quotas:
        parking_lot::RwLock<Arc<std::collections::BTreeMap<plusfs_proto::quota::Owner, plusfs_proto::quota::QuotaDef>>>,
    /// Where batches over a ceiling get more allowance (the quota protocol).
    allowances: std::sync::OnceLock<std::sync::Weak<dyn quota::Allowances>>,
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).expect("in-memory encoding cannot fail")
}

/// The counter that records that a store's quota usage was counted from what it held.
const USAGE_COUNTED: &str = "usage_counted";

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
        let engine = Engine {
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
            quotas: Default::default(),
            allowances: Default::default(),
        };
        engine.load_quotas()?;
        Ok(engine)
    }

    /// Counts the quota usage of a store that was written before usage was counted (once:
    /// a counter records it), so its counters start from what it holds.
    pub(crate) async fn count_usage_once(&self) -> Result<(), StoreError> {
        if self.store.get_counter(USAGE_COUNTED)? == Some(1) {
            return Ok(());
        }
        let (wrong, mut fix) = self.store.check_usage()?;
        fix.put_counter(USAGE_COUNTED, 1);
        commit(self.store.as_ref(), fix).await?;
        if !wrong.is_empty() {
            tracing::info!(owners = wrong.len(), "counted the quota usage of what the store held");
        }
        Ok(())
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
        self.store.get_dir(dir).map_err(eio)?.ok_or_else(|| OpError::MissingDir((dir).to_string()))
    }

    pub(crate) async fn new_ino(&self) -> OpResult<u64> {
        self.inos.next(self.store.as_ref()).await.map_err(eio)
    }

    /// Makes `b` durable atomically: the only way a server's state changes.
    pub(crate) async fn apply(&self, b: Batch) -> OpResult<()> {
        self.commit_counted(b).await
    }

    /// Applies `b`, a batch of `call`'s effects: with the request's exactly-once mark (and
    /// at its commit point its answer) if it is an exactly-once request.
    pub(crate) async fn apply_for(&self, call: &call::Call, mut b: Batch) -> OpResult<()> {
        call.mark(&mut b);
        self.apply(b).await
    }

    /// [`Engine::apply`] with the store's error (start-up and recovery, which report it).
    pub(crate) async fn commit(&self, b: Batch) -> Result<(), StoreError> {
        commit(self.store.as_ref(), b).await
    }

    /// Submits `b` without waiting (a caller that waits by blocking, like compaction).
    pub(crate) fn submit(&self, b: Batch) -> plusfs_store::Commit {
        self.store.submit(b)
    }

    /// This server's id.
    pub fn id(&self) -> ServerId {
        self.id
    }

    /// Reads of the store.
    pub fn store(&self) -> &dyn StoreRead {
        self.store.as_ref()
    }

    /// The store itself, for what runs beside the protocols: the disk-space keeper
    /// (upkeep room, reclaim), metrics (latency histograms) and tests (to see it closed).
    pub fn store_handle(&self) -> Arc<dyn DirStore> {
        self.store.clone()
    }

    /// The busy and transaction locks.
    pub fn locks(&self) -> &Arc<LockTable> {
        &self.locks
    }

    /// The server's counters.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The file data stored here.
    pub(crate) fn data(&self) -> &Arc<plusfs_data::DataStore> {
        &self.data
    }

    /// Held shared by changes of the record index, exclusively by compaction's switch.
    pub(crate) fn data_gate(&self) -> &tokio::sync::RwLock<()> {
        &self.data_gate
    }

    /// A new transaction (or delegation) id.
    pub(crate) async fn new_txid(&self) -> OpResult<u64> {
        self.txids.next(self.store.as_ref()).await.map_err(eio)
    }

    /// The first of `n` consecutive new inode numbers.
    pub(crate) async fn new_inos(&self, n: u64) -> OpResult<u64> {
        self.inos.next_block(self.store.as_ref(), n).await.map_err(eio)
    }

    /// The entry `name` of `dir`, or ENOENT.
    pub(crate) fn entry(&self, d: &DirObject, p: &str, name: &str) -> OpResult<Inode> {
        self.store
            .get_entry(d.ino, name)
            .map_err(eio)?
            .ok_or_else(|| err(Errno::ENOENT, format!("'{p}' does not exist")))
    }
}

#[cfg(test)]
mod tests {
    use crate::testkit::Kit;
    use plusfs_proto::Errno;
    use plusfs_store::mem::Faults;
    use plusfs_store::Batch;

    #[tokio::test]
    async fn ids_are_never_reused_after_a_crash() {
        let kit = Kit::new().await;
        let before = [kit.osd.engine.new_txid().await.unwrap(), kit.osd.engine.new_inos(10).await.unwrap()];
        let kit = kit.crash_and_restart().await;
        assert!(kit.osd.engine.new_txid().await.unwrap() > before[0]);
        assert!(kit.osd.engine.new_inos(1).await.unwrap() >= before[1] + 10);
    }

    #[tokio::test]
    async fn a_write_the_store_refuses_changes_nothing() {
        let kit = Kit::new().await;
        let committed = kit.store.committed();
        kit.store.inject(Faults { fail_from: Some(0), no_space: true });
        let mut b = Batch::new();
        b.put_counter("probe", 7);
        let e = kit.osd.engine.apply(b).await.unwrap_err();
        assert_eq!(e.errno(), Errno::ENOSPC, "{e}");
        assert_eq!(kit.osd.engine.store().get_counter("probe").unwrap(), None);
        assert_eq!(kit.store.committed(), committed);
    }
}
