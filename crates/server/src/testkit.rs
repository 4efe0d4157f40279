//! A server over an in-memory store, for unit tests of the engine and the protocols: no
//! RocksDB and no network (a one-server map, so every request a protocol sends goes to
//! the server itself and is served without a message). A test drives a protocol by
//! calling its struct (`kit.osd.twopc`, `kit.osd.namespace`, ...), injects store faults
//! through [`Kit::store`], and restarts the server over what its store committed with
//! [`Kit::crash_and_restart`].

use crate::osd::Osd;
use plusfs_placement::{ClusterMap, ServerEntry};
use plusfs_proto::Cred;
use plusfs_rpc::Pool;
use plusfs_store::mem::MemStore;
use std::sync::Arc;

/// One server for a unit test.
pub(crate) struct Kit {
    pub(crate) osd: Arc<Osd>,
    pub(crate) store: Arc<MemStore>,
    data_dir: tempfile::TempDir,
}

impl Kit {
    /// A new one-server cluster: `/` exists and is empty.
    pub(crate) async fn new() -> Kit {
        Kit::over(Arc::new(MemStore::new()), tempfile::tempdir().expect("temporary directory")).await
    }

    async fn over(store: Arc<MemStore>, data_dir: tempfile::TempDir) -> Kit {
        let map = ClusterMap::with_servers(vec![ServerEntry::new(0, "127.0.0.1:1".into(), 1.0)]);
        let opts = plusfs_data::DataOptions { segment_bytes: 1 << 20, sync: false, reserve_bytes: 0, replica: false };
        let data = Arc::new(plusfs_data::DataStore::open(data_dir.path(), opts).expect("data store"));
        let pool = Pool::new(&map, 1, 0);
        let osd = Osd::open(0, map, store.clone(), data, pool, Arc::default(), None).await.expect("server opens");
        osd.twopc.recover().await.expect("two-phase commit recovers");
        osd.cx.recover_cx().expect("Cx recovers");
        Kit { osd, store, data_dir }
    }

    /// The server after a crash: a new one over exactly what its store committed (and the
    /// same data directory), recovered as a restarted server is.
    pub(crate) async fn crash_and_restart(self) -> Kit {
        let store = Arc::new(self.store.crashed());
        Kit::over(store, self.data_dir).await
    }
}

/// The credential of root.
pub(crate) fn root() -> Cred {
    Cred::new(0, 0, Vec::new())
}
