//! How a client follows the cluster map: when an answer's frame carries a newer epoch
//! than the client routes with, its next request first fetches the map from the map
//! service (server 0) and routes with it from then on. A request sent with the older map
//! is forwarded by the server that got it, so none is served wrongly meanwhile.

use plusfs_placement::ClusterMap;
use plusfs_proto::{Reply, Request};
use plusfs_rpc::Pool;
use std::sync::{Arc, RwLock};

/// The server that keeps the cluster map.
const KEEPER: plusfs_proto::ServerId = 0;

/// The map a client routes with, shared by its clones.
#[derive(Clone)]
pub(crate) struct SharedMap {
    cell: Arc<RwLock<Arc<ClusterMap>>>,
    fetch: Arc<tokio::sync::Mutex<()>>,
}

impl SharedMap {
    pub(crate) fn new(map: Arc<ClusterMap>) -> SharedMap {
        SharedMap { cell: Arc::new(RwLock::new(map)), fetch: Arc::default() }
    }

    pub(crate) fn get(&self) -> Arc<ClusterMap> {
        self.cell.read().expect("cluster map").clone()
    }

    /// Fetches the map if `pool`'s answers spoke of a newer epoch (one fetch at a time).
    pub(crate) async fn follow(&self, pool: &Pool) {
        if !pool.counters().epochs.is_stale() {
            return;
        }
        let _one = self.fetch.lock().await;
        if pool.counters().epochs.is_stale() {
            self.refresh(pool).await;
        }
    }

    async fn refresh(&self, pool: &Pool) {
        let current = self.get();
        match pool.call(KEEPER, &Request::MapGet).await {
            Ok(Ok(Reply::Map(text))) => match ClusterMap::from_toml(&text) {
                Ok(mut map) if map.epoch > current.epoch => {
                    map.tls = current.tls.clone();
                    pool.learn_map(&map);
                    tracing::debug!(epoch = map.epoch, "client adopted a newer cluster map");
                    *self.cell.write().expect("cluster map") = Arc::new(map);
                }
                Ok(_) => pool.counters().epochs.set_current(current.epoch),
                Err(e) => {
                    tracing::warn!(cause = %e, "the map service sent a bad map");
                    pool.counters().epochs.set_current(current.epoch);
                }
            },
            other => {
                // Asked again on a later hint: the map service may be down.
                tracing::debug!(?other, "cannot fetch the cluster map");
                pool.counters().epochs.set_current(current.epoch);
            }
        }
    }
}
