//! How a client follows the cluster map: when an answer's frame carries a newer epoch
//! than the client routes with, its next request first fetches the map from the map
//! service (the map's keeper; any other server if it does not answer) and routes with it
//! from then on. A request sent with the older map is forwarded by the server that got
//! it, so none is served wrongly meanwhile. A client that cannot reach a server asks for
//! the map too (at most once per [`RESCUE_EVERY`]), and when no server it knows answers it
//! reads the map file it started from again: a client idle while every server it knew
//! left the cluster finds it through the file an operator's commands keep up to date.

use plusfs_placement::ClusterMap;
use plusfs_proto::{Reply, Request};
use plusfs_rpc::Pool;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Least time between two map fetches set off by unreachable servers.
pub(crate) const RESCUE_EVERY: Duration = Duration::from_secs(2);

/// The map a client routes with, shared by its clones.
#[derive(Clone)]
pub(crate) struct SharedMap {
    cell: Arc<RwLock<Arc<ClusterMap>>>,
    fetch: Arc<tokio::sync::Mutex<()>>,
    /// The map file this client started from, if any.
    file: Option<Arc<PathBuf>>,
    last_rescue: Arc<Mutex<Option<Instant>>>,
}

impl SharedMap {
    pub(crate) fn new(map: Arc<ClusterMap>, file: Option<PathBuf>) -> SharedMap {
        SharedMap {
            cell: Arc::new(RwLock::new(map)),
            fetch: Arc::default(),
            file: file.map(Arc::new),
            last_rescue: Arc::default(),
        }
    }

    /// After a server could not be reached: fetches the map (servers, then the map file),
    /// unless that was done less than [`RESCUE_EVERY`] ago. Answers whether the client now
    /// routes with a newer map.
    pub(crate) async fn rescue(&self, pool: &Pool) -> bool {
        {
            let mut last = self.last_rescue.lock().expect("rescue time");
            if last.is_some_and(|t| t.elapsed() < RESCUE_EVERY) {
                return false;
            }
            *last = Some(Instant::now());
        }
        let before = self.get().epoch;
        let _one = self.fetch.lock().await;
        self.refresh(pool).await;
        self.get().epoch > before
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
        let mut got = Self::ask_servers(&self.get(), pool).await;
        if got.is_none() && self.adopt_file(pool) {
            got = Self::ask_servers(&self.get(), pool).await;
        }
        let current = self.get();
        match got {
            Some(Reply::Map(text)) => match ClusterMap::from_toml(&text) {
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
            _ => {
                // Asked again on a later hint: no server answered.
                pool.counters().epochs.set_current(current.epoch);
            }
        }
    }

    /// The map answer of the keeper of `map`, or of the first other server that answers.
    async fn ask_servers(map: &ClusterMap, pool: &Pool) -> Option<Reply> {
        let others = map.servers.iter().map(|s| s.id).filter(|&id| id != map.keeper);
        for id in std::iter::once(map.keeper).chain(others) {
            match pool.call_no_resend(id, &Request::MapGet).await {
                Ok(Ok(reply)) => return Some(reply),
                other => tracing::debug!(server = id, ?other, "cannot fetch the cluster map"),
            }
        }
        None
    }

    /// Routes with the map file's map if it is newer than this client's; answers whether
    /// it was.
    fn adopt_file(&self, pool: &Pool) -> bool {
        let Some(path) = &self.file else { return false };
        let current = self.get();
        match ClusterMap::load(path) {
            Ok(mut map) if map.epoch > current.epoch => {
                map.tls = current.tls.clone();
                pool.learn_map(&map);
                tracing::info!(epoch = map.epoch, file = %path.display(), "no server answered: routing with the map file's newer map");
                *self.cell.write().expect("cluster map") = Arc::new(map);
                true
            }
            Ok(_) => false,
            Err(e) => {
                tracing::debug!(cause = %e, "cannot read the cluster map file again");
                false
            }
        }
    }
}
