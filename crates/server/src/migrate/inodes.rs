//! Shared (hard-linked) inodes leave a drained server.
//!
//! Once a drained server holds no directory object and no shard, each shared inode it is
//! the home of goes to an *heir*: the server CRUSH places the inode's first chunk on.
//! 1. Under the inode's lock (which waits for prepared link transactions), the heir copies
//!    the bytes the inode's pieces keep here and stores the inode (`InodeIn`, repeatable:
//!    a crash before step 2 sends it again and the heir replaces its copy).
//! 2. One write here deletes the inode and its records and keeps an [`InodeMoved`] record.
//!    From then on requests reaching this server about the inode are forwarded to the heir
//!    (`Links::find`), and link transactions planned with this server as the home ask it
//!    where the inode is (`InodeHome`, `Links::home_now`).
//! 3. Every server rewrites its link entries naming this server to name the heir
//!    (`Relink`, after letting the transactions in flight land), pass after pass until a
//!    pass finds none anywhere: then nothing names this server as a home any more, and the
//!    walker may report its part done.

use super::Migration;
use crate::engine::errors::{eio, err, OpResult};
use crate::engine::links::inode_lock;
use crate::engine::locks::Scope;
use crate::engine::logrec::{self, InodeMoved};
use plusfs_placement::ClusterMap;
use plusfs_proto::{DistState, Errno, Ino, Inode, Reply, Request, ServerId};
use plusfs_store::Batch;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Bytes fetched per request when an inode's data travels.
const FETCH_BYTES: u64 = 8 << 20;
/// Inodes named per `Relink` request (a frame holds 16 MiB).
const RELINK_BATCH: usize = 500_000;

impl Migration {
    /// One pass of a drained server's last stage: moves every shared inode still here to
    /// its heir, then has every server relink. Answers whether nothing is left (also for a
    /// server that is not drained: it has nothing to do).
    pub(super) async fn move_inodes_once(self: &Arc<Self>, map: &ClusterMap) -> OpResult<bool> {
        let me = self.engine.id();
        if map.server(me).is_some_and(|s| s.weight > 0.0) {
            // Given weight again after a drain: links may still name it for inodes it
            // moved; they learn the heirs, then the forwarding records go.
            return self.relink_everywhere(map).await;
        }
        let inodes = self.engine.store().all_inodes().map_err(eio)?;
        let mut failed = 0;
        for inode in &inodes {
            if self.engine.map().epoch != map.epoch {
                return Ok(false); // plan again with the newer map
            }
            let heir = map.chunk_server(inode.ino, 0);
            if heir == me {
                return Err(err(Errno::ENOSPC, "no server with weight above 0 to take this server's shared inodes"));
            }
            if let Err(e) = self.move_inode(inode.ino, heir).await {
                tracing::warn!(ino = inode.ino, heir, cause = %e.message(), "cannot move a shared inode yet");
                failed += 1;
            }
        }
        if failed > 0 || !self.engine.store().all_inodes().map_err(eio)?.is_empty() {
            return Ok(false);
        }
        self.relink_everywhere(map).await
    }

    /// Hands shared inode `ino` to `heir` and forgets it here (steps 1 and 2).
    async fn move_inode(self: &Arc<Self>, ino: Ino, heir: ServerId) -> OpResult<()> {
        let me = self.engine.id();
        // A link transaction prepared on it goes first (its decision may be long in
        // coming: this pass leaves the inode, the next tries again).
        let busy = |c: crate::engine::locks::Conflict| err(Errno::EBUSY, format!("transaction {} holds it", c.0));
        let _g = self.engine.locks().lock(&[inode_lock(ino)], None, false).await.map_err(busy)?;
        let Some(inode) = self.engine.store().get_inode(ino).map_err(eio)? else { return Ok(()) };
        match self.peers.pool.call(heir, &Request::InodeIn { inode: inode.clone(), from: me }).await {
            Ok(Ok(Reply::Done)) => {}
            Ok(Ok(other)) => return Err(err(Errno::EIO, format!("server {heir} answered {other:?}"))),
            Ok(Err(e)) => return Err(e.into()),
            Err(e) => return Err(err(e.errno(), format!("cannot reach server {heir}: {e}"))),
        }
        let mut mine: Vec<u64> = inode.pieces.iter().filter(|p| p.server == me).map(|p| p.record).collect();
        mine.sort_unstable();
        mine.dedup();
        let gate = self.engine.data_gate().read().await;
        let mut b = Batch::new();
        b.del_inode(ino);
        logrec::put(&mut b, ino, &InodeMoved { to: heir });
        self.engine.drop_local(&mine, &mut b)?;
        self.engine.apply(b).await?;
        drop(gate);
        self.migration.objects_out.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(ino, heir, "shared inode moved to its heir");
        Ok(())
    }

    /// `InodeIn` on the heir: stores `inode` (of drained server `from`) with the bytes its
    /// pieces keep on `from` copied here; a copy taken before is replaced.
    pub(crate) async fn inode_in(self: &Arc<Self>, mut inode: Inode, from: ServerId) -> OpResult<Reply> {
        let conflict = |c: crate::engine::locks::Conflict| err(Errno::EIO, format!("unexpected conflict with {}", c.0));
        let _g = self.engine.locks().lock(&[inode_lock(inode.ino)], None, true).await.map_err(conflict)?;
        let travelling: Vec<usize> = (0..inode.pieces.len()).filter(|&k| inode.pieces[k].server == from).collect();
        for part in chunked(&inode, &travelling) {
            let ranges =
                part.iter().map(|&k| (inode.pieces[k].record, inode.pieces[k].skip, inode.pieces[k].len)).collect();
            let data = self.filedata.fetch_ranges(from, ranges).await?;
            let ids = self.store_local(&vec![inode.ino; part.len()], data).await?;
            for (&k, id) in part.iter().zip(ids) {
                let p = &mut inode.pieces[k];
                (p.server, p.record, p.skip) = (self.engine.id(), id, 0);
            }
        }
        let gate = self.engine.data_gate().read().await;
        let mut b = Batch::new();
        if let Some(old) = self.engine.store().get_inode(inode.ino).map_err(eio)? {
            let mine = |i: &Inode| {
                plusfs_proto::filedata::records(&i.pieces).into_iter().filter(|q| q.0 == self.engine.id()).collect()
            };
            self.engine.drop_unused(&mine(&old), &mine(&inode), &mut b)?;
        }
        b.put_inode(&inode);
        // Moved away from here once, it is back: the old forwarding record goes.
        b.del_log(plusfs_store::LogKind::InodeMove, inode.ino);
        self.engine.apply(b).await?;
        drop(gate);
        Ok(Reply::Done)
    }

    /// Step 3: every server of `map` relinks; answers whether a pass found no link entry
    /// naming this server anywhere.
    async fn relink_everywhere(self: &Arc<Self>, map: &ClusterMap) -> OpResult<bool> {
        let me = self.engine.id();
        let moved: Vec<(Ino, ServerId)> =
            self.engine.log_all::<InodeMoved>().map_err(eio)?.into_iter().map(|(ino, m)| (ino, m.to)).collect();
        if moved.is_empty() {
            return Ok(true);
        }
        let mut found = 0;
        for s in &map.servers {
            // Each request scans every entry of its server: the count is the most one saw.
            let mut most = 0;
            for part in moved.chunks(RELINK_BATCH) {
                let n = if s.id == me {
                    self.relink(me, part.to_vec()).await?
                } else {
                    match self.peers.pool.call(s.id, &Request::Relink { from: me, moved: part.to_vec() }).await {
                        Ok(Ok(Reply::Count(n))) => n,
                        Ok(Ok(other)) => return Err(err(Errno::EIO, format!("server {} answered {other:?}", s.id))),
                        Ok(Err(e)) => return Err(e.into()),
                        Err(e) => return Err(err(e.errno(), format!("cannot reach server {}: {e}", s.id))),
                    }
                };
                most = most.max(n);
            }
            found += most;
        }
        if found > 0 {
            tracing::info!(found, "link entries named this drained server as their inode's home");
            return Ok(false);
        }
        if map.server(me).is_some_and(|s| s.weight > 0.0) {
            // Nothing names this server for the inodes it moved: no forwarding is needed.
            let mut b = Batch::new();
            for (ino, _) in &moved {
                b.del_log(plusfs_store::LogKind::InodeMove, *ino);
            }
            self.engine.apply(b).await?;
        }
        Ok(true)
    }

    /// `Relink`: rewrites the link entries here that name `from` as their home, for the
    /// inodes `moved` names, to name the new home. Answers how many entries naming `from`
    /// it found (rewritten, or of inodes not moved yet).
    pub(crate) async fn relink(self: &Arc<Self>, from: ServerId, moved: Vec<(Ino, ServerId)>) -> OpResult<u64> {
        // Transactions in flight may carry link entries naming `from` (a rename's): they
        // land first.
        if !self.settle_older_transactions().await {
            return Err(err(Errno::EAGAIN, "a transaction is in doubt here: relink later"));
        }
        let to: HashMap<Ino, ServerId> = moved.into_iter().collect();
        let places = self.entry_places()?;
        // A server given weight again holds shared inodes anew: only links to the moved
        // ones count then.
        let drained = self.engine.map().server(from).is_none_or(|s| s.weight == 0.0);
        let mut found = 0;
        for (dir, name, e) in self.engine.store().all_entries().map_err(eio)? {
            if e.link_home != Some(from) {
                continue;
            }
            let Some(&heir) = to.get(&e.ino) else {
                found += u64::from(drained); // its inode is still to move
                continue;
            };
            let Some(path) = places.get(&dir) else {
                // An orphan (fsck reports it): nothing to rewrite it under.
                tracing::warn!(dir, name, ino = e.ino, "a link entry without its directory here cannot be relinked");
                continue;
            };
            found += 1; // counted until rewritten: the drain waits for it
            let wanted = [(path.clone(), Scope::Name(name.clone()))];
            let conflict =
                |c: crate::engine::locks::Conflict| err(Errno::EIO, format!("unexpected conflict with {}", c.0));
            let _g = self.engine.locks().lock(&wanted, None, true).await.map_err(conflict)?;
            let Some(mut now) = self.engine.store().get_entry(dir, &name).map_err(eio)? else { continue };
            if now.ino != e.ino || now.link_home != Some(from) {
                continue;
            }
            now.link_home = Some(heir);
            let mut b = Batch::new();
            b.put_entry(dir, &name, &now);
            self.engine.apply(b).await?;
        }
        Ok(found)
    }

    /// The path of every directory whose entries are here (objects and shards), by inode.
    fn entry_places(&self) -> OpResult<HashMap<Ino, String>> {
        let mut places = HashMap::new();
        for (p, d) in self.engine.store().dirs_within("/").map_err(eio)? {
            // A distributed directory's entries are in its shards (a distributing one's
            // still partly at its home).
            if d.dist.state != DistState::Distributed {
                places.insert(d.ino, p);
            }
        }
        for (p, d) in self.engine.store().shards_within("/").map_err(eio)? {
            places.insert(d.ino, p);
        }
        Ok(places)
    }
}

/// `pieces` (indexes into `inode.pieces`) in parts of about [`FETCH_BYTES`] each.
fn chunked(inode: &Inode, pieces: &[usize]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0;
    for &k in pieces {
        if out.is_empty() || bytes >= FETCH_BYTES {
            out.push(Vec::new());
            bytes = 0;
        }
        bytes += inode.pieces[k].len;
        out.last_mut().expect("pushed").push(k);
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::engine::attrs::NewNode;
    use crate::engine::host::Via;
    use crate::testkit::{root, Mesh};
    use plusfs_placement::MapChange;
    use plusfs_proto::{FileKind, Reply, Threshold};
    use std::time::Duration;

    /// A drained server that is the home of a shared inode: the inode and its bytes go to
    /// the heir, the link entry elsewhere names the heir, both names reach the inode, an
    /// unlink through either reaches it too.
    #[tokio::test]
    async fn a_drained_home_hands_its_shared_inodes_to_an_heir_and_every_link_learns_it() {
        let mesh = Mesh::new(3).await;
        let c = root();
        let top = mesh.home("/");
        let d = (0..).map(|i| format!("/d{i}")).find(|p| mesh.home(p) != top && mesh.home(p) != 0).unwrap();
        let drained = mesh.home(&d);
        let parent = mesh.server(top);
        let plan = crate::twopc::Plan::now(&parent.engine);
        parent.twopc.mkdir(plan, &d, 0o755, (0, 0), (Threshold::Never, 0), Via::Home, &c).await.unwrap();
        let (f, g) = (format!("{d}/f"), "/g".to_string());
        let at = mesh.server(drained);
        let node = NewNode { target: None, rdev: 0, access: 0 };
        at.namespace.create(&f, FileKind::File, 0o644, (0, 0), true, node, Via::Home, &c).await.unwrap();
        at.filedata.write_file(&f, 0, bytes::Bytes::from_static(b"linked bytes"), false, Via::Home, &c).await.unwrap();
        at.namespace.link(&f, &g, Via::Home, &c).await.unwrap();
        assert_eq!(at.engine.store().all_inodes().unwrap().len(), 1, "the drained server is the inode's home");

        let drain = MapChange::Reweight { id: drained, weight: 0.0 }.to_text();
        mesh.server(0).migrate.change_map(&drain, &root()).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while mesh.server(0).engine.map().migrating() || !at.engine.store().all_inodes().unwrap().is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "the shared inode did not move");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let root_ino = parent.engine.dir_object("/").unwrap().ino;
        let link = parent.engine.store().get_entry(root_ino, "g").unwrap().unwrap();
        let heir = link.link_home.unwrap();
        assert_ne!(heir, drained, "the link entry names the heir");
        assert_eq!(mesh.server(heir).engine.store().all_inodes().unwrap().len(), 1);
        assert_eq!(at.engine.store().record_count().unwrap(), 0, "the drained server keeps no data");
        let home_now = mesh.home(&d);
        let stat = |s: u32, p: String| {
            let osd = mesh.server(s).clone();
            async move {
                match osd.namespace.stat(&p, Via::Home, &root()).await.unwrap() {
                    Reply::Attr(a) => (a.ino, a.nlink, a.size),
                    other => panic!("{other:?}"),
                }
            }
        };
        let (fa, ga) = (stat(home_now, f.clone()).await, stat(top, g.clone()).await);
        assert_eq!((fa.0, fa.1, fa.2), (ga.0, 2, 12));
        match mesh.server(top).filedata.read_file(&g, 0, 64, Via::Home, &c).await.unwrap() {
            Reply::Data(d) => assert_eq!(d.to_vec(), b"linked bytes"),
            other => panic!("{other:?}"),
        }
        parent.namespace.unlink(&g, Via::Home, &c).await.unwrap();
        assert_eq!(stat(home_now, f).await.1, 1, "the unlink reached the inode at the heir");
    }
}
