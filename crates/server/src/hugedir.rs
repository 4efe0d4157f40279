//! Huge directories on the server side (seed 001 §IV, seed 000 §2.5).
//!
//! The home of a directory (its *primary*) decides when the directory is distributed and
//! leads the redistribution; each member of the storing set keeps a *shard*: a directory
//! object under the shard key with this server's part of the entries and its counts.
//!
//! Redistribution (one at a time per directory on its primary):
//! 1. under the directory's busy lock, once no transaction holds any of it, the primary
//!    records `Distributing` with the storing set in its object (durable);
//! 2. it streams its entries, sending each storing server the ones Eq. 2 gives it
//!    (`ShardImport`, in parallel, repeated until acknowledged);
//! 3. it sends each storing server its shard object with the counts;
//! 4. under the busy lock again, in one store write it drops the entries that moved,
//!    writes its own shard (if it is a member) and records `Distributed`.
//!
//! Steps 2 and 3 wait for other servers and hold no lock. A storing server's import waits
//! for the transactions that lock the path there, and such a transaction may wait for a
//! lock on the primary: a rename onto the directory locks its path on every server, and its
//! prepare on the primary would wait for the busy lock held across the imports, which wait
//! for the rename (a deadlock that outlived its clients). What keeps the entries still
//! meanwhile is the durable `Distributing` state: requests about entries are redirected with
//! it (writers, like readers, wait and retry), sub-operations that would remove, move or
//! re-ancestry a `Distributing` directory are refused (`Engine::being_distributed`: their
//! coordinators and clients wait and retry), and the transactions that held any of it were
//! waited for in step 1. Changes of the object's own attributes that need no other server
//! (times, extended attributes, threshold) may land meanwhile; step 4 keeps them.
//!
//! Until step 4 every entry is still on the primary and nobody can reach the shards, so a
//! crash before it is repaired by running the same steps again (a restarted primary resumes
//! every `Distributing` directory); imports are idempotent. After it, the directory is
//! distributed and the primary only routes.

use crate::backoff::Backoff;
use crate::deleg::Delegations;
use crate::engine::errors::{check_dir_path, eio, err, OpError, OpResult};
use crate::engine::host::Via;
use crate::engine::locks::Scope;
use crate::engine::Engine;
use crate::failpoint::Failpoints;
use crate::peers::Peers;
use futures::future::join_all;
use parking_lot::Mutex;
use plusfs_proto::hugedir::slot_of;
use plusfs_proto::{
    Attr, Cred, DirObject, DistInfo, DistReport, DistState, Errno, FileKind, Inode, Reply, Request, ServerId,
    Threshold, Timespec,
};
use plusfs_store::Batch;
use std::collections::HashMap;
use std::collections::HashSet;
use std::sync::Arc;

/// Entries per `ShardImport` request while distributing.
const IMPORT_CHUNK: usize = 16_384;

/// The server that takes the slots of `from` in storing set `set` of the directory at
/// `dir`: among the servers of weight > 0 (in their straw order for the path), one not in
/// the set yet, else one holding the fewest slots.
fn taker(map: &plusfs_placement::ClusterMap, dir: &str, set: &[ServerId], from: ServerId) -> Option<ServerId> {
    map.storing_set(dir, 0).into_iter().filter(|&s| s != from).min_by_key(|s| set.iter().filter(|&&x| x == *s).count())
}

/// Huge directories: their redistribution over storing servers, policies, reports and
/// attributes gathered from the shards.
pub(crate) struct HugeDirs {
    engine: Arc<Engine>,
    peers: Arc<Peers>,
    failpoints: Arc<Failpoints>,
    deleg: Arc<Delegations>,
    /// Directories whose redistribution runs in a background task.
    distributing: Mutex<HashSet<String>>,
    /// Directories whose redistribution runs now (one at a time each).
    turns: crate::turns::Turns,
}

impl HugeDirs {
    pub(crate) fn new(
        engine: Arc<Engine>,
        peers: Arc<Peers>,
        failpoints: Arc<Failpoints>,
        deleg: Arc<Delegations>,
    ) -> HugeDirs {
        HugeDirs { engine, peers, failpoints, deleg, distributing: Mutex::default(), turns: Default::default() }
    }
}

impl HugeDirs {
    /// The busy lock of the whole directory `dir`, once no transaction holds any of it.
    async fn lock_whole(self: &Arc<Self>, dir: &str) -> OpResult<crate::engine::locks::Guard> {
        // With wait_tx set the lock waits instead of reporting a conflict.
        self.engine
            .locks()
            .lock(&[(dir.to_string(), Scope::Whole)], None, true)
            .await
            .map_err(|c| err(Errno::EIO, format!("'{dir}': unexpected conflict with transaction {}", c.0)))
    }

    /// Starts a background redistribution of `dir` unless one is running (a restarted
    /// primary resuming, or a request that met a `Distributing` directory).
    pub(crate) fn ensure_distributing(self: &Arc<Self>, dir: &str) {
        if !self.distributing.lock().insert(dir.to_string()) {
            return;
        }
        let osd = self.clone();
        let dir = dir.to_string();
        tokio::spawn(async move {
            if let Err(e) = osd.distribute(&dir).await {
                tracing::error!(dir, cause = %e.message(), "redistribution failed");
            }
            osd.distributing.lock().remove(&dir);
        });
    }

    /// Distributes `dir` if it is over its threshold (or resumes a started distribution).
    /// Returns the distribution when the directory is distributed at the end.
    ///
    /// Holds the directory's busy lock only for steps 1 and 4 (see the module
    /// documentation), never while waiting for another server.
    pub(crate) async fn distribute(self: &Arc<Self>, dir: &str) -> OpResult<Option<DistInfo>> {
        // Another caller distributing it: wait for it, then find the directory distributed.
        let _turn = self.turns.take(dir).await;
        // Work queued under a delegation of the directory is applied first: it could not
        // be once the directory is spread (its holder's own requests do not recall it).
        // (Not for a directory already distributed: its delegations are of its shards.)
        let spread = matches!(self.engine.store().get_dir(dir), Ok(Some(d)) if d.dist.state == DistState::Distributed);
        let recalled = match spread {
            true => None,
            false => Some(self.deleg.recall_all(dir).await),
        };
        let d = {
            let _guard = self.lock_whole(dir).await?;
            let Some(mut d) = self.engine.store().get_dir(dir).map_err(eio)? else { return Ok(None) };
            match d.dist.state {
                DistState::Distributed => return Ok(Some(self.engine.dist_info(dir, &d))),
                DistState::Nondistributed if !self.engine.over_threshold(&d) => return Ok(None),
                DistState::Nondistributed => {
                    let width = if d.dist.width == 0 { self.engine.map().hugedirs.width } else { d.dist.width };
                    d.dist.set = self.engine.map().storing_set(dir, width);
                    d.dist.state = DistState::Distributing;
                    let mut b = Batch::new();
                    b.put_dir(dir, &d);
                    self.engine.apply(b).await?;
                }
                DistState::Distributing => tracing::info!(dir, "resuming an interrupted redistribution"),
            }
            d
        };
        drop(recalled);
        self.failpoints.hit(crate::failpoint::FailStep::DistributeAfterIntent).await;
        let started = std::time::Instant::now();
        let set = d.dist.set.clone();
        let (counts, moved) = self.export_entries(dir, &d, &set).await?;
        self.failpoints.hit(crate::failpoint::FailStep::DistributeAfterEntries).await;
        let shard_of = |s: ServerId| {
            let (entries, subdirs) = counts.get(&s).copied().unwrap_or((0, 0));
            let mut shard = DirObject { entries, subdirs, ..d.clone() };
            shard.dist.state = DistState::Distributed;
            shard
        };
        let remote: Vec<ServerId> = set.iter().copied().filter(|&s| s != self.engine.id()).collect();
        join_all(remote.iter().map(|&s| {
            let req = Request::ShardImport {
                path: dir.to_string(),
                ino: d.ino,
                entries: Vec::new(),
                shard: Some(shard_of(s)),
            };
            self.send_until_acked(s, req)
        }))
        .await;
        self.failpoints.hit(crate::failpoint::FailStep::DistributeAfterShards).await;
        // Flip: drop what moved, keep our own part as our shard, record Distributed. The
        // object is read again: its attributes (and threshold) may have changed since step 1,
        // not its entries (their counts say so) nor its storing set.
        let _guard = self.lock_whole(dir).await?;
        let mut now = match self.engine.store().get_dir(dir).map_err(eio)? {
            Some(now)
                if now.ino == d.ino
                    && (now.dist.state, &now.dist.set) == (d.dist.state, &d.dist.set)
                    && (now.entries, now.subdirs) == (d.entries, d.subdirs) =>
            {
                now
            }
            now => {
                let found = now.map(|o| (o.ino, o.dist.state, o.entries, o.subdirs));
                return Err(err(
                    Errno::EIO,
                    format!(
                        "'{dir}' changed while being distributed: (inode, state, entries, subdirectories) {:?} now {found:?}",
                        (d.ino, d.dist.state, d.entries, d.subdirs)
                    ),
                ));
            }
        };
        let mut b = Batch::new();
        for name in &moved {
            b.del_entry(now.ino, name);
        }
        if set.contains(&self.engine.id()) {
            b.put_shard(dir, &shard_of(self.engine.id()));
        }
        now.dist.state = DistState::Distributed;
        now.entries = 0;
        now.subdirs = 0;
        b.put_dir(dir, &now);
        self.engine.apply(b).await?;
        let moved: u64 = counts.iter().filter(|(s, _)| **s != self.engine.id()).map(|(_, c)| c.0).sum();
        tracing::info!(
            dir,
            set = ?set,
            moved,
            ms = started.elapsed().as_millis() as u64,
            "directory distributed"
        );
        Ok(Some(self.engine.dist_info(dir, &now)))
    }

    /// Step 2: sends every entry to its storing server; returns (entries, subdirectories)
    /// per storing server, and the names that moved away from this server.
    async fn export_entries(
        self: &Arc<Self>,
        dir: &str,
        d: &DirObject,
        set: &[ServerId],
    ) -> OpResult<(HashMap<ServerId, (u64, u64)>, Vec<String>)> {
        let mut counts: HashMap<ServerId, (u64, u64)> = HashMap::new();
        let mut moved = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = self.engine.store().list_entries(d.ino, after.as_deref(), IMPORT_CHUNK).map_err(eio)?;
            let Some((last, _)) = page.last() else { break };
            after = Some(last.clone());
            let mut parts: HashMap<ServerId, Vec<(String, Inode)>> = HashMap::new();
            for (name, inode) in page {
                let s = set[slot_of(&name, set.len())];
                let c = counts.entry(s).or_default();
                c.0 += 1;
                c.1 += u64::from(inode.kind == FileKind::Dir);
                if s != self.engine.id() {
                    moved.push(name.clone());
                    parts.entry(s).or_default().push((name, inode));
                }
            }
            join_all(parts.into_iter().map(|(s, entries)| {
                let req = Request::ShardImport { path: dir.to_string(), ino: d.ino, entries, shard: None };
                self.send_until_acked(s, req)
            }))
            .await;
        }
        Ok((counts, moved))
    }

    /// Sends `req` to `server` until it succeeds; the directory waits meanwhile.
    async fn send_until_acked(self: &Arc<Self>, server: ServerId, req: Request) {
        let mut backoff = Backoff::delivery(&self.engine.map());
        loop {
            match self.peers.pool.call(server, &req).await {
                Ok(Ok(_)) => return,
                Ok(Err(e)) => tracing::warn!(server, cause = %e.message, "shard import refused; retrying"),
                Err(e) => tracing::warn!(server, cause = %e, "storing server unreachable; retrying"),
            }
            backoff.wait().await;
        }
    }

    /// A storing server's side of steps 2 and 3.
    pub(crate) async fn shard_import(
        self: &Arc<Self>,
        path: &str,
        ino: u64,
        entries: Vec<(String, Inode)>,
        shard: Option<DirObject>,
    ) -> OpResult<Reply> {
        check_dir_path(path)?;
        // The path, and its ancestors' objects: a transaction that moves or re-ancestries a
        // subtree holding the path (locking its root Whole on every server) may have scanned
        // this server's shards before this one arrived; it is waited for (its part on the
        // primary refuses a `Distributing` directory, so it ends without the import).
        let mut wanted = vec![(path.to_string(), Scope::Whole)];
        let mut p = path;
        while let Some((parent, _)) = plusfs_proto::path::split(p) {
            wanted.push((parent.to_string(), Scope::object_only()));
            p = parent;
        }
        let _g = self
            .engine
            .locks()
            .lock(&wanted, None, true)
            .await
            .map_err(|c| err(Errno::EIO, format!("'{path}': unexpected conflict with transaction {}", c.0)))?;
        if let Some(old) = self.engine.store().get_shard(path).map_err(eio)? {
            if old.ino != ino {
                tracing::warn!(path, old = old.ino, new = ino, "replacing the shard of an older directory");
            }
        }
        let mut b = Batch::new();
        for (name, inode) in &entries {
            b.put_entry(ino, name, inode);
        }
        if let Some(s) = &shard {
            self.failpoints.hit(crate::failpoint::FailStep::StoringBeforeShardObject).await;
            if s.ino != ino {
                return Err(err(Errno::EINVAL, format!("shard of '{path}' has inode {} not {ino}", s.ino)));
            }
            b.put_shard(path, s);
        }
        self.engine.apply(b).await?;
        Ok(Reply::Done)
    }

    /// `ShardEvict` on the home of distributed directory `dir`: gives every slot of its
    /// storing set held by `from` (a server being drained) to one taker, which records
    /// that the shard comes before the new set is recorded here (`migrate/shards.rs`).
    /// Answers the distribution, whose set no longer names `from`.
    pub(crate) async fn evict_shard(self: &Arc<Self>, dir: &str, from: ServerId) -> OpResult<Reply> {
        check_dir_path(dir)?;
        let _turn = self.turns.take(dir).await;
        let _guard = self.lock_whole(dir).await?;
        let mut d = self.engine.dir_object(dir)?;
        match d.dist.state {
            DistState::Distributed => {}
            DistState::Distributing => {
                self.engine.want_distribution(dir);
                return Err(self.engine.being_distributed(dir, &d));
            }
            DistState::Nondistributed => return Err(err(Errno::EINVAL, format!("'{dir}' is not distributed"))),
        }
        if d.dist.set.contains(&from) {
            let map = self.engine.map();
            if map.server(from).is_some_and(|s| s.weight > 0.0) {
                return Err(err(
                    Errno::EINVAL,
                    format!("server {from} is not being drained: it keeps its shard of '{dir}'"),
                ));
            }
            let Some(to) = taker(&map, dir, &d.dist.set, from) else {
                return Err(err(
                    Errno::ENOSPC,
                    format!("no server of weight > 0 can take server {from}'s shard of '{dir}'"),
                ));
            };
            let set: Vec<ServerId> = d.dist.set.iter().map(|&s| if s == from { to } else { s }).collect();
            // Under the busy lock across one call: the taker only writes a record (it takes
            // no lock and asks no one), and the set must not change in between.
            let expect = Request::ShardExpect {
                path: dir.to_string(),
                ino: d.ino,
                incarnation: d.incarnation,
                from,
                set: set.clone(),
            };
            self.peers.call(to, expect, &Cred::server()).await.map_err(OpError::from)?;
            d.dist.set = set;
            let mut b = Batch::new();
            b.put_dir(dir, &d);
            self.engine.apply(b).await?;
            tracing::info!(dir, from, to, set = ?d.dist.set, "storing slots given to another server");
        }
        Ok(Reply::Dist(self.base_report(dir, &d)))
    }

    /// `ShardSet` on the home of `dir`: its distribution without asking any storing server.
    pub(crate) fn shard_set(&self, dir: &str) -> OpResult<Reply> {
        check_dir_path(dir)?;
        let d = self.engine.dir_object(dir)?;
        Ok(Reply::Dist(self.base_report(dir, &d)))
    }

    /// `SetPolicy`: changes the threshold and width of a directory on its home, then
    /// distributes it if it is over the new threshold.
    pub(crate) async fn set_policy(
        self: &Arc<Self>,
        path: &str,
        threshold: Option<Threshold>,
        width: Option<u32>,
    ) -> OpResult<Reply> {
        check_dir_path(path)?;
        {
            let _g = self.lock_whole(path).await?;
            let mut d = self.engine.dir_object(path)?;
            if let Some(t) = threshold {
                d.dist.threshold = t;
            }
            if let Some(w) = width {
                if d.dist.state != DistState::Nondistributed && w != d.dist.width {
                    return Err(err(
                        Errno::EBUSY,
                        format!(
                            "'{path}' is already distributed over {} servers; its width is fixed",
                            d.dist.set.len()
                        ),
                    ));
                }
                d.dist.width = w;
            }
            d.ctime = Timespec::now();
            let mut b = Batch::new();
            b.put_dir(path, &d);
            self.engine.apply(b).await?;
        }
        self.distribute(path).await?;
        self.dist_status(path).await
    }

    /// `DistStatus`: the distribution of a directory homed here and entries per server.
    pub(crate) async fn dist_status(self: &Arc<Self>, path: &str) -> OpResult<Reply> {
        check_dir_path(path)?;
        let d = self.engine.dir_object(path)?;
        Ok(Reply::Dist(self.report(path, &d).await?))
    }

    /// The distribution of `d` without entry counts.
    fn base_report(&self, path: &str, d: &DirObject) -> DistReport {
        DistReport {
            path: path.to_string(),
            state: d.dist.state,
            threshold: d.dist.threshold,
            effective: d.dist.threshold.resolve(self.engine.cluster_threshold()),
            width: d.dist.width,
            set: d.dist.set.clone(),
            entries: Vec::new(),
        }
    }

    /// The distribution of `d` with the entries each storing server holds.
    async fn report(self: &Arc<Self>, path: &str, d: &DirObject) -> OpResult<DistReport> {
        let entries = match d.dist.state {
            DistState::Distributed => {
                self.shard_attrs(path, d, 0).await?.into_iter().map(|(s, a)| (s, a.size)).collect()
            }
            _ => vec![(self.engine.id(), d.entries)],
        };
        Ok(DistReport { entries, ..self.base_report(path, d) })
    }

    /// Attributes of every shard of the distributed directory `d` (asked in parallel), for
    /// a request of client `session`: the storing servers do not recall that session's own
    /// delegations of their shards for it (the client wrote their queued work back before
    /// sending the request), only other sessions'.
    async fn shard_attrs(self: &Arc<Self>, path: &str, d: &DirObject, session: u64) -> OpResult<Vec<(ServerId, Attr)>> {
        let cred = &Cred { session, ..Cred::server() };
        let asks = plusfs_proto::hugedir::distinct(&d.dist.set).into_iter().map(|s| async move {
            let r = if s == self.engine.id() {
                self.engine.host(path, Via::Shard(d.incarnation)).map(|h| Reply::Attr(Attr::of_dir(&h.obj)))
            } else {
                let req = Request::Shard {
                    incarnation: d.incarnation,
                    op: Box::new(Request::DirStat { path: path.to_string() }),
                };
                match self.peers.pool.call_as(s, cred, &req).await {
                    Ok(r) => r.map_err(OpError::from),
                    Err(e) => Err(err(Errno::EIO, format!("storing server {s} of '{path}': {e}"))),
                }
            };
            match r {
                Ok(Reply::Attr(a)) => Ok((s, a)),
                Ok(other) => Err(err(Errno::EIO, format!("unexpected reply {other:?}"))),
                Err(e) => Err(e),
            }
        });
        join_all(asks).await.into_iter().collect()
    }

    /// `stat` of a directory on its home for client `session`: for a distributed one, size
    /// and link count are the sums over its shards and mtime the latest.
    pub(crate) async fn dir_attr(self: &Arc<Self>, path: &str, session: u64) -> OpResult<Attr> {
        let d = self.engine.dir_object(path)?;
        let mut attr = Attr::of_dir(&d);
        if d.dist.state == DistState::Distributed {
            let (mut size, mut subdirs) = (0u64, 0u64);
            for (_, a) in self.shard_attrs(path, &d, session).await? {
                size += a.size;
                subdirs += u64::from(a.nlink.saturating_sub(2));
                if a.mtime > attr.mtime {
                    attr.mtime = a.mtime;
                }
            }
            attr.size = size;
            attr.nlink = (2 + subdirs).min(u32::MAX as u64) as u32;
        }
        Ok(attr)
    }

    /// Distributed directories homed here, for `cluster status` (without entry counts
    /// when a storing server does not answer).
    ///
    /// Entries per storing server are left out: each server reports its own shards, and
    /// asking them here would be a stat of the directory, which commits pending Cx
    /// operations in it (monitoring must not change what it measures).
    pub(crate) async fn hugedir_reports(self: &Arc<Self>) -> OpResult<Vec<DistReport>> {
        let mut out = Vec::new();
        for (path, d) in self.engine.store().dirs_within("/").map_err(eio)? {
            if d.dist.state != DistState::Nondistributed {
                out.push(self.base_report(&path, &d));
            }
        }
        Ok(out)
    }

    /// After a restart: resume every redistribution that was under way.
    pub(crate) fn resume_distributions(self: &Arc<Self>) -> Result<(), plusfs_store::StoreError> {
        for (path, d) in self.engine.store().dirs_within("/")? {
            if d.dist.state == DistState::Distributing {
                self.ensure_distributing(&path);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::attrs::NewNode;
    use crate::engine::host::Via;
    use crate::testkit::{root, Kit};
    use plusfs_proto::{DistState, Errno, FileKind, Reply, Threshold};

    #[tokio::test]
    async fn a_directory_over_its_threshold_is_spread_and_stays_so_after_a_crash() {
        let kit = Kit::new().await;
        let (ns, c) = (&kit.osd.namespace, root());
        let plan = crate::twopc::Plan::now(&kit.osd.engine);
        kit.osd.twopc.mkdir(plan, "/big", 0o755, (0, 0), (Threshold::Never, 0), Via::Home, &c).await.unwrap();
        for i in 0..5 {
            let node = NewNode { target: None, rdev: 0, access: 0 };
            let p = format!("/big/f{i}");
            ns.create(&p, FileKind::File, 0o644, (0, 0), true, node, Via::Home, &c).await.unwrap();
        }
        let status = kit.osd.hugedirs.set_policy("/big", Some(Threshold::Entries(2)), None).await.unwrap();
        assert!(matches!(status, Reply::Dist(_)), "{status:?}");

        let kit = kit.crash_and_restart().await;
        let home = kit.osd.engine.store().get_dir("/big").unwrap().expect("the home object stays");
        assert_eq!(home.dist.state, DistState::Distributed);
        assert_eq!(home.dist.set, [0], "one server stores every entry");
        let shard = kit.osd.engine.store().get_shard("/big").unwrap().expect("its shard");
        // The home redirects entry requests; the shard answers them.
        let e = kit.osd.namespace.stat("/big/f3", Via::Home, &root()).await.unwrap_err();
        assert_eq!(e.errno(), Errno::EREMCHG, "{e}");
        let via = Via::Shard(home.incarnation);
        assert!(kit.osd.namespace.stat("/big/f3", via, &root()).await.is_ok());
        assert_eq!(shard.entries, 5, "every entry moved to the shard");
    }
}
