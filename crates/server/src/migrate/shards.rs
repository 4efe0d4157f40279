//! Shards of distributed directories leaving a drained storing server.
//!
//! A distributed directory's entries live on its storing set by Eq. 2,
//! `set[hash(name) % set.len()]`. Draining a member of the set replaces it in every slot it
//! holds by one *taker* (so no other entry moves, and the set's length stays): a server not
//! yet in the set when there is one, else the one holding the fewest slots (it then keeps
//! the entries of several slots in one shard).
//!
//! 1. The drained server's walker asks the directory's home (`ShardEvict`). Under the
//!    directory's busy lock the home picks the taker, has it record durably that the shard
//!    comes (`ShardExpect`: a `ShardMove` record, stage `Expected`), then records the new
//!    set in its object. From then on its redirects name the taker.
//! 2. The walker asks the taker to pull (`ShardPull`); any request about the shard that
//!    reaches the taker first pulls it too (and waits for it).
//! 3. The taker asks the giver for it (`ShardOut`). The giver, once no transaction holds the
//!    shard (it hurries those that do and refuses meanwhile), moves it from what it serves
//!    into a `ShardMove` record (stage `Out`) in one store write and answers the object with
//!    its first entries; later requests about it get a redirect carrying the new set.
//! 4. The taker fetches the other entries (`ShardEntries`, pages checked against their
//!    checksum) and the small-file data that travels with them, stores them, then in one
//!    write merges the shard object into its own (counts added) and marks its record
//!    `Taken`; it confirms with `ShardDone`, after which the giver drops the entries (its
//!    record becomes `Gone`, a forwarding address) and the taker its record.
//!
//! Every step is repeatable and each side's record says where it stands, so a crash of
//! either is resumed: the walker asks again while the drained server holds a shard or an
//! unconfirmed hand-over, and a restarted taker confirms what it took.

use super::{check_intact, path_key, with_ancestors, Migration, ENTRIES_PER_MESSAGE, PULL_PATIENCE};
use crate::engine::errors::{check_dir_path, eio, err, OpError, OpResult};
use crate::engine::logrec::{self, MoveStage, ShardMove};
use plusfs_placement::ClusterMap;
use plusfs_proto::migrate::MovedDir;
use plusfs_proto::{Cred, Errno, Reply, Request, ServerId};
use plusfs_store::{Batch, LogKind};
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Migration {
    /// This server's shard-move record of `path`, if it keeps one.
    fn shard_move(&self, path: &str) -> OpResult<Option<ShardMove>> {
        Ok(self.engine.log_get::<ShardMove>(path_key(path))?.filter(|r| r.path == path))
    }

    /// After a restart: shards expected here are pulled by the next request about them
    /// (or the drained server's walker), and those taken are confirmed to their giver.
    pub(crate) fn resume_shard_moves(self: &Arc<Self>) -> Result<(), plusfs_store::StoreError> {
        for (_, rec) in self.engine.log_all::<ShardMove>()? {
            match rec.stage {
                MoveStage::Expected => {
                    self.expected_shards.lock().insert(rec.path.clone());
                }
                MoveStage::Taken => self.confirm_in_background(rec),
                MoveStage::Out(_) | MoveStage::Gone => {}
            }
        }
        Ok(())
    }

    /// `ShardExpect` on the taker: records that the shard of `path` comes from `from`.
    pub(crate) async fn shard_expect(
        &self,
        path: &str,
        ino: u64,
        incarnation: u64,
        from: ServerId,
        set: Vec<ServerId>,
    ) -> OpResult<Reply> {
        check_dir_path(path)?;
        let me = self.engine.id();
        if !set.contains(&me) || set.contains(&from) || from == me {
            return Err(err(
                Errno::EINVAL,
                format!("'{path}': the new storing set {set:?} must name server {me} and not server {from}"),
            ));
        }
        match self.shard_move(path)? {
            Some(r) if r.ino == ino && r.from == from && matches!(r.stage, MoveStage::Expected | MoveStage::Taken) => {
                return Ok(Reply::Done);
            }
            Some(r) if matches!(r.stage, MoveStage::Out(_)) => {
                return Err(OpError::Moved(format!("server {me} is still handing its shard of '{path}' over")));
            }
            // One giver at a time: another drained server's shard of it is still coming.
            Some(r) if matches!(r.stage, MoveStage::Expected | MoveStage::Taken) => {
                return Err(OpError::Moved(format!(
                    "server {me} is still taking server {}'s shard of '{path}'",
                    r.from
                )));
            }
            _ => {}
        }
        let rec = ShardMove { path: path.to_string(), ino, incarnation, from, to: me, set, stage: MoveStage::Expected };
        let mut b = Batch::new();
        logrec::put(&mut b, path_key(path), &rec);
        self.engine.apply(b).await?;
        self.expected_shards.lock().insert(path.to_string());
        Ok(Reply::Done)
    }

    /// Before a request is served here: pulls every shard it is about that a drained
    /// server is to hand here. A sub-operation of a cross-server operation does not wait
    /// for a giver that refuses (a transaction of the same coordinator may hold the shard
    /// there): it is refused with EBUSY and its coordinator tries again.
    pub(crate) async fn pull_expected(self: &Arc<Self>, req: &Request) -> OpResult<()> {
        if self.expected_shards.lock().is_empty() {
            return Ok(());
        }
        // The moves' own requests never wait for a pull (a pull asks the home for its set,
        // and the home may be this server).
        if req.is_shard_move() {
            return Ok(());
        }
        let mut about: Vec<String> = plusfs_proto::touch::touched(req).into_iter().map(|t| t.0).collect();
        about.extend(req.inner().target_dir().map(String::from));
        about.retain(|p| self.expected_shards.lock().contains(p));
        about.sort();
        about.dedup();
        let planned = matches!(req, Request::TxPrepare { .. } | Request::CxExec { .. } | Request::SubExec { .. });
        let patience = if planned { Duration::ZERO } else { PULL_PATIENCE };
        for p in about {
            self.pull_shard(&p, patience).await?;
        }
        Ok(())
    }

    /// `ShardPull`: pulls the shard of `path` if it is expected here, in a task of its own
    /// (a caller that gives up does not stop it); answers once it is stored.
    pub(crate) async fn shard_pull(self: &Arc<Self>, path: &str) -> OpResult<Reply> {
        check_dir_path(path)?;
        let (osd, p) = (self.clone(), path.to_string());
        match tokio::spawn(async move { osd.pull_shard(&p, PULL_PATIENCE).await }).await {
            Ok(r) => r.map(|()| Reply::Done),
            Err(e) => Err(err(Errno::EIO, format!("pulling the shard of '{path}': {e}"))),
        }
    }

    /// Takes the shard of `path` from its giver if it is expected here (concurrent callers
    /// wait for the first), retrying for `patience` while the giver refuses. A record the
    /// home's decision no longer backs (it gave the slots to another server after a crash)
    /// is dropped.
    async fn pull_shard(self: &Arc<Self>, path: &str, patience: Duration) -> OpResult<()> {
        let gate = self.shard_pulls.gate(path);
        let _held = gate.lock().await;
        let started = Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            let Some(rec) = self.shard_move(path)? else { return Ok(()) };
            match rec.stage {
                MoveStage::Expected => {}
                MoveStage::Taken => {
                    self.confirm_in_background(rec);
                    return Ok(());
                }
                MoveStage::Out(_) | MoveStage::Gone => return Ok(()),
            }
            match self.take_shard(&rec).await {
                Ok(taken) => {
                    self.confirm_in_background(taken);
                    return Ok(());
                }
                Err(e) if e.errno() == Errno::EBUSY && started.elapsed() < patience => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Err(e) if e.errno() == Errno::ESTALE => {
                    tracing::warn!(path, from = rec.from, cause = %e.message(), "dropping a shard move the home did not make");
                    let mut b = Batch::new();
                    b.del_log(LogKind::ShardMove, path_key(path));
                    self.engine.apply(b).await?;
                    self.expected_shards.lock().remove(path);
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Steps 3 and 4 on the taker; answers the record as it now stands (`Taken`).
    async fn take_shard(self: &Arc<Self>, rec: &ShardMove) -> OpResult<ShardMove> {
        let started = Instant::now();
        let (path, from, ino) = (rec.path.as_str(), rec.from, rec.ino);
        let out = Request::ShardOut { path: path.to_string(), ino, incarnation: rec.incarnation, set: rec.set.clone() };
        let first = match self.peers.call(from, out, &Cred::server()).await? {
            Reply::Moved(mut v) if v.len() == 1 => v.remove(0),
            other => return Err(err(Errno::EIO, format!("server {from} answered a shard hand-over with {other:?}"))),
        };
        check_intact(&first)?;
        let Some(shard) = first.object.clone() else {
            return Err(err(Errno::EIO, format!("server {from} handed over no shard of '{path}'")));
        };
        if (shard.ino, shard.incarnation) != (ino, rec.incarnation) {
            return Err(err(Errno::EIO, format!("server {from} handed over another directory's shard of '{path}'")));
        }
        let next =
            |after| Request::ShardEntries { path: path.to_string(), ino, after, limit: ENTRIES_PER_MESSAGE as u32 };
        let entries = self.store_entries(from, &first, ino, next).await?;
        self.failpoints.hit(crate::failpoint::FailStep::ShardBeforeTake).await;
        let mut wanted = with_ancestors(path);
        wanted.sort();
        let _g = self
            .engine
            .locks()
            .lock(&wanted, None, true)
            .await
            .map_err(|c| err(Errno::EIO, format!("'{path}': unexpected conflict with transaction {}", c.0)))?;
        let merged = match self.engine.store().get_shard(path).map_err(eio)? {
            Some(mut own) if own.ino == ino => {
                own.entries += shard.entries;
                own.subdirs += shard.subdirs;
                own.mtime = own.mtime.max(shard.mtime);
                own.dist.set = rec.set.clone();
                own
            }
            _ => {
                let mut s = shard;
                s.dist.set = rec.set.clone();
                s
            }
        };
        let taken = ShardMove { stage: MoveStage::Taken, ..rec.clone() };
        let mut b = Batch::new();
        b.put_shard(path, &merged);
        logrec::put(&mut b, path_key(path), &taken);
        self.engine.apply(b).await?;
        self.expected_shards.lock().remove(path);
        tracing::info!(path, from, entries, ms = started.elapsed().as_millis() as u64, "took a drained server's shard");
        Ok(taken)
    }

    /// Tells the giver a shard is stored here, then forgets the move (in the background;
    /// the giver's walker asks again if this is lost).
    fn confirm_in_background(self: &Arc<Self>, rec: ShardMove) {
        let osd = self.clone();
        tokio::spawn(async move {
            let done = Request::ShardDone { path: rec.path.clone(), ino: rec.ino };
            if let Err(e) = osd.peers.call(rec.from, done, &Cred::server()).await {
                tracing::debug!(from = rec.from, cause = %e.message, "shard confirmation not delivered; asked again later");
                return;
            }
            // The record goes only if it is still this move's (a later move of the path
            // from another giver may have replaced it).
            let gate = osd.shard_pulls.gate(&rec.path);
            let _held = gate.lock().await;
            match osd.shard_move(&rec.path) {
                Ok(Some(now)) if now.from == rec.from && now.stage == MoveStage::Taken => {}
                _ => return,
            }
            let mut b = Batch::new();
            b.del_log(LogKind::ShardMove, path_key(&rec.path));
            if let Err(e) = osd.engine.apply(b).await {
                tracing::warn!(path = rec.path, cause = %e.message(), "cannot drop a finished shard move's record");
            }
        });
    }

    /// `ShardOut` on the giver: stops serving the shard of `path` and answers it with its
    /// first entries (from its record when it was handed over already).
    pub(crate) async fn shard_out(
        self: &Arc<Self>,
        path: &str,
        ino: u64,
        incarnation: u64,
        set: Vec<ServerId>,
    ) -> OpResult<Reply> {
        check_dir_path(path)?;
        if let Some(rec) = self.shard_move(path)? {
            match rec.stage {
                MoveStage::Out(obj) if obj.ino == ino => return self.first_page(path, *obj),
                // Its taker has it: whoever asks holds a move the home did not make.
                MoveStage::Gone if rec.ino == ino => {
                    return Err(err(
                        Errno::ESTALE,
                        format!("the shard of '{path}' went to server {} and was dropped here", rec.to),
                    ));
                }
                _ => {}
            }
        }
        // Only once the home records a set without this server: until then it sends
        // requests about these names here, and this server serves them.
        let home_set = self.home_set(path).await?;
        if home_set.contains(&self.engine.id()) {
            return Err(OpError::Moved(format!("the home of '{path}' has not given this server's slots away yet")));
        }
        if home_set != set {
            return Err(err(Errno::ESTALE, format!("the home of '{path}' gave this server's slots to another server")));
        }
        let mut wanted = with_ancestors(path);
        wanted.sort();
        let _g = match self.engine.locks().lock(&wanted, None, false).await {
            Ok(g) => g,
            Err(c) => {
                self.engine.locks().hurry(c.0);
                return Err(OpError::Moved(format!("a transaction holds the shard of '{path}'")));
            }
        };
        let Some(obj) = self.engine.store().get_shard(path).map_err(eio)? else {
            return Err(err(Errno::ENOENT, format!("no shard of '{path}' here")));
        };
        if (obj.ino, obj.incarnation) != (ino, incarnation) {
            return Err(err(Errno::ESTALE, format!("the shard of '{path}' here is of another directory")));
        }
        let me = self.engine.id();
        let slot = obj.dist.set.iter().position(|&s| s == me);
        let Some(&to) = slot.and_then(|i| set.get(i)) else {
            return Err(err(Errno::EINVAL, format!("'{path}': the set {set:?} has no slot of this server's shard")));
        };
        let rec = ShardMove {
            path: path.to_string(),
            ino,
            incarnation,
            from: me,
            to,
            set,
            stage: MoveStage::Out(Box::new(obj.clone())),
        };
        let mut b = Batch::new();
        b.del_shard(path);
        logrec::put(&mut b, path_key(path), &rec);
        self.engine.apply(b).await?;
        self.failpoints.hit(crate::failpoint::FailStep::ShardAfterOut).await;
        tracing::info!(path, to, entries = obj.entries, "handing a shard to another storing server");
        self.first_page(path, obj)
    }

    /// The storing set the home of distributed directory `path` holds now.
    pub(crate) async fn home_set(&self, path: &str) -> OpResult<Vec<ServerId>> {
        let home = self.engine.map().home_of_dir(path);
        let ask = Request::ShardSet { path: path.to_string() };
        match self.peers.call(home, ask, &Cred::server()).await? {
            Reply::Dist(report) => Ok(report.set),
            other => Err(err(Errno::EIO, format!("the home of '{path}' answered {other:?}"))),
        }
    }

    fn first_page(&self, path: &str, obj: plusfs_proto::DirObject) -> OpResult<Reply> {
        let limit = ENTRIES_PER_MESSAGE;
        let mut page = self.engine.store().list_entries(obj.ino, None, limit + 1).map_err(eio)?;
        let more = page.len() > limit;
        page.truncate(limit);
        Ok(Reply::Moved(vec![MovedDir::new(path.to_string(), Some(obj), page, more)]))
    }

    /// `ShardEntries` on the giver: a page of a handed-over shard's entries.
    pub(crate) fn shard_entries(&self, path: &str, ino: u64, after: Option<&str>, limit: u32) -> OpResult<Reply> {
        match self.shard_move(path)? {
            Some(ShardMove { stage: MoveStage::Out(obj), .. }) if obj.ino == ino => {}
            _ => {
                return Err(err(Errno::ENOENT, format!("no shard of '{path}' (inode {ino}) is being handed over here")))
            }
        }
        let limit = (limit as usize).clamp(1, ENTRIES_PER_MESSAGE);
        let mut page = self.engine.store().list_entries(ino, after, limit + 1).map_err(eio)?;
        let more = page.len() > limit;
        page.truncate(limit);
        Ok(Reply::Moved(vec![MovedDir::new(path.to_string(), None, page, more)]))
    }

    /// `ShardDone` on the giver: drops the handed-over entries; the record stays as a
    /// forwarding address.
    pub(crate) async fn shard_done(self: &Arc<Self>, path: &str, ino: u64) -> OpResult<Reply> {
        let Some(rec) = self.shard_move(path)? else { return Ok(Reply::Done) };
        let MoveStage::Out(obj) = &rec.stage else { return Ok(Reply::Done) };
        if obj.ino != ino {
            return Ok(Reply::Done);
        }
        self.drop_entries(ino).await?;
        let mut b = Batch::new();
        logrec::put(&mut b, path_key(path), &ShardMove { stage: MoveStage::Gone, ..rec });
        self.engine.apply(b).await?;
        Ok(Reply::Done)
    }

    /// The walker's step on a drained server (weight 0 in `map`): every shard still served
    /// here is given away (step 1, then the taker is asked to pull), every unconfirmed
    /// hand-over is asked about again. Answers whether nothing is left.
    pub(super) async fn move_shards_once(self: &Arc<Self>, map: &ClusterMap) -> OpResult<bool> {
        let me = self.engine.id();
        if map.server(me).is_some_and(|s| s.weight > 0.0) {
            return Ok(true);
        }
        let live = self.engine.store().shards_within("/").map_err(eio)?;
        let out: Vec<ShardMove> = self
            .engine
            .log_all::<ShardMove>()
            .map_err(eio)?
            .into_iter()
            .map(|(_, r)| r)
            .filter(|r| matches!(r.stage, MoveStage::Out(_)))
            .collect();
        if live.is_empty() && out.is_empty() {
            return Ok(true);
        }
        for (path, obj) in live {
            if self.engine.map().epoch != map.epoch {
                return Ok(false);
            }
            let evict = Request::ShardEvict { path: path.clone(), from: me };
            let set = match self.peers.call(map.home_of_dir(&path), evict, &Cred::server()).await {
                Ok(Reply::Dist(report)) => report.set,
                Ok(other) => return Err(err(Errno::EIO, format!("'{path}': its home answered {other:?}"))),
                Err(e) if e.errno == Errno::EBUSY => {
                    tracing::debug!(path, cause = %e.message, "the home did not give this server's slots away yet");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(path, cause = %e.message, "the home refused to give this server's slots away");
                    continue;
                }
            };
            let slot = obj.dist.set.iter().position(|&s| s == me);
            let Some(&to) = slot.and_then(|i| set.get(i)) else {
                tracing::warn!(path, ?set, "cannot tell which server takes this shard");
                continue;
            };
            self.ask_to_pull(to, &path).await;
        }
        for rec in out {
            self.ask_to_pull(rec.to, &rec.path).await;
        }
        Ok(false)
    }

    async fn ask_to_pull(&self, to: ServerId, path: &str) {
        let pull = Request::ShardPull { path: path.to_string() };
        if let Err(e) = self.peers.call(to, pull, &Cred::server()).await {
            tracing::debug!(path, to, cause = %e.message, "the taker did not take the shard yet");
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::attrs::NewNode;
    use crate::engine::host::Via;
    use crate::engine::logrec::MoveStage;
    use crate::testkit::{root, Mesh};
    use plusfs_placement::MapChange;
    use plusfs_proto::{FileKind, Threshold};
    use std::time::Duration;

    #[tokio::test]
    async fn a_drained_storing_server_gives_its_shard_to_another() {
        let mesh = Mesh::new(3).await;
        let c = root();
        let home = mesh.home("/big");
        let parent = mesh.server(mesh.home("/"));
        let plan = crate::twopc::Plan::now(&parent.engine);
        parent.twopc.mkdir(plan, "/big", 0o755, (0, 0), (Threshold::Never, 0), Via::Home, &c).await.unwrap();
        for i in 0..60 {
            let node = NewNode { target: None, rdev: 0, access: 0 };
            let p = format!("/big/f{i}");
            mesh.server(home)
                .namespace
                .create(&p, FileKind::File, 0o644, (0, 0), true, node, Via::Home, &c)
                .await
                .unwrap();
        }
        mesh.server(home).hugedirs.set_policy("/big", Some(Threshold::Entries(0)), None).await.unwrap();
        let before = mesh.server(home).engine.dir_object("/big").unwrap();
        assert_eq!(before.dist.set.len(), 3);
        // A storing server that is neither the home nor the map service's.
        let drained = *before.dist.set.iter().find(|&&s| s != home && s != 0).unwrap_or(&before.dist.set[0]);
        assert!(mesh.server(drained).engine.store().get_shard("/big").unwrap().is_some());
        let drain = MapChange::Reweight { id: drained, weight: 0.0 }.to_text();
        mesh.server(0).migrate.change_map(&drain, &root()).await.unwrap();
        // A server told the shard comes whose home never recorded it (a home that died
        // between the two steps, or chose another taker): the giver refuses to hand over.
        let stray = *before.dist.set.iter().find(|&&s| s != drained).unwrap();
        let stray_set: Vec<u32> = before.dist.set.iter().map(|&s| if s == drained { stray } else { s }).collect();
        let m = &mesh.server(stray).migrate;
        m.shard_expect("/big", before.ino, before.incarnation, drained, stray_set).await.unwrap();
        mesh.server(home).engine.dir_object("/big").unwrap(); // (the home's set is unchanged)
        let refused = m.pull_shard("/big", Duration::ZERO).await;
        if mesh.server(home).engine.dir_object("/big").unwrap().dist.set.contains(&drained) {
            let e = refused.expect_err("the giver handed over a shard its home still routes to it");
            assert_eq!(e.errno(), plusfs_proto::Errno::EBUSY, "{e}");
            assert!(mesh.server(drained).engine.store().get_shard("/big").unwrap().is_some(), "still served");
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let gone = mesh.server(drained).engine.store().get_shard("/big").unwrap().is_none();
            let settled = mesh.servers.iter().all(|k| k.osd.engine.shards_moving().unwrap().is_empty());
            if gone && settled && !mesh.server(0).engine.map().migrating() {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "the shard did not move (gone {gone}, settled {settled})");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let after = mesh.server(home).engine.dir_object("/big").unwrap();
        assert_eq!(after.dist.set.len(), 3, "the set keeps its slots: {:?}", after.dist.set);
        assert!(!after.dist.set.contains(&drained), "{:?}", after.dist.set);
        let mut total = 0;
        for s in plusfs_proto::hugedir::distinct(&after.dist.set) {
            total += mesh.server(s).engine.store().get_shard("/big").unwrap().expect("a shard").entries;
        }
        assert_eq!(total, 60, "the shards' counts add up");
        let info = mesh.server(home).engine.dist_info("/big", &after);
        for i in 0..60 {
            let (p, name) = (format!("/big/f{i}"), format!("f{i}"));
            let at = mesh.server(info.server_of(&name));
            at.namespace.stat(&p, Via::Shard(after.incarnation), &c).await.unwrap_or_else(|e| panic!("{p}: {e}"));
        }
        // A stray expectation the home did not back is dropped at its next pull.
        mesh.server(stray).migrate.pull_shard("/big", Duration::ZERO).await.unwrap();
        assert!(mesh.server(stray).migrate.shard_move("/big").unwrap().is_none_or(|r| r.stage == MoveStage::Taken));
        // The drained server redirects a client with the old set to the new one.
        let e = mesh.server(drained).namespace.stat("/big/f1", Via::Shard(after.incarnation), &c).await.unwrap_err();
        assert_eq!(e.dist().map(|d| d.set.clone()), Some(after.dist.set.clone()), "{e}");
    }
}
