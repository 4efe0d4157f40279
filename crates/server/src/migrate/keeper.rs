//! The map service and how every server follows it.
//!
//! One server keeps the cluster map (the map's `keeper`: server 0 until it is drained), in
//! its store, so a replicated keeper keeps it in its Raft log, as Ceph's monitors keep
//! theirs. `MapChange` applies an administrator's change there, stores the next epoch and
//! pushes it to every server (`MapPush`). Any server that sees a newer epoch hint in a
//! frame, or starts, fetches the map from the keeper (`MapGet`; any other server if the
//! keeper does not answer) before it serves the next request. Draining the keeper's server
//! moves the service: the change names a new keeper, which stores the map before it
//! answers the push that tells it (the old keeper pushes until it does). Each process keeps
//! its own `[tls]` section: certificate paths are local facts.

use super::Migration;
use crate::engine::call::Call;
use crate::engine::errors::{eio, err, OpError, OpResult};
use plusfs_placement::{ClusterMap, MapChange};
use plusfs_proto::{Cred, Errno, Reply, Request, ServerId};
use plusfs_store::{Batch, LogKind};
use std::sync::Arc;
use std::time::Duration;

/// How long a server waits for the map service when it fetches the map.
const FETCH_WAIT: Duration = Duration::from_secs(3);
/// After the map service could not be reached, how long requests go on with the map a
/// server has before it asks again.
const FETCH_BACKOFF: Duration = Duration::from_secs(1);
/// How long a change that moves the map service waits for the new keeper to store the map
/// before it answers (the old keeper goes on pushing in the background after that).
const HAND_OVER_WAIT: Duration = Duration::from_secs(20);

fn parse_map(text: &str) -> OpResult<ClusterMap> {
    ClusterMap::from_toml(text).map_err(|e| err(Errno::EINVAL, e.to_string()))
}

impl Migration {
    /// Adopts `map` if it is newer than this server's (keeping the local `[tls]`), and
    /// acts on it: connections to new servers, this server's walker for a migration, the
    /// receipts of a finished one dropped.
    pub(crate) fn adopt_map(self: &Arc<Self>, mut map: ClusterMap) -> bool {
        let old = self.engine.map();
        map.tls = old.tls.clone();
        let (epoch, migrating) = (map.epoch, map.migrating());
        let finished = old.migrating() && !migrating;
        let learnt = map.clone();
        if !self.engine.install_map(map) {
            return false;
        }
        self.peers.pool.learn_map(&learnt);
        tracing::info!(epoch, migrating, "cluster map installed");
        if migrating {
            self.start_walker();
        }
        if finished {
            let osd = self.clone();
            tokio::spawn(async move {
                if let Err(e) = osd.drop_receipts().await {
                    tracing::warn!(cause = %e.message(), "cannot drop the receipts of the finished migration");
                }
            });
        }
        true
    }

    /// Fetches the map from the map service if a peer spoke of a newer epoch (one fetch
    /// at a time; the others wait for it).
    pub(crate) async fn refresh_if_stale(self: &Arc<Self>) {
        if !self.peers.pool.counters().epochs.is_stale() {
            return;
        }
        let mut last_failure = self.map_fetch.lock().await;
        if !self.peers.pool.counters().epochs.is_stale() {
            return;
        }
        if last_failure.is_some_and(|t| t.elapsed() < FETCH_BACKOFF) {
            return; // the map service was just unreachable: requests go on with this map
        }
        *last_failure = (!self.fetch_map().await).then(std::time::Instant::now);
    }

    /// The server that keeps the map, by this server's map.
    fn keeper(&self) -> ServerId {
        self.engine.map().keeper
    }

    /// Whether this server keeps the map.
    fn keeps(&self) -> bool {
        self.keeper() == self.engine.id()
    }

    /// The epoch of the map this server stores (0: none).
    fn kept_epoch(&self) -> OpResult<u64> {
        match self.engine.store().get_log(LogKind::Meta, 0).map_err(eio)? {
            Some(raw) => Ok(parse_map(&String::from_utf8_lossy(&raw))?.epoch),
            None => Ok(0),
        }
    }

    /// Adopts `map` if newer; one that names this server its keeper is stored first (the
    /// map service's state must outlive a restart before this server acts as it).
    async fn adopt_newer(self: &Arc<Self>, map: ClusterMap) -> OpResult<bool> {
        let current = self.engine.map();
        if map.epoch <= current.epoch {
            return Ok(false);
        }
        if map.keeper == self.engine.id() && current.keeper != self.engine.id() && self.kept_epoch()? < map.epoch {
            self.keep(&map).await?;
            tracing::info!(epoch = map.epoch, "this server keeps the cluster map from now on");
        }
        Ok(self.adopt_map(map))
    }

    /// Asks the map service for the map (any other server if it does not answer) and
    /// adopts it if newer; answers whether a server answered.
    pub(crate) async fn fetch_map(self: &Arc<Self>) -> bool {
        if self.keeps() {
            // The keeper's map is the newest there is; a newer hint came from a stale
            // store (a member that lost its log): nothing to fetch.
            self.peers.pool.counters().epochs.set_current(self.engine.map().epoch);
            return true;
        }
        let map = self.engine.map();
        let me = self.engine.id();
        let others = map.servers.iter().map(|s| s.id).filter(|&id| id != map.keeper && id != me);
        for id in std::iter::once(map.keeper).chain(others) {
            let got = tokio::time::timeout(FETCH_WAIT, self.peers.pool.call(id, &Request::MapGet)).await;
            let text = match got {
                Ok(Ok(Ok(Reply::Map(text)))) => text,
                other => {
                    tracing::warn!(server = id, ?other, "cannot fetch the cluster map");
                    continue;
                }
            };
            match parse_map(&text) {
                Ok(fetched) => match self.adopt_newer(fetched).await {
                    Ok(true) => {}
                    Ok(false) => self.peers.pool.counters().epochs.set_current(self.engine.map().epoch),
                    Err(e) => {
                        tracing::warn!(cause = %e.message(), "cannot keep the cluster map handed to this server");
                        return false;
                    }
                },
                Err(e) => {
                    tracing::warn!(server = id, cause = %e.message(), "a server sent a bad map");
                    continue;
                }
            }
            return true;
        }
        false
    }

    /// At start: the map this server keeps (or kept) if it is newer than the file's; the
    /// keeper stores the file's otherwise, the others fetch the map from the keeper
    /// (proceeding with the file's if it cannot be reached); a former keeper makes sure its
    /// successor has the map; the walker resumes a migration.
    pub(crate) async fn join_map(self: &Arc<Self>) {
        let handed = match self.load_kept_map().await {
            Ok(handed) => handed,
            Err(e) => {
                tracing::error!(cause = %e.message(), "cannot load the kept cluster map");
                None
            }
        };
        if !self.keeps() {
            self.fetch_map().await;
        }
        // Handed over before a restart, and nobody knows a newer map: perhaps the
        // successor never stored it.
        if let Some(kept) = handed.filter(|k| k.epoch >= self.engine.map().epoch) {
            self.hand_over_in_background(kept);
        }
        self.peers.pool.counters().epochs.set_current(self.engine.map().epoch);
        if self.engine.map().migrating() {
            self.start_walker();
        } else if let Err(e) = self.drop_receipts().await {
            tracing::warn!(cause = %e.message(), "cannot drop the receipts of a finished migration");
        }
    }

    /// At start: the stored map if this server has one newer than the file's (a keeper,
    /// or a server the service moved away from: then that map is answered, to be handed
    /// over again); the keeper stores the file's if it has none as new.
    pub(crate) async fn load_kept_map(self: &Arc<Self>) -> OpResult<Option<ClusterMap>> {
        if let Some(raw) = self.engine.store().get_log(LogKind::Meta, 0).map_err(eio)? {
            let text = String::from_utf8(raw).map_err(|_| err(Errno::EIO, "stored cluster map is not UTF-8"))?;
            let kept = parse_map(&text)?;
            if kept.epoch >= self.engine.map().epoch {
                self.adopt_map(kept.clone());
                return Ok((kept.keeper != self.engine.id()).then_some(kept));
            }
        }
        if self.keeps() {
            self.keep(&self.engine.map()).await?;
        }
        Ok(None)
    }

    async fn keep(&self, map: &ClusterMap) -> OpResult<()> {
        self.keep_for(&Call::server(), map).await
    }

    /// Keeps `map` as the effect of request `call` (a map change: exactly-once marked).
    async fn keep_for(&self, call: &Call, map: &ClusterMap) -> OpResult<()> {
        let mut b = Batch::new();
        let mut stored = map.clone();
        stored.tls = Default::default();
        b.put_log(LogKind::Meta, 0, stored.to_toml().into_bytes());
        self.engine.apply_for(call, b).await
    }

    /// `MapChange` on the keeper: applies `change` (TOML of a [`MapChange`]), stores the
    /// next epoch, pushes it to every server and answers it.
    pub(crate) async fn change_map(self: &Arc<Self>, change: &str, call: &Call) -> OpResult<Reply> {
        let change = MapChange::from_text(change).map_err(|e| err(Errno::EINVAL, e.to_string()))?;
        let _one = self.map_fetch.lock().await;
        if !self.keeps() {
            return Err(err(
                Errno::EINVAL,
                format!("server {} does not keep the cluster map; server {} does", self.engine.id(), self.keeper()),
            ));
        }
        let current = self.engine.map();
        if let MapChange::Remove { id } = change {
            self.check_drained(id).await?;
        }
        let next = current.apply_change(&change).map_err(|e| err(Errno::EINVAL, e.to_string()))?;
        if next.epoch == current.epoch {
            return Ok(Reply::Map(next.to_toml()));
        }
        self.keep_for(call, &next).await?;
        tracing::info!(epoch = next.epoch, ?change, "cluster map changed");
        self.adopt_map(next.clone());
        if next.keeper != self.engine.id() {
            tracing::info!(to = next.keeper, epoch = next.epoch, "the map service moves");
            if tokio::time::timeout(HAND_OVER_WAIT, self.hand_over(&next)).await.is_err() {
                tracing::warn!(to = next.keeper, "the new keeper has not stored the map yet; pushing on");
                self.hand_over_in_background(next.clone());
            }
        }
        self.push_map(&next);
        Ok(Reply::Map(next.to_toml()))
    }

    /// Pushes `map` to the keeper it names until that server answers (it stores the map
    /// before it does), for at most about an hour.
    async fn hand_over(self: &Arc<Self>, map: &ClusterMap) {
        let req = Request::MapPush { map: map.to_toml() };
        let mut pause = Duration::from_millis(50);
        for _ in 0..2000 {
            match self.peers.pool.call(map.keeper, &req).await {
                Ok(Ok(_)) => return,
                Ok(Err(e)) => tracing::debug!(to = map.keeper, cause = %e, "map hand-over refused"),
                Err(e) => tracing::debug!(to = map.keeper, cause = %e, "map hand-over not delivered"),
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
        tracing::error!(to = map.keeper, epoch = map.epoch, "the new keeper never took the cluster map");
    }

    fn hand_over_in_background(self: &Arc<Self>, map: ClusterMap) {
        let osd = self.clone();
        tokio::spawn(async move { osd.hand_over(&map).await });
    }

    async fn status_of(self: &Arc<Self>, id: ServerId) -> OpResult<plusfs_proto::ServerStatus> {
        // Bounded: the keeper asks itself too, while it holds the map lock a stale request
        // of its own would wait for.
        let asked = tokio::time::timeout(Duration::from_secs(10), self.peers.pool.call(id, &Request::Status)).await;
        let Ok(asked) = asked else {
            return Err(err(Errno::EIO, format!("server {id} did not say what it holds within 10 s")));
        };
        match asked {
            Ok(Ok(Reply::Status(s))) => Ok(*s),
            Ok(Err(e)) => Err(e.into()),
            Ok(Ok(other)) => Err(err(Errno::EIO, format!("server {id} answered status with {other:?}"))),
            Err(e) => Err(err(Errno::EIO, format!("cannot ask server {id} what it holds: {e}"))),
        }
    }

    /// Refuses to remove server `id` unless it holds nothing.
    async fn check_drained(self: &Arc<Self>, id: ServerId) -> OpResult<()> {
        // Its walker reports its part done only once nothing names it any more (the link
        // entries of the shared inodes it moved included).
        if self.engine.map().migration.as_ref().is_some_and(|m| !m.done.contains(&id)) {
            return Err(err(
                Errno::EBUSY,
                format!("server {id} has not finished its part of the running migration: wait for it (`cluster drain --wait`)"),
            ));
        }
        let status = self.status_of(id).await?;
        let held = status.dir_objects + status.shards.len() as u64 + status.data_records + status.inodes;
        if held > 0 {
            return Err(err(
                Errno::EBUSY,
                format!(
                    "server {id} still holds {} directory objects, {} shards, {} data records and {} shared inodes: \
                     drain it first (data records no file uses, left by a failed drop, go with `plusfs fsck \
                     --reclaim`)",
                    status.dir_objects,
                    status.shards.len(),
                    status.data_records,
                    status.inodes
                ),
            ));
        }
        Ok(())
    }

    /// Sends `map` to every other server (in the background; those that miss it fetch it
    /// when a frame tells them of it).
    fn push_map(self: &Arc<Self>, map: &ClusterMap) {
        let text = map.to_toml();
        let mut targets: Vec<ServerId> = map.servers.iter().map(|s| s.id).collect();
        if let Some(m) = &map.migration {
            targets.extend(m.before.iter().map(|s| s.id));
        }
        targets.sort_unstable();
        targets.dedup();
        for id in targets.into_iter().filter(|&id| id != self.engine.id()) {
            let (osd, text) = (self.clone(), text.clone());
            tokio::spawn(async move {
                let req = Request::MapPush { map: text };
                if let Err(e) = osd.peers.pool.call(id, &req).await {
                    tracing::debug!(server = id, cause = %e, "map push not delivered");
                }
            });
        }
    }

    /// `MapPush` from the keeper (stored first if it makes this server the keeper).
    pub(crate) async fn pushed_map(self: &Arc<Self>, text: &str) -> OpResult<Reply> {
        let map = parse_map(text)?;
        self.adopt_newer(map).await?;
        Ok(Reply::Done)
    }

    /// Tells the map service this server has handed over its directory objects (or, with
    /// `all`, everything) for the migration from `from_epoch`.
    pub(crate) async fn report_done(self: &Arc<Self>, from_epoch: u64, all: bool) -> OpResult<()> {
        let change = match all {
            false => MapChange::DirsDone { id: self.engine.id(), from_epoch },
            true => MapChange::Done { id: self.engine.id(), from_epoch },
        };
        let text = change.to_text();
        let resp = if self.keeps() {
            self.change_map(&text, &Call::server()).await
        } else {
            self.peers
                .pool
                .call_as(self.keeper(), &Cred::server(), &Request::MapChange { change: text })
                .await
                .map_err(|e| err(e.errno(), format!("cannot reach the map service: {e}")))?
                .map_err(OpError::from)
        };
        match resp? {
            Reply::Map(text) => {
                self.adopt_newer(parse_map(&text)?).await?;
                Ok(())
            }
            other => Err(err(Errno::EIO, format!("the map service answered {other:?}"))),
        }
    }
}
