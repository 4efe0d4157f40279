//! Single-server namespace operations: create, stat, unlink, readdir, attributes,
//! symlinks, and the server-wide reports (statfs, status, fsck scan). Each reads, checks
//! and applies one store batch under the busy lock of what it touches.

mod links;
mod xattr;

use crate::engine::attrs::{apply_set, count_entry, NewNode};
use crate::engine::call::Call;
use crate::engine::errors::{check_dir_path, eio, err, split_entry, OpError, OpResult};
use crate::engine::host::Via;
use crate::engine::locks::Scope;
use crate::engine::perm;
use crate::engine::Engine;
use crate::filedata::FileData;
use crate::hugedir::HugeDirs;
use crate::links::Found;
use crate::links::Links;
use crate::twopc::TwoPhase;
use plusfs_proto::acl;
use plusfs_proto::{
    Attr, DirEntry, DirObject, Dirents, DistState, Errno, FileKind, FsckData, Inode, Reply, Request, SetAttr, Statfs,
    MAY_READ, MAY_WRITE,
};
use plusfs_store::Batch;
use std::collections::HashSet;
use std::sync::Arc;

/// Largest readdir page a server returns.
pub const MAX_READDIR_PAGE: u32 = 4096;

/// Operations on one directory's entries and attributes (create, stat, unlink, readdir,
/// setattr, links, xattrs) and the server's totals.
pub(crate) struct Namespace {
    engine: Arc<Engine>,
    links: Arc<Links>,
    filedata: Arc<FileData>,
    hugedirs: Arc<HugeDirs>,
    twopc: Arc<TwoPhase>,
}

impl Namespace {
    pub(crate) fn new(
        engine: Arc<Engine>,
        links: Arc<Links>,
        filedata: Arc<FileData>,
        hugedirs: Arc<HugeDirs>,
        twopc: Arc<TwoPhase>,
    ) -> Namespace {
        Namespace { engine, links, filedata, hugedirs, twopc }
    }
}

impl Namespace {
    /// Creates a file, FIFO or symlink entry.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn create(
        self: &Arc<Self>,
        p: &str,
        kind: FileKind,
        mode: u32,
        owner: (u32, u32),
        exclusive: bool,
        node: NewNode,
        via: Via,
        c: &Call,
    ) -> OpResult<Reply> {
        let NewNode { target, rdev, access } = node;
        let (dir, name) = split_entry(p)?;
        if kind == FileKind::Dir {
            return Err(err(Errno::EINVAL, "create cannot make directories"));
        }
        let g = self.engine.locks().lock(&[(dir.to_string(), Scope::Name(name.to_string()))], None, true).await;
        let mut host = self.engine.host(dir, via)?;
        if !host.shard && self.engine.over_threshold(&host.obj) {
            // Due for distribution (another writer crossed the threshold): distribute
            // first, so writers cannot keep the directory from ever being distributed.
            drop(g);
            let info = self.hugedirs.distribute(dir).await?;
            return Err(OpError::Redirect(Box::new(info.unwrap_or_else(|| self.engine.dist_info(dir, &host.obj)))));
        }
        perm::check_search(c, &host.obj, dir)?;
        if let Some(e) = self.engine.store().get_entry(host.obj.ino, name).map_err(eio)? {
            return match e.kind {
                _ if exclusive => Err(err(Errno::EEXIST, format!("'{p}' exists"))),
                FileKind::Dir => Err(err(Errno::EISDIR, format!("'{p}' is a directory"))),
                // An open of what is there, checked where its inode (and ACL) is kept.
                _ => {
                    drop(g);
                    self.open_entry(p, access, via, c).await
                }
            };
        }
        perm::check_dir_write(c, &host.obj, dir)?;
        perm::check_mknod(c, kind, p)?;
        let n = perm::new_entry(c, &host.obj, owner, mode, kind);
        let size = target.as_ref().map_or(0, |t| t.len() as u64);
        let rdev = if matches!(kind, FileKind::BlockDev | FileKind::CharDev) { rdev } else { 0 };
        let new = Inode::new(self.engine.new_ino().await?, kind, n.mode, n.uid, n.gid);
        let inode = Inode { size, target, rdev, xattrs: n.xattrs, ..new };
        count_entry(&mut host.obj, kind, 1);
        let mut b = Batch::counted();
        b.put_entry(host.obj.ino, name, &inode);
        host.save(&mut b, dir);
        self.engine.apply_for(c, b).await?;
        drop(g);
        if !host.shard && self.engine.over_threshold(&host.obj) {
            // The create is done whatever happens to the distribution (a failed one stays
            // `Distributing` and is finished by the next request or restart).
            if let Err(e) = self.hugedirs.distribute(dir).await {
                tracing::error!(dir, cause = %e.message(), "redistribution failed");
            }
        }
        Ok(Reply::Attr(Attr::of_inode(&inode)))
    }

    /// `lstat` of an entry: its attributes, or `IsDir` for a subdirectory.
    pub(crate) async fn stat(self: &Arc<Self>, p: &str, via: Via, c: &Call) -> OpResult<Reply> {
        let e = match self.links.find(p, via, false, c).await? {
            Found::Here(t) => t.inode,
            Found::Elsewhere { home, ino } => {
                return self.links.forward(home, ino, Request::Stat { path: p.into() }, c).await
            }
        };
        Ok(match e.kind {
            FileKind::Dir => Reply::IsDir { ino: e.ino },
            _ => Reply::Attr(Attr::of_inode(&e)),
        })
    }

    /// `open` of an entry: as `stat`, after checking the opener's `access` (`MAY_READ`,
    /// `MAY_WRITE`) against the file (a directory's own server checks nothing more).
    pub(crate) async fn open_entry(self: &Arc<Self>, p: &str, access: u32, via: Via, c: &Call) -> OpResult<Reply> {
        let e = match self.links.find(p, via, false, c).await? {
            Found::Here(t) => t.inode,
            Found::Elsewhere { home, ino } => {
                return self.links.forward(home, ino, Request::Open { path: p.into(), access }, c).await
            }
        };
        if e.kind == FileKind::Dir {
            return Ok(Reply::IsDir { ino: e.ino });
        }
        for want in [MAY_READ, MAY_WRITE].into_iter().filter(|w| access & w != 0) {
            perm::check_acl(c, e.mode, e.uid, e.gid, e.access_acl().as_ref(), want, p)?;
        }
        Ok(Reply::Attr(Attr::of_inode(&e)))
    }

    pub(crate) async fn dir_stat(self: &Arc<Self>, p: &str, via: Via, c: &Call) -> OpResult<Reply> {
        check_dir_path(p)?;
        match via {
            Via::Home => {
                perm::check_search_above(c, &self.engine.dir_object(p)?, p)?;
                Ok(Reply::Attr(self.hugedirs.dir_attr(p, c.session).await?))
            }
            Via::Shard(_) | Via::Inode(_) => {
                let d = self.engine.host(p, via)?.obj;
                perm::check_search_above(c, &d, p)?;
                Ok(Reply::Attr(Attr::of_dir(&d)))
            }
        }
    }

    /// A directory's mode, owner and ancestry (`DirPerms`, from the server of a new
    /// subdirectory's object).
    pub(crate) fn dir_perms(&self, p: &str) -> OpResult<Reply> {
        check_dir_path(p)?;
        let d = self.engine.dir_object(p)?;
        let perms = plusfs_proto::ParentPerms::of(d.clone());
        Ok(Reply::DirPerms {
            mode: d.mode,
            uid: d.uid,
            gid: d.gid,
            ancestry: perms.ancestry,
            default_acl: perms.default_acl,
        })
    }

    pub(crate) async fn unlink(self: &Arc<Self>, p: &str, via: Via, c: &Call) -> OpResult<Reply> {
        let (dir, name) = split_entry(p)?;
        let _g = self.engine.locks().lock(&[(dir.to_string(), Scope::Name(name.to_string()))], None, true).await;
        let mut host = self.engine.host(dir, via)?;
        perm::check_search(c, &host.obj, dir)?;
        let e = self.engine.entry(&host.obj, p, name)?;
        perm::check_dir_write(c, &host.obj, dir)?;
        if host.obj.mode & libc::S_ISVTX != 0 && !c.is_root() {
            let owner = self.links.resolve(p, e.clone()).await?.uid;
            perm::check_sticky(c, &host.obj, owner, p)?;
        }
        if e.kind == FileKind::Dir {
            return Err(err(Errno::EISDIR, format!("'{p}' is a directory")));
        }
        if e.link_home.is_some() {
            drop(_g);
            return self.unlink_link(p, &e, via, c).await;
        }
        count_entry(&mut host.obj, e.kind, -1);
        let gate = self.engine.data_gate().read().await;
        let mut b = Batch::new();
        let remote =
            self.engine.drop_unused(&plusfs_proto::filedata::records(&e.pieces), &Default::default(), &mut b)?;
        b.del_entry(host.obj.ino, name);
        host.save(&mut b, dir);
        c.answer_with_next_batch(&Ok(Reply::Done));
        self.engine.apply_for(c, b).await?;
        drop(gate);
        self.filedata.drop_remote(remote).await;
        Ok(Reply::Done)
    }

    pub(crate) fn readdir(
        self: &Arc<Self>,
        p: &str,
        after: Option<String>,
        limit: u32,
        via: Via,
        c: &Call,
    ) -> OpResult<Reply> {
        check_dir_path(p)?;
        let d = self.engine.host(p, via)?.obj;
        perm::check_search_above(c, &d, p)?;
        perm::check_dir(c, &d, MAY_READ, p)?;
        let limit = if limit == 0 { 1024 } else { limit.min(MAX_READDIR_PAGE) } as usize;
        let mut page = self.engine.store().list_entries(d.ino, after.as_deref(), limit + 1).map_err(eio)?;
        let more = page.len() > limit;
        page.truncate(limit);
        let entries = page.into_iter().map(|(name, i)| DirEntry { name, ino: i.ino, kind: i.kind }).collect();
        Ok(Reply::Dirents(Dirents { incarnation: d.incarnation, entries, more }))
    }

    pub(crate) async fn set_attr(self: &Arc<Self>, p: &str, set: &SetAttr, via: Via, c: &Call) -> OpResult<Reply> {
        let mut t = match self.links.find(p, via, true, c).await? {
            Found::Here(t) => t,
            Found::Elsewhere { home, ino } => {
                return self.links.forward(home, ino, Request::SetAttr { path: p.into(), set: set.clone() }, c).await
            }
        };
        let e = &mut t.inode;
        if e.kind == FileKind::Dir {
            return Ok(Reply::IsDir { ino: e.ino });
        }
        let set = &perm::check_setattr(c, &perm::Owned::of_inode(e), set, p)?;
        let gate = self.engine.data_gate().read().await;
        let mut b = Batch::counted();
        let mut remote = Vec::new();
        if let Some(size) = set.size {
            if e.kind != FileKind::File {
                return Err(err(Errno::EINVAL, format!("'{p}' is not a regular file")));
            }
            remote = self.filedata.resize(e, size, &mut b)?;
        }
        apply_set(set, &mut e.mode, &mut e.uid, &mut e.gid, &mut e.atime, &mut e.mtime, &mut e.ctime);
        if let Some(m) = set.mode {
            plusfs_proto::acl::chmod_xattrs(&mut e.xattrs, m);
        }
        t.save(&mut b);
        let answer = Reply::Attr(Attr::of_inode(&t.inode));
        c.answer_with_next_batch(&Ok(answer.clone()));
        self.engine.apply_for(c, b).await?;
        drop(gate);
        self.filedata.drop_remote(remote).await;
        Ok(answer)
    }

    pub(crate) async fn readlink(self: &Arc<Self>, p: &str, via: Via, c: &Call) -> OpResult<Reply> {
        let e = match self.links.find(p, via, false, c).await? {
            Found::Here(t) => t.inode,
            Found::Elsewhere { home, ino } => {
                return self.links.forward(home, ino, Request::Readlink { path: p.into() }, c).await
            }
        };
        match e.target {
            Some(t) if e.kind == FileKind::Symlink => Ok(Reply::Target(t)),
            _ => Err(err(Errno::EINVAL, format!("'{p}' is not a symbolic link"))),
        }
    }

    /// Directory objects homed here, and entries held here (in objects and shards).
    pub(crate) fn totals(&self) -> OpResult<(u64, u64)> {
        let dirs = self.engine.store().dirs_within("/").map_err(eio)?;
        let shards = self.engine.store().shards_within("/").map_err(eio)?;
        let entries = dirs.iter().chain(&shards).map(|(_, d)| d.entries).sum();
        Ok((dirs.len() as u64, entries))
    }

    pub(crate) fn statfs(&self) -> OpResult<Reply> {
        let (dir_objects, entries) = self.totals()?;
        Ok(Reply::Statfs(Statfs { dir_objects, entries }))
    }

    pub(crate) async fn fsck_scan(&self) -> OpResult<Reply> {
        let dirs = self.engine.store().dirs_within("/").map_err(eio)?;
        let shards = self.engine.store().shards_within("/").map_err(eio)?;
        // Entries belong to a nondistributed directory object or to a shard held here.
        let local: HashSet<u64> =
            dirs.iter().filter(|(_, d)| d.dist.state != DistState::Distributed).map(|(_, d)| d.ino).collect();
        let shard_of: std::collections::HashMap<u64, (&String, &DirObject)> =
            shards.iter().map(|(p, d)| (d.ino, (p, d))).collect();
        // Directories handed to their new home and not yet confirmed there: their entries
        // stay here until then (what the new home imports).
        let mut moving: HashSet<u64> = self.engine.handed_over()?.into_iter().map(|(_, d)| d.ino).collect();
        // Shards moving between storing servers: the giver's entries stay until the taker
        // has them all, and the taker's are complete once it has.
        moving.extend(self.engine.shards_moving()?.into_iter().filter(|(_, _, taken)| !taken).map(|(_, ino, _)| ino));
        let mut data = FsckData {
            dirs: dirs.iter().map(|(p, d)| (p.clone(), d.ino)).collect(),
            pending_tx: (self.engine.store().log_records(plusfs_store::LogKind::Participant).map_err(eio)?.len()
                + self.engine.store().log_records(plusfs_store::LogKind::Cx).map_err(eio)?.len()
                + moving.len()) as u64,
            shards: shards.iter().map(|(p, d)| (p.clone(), d.ino, d.incarnation)).collect(),
            distributed: dirs
                .iter()
                .filter(|(_, d)| d.dist.state == DistState::Distributed)
                .map(|(p, d)| (p.clone(), d.ino, d.incarnation, d.dist.set.clone()))
                .collect(),
            ..Default::default()
        };
        for (p, d) in dirs.iter().chain(shards.iter()) {
            data.acl_problems.extend(acl::problems(&d.xattrs, d.mode, true).into_iter().map(|e| format!("'{p}': {e}")));
            if d.ancestry.as_ref().is_some_and(|a| !a.holds(&d.search_elem())) {
                data.acl_problems.push(format!("'{p}': its ancestry lacks its own search element"));
            }
        }
        let shared = self.engine.store().all_inodes().map_err(eio)?;
        for i in &shared {
            let found = acl::problems(&i.xattrs, i.mode, false);
            data.acl_problems.extend(found.into_iter().map(|e| format!("shared inode {}: {e}", i.ino)));
        }
        data.shared = shared.iter().map(|i| (i.ino, i.nlink)).collect();
        data.pieces = shared.iter().flat_map(|i| i.pieces.iter().map(|q| (q.server, q.record))).collect();
        data.records = self.filedata.record_inventory().await?;
        for (parent, name, inode) in self.engine.store().all_entries().map_err(eio)? {
            data.pieces.extend(inode.pieces.iter().map(|q| (q.server, q.record)));
            if let Some(home) = inode.link_home {
                data.links.push((inode.ino, home));
            } else if inode.kind != FileKind::Dir {
                let found = acl::problems(&inode.xattrs, inode.mode, false);
                data.acl_problems
                    .extend(found.into_iter().map(|e| format!("entry '{name}' of directory inode {parent}: {e}")));
            }
            if moving.contains(&parent) {
                continue;
            }
            if let Some((path, shard)) = shard_of.get(&parent) {
                let set = &shard.dist.set;
                if set.get(plusfs_proto::hugedir::slot_of(&name, set.len())) != Some(&self.engine.id()) {
                    data.misplaced.push(((*path).clone(), name.clone()));
                }
            } else if !local.contains(&parent) {
                data.orphans.push((parent, name));
                continue;
            }
            if inode.kind == FileKind::Dir {
                data.subdirs.push((parent, name, inode.ino));
            }
        }
        Ok(Reply::Fsck(data))
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::attrs::NewNode;
    use crate::engine::call::Call;
    use crate::engine::host::Via;
    use crate::testkit::{root, Kit};
    use plusfs_proto::{Cred, Errno, FileKind, Reply};
    use plusfs_store::mem::Faults;

    async fn create(kit: &Kit, p: &str, c: &Call) -> plusfs_proto::Response {
        let node = NewNode { target: None, rdev: 0, access: 0 };
        kit.osd
            .namespace
            .create(p, FileKind::File, 0o644, (c.uid, c.gid), true, node, Via::Home, c)
            .await
            .map_err(plusfs_proto::WireError::from)
    }

    #[tokio::test]
    async fn create_stat_and_unlink_on_one_server() {
        let kit = Kit::new().await;
        create(&kit, "/f", &root()).await.unwrap();
        let ns = &kit.osd.namespace;
        assert!(matches!(ns.stat("/f", Via::Home, &root()).await.unwrap(), Reply::Attr(a) if a.size == 0));
        assert_eq!(create(&kit, "/f", &root()).await.unwrap_err().errno, Errno::EEXIST);
        ns.unlink("/f", Via::Home, &root()).await.unwrap();
        let e = ns.stat("/f", Via::Home, &root()).await.unwrap_err();
        assert_eq!(e.errno(), Errno::ENOENT);
        assert!(e.message().contains("/f"), "the error names the path: {e}");
        assert_eq!(kit.osd.engine.dir_object("/").unwrap().entries, 0);
    }

    #[tokio::test]
    async fn a_user_cannot_create_in_a_directory_it_may_not_write() {
        let kit = Kit::new().await;
        let e = create(&kit, "/mine", &Call::new(Cred::new(1000, 1000, Vec::new()))).await.unwrap_err();
        assert_eq!(e.errno, Errno::EACCES, "{e}");
    }

    #[tokio::test]
    async fn a_full_disk_fails_a_create_and_keeps_nothing() {
        let kit = Kit::new().await;
        kit.store.inject(Faults { fail_from: Some(0), no_space: true });
        let e = create(&kit, "/g", &root()).await.unwrap_err();
        assert_eq!(e.errno, Errno::ENOSPC, "{e}");
        kit.store.inject(Faults::default());
        let kit = kit.crash_and_restart().await;
        let e = kit.osd.namespace.stat("/g", Via::Home, &root()).await.unwrap_err();
        assert_eq!(e.errno(), Errno::ENOENT);
        assert_eq!(kit.osd.engine.dir_object("/").unwrap().entries, 0);
    }
}
