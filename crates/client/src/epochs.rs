//! How a client follows the cluster map: when an answer's frame carries a newer epoch
//! than the client routes with, a background task fetches the map from the map service
//! (server 0) and the client routes with it from then on. Requests sent with the older
//! map meanwhile are forwarded by the server that got them, so none is served wrongly.

use plusfs_placement::ClusterMap;
use plusfs_proto::{Reply, Request};
use plusfs_rpc::Pool;
use std::sync::{Arc, RwLock, Weak};

/// The server that keeps the cluster map.
const KEEPER: plusfs_proto::ServerId = 0;

/// Starts the task that keeps `map` at the newest epoch `pool`'s answers speak of (none
/// outside a Tokio runtime: such a client keeps its map).
pub(crate) fn follow(map: &Arc<RwLock<Arc<ClusterMap>>>, pool: &Arc<Pool>) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
    let (cell, pool) = (Arc::downgrade(map), Arc::downgrade(pool));
    let counters = match pool.upgrade() {
        Some(p) => p.counters().clone(),
        None => return,
    };
    rt.spawn(async move {
        loop {
            counters.epochs.newer().await;
            if !refresh(&cell, &pool).await {
                return;
            }
        }
    });
}

/// Fetches the map once and installs it if newer; false once the client is gone.
async fn refresh(cell: &Weak<RwLock<Arc<ClusterMap>>>, pool: &Weak<Pool>) -> bool {
    let (Some(c), Some(p)) = (cell.upgrade(), pool.upgrade()) else { return false };
    let current = c.read().expect("cluster map").clone();
    match p.call(KEEPER, &Request::MapGet).await {
        Ok(Ok(Reply::Map(text))) => match ClusterMap::from_toml(&text) {
            Ok(mut map) if map.epoch > current.epoch => {
                map.tls = current.tls.clone();
                p.learn_map(&map);
                tracing::debug!(epoch = map.epoch, "client adopted a newer cluster map");
                *c.write().expect("cluster map") = Arc::new(map);
            }
            Ok(_) => p.counters().epochs.set_current(current.epoch),
            Err(e) => tracing::warn!(cause = %e, "the map service sent a bad map"),
        },
        other => {
            tracing::debug!(?other, "cannot fetch the cluster map");
            // Try again on a later hint, not at once: the map service may be down.
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            p.counters().epochs.set_current(current.epoch);
        }
    }
    true
}
