//! Directory objects move to the homes a new map epoch gives them (an elastic cluster).
//!
//! Authority over a directory lies with its home under the newest epoch. A server that
//! gets a request about a directory homed elsewhere forwards it there (the caller learns
//! the newer epoch from the answer's frame); sub-operations of cross-server operations
//! are refused with EBUSY instead, and their coordinators plan again with the new map. A
//! home that lacks a directory the migration brings it pulls the object before serving
//! anything about it (`MigrateOut`): the old home takes the directory's locks (refusing
//! while a transaction holds them), moves the object from what it serves into its outbox
//! in one store write and answers it with its first entries; the new home fetches the
//! rest (`MigrateEntries`), checks every checksum, and stores entries, then the object
//! with a receipt; the old home then drops its copy (`MigrateDone`). Each server's walker
//! (`walker.rs`) asks new homes to pull what it still holds. A crash anywhere is resumed
//! from the outbox (the old home answers from it) and the receipts (a new home never
//! takes an object twice).

mod data;
mod inodes;
pub(crate) mod keeper;
pub(crate) mod route;
mod shards;
pub(crate) mod state;
mod walker;

use crate::engine::errors::{eio, err, OpError, OpResult};
use crate::engine::locks::Scope;
use crate::engine::logrec::{self, Outbox, Receipt};
use crate::engine::Engine;
use crate::failpoint::Failpoints;
use crate::filedata::FileData;
use crate::peers::Peers;
use plusfs_proto::migrate::MovedDir;
use plusfs_proto::{DirObject, DistState, Errno, Inode, Reply, Request, ServerId};
use plusfs_store::{Batch, LogKind};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Entries a hand-over carries per message.
const ENTRIES_PER_MESSAGE: usize = 8192;
/// How long a new home keeps asking an old home that refuses (a transaction holds the
/// directory) before it gives the caller EBUSY.
const PULL_PATIENCE: Duration = Duration::from_secs(20);

/// What a receipt is valid for: the migration running (the epoch it moves from), or, with
/// none, the current epoch (objects an older map's transaction placed on another server).
fn receipt_epoch(map: &plusfs_placement::ClusterMap) -> u64 {
    map.migration.as_ref().map_or(map.epoch, |m| m.from_epoch)
}

/// The key of a path in the outbox and receipt logs.
fn path_key(path: &str) -> u64 {
    plusfs_placement::path_hash(path)
}
/// A path with its ancestors' objects: what a hand-over locks (as a shard import does), so
/// a transaction moving or re-ancestrying a subtree above it cannot interleave.
fn with_ancestors(path: &str) -> Vec<(String, Scope)> {
    let mut wanted = vec![(path.to_string(), Scope::Whole)];
    let mut p = path;
    while let Some((parent, _)) = plusfs_proto::path::split(p) {
        wanted.push((parent.to_string(), Scope::object_only()));
        p = parent;
    }
    wanted
}

/// Migration: map changes (growth, drain), the hand-over of directory objects and file
/// data to their new homes, forwarding while it runs.
pub(crate) struct Migration {
    engine: Arc<Engine>,
    peers: Arc<Peers>,
    failpoints: Arc<Failpoints>,
    filedata: Arc<FileData>,
    /// The running migration's counters.
    pub(crate) migration: state::Progress,
    /// Pulls of directory objects under way, one per path.
    pulls: state::Pulls,
    /// Held while the map is fetched from (or changed at) the map service; holds when
    /// the map service last failed to answer.
    map_fetch: tokio::sync::Mutex<Option<std::time::Instant>>,
    /// Whether the migration walker runs.
    walker_running: std::sync::atomic::AtomicBool,
    /// Paths of the shards expected here from a drained server (`shards.rs`): requests
    /// about them pull them first.
    expected_shards: parking_lot::Mutex<std::collections::HashSet<String>>,
    /// Pulls of shards under way, one per path.
    shard_pulls: state::Pulls,
}

impl Migration {
    pub(crate) fn new(
        engine: Arc<Engine>,
        peers: Arc<Peers>,
        failpoints: Arc<Failpoints>,
        filedata: Arc<FileData>,
    ) -> Migration {
        Migration {
            engine,
            peers,
            failpoints,
            filedata,
            migration: Default::default(),
            pulls: Default::default(),
            map_fetch: Default::default(),
            walker_running: Default::default(),
            expected_shards: Default::default(),
            shard_pulls: Default::default(),
        }
    }
}

impl Migration {
    /// The object at `path` this server handed over and still keeps in its outbox.
    pub(crate) fn outbox(&self, path: &str) -> OpResult<Option<DirObject>> {
        let Some(rec) = self.engine.log_get::<Outbox>(path_key(path))? else {
            return Ok(None);
        };
        Ok((rec.path == path).then_some(rec.object))
    }

    /// Whether this server took over the object at `path` during the running migration
    /// (receipts of earlier migrations, kept by a crash, do not count).
    fn has_receipt(&self, path: &str) -> OpResult<bool> {
        let Some(rec) = self.engine.log_get::<Receipt>(path_key(path))? else {
            return Ok(false);
        };
        Ok(rec.path == path && rec.of == receipt_epoch(&self.engine.map()))
    }

    /// Paths in this server's outbox (handed over, not yet confirmed).
    pub(crate) fn outbox_paths(&self) -> OpResult<Vec<String>> {
        Ok(self.engine.handed_over()?.into_iter().map(|(p, _)| p).collect())
    }

    /// Makes sure every directory of `paths` that the running migration brings here is
    /// here: pulls those missing from their previous home.
    pub(crate) async fn pull_in(self: &Arc<Self>, paths: &[String]) -> OpResult<()> {
        let map = self.engine.map();
        let mut by_old: HashMap<ServerId, Vec<String>> = HashMap::new();
        for p in paths {
            if map.home_of_dir(p) != self.engine.id() {
                continue;
            }
            let Some(old) = map.previous_home_of_dir(p) else { continue };
            if self.engine.store().get_dir(p).map_err(eio)?.is_some() || self.has_receipt(p)? {
                continue;
            }
            by_old.entry(old).or_default().push(p.clone());
        }
        for (old, mut wanted) in by_old {
            wanted.sort();
            wanted.dedup();
            for chunk in wanted.chunks(map.rebalance.batch as usize) {
                self.pull_from(old, chunk).await?;
            }
        }
        Ok(())
    }

    /// Pulls `paths` from their old home `old`, each once (concurrent pulls of a path wait
    /// for the first), retrying while the old home refuses.
    async fn pull_from(self: &Arc<Self>, old: ServerId, paths: &[String]) -> OpResult<()> {
        // One order for every pull, so two pulls never wait for each other's gates.
        let mut sorted = paths.to_vec();
        sorted.sort();
        sorted.dedup();
        let paths = &sorted[..];
        let gates: Vec<_> = paths.iter().map(|p| self.pulls.gate(p)).collect();
        let mut held = Vec::with_capacity(gates.len());
        for g in &gates {
            held.push(g.lock().await);
        }
        let started = Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            let mut missing = Vec::new();
            for p in paths {
                if self.engine.store().get_dir(p).map_err(eio)?.is_none() && !self.has_receipt(p)? {
                    missing.push(p.clone());
                }
            }
            if missing.is_empty() {
                return Ok(());
            }
            let moved = match self
                .peers
                .call(old, Request::MigrateOut { paths: missing.clone() }, &plusfs_proto::Cred::server())
                .await
            {
                Ok(Reply::Moved(m)) => m,
                Ok(other) => return Err(err(Errno::EIO, format!("server {old} answered a hand-over with {other:?}"))),
                Err(e) if e.errno == Errno::EBUSY => Vec::new(),
                Err(e) => return Err(e.into()),
            };
            let taken: Vec<String> = moved.iter().map(|m| m.path.clone()).collect();
            if !moved.is_empty() {
                self.import(old, moved).await?;
                self.finish_handover(old, taken.clone());
            }
            if taken.len() == missing.len() {
                return Ok(());
            }
            if started.elapsed() > PULL_PATIENCE {
                return Err(OpError::Moved(format!("'{}' is still moving here from server {old}", missing[0])));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// Tells the old home its copies of `paths` may go (in the background; its walker
    /// asks again if this is lost).
    fn finish_handover(self: &Arc<Self>, old: ServerId, paths: Vec<String>) {
        let osd = self.clone();
        tokio::spawn(async move {
            if let Err(e) = osd.peers.call(old, Request::MigrateDone { paths }, &plusfs_proto::Cred::server()).await {
                tracing::debug!(old, cause = %e.message, "hand-over confirmation not delivered; the walker repeats it");
            }
        });
    }

    /// Stores handed-over objects: every message's checksum checked, their entries
    /// written first (fetching the rest from the old home; invisible until their object
    /// is), then, under the objects' and their ancestors' locks, the objects with their
    /// receipts in one write.
    async fn import(self: &Arc<Self>, old: ServerId, moved: Vec<MovedDir>) -> OpResult<()> {
        let mut entries_total = 0u64;
        for m in &moved {
            check_intact(m)?;
            if let Some(obj) = &m.object {
                let (path, ino) = (m.path.clone(), obj.ino);
                let next = |after| Request::MigrateEntries {
                    path: path.clone(),
                    ino,
                    after,
                    limit: ENTRIES_PER_MESSAGE as u32,
                };
                entries_total += self.store_entries(old, m, obj.ino, next).await?;
            }
        }
        let mut wanted: Vec<(String, Scope)> = moved.iter().flat_map(|m| with_ancestors(&m.path)).collect();
        wanted.sort();
        wanted.dedup();
        let _g = self
            .engine
            .locks()
            .lock(&wanted, None, true)
            .await
            .map_err(|c| err(Errno::EIO, format!("unexpected conflict with transaction {}", c.0)))?;
        let mut last = Batch::new();
        for m in &moved {
            let Some(obj) = &m.object else { continue };
            last.put_dir(&m.path, obj);
            let of = receipt_epoch(&self.engine.map());
            let receipt = Receipt { path: m.path.clone(), incarnation: obj.incarnation, of };
            logrec::put(&mut last, path_key(&m.path), &receipt);
        }
        self.failpoints.hit(crate::failpoint::FailStep::MigrateBeforeImport).await;
        self.engine.apply(last).await?;
        let objects = moved.iter().filter(|m| m.object.is_some()).count() as u64;
        self.migration.objects_in.fetch_add(objects, Ordering::Relaxed);
        self.migration.entries_in.fetch_add(entries_total, Ordering::Relaxed);
        Ok(())
    }

    /// Writes the entries of one handed-over directory (their travelling data copied
    /// here first): those that came with it, then page after page from the old home.
    /// Returns how many.
    /// `next(after)` is the request for the page after `after`.
    async fn store_entries(
        self: &Arc<Self>,
        old: ServerId,
        m: &MovedDir,
        ino: u64,
        next: impl Fn(Option<String>) -> Request,
    ) -> OpResult<u64> {
        let mut count = 0;
        let mut page = m.entries.clone();
        let (mut more, mut after) = (m.more, m.entries.last().map(|e| e.0.clone()));
        loop {
            self.bring_data(old, &mut page).await?;
            let mut b = Batch::new();
            for (name, inode) in &page {
                b.put_entry(ino, name, inode);
            }
            self.engine.apply(b).await?;
            count += page.len() as u64;
            if !more {
                return Ok(count);
            }
            let req = next(after.clone());
            let next = match self.peers.call(old, req, &plusfs_proto::Cred::server()).await? {
                Reply::Moved(mut v) if v.len() == 1 => v.remove(0),
                other => return Err(err(Errno::EIO, format!("server {old} answered entries with {other:?}"))),
            };
            check_intact(&next)?;
            more = next.more && !next.entries.is_empty();
            after = next.entries.last().map(|e| e.0.clone());
            page = next.entries;
        }
    }

    /// `MigrateOut` on an old home: hands over what it can of `paths` (a path whose
    /// directory a transaction holds is left out; the new home asks again).
    pub(crate) async fn migrate_out(self: &Arc<Self>, paths: &[String]) -> OpResult<Reply> {
        let map = self.engine.map();
        if let Some(p) = paths.iter().find(|p| map.home_of_dir(p) == self.engine.id()) {
            return Err(OpError::StaleEpoch(format!("'{p}' is homed here at epoch {}: the maps differ", map.epoch)));
        }
        let mut wanted: Vec<(String, Scope)> = paths.iter().flat_map(|p| with_ancestors(p)).collect();
        wanted.sort();
        wanted.dedup();
        let Ok(_g) = self.engine.locks().lock(&wanted, None, false).await else {
            return Err(OpError::Moved("a transaction holds a directory being handed over".into()));
        };
        let mut b = Batch::new();
        let mut out = Vec::new();
        let mut budget = ENTRIES_PER_MESSAGE;
        for p in paths {
            let (obj, live) = match self.engine.store().get_dir(p).map_err(eio)? {
                Some(o) => (Some(o), true),
                None => (self.outbox(p)?, false),
            };
            let Some(obj) = obj else {
                out.push(MovedDir::new(p.clone(), None, Vec::new(), false));
                continue;
            };
            if obj.dist.state == DistState::Distributing {
                // Its redistribution finishes first (and is resumed if it stopped).
                if live {
                    self.engine.want_distribution(p);
                }
                continue;
            }
            let entries = if obj.dist.state == DistState::Nondistributed {
                let limit = budget.max(1);
                self.engine.store().list_entries(obj.ino, None, limit + 1).map_err(eio)?
            } else {
                Vec::new() // the entries are the shards', which stay where they are
            };
            let more = entries.len() > budget.max(1);
            let entries: Vec<(String, Inode)> = entries.into_iter().take(budget.max(1)).collect();
            budget = budget.saturating_sub(entries.len());
            if live {
                b.del_dir(p);
                logrec::put(&mut b, path_key(p), &Outbox { path: p.clone(), object: obj.clone() });
            }
            out.push(MovedDir::new(p.clone(), Some(obj), entries, more));
        }
        if !b.is_empty() {
            self.engine.apply(b).await?;
            self.failpoints.hit(crate::failpoint::FailStep::MigrateAfterOutbox).await;
        }
        Ok(Reply::Moved(out))
    }

    /// `MigrateEntries` on an old home: a page of a handed-over directory's entries.
    pub(crate) fn migrate_entries(&self, path: &str, ino: u64, after: Option<&str>, limit: u32) -> OpResult<Reply> {
        match self.outbox(path)? {
            Some(obj) if obj.ino == ino && obj.dist.state == DistState::Nondistributed => {}
            _ => return Err(err(Errno::ENOENT, format!("'{path}' (inode {ino}) is not being handed over from here"))),
        }
        let limit = (limit as usize).clamp(1, ENTRIES_PER_MESSAGE);
        let mut page = self.engine.store().list_entries(ino, after, limit + 1).map_err(eio)?;
        let more = page.len() > limit;
        page.truncate(limit);
        Ok(Reply::Moved(vec![MovedDir::new(path.to_string(), None, page, more)]))
    }

    /// `MigrateDone` (or the walker, for objects their new home has): drops the outbox
    /// copies of `paths` and their entries.
    pub(crate) async fn migrate_done(self: &Arc<Self>, paths: &[String]) -> OpResult<Reply> {
        for p in paths {
            let Some(obj) = self.outbox(p)? else { continue };
            if obj.dist.state == DistState::Nondistributed {
                self.drop_entries(obj.ino).await?;
            }
            let mut b = Batch::new();
            b.del_log(LogKind::Outbox, path_key(p));
            self.engine.apply(b).await?;
            self.migration.objects_out.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Reply::Done)
    }

    /// Drops every entry of the directory (or shard) with inode `ino` that was handed
    /// over, with the small-file data that travelled with them.
    async fn drop_entries(&self, ino: u64) -> OpResult<()> {
        loop {
            let page = self.engine.store().list_entries(ino, None, 16_384).map_err(eio)?;
            if page.is_empty() {
                return Ok(());
            }
            let gate = self.engine.data_gate().read().await;
            let mut b = Batch::new();
            self.engine.drop_local(&self.travelled_records(&page), &mut b)?;
            for (name, _) in &page {
                b.del_entry(ino, name);
            }
            self.engine.apply(b).await?;
            drop(gate);
        }
    }

    /// `MigrateIn` on a new home: pulls `paths` from `from`, which holds them; answers
    /// once they are all here (or were taken over before).
    pub(crate) async fn migrate_in(self: &Arc<Self>, paths: &[String], from: ServerId) -> OpResult<Reply> {
        let map = self.engine.map();
        if let Some(p) = paths.iter().find(|p| map.home_of_dir(p) != self.engine.id()) {
            return Err(OpError::StaleEpoch(format!(
                "'{p}' is not homed here at epoch {}: the maps differ",
                map.epoch
            )));
        }
        for chunk in paths.chunks(map.rebalance.batch.max(1) as usize) {
            self.pull_from(from, chunk).await?;
        }
        Ok(Reply::Done)
    }

    /// Drops the receipts of a finished migration.
    pub(crate) async fn drop_receipts(&self) -> OpResult<()> {
        let recs = self.engine.store().log_records(LogKind::Receipt).map_err(eio)?;
        for chunk in recs.chunks(4096) {
            let mut b = Batch::new();
            for (k, _) in chunk {
                b.del_log(LogKind::Receipt, *k);
            }
            self.engine.apply(b).await?;
        }
        Ok(())
    }
}

fn check_intact(m: &MovedDir) -> OpResult<()> {
    if m.is_intact() {
        Ok(())
    } else {
        Err(err(Errno::EIO, format!("hand-over of '{}' arrived damaged (checksum mismatch)", m.path)))
    }
}

#[cfg(test)]
mod tests {
    use super::path_key;
    use crate::engine::logrec::{self, Outbox};
    use crate::testkit::Kit;
    use plusfs_proto::DirObject;
    use plusfs_store::Batch;

    #[tokio::test]
    async fn the_outbox_answers_for_its_own_path_only() {
        let kit = Kit::new().await;
        let mut b = Batch::new();
        let object = DirObject::new(77, 0o755, 0, 0);
        logrec::put(&mut b, path_key("/moved"), &Outbox { path: "/moved".into(), object });
        kit.osd.engine.apply(b).await.unwrap();
        let m = &kit.osd.migrate;
        assert_eq!(m.outbox("/moved").unwrap().map(|d| d.ino), Some(77));
        assert!(m.outbox("/other").unwrap().is_none());
        assert_eq!(m.outbox_paths().unwrap(), ["/moved"]);
    }

    #[tokio::test]
    async fn a_drained_server_hands_every_directory_to_the_other() {
        use crate::engine::attrs::NewNode;
        use crate::engine::host::Via;
        use crate::testkit::{root, Mesh};
        use plusfs_placement::MapChange;
        use plusfs_proto::{FileKind, Threshold};
        let mesh = Mesh::new(2).await;
        let c = root();
        let on_one: Vec<String> = (0..40).map(|i| format!("/m{i}")).filter(|p| mesh.home(p) == 1).take(4).collect();
        assert_eq!(on_one.len(), 4, "some directories are homed on server 1");
        for p in &on_one {
            let entry_server = mesh.server(mesh.home("/"));
            let plan = crate::twopc::Plan::now(&entry_server.engine);
            let policy = (Threshold::Never, 0);
            entry_server.twopc.mkdir(plan, p, 0o755, (0, 0), policy, Via::Home, &c).await.unwrap();
            let node = NewNode { target: None, rdev: 0, access: 0 };
            let f = format!("{p}/f");
            mesh.server(1)
                .namespace
                .create(&f, FileKind::File, 0o644, (0, 0), true, node, Via::Home, &c)
                .await
                .unwrap();
        }
        let drain = MapChange::Reweight { id: 1, weight: 0.0 }.to_text();
        mesh.server(0).migrate.change_map(&drain, &root()).await.unwrap();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let map = mesh.server(0).engine.map();
            let left = mesh.server(1).engine.store().dirs_within("/").unwrap();
            if !map.migrating() && left.is_empty() {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "the drain did not end: {left:?}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        for p in &on_one {
            let d = mesh.server(0).engine.dir_object(p).unwrap();
            assert_eq!(d.entries, 1, "{p} came with its entry");
            let f = format!("{p}/f");
            assert!(mesh.server(0).namespace.stat(&f, Via::Home, &root()).await.is_ok(), "{f}");
        }
    }
}
