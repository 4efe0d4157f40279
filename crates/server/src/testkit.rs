//! A server over an in-memory store, for unit tests of the engine and the protocols: no
//! RocksDB and no network (a one-server map, so every request a protocol sends goes to
//! the server itself and is served without a message). A test drives a protocol by
//! calling its struct (`kit.osd.twopc`, `kit.osd.namespace`, ...), injects store faults
//! through [`Kit::store`], and restarts the server over what its store committed with
//! [`Kit::crash_and_restart`]. [`Mesh`] puts several such servers in one process, their
//! requests to each other passed as calls (a cross-server protocol without sockets).

use crate::osd::Osd;
use futures::future::BoxFuture;
use parking_lot::RwLock;
use plusfs_placement::{ClusterMap, ServerEntry};
use plusfs_proto::{Cred, Request, Response, ServerId};
use plusfs_rpc::{CallError, Pool, Transport};
use plusfs_store::mem::MemStore;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

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
        let pool = Pool::new(&map, 1, 0);
        Kit::start(0, map, pool, store, data_dir).await
    }

    async fn start(id: ServerId, map: ClusterMap, pool: Pool, store: Arc<MemStore>, dir: tempfile::TempDir) -> Kit {
        let opts = plusfs_data::DataOptions { segment_bytes: 1 << 20, sync: false, reserve_bytes: 0, replica: false };
        let data = Arc::new(plusfs_data::DataStore::open(dir.path(), opts).expect("data store"));
        let osd = Osd::open(id, map, store.clone(), data, pool, Arc::default(), None).await.expect("server opens");
        osd.twopc.recover().await.expect("two-phase commit recovers");
        osd.cx.start_cx();
        osd.cx.recover_cx().expect("Cx recovers");
        osd.migrate.join_map().await;
        Kit { osd, store, data_dir: dir }
    }

    /// The server after a crash: a new one over exactly what its store committed (and the
    /// same data directory), recovered as a restarted server is.
    pub(crate) async fn crash_and_restart(self) -> Kit {
        let store = Arc::new(self.store.crashed());
        Kit::over(store, self.data_dir).await
    }
}

/// Servers in one process whose requests to each other are calls of `Osd::handle`.
pub(crate) struct Mesh {
    pub(crate) servers: Vec<Kit>,
}

/// The transport of a [`Mesh`]: a request to server `n` is served by its `Osd`.
#[derive(Default)]
struct Calls(RwLock<HashMap<ServerId, Weak<Osd>>>);

impl Transport for Calls {
    fn send<'a>(
        &'a self,
        server: ServerId,
        cred: &'a Cred,
        req: &'a Request,
    ) -> BoxFuture<'a, Result<Response, CallError>> {
        let osd = self.0.read().get(&server).and_then(Weak::upgrade);
        Box::pin(async move {
            match osd {
                Some(osd) => Ok(osd.handle(cred.clone(), req.clone()).await),
                None => Err(CallError::Connect { addr: format!("server {server}"), reason: "down".into() }),
            }
        })
    }
}

impl Mesh {
    /// `n` new servers (ids 0..n, equal weights); `/` exists and is empty.
    pub(crate) async fn new(n: u32) -> Mesh {
        let entries = (0..n).map(|i| ServerEntry::new(i, format!("127.0.0.1:{}", 1 + i), 1.0)).collect();
        let map = ClusterMap::with_servers(entries);
        let calls = Arc::new(Calls::default());
        let mut servers = Vec::new();
        for id in 0..n {
            let pool = Pool::with_transport(calls.clone(), Arc::default(), 0);
            let dir = tempfile::tempdir().expect("temporary directory");
            let kit = Kit::start(id, map.clone(), pool, Arc::new(MemStore::new()), dir).await;
            calls.0.write().insert(id, Arc::downgrade(&kit.osd));
            servers.push(kit);
        }
        Mesh { servers }
    }

    /// The server with id `id`.
    pub(crate) fn server(&self, id: ServerId) -> &Arc<Osd> {
        &self.servers[id as usize].osd
    }

    /// A name `PREFIXn` whose directory `/PREFIXn` is homed on another server than `/`.
    pub(crate) fn name_away_from_root(&self, prefix: &str) -> String {
        let root = self.home("/");
        (0..64).map(|i| format!("{prefix}{i}")).find(|n| self.home(&format!("/{n}")) != root).expect("a name")
    }

    /// The server a directory at `path` is homed on.
    pub(crate) fn home(&self, path: &str) -> ServerId {
        self.servers[0].osd.engine.map().home_of_dir(path)
    }
}

/// The credential of root.
pub(crate) fn root() -> crate::engine::call::Call {
    crate::engine::call::Call::new(Cred::new(0, 0, Vec::new()))
}
