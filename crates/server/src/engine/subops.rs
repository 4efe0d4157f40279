//! Sub-operations: the units every cross-server protocol (two-phase commit, Cx, serial)
//! is made of. Checking one takes its busy locks and reads; applying one adds its effects to
//! a store batch. Neither touches the network.

use super::attrs::count_entry;
use super::errors::{check_dir_path, eio, err, OpResult};
use super::host::Via;
use super::locks::Scope;
use super::perm;
use super::Engine;
use crate::engine::errors::OpError;
use plusfs_proto::path::rebase;
use plusfs_proto::WireError;
use plusfs_proto::{
    Ancestry, CommitPayload, Cred, DirDump, DirObject, DistState, Errno, FileKind, Ino, Inode, Replace, SearchElem,
    ServerId, SubOp, Timespec, TxId, MAY_WRITE,
};
use plusfs_store::Batch;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A participant's log record: what it prepared and what it locked.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub(crate) struct Prepared {
    pub(crate) ops: Vec<SubOp>,
    pub(crate) locks: Vec<(String, Scope)>,
    /// Objects exported by `ExportSubtree`: (path, inode number).
    pub(crate) exported: Vec<(String, Ino)>,
    /// Shards at or below the `ExportSubtree` root: re-keyed under the new root at commit.
    pub(crate) reshards: Vec<String>,
}

impl crate::engine::logrec::Logged for Prepared {
    const KIND: plusfs_store::LogKind = plusfs_store::LogKind::Participant;
    const WHAT: &'static str = "prepare record";
    const VERSION: u8 = 3;
    fn upgrade(version: u8, body: &[u8]) -> Result<Self, crate::engine::logrec::RecordError> {
        crate::engine::logrec::older_ancestries(version, body, Self::VERSION)
    }
}

/// The ancestry of an object moved from under one parent to another: `anc` is (old
/// parent's, new parent's), `None` when either has none (the object then has none).
pub(crate) fn rebase_ancestry(own: Option<Ancestry>, anc: Option<&(Ancestry, Ancestry)>) -> Option<Ancestry> {
    match (own, anc) {
        (Some(a), Some((from, to))) => Some(a.rebase(from, to)),
        _ => None,
    }
}

/// The inode an `InsertEntry` of `dir/name` writes: a moved file's inode as its old entry
/// holds it at the vote (`payload`), with the rename's change time, else `inode` itself
/// (a directory, or a coordinator of an earlier build that sends none).
fn moved_inode<'a>(payload: &CommitPayload, dir: &str, name: &str, inode: &'a Inode) -> std::borrow::Cow<'a, Inode> {
    let now = payload.swap_in.iter().find(|(d, n, i)| d == dir && n == name && i.ino == inode.ino);
    match now {
        Some((_, _, now)) if inode.kind != FileKind::Dir => {
            std::borrow::Cow::Owned(Inode { ctime: inode.ctime, ..now.clone() })
        }
        _ => std::borrow::Cow::Borrowed(inode),
    }
}

impl Engine {
    /// Directory locks a list of sub-operations needs (ExportSubtree adds its objects).
    pub(crate) fn subop_locks(ops: &[SubOp]) -> Vec<(String, Scope)> {
        ops.iter()
            .flat_map(|o| match o {
                SubOp::InsertEntry { dir, name, .. }
                | SubOp::RemoveEntry { dir, name, .. }
                | SubOp::ExchangeEntry { dir, name, .. } => vec![(dir.clone(), Scope::Name(name.clone()))],
                SubOp::CreateDir { path, .. } | SubOp::RemoveDir { path, .. } | SubOp::RemoveShard { path, .. } => {
                    vec![(path.clone(), Scope::Whole)]
                }
                // The entry, and the shared inode it is about to become.
                SubOp::ShareInode { dir, name, ino, .. } => {
                    vec![(dir.clone(), Scope::Name(name.clone())), crate::engine::links::inode_lock(*ino)]
                }
                SubOp::AdjustLinks { ino, .. } => vec![crate::engine::links::inode_lock(*ino)],
                // The destination of a moved subtree: until the decision arrives, requests on
                // it wait (its objects come with the commit payload). And the moved root on
                // every server: a shard arriving below it after the scan (a redistribution's
                // import) waits for the decision, not to be left at the old path.
                SubOp::ExportSubtree { root, new_root, .. } => {
                    vec![(new_root.clone(), Scope::Whole), (root.clone(), Scope::Whole)]
                }
                // The directory (its objects below come from the scan) and its entry.
                // The quota table (one change at a time), and a tree quota's root.
                SubOp::SetQuota { def, .. } => {
                    let mut l = vec![("#quota-table".to_string(), Scope::Whole)];
                    l.extend(def.path.iter().map(|root| (root.clone(), Scope::Whole)));
                    l
                }
                SubOp::Reancestry { root, .. } | SubOp::ReancestryAcl { root, .. } => {
                    let mut l = vec![(root.clone(), Scope::Whole)];
                    if let Some((dir, name)) = plusfs_proto::path::split(root) {
                        l.push((dir.to_string(), Scope::Name(name.to_string())));
                    }
                    l
                }
            })
            .collect()
    }

    /// A directory at or below `root` this server has handed to its new home without the
    /// new home having confirmed it (a transaction over the subtree waits for it).
    /// Shards of distributed directories count too: one this server hands over, or is
    /// to take, from a drained storing server.
    fn handed_over_within(&self, root: &str) -> OpResult<Option<String>> {
        let shards = self.shards_moving()?.into_iter().filter(|(_, _, taken)| !taken).map(|(p, _, _)| p);
        Ok(self
            .handed_over()?
            .into_iter()
            .map(|(p, _)| p)
            .chain(shards)
            .find(|p| plusfs_proto::path::is_within(p, root)))
    }

    /// Shards moving to or from this server: (path, inode, whether this server has taken
    /// it), from the shard-move records (not the forwarding addresses of shards gone).
    pub(crate) fn shards_moving(&self) -> OpResult<Vec<(String, u64, bool)>> {
        use crate::engine::logrec::{MoveStage, ShardMove};
        // As for the outbox: a record that cannot be read is skipped and logged.
        let mut out = Vec::new();
        for (key, raw) in self.store.log_records(plusfs_store::LogKind::ShardMove).map_err(eio)? {
            match crate::engine::logrec::decode::<ShardMove>(key, &raw) {
                Ok(r) => match r.stage {
                    MoveStage::Gone => {}
                    MoveStage::Taken => out.push((r.path, r.ino, true)),
                    MoveStage::Expected | MoveStage::Out(_) => out.push((r.path, r.ino, false)),
                },
                Err(e) => tracing::error!(cause = %e, "a shard move record cannot be read; skipped"),
            }
        }
        Ok(out)
    }

    /// The directory objects this server handed to their new home and keeps until the new
    /// home confirms them (the migration outbox: path and object).
    pub(crate) fn handed_over(&self) -> OpResult<Vec<(String, plusfs_proto::DirObject)>> {
        // One record that cannot be read is skipped (and logged), not made an error of
        // every subtree operation, fsck and the walker.
        let mut out = Vec::new();
        for (key, raw) in self.store.log_records(plusfs_store::LogKind::Outbox).map_err(eio)? {
            match crate::engine::logrec::decode::<crate::engine::logrec::Outbox>(key, &raw) {
                Ok(r) => out.push((r.path, r.object)),
                Err(e) => tracing::error!(cause = %e, "an outbox record cannot be read; skipped"),
            }
        }
        Ok(out)
    }

    /// Locks and checks `ops` for caller `c`. Returns the held busy locks and the prepared
    /// record; the transactions waited for are added to `blockers`.
    pub(crate) async fn check_subops(
        &self,
        txid: TxId,
        ops: &[SubOp],
        wait_tx: bool,
        blockers: &mut Vec<TxId>,
        c: &Cred,
    ) -> OpResult<(crate::engine::locks::Guard, Prepared)> {
        // A subtree every object of which is locked: exported, or re-ancestried.
        let (export_root, exporting) = match ops.iter().find_map(|o| match o {
            SubOp::ExportSubtree { root, .. } => Some((root.clone(), true)),
            SubOp::Reancestry { root, .. } | SubOp::ReancestryAcl { root, .. } => Some((root.clone(), false)),
            SubOp::SetQuota { def, .. } => def.path.clone().map(|root| (root, false)),
            _ => None,
        }) {
            Some((root, exporting)) => (Some(root), exporting),
            None => (None, false),
        };
        let shards_within = |root: &str| -> OpResult<Vec<String>> {
            Ok(self.store.shards_within(root).map_err(eio)?.into_iter().map(|(p, _)| p).collect())
        };
        loop {
            let mut locks = Self::subop_locks(ops);
            let mut exported = Vec::new();
            let mut reshards = Vec::new();
            if let Some(root) = &export_root {
                check_dir_path(root)?;
                exported = self.store.dirs_within(root).map_err(eio)?.into_iter().map(|(p, d)| (p, d.ino)).collect();
                reshards = shards_within(root)?;
                locks.extend(exported.iter().map(|(p, _)| (p.clone(), Scope::Whole)));
                locks.extend(reshards.iter().map(|p| (p.clone(), Scope::Whole)));
            }
            let guard = self
                .locks
                .lock_noting(&locks, Some(txid), wait_tx, blockers)
                .await
                .map_err(|c| OpError::Conflict(format!("conflicts with transaction {}", c.0)))?;
            if let Some(root) = &export_root {
                if let Some(t) = self.locks.tx_locked_within(root, txid) {
                    return Err(OpError::Conflict(format!("conflicts with transaction {t}")));
                }
                let again: Vec<(String, Ino)> =
                    self.store.dirs_within(root).map_err(eio)?.into_iter().map(|(p, d)| (p, d.ino)).collect();
                if again != exported || shards_within(root)? != reshards {
                    continue; // an object appeared or vanished between scan and lock
                }
                if let Some(p) = self.handed_over_within(root)? {
                    return Err(OpError::Moved(format!("'{p}' is moving to its new home")));
                }
                if let Some((p, d)) = self
                    .store
                    .dirs_within(root)
                    .map_err(eio)?
                    .into_iter()
                    .find(|(_, d)| d.dist.state == DistState::Distributing)
                {
                    return Err(self.being_distributed(&p, &d));
                }
                if !exporting {
                    // Re-ancestry also rewrites the root's entry (its owner) in its parent.
                    if let Some(parent) = plusfs_proto::path::split(root).map(|(dir, _)| dir) {
                        if let Some(d) = self.store.get_dir(parent).map_err(eio)? {
                            if d.dist.state == DistState::Distributing {
                                return Err(self.being_distributed(parent, &d));
                            }
                        }
                    }
                }
            }
            for op in ops {
                self.check_subop(op)?;
                self.check_subop_perm(op, c)?;
            }
            if !exporting {
                (exported, reshards) = (Vec::new(), Vec::new());
            }
            return Ok((guard, Prepared { ops: ops.to_vec(), locks, exported, reshards }));
        }
    }

    /// The object holding the entries of `dir` that a sub-operation names.
    pub(crate) fn sub_host(&self, dir: &str, shard: Option<u64>) -> OpResult<crate::engine::host::Host> {
        self.host(dir, shard.map_or(Via::Home, Via::Shard))
    }

    pub(crate) fn check_subop(&self, op: &SubOp) -> OpResult<()> {
        match op {
            SubOp::InsertEntry { dir, name, inode, replace, shard } => {
                let p = plusfs_proto::path::join(dir, name);
                let d = self.sub_host(dir, *shard)?.obj;
                match (self.store.get_entry(d.ino, name).map_err(eio)?, replace) {
                    (None, _) => Ok(()),
                    (Some(_), Replace::Never) => Err(err(Errno::EEXIST, format!("'{p}' exists"))),
                    (Some(e), Replace::NonDir) if e.kind == FileKind::Dir => {
                        Err(err(Errno::EISDIR, format!("'{p}' is a directory")))
                    }
                    (Some(e), Replace::Dir(_)) if e.kind != FileKind::Dir => {
                        Err(err(Errno::ENOTDIR, format!("'{p}' is not a directory")))
                    }
                    (Some(e), Replace::Dir(ino)) if e.ino != *ino => {
                        Err(OpError::Conflict(format!("'{p}' changed during the operation")))
                    }
                    // A hard link goes only with one of its links (the coordinator retries).
                    (Some(e), Replace::NonDir) if e.link_home.is_some() => {
                        Err(WireError::replaced_link(&p, e.ino, e.link_home.expect("a link")).into())
                    }
                    (Some(e), Replace::Link(ino)) if e.ino != *ino || e.link_home.is_none() => {
                        Err(OpError::Conflict(format!("'{p}' changed during the operation")))
                    }
                    (Some(e), _) if e.ino == inode.ino => Err(OpError::Conflict(format!("'{p}' is being moved"))),
                    _ => Ok(()),
                }
            }
            SubOp::RemoveEntry { dir, name, ino, shard } => {
                let p = plusfs_proto::path::join(dir, name);
                let e = self.entry(&self.sub_host(dir, *shard)?.obj, &p, name)?;
                if *ino == 0 {
                    // From a client (Cx, serial rmdir): any directory of that name.
                    return match e.kind {
                        FileKind::Dir => Ok(()),
                        _ => Err(err(Errno::ENOTDIR, format!("'{p}' is not a directory"))),
                    };
                }
                if e.ino != *ino {
                    return Err(OpError::Conflict(format!("'{p}' changed during the operation")));
                }
                Ok(())
            }
            SubOp::CreateDir { path, .. } => match self.store.get_dir(path).map_err(eio)? {
                Some(_) => Err(err(Errno::EEXIST, format!("directory object '{path}' exists"))),
                None => Ok(()),
            },
            SubOp::RemoveDir { path, ino, shards } => {
                let d = self.store.get_dir(path).map_err(eio)?;
                match d {
                    Some(d) if *ino != 0 && d.ino != *ino => {
                        Err(OpError::Conflict(format!("'{path}' changed during the operation")))
                    }
                    Some(d) if d.dist.state == DistState::Distributing => Err(self.being_distributed(path, &d)),
                    // Its shards must be removed by the same transaction.
                    Some(d) if d.dist.state == DistState::Distributed && d.dist.set != *shards => {
                        Err(OpError::Redirect(Box::new(self.dist_info(path, &d))))
                    }
                    Some(d) if d.entries > 0 => Err(err(Errno::ENOTEMPTY, format!("'{path}' is not empty"))),
                    Some(_) => Ok(()),
                    // The client tells ENOENT from ENOTDIR (a file of that name) by looking.
                    None => Err(OpError::MissingDir((path).to_string())),
                }
            }
            SubOp::RemoveShard { path, ino } => match self.store.get_shard(path).map_err(eio)? {
                Some(s) if s.ino != *ino => Err(OpError::Conflict(format!("'{path}' changed during the operation"))),
                Some(s) if s.entries > 0 => Err(err(Errno::ENOTEMPTY, format!("'{path}' is not empty"))),
                Some(_) => Ok(()),
                None => Err(err(Errno::ENOENT, format!("no shard of '{path}' here"))),
            },
            SubOp::ShareInode { dir, name, ino, shard } => self.check_share(dir, name, *ino, *shard),
            SubOp::AdjustLinks { ino, delta } => self.check_adjust(*ino, *delta),
            SubOp::ExchangeEntry { dir, name, shard } => {
                let p = plusfs_proto::path::join(dir, name);
                match self.entry(&self.sub_host(dir, *shard)?.obj, &p, name)?.kind {
                    FileKind::Dir => Err(err(Errno::EINVAL, format!("'{p}' is a directory; only files are exchanged"))),
                    _ => Ok(()),
                }
            }
            SubOp::ExportSubtree { .. } => Ok(()),
            // The directory must still have the search element the change replaces.
            SubOp::Reancestry { root, old, .. } => self.check_unchanged(root, &SearchElem::Mode(*old)),
            SubOp::ReancestryAcl { root, old, .. } => self.check_unchanged(root, old),
            // The tree's root must still be the directory the quota was set on.
            SubOp::SetQuota { def, .. } => match (&def.path, def.owner) {
                (Some(root), plusfs_proto::quota::Owner::Tree(ino)) => match self.store.get_dir(root).map_err(eio)? {
                    Some(d) if d.ino != ino => Err(OpError::Conflict(format!("'{root}' changed during the operation"))),
                    _ => Ok(()),
                },
                _ => Ok(()),
            },
        }
    }

    /// Checks caller `c`'s permissions for `op` (root and peers pass): search and write on
    /// the directories whose entries change, the sticky rule for entries removed or
    /// replaced, write on a directory moved to another parent.
    pub(crate) fn check_subop_perm(&self, op: &SubOp, c: &Cred) -> OpResult<()> {
        if c.is_root() {
            return Ok(());
        }
        match op {
            SubOp::InsertEntry { dir, name, shard, .. } | SubOp::RemoveEntry { dir, name, shard, .. } => {
                let d = self.sub_host(dir, *shard)?.obj;
                perm::check_dir_write(c, &d, dir)?;
                match self.store.get_entry(d.ino, name).map_err(eio)? {
                    // A hard link's owner is with its inode: the operation's server checks it.
                    Some(e) if e.link_home.is_none() => {
                        perm::check_sticky(c, &d, e.uid, &plusfs_proto::path::join(dir, name)).map_err(OpError::from)
                    }
                    _ => Ok(()),
                }
            }
            SubOp::ExchangeEntry { dir, name, shard } => {
                let d = self.sub_host(dir, *shard)?.obj;
                perm::check_dir_write(c, &d, dir)?;
                let p = plusfs_proto::path::join(dir, name);
                match self.entry(&d, &p, name)? {
                    e if e.link_home.is_none() => perm::check_sticky(c, &d, e.uid, &p).map_err(OpError::from),
                    // A hard link: its owner is with its inode (not checked here).
                    _ => Ok(()),
                }
            }
            SubOp::ShareInode { dir, shard, .. } => Ok(perm::check_search(c, &self.sub_host(dir, *shard)?.obj, dir)?),
            SubOp::ExportSubtree { root, new_root, .. } => {
                let moved =
                    plusfs_proto::path::split(root).map(|x| x.0) != plusfs_proto::path::split(new_root).map(|x| x.0);
                match self.store.get_dir(root).map_err(eio)? {
                    // Linux: moving a directory to another parent rewrites its "..".
                    Some(d) if moved => perm::check_dir(c, &d, MAY_WRITE, root).map_err(OpError::from),
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    pub(crate) fn dump(&self, exported: &[(String, Ino)]) -> OpResult<Vec<DirDump>> {
        exported
            .iter()
            .map(|(path, _)| {
                let object = self.dir_object(path)?;
                // A distributed directory's entries stay in its shards: only its object moves.
                let entries = match object.dist.state {
                    DistState::Distributed => Vec::new(),
                    _ => self.store.list_entries(object.ino, None, usize::MAX).map_err(eio)?,
                };
                Ok(DirDump { path: path.clone(), object, entries })
            })
            .collect()
    }

    /// The store batch that applies prepared sub-operations: removals first, then inserts
    /// and imports, so a replaced directory's object is deleted before its successor lands.
    /// Also returns the other servers' data records that files removed here no longer use
    /// (to drop once the batch is written).
    pub(crate) fn commit_batch(
        &self,
        p: &Prepared,
        payload: &CommitPayload,
    ) -> OpResult<(Batch, Vec<(ServerId, u64)>)> {
        let mut remote = Vec::new();
        // Changed entry holders, keyed by (path, is a shard).
        let mut hosts: BTreeMap<(String, bool), DirObject> = BTreeMap::new();
        let mut b = Batch::new();
        let load = |hosts: &mut BTreeMap<(String, bool), DirObject>,
                    path: &str,
                    shard: Option<u64>|
         -> OpResult<(String, bool)> {
            let key = (path.to_string(), shard.is_some());
            if !hosts.contains_key(&key) {
                let obj = match shard {
                    Some(_) => self
                        .store
                        .get_shard(path)
                        .map_err(eio)?
                        .ok_or_else(|| OpError::MissingDir((path).to_string()))?,
                    None => self.dir_object(path)?,
                };
                hosts.insert(key.clone(), obj);
            }
            Ok(key)
        };
        let export_roots = p.ops.iter().find_map(|o| match o {
            SubOp::ExportSubtree { root, new_root, rebase } => Some((root.clone(), new_root.clone(), rebase.clone())),
            _ => None,
        });
        for op in &p.ops {
            match op {
                SubOp::RemoveEntry { dir, name, shard, .. } => {
                    let key = load(&mut hosts, dir, *shard)?;
                    let d = hosts.get_mut(&key).expect("loaded");
                    if let Some(e) = self.store.get_entry(d.ino, name).map_err(eio)? {
                        count_entry(d, e.kind, -1);
                        b.del_entry(d.ino, name);
                    }
                }
                SubOp::RemoveDir { path, .. } => b.del_dir(path),
                SubOp::RemoveShard { path, .. } => b.del_shard(path),
                SubOp::AdjustLinks { ino, delta } => remote.extend(self.commit_adjust(*ino, *delta, &mut b)?),
                _ => {}
            }
        }
        for (path, ino) in &p.exported {
            let distributed =
                self.store.get_dir(path).map_err(eio)?.is_some_and(|d| d.dist.state == DistState::Distributed);
            b.del_dir(path);
            if !distributed {
                for (name, _) in self.store.list_entries(*ino, None, usize::MAX).map_err(eio)? {
                    b.del_entry(*ino, &name);
                }
            }
        }
        if let Some((root, new_root, anc)) = &export_roots {
            // Shards move by key only; their entries are keyed by inode and stay.
            for path in &p.reshards {
                if let Some(mut shard) = self.store.get_shard(path).map_err(eio)? {
                    shard.ancestry = rebase_ancestry(shard.ancestry, anc.as_ref());
                    b.del_shard(path);
                    b.put_shard(&rebase(path, root, new_root), &shard);
                }
            }
        }
        for op in &p.ops {
            match op {
                SubOp::Reancestry { root, old, new, mode, uid, gid } => {
                    let elems = (SearchElem::Mode(*old), SearchElem::Mode(*new));
                    self.commit_reancestry(root, elems, (*mode, *uid, *gid), None, &mut b)?;
                }
                SubOp::ReancestryAcl { root, old, new, mode, uid, gid, acls, .. } => {
                    let elems = (old.clone(), new.clone());
                    self.commit_reancestry(root, elems, (*mode, *uid, *gid), Some(acls), &mut b)?;
                }
                SubOp::SetQuota { def, remove } => self.commit_set_quota(def, *remove, &mut b)?,
                _ => {}
            }
        }
        for op in &p.ops {
            match op {
                SubOp::InsertEntry { dir, name, inode, shard, .. } => {
                    let inode = &moved_inode(payload, dir, name, inode);
                    let key = load(&mut hosts, dir, *shard)?;
                    let d = hosts.get_mut(&key).expect("loaded");
                    match self.store.get_entry(d.ino, name).map_err(eio)? {
                        Some(old) => {
                            d.mtime = Timespec::now();
                            d.ctime = d.mtime;
                            // A file replaced by a rename: its data records go (a hard
                            // link's belong to its shared inode, which `AdjustLinks` handles).
                            if old.link_home.is_none() {
                                remote.extend(self.drop_unused(
                                    &plusfs_proto::filedata::records(&old.pieces),
                                    &plusfs_proto::filedata::records(&inode.pieces),
                                    &mut b,
                                )?);
                            }
                        }
                        None => count_entry(d, inode.kind, 1),
                    }
                    b.put_entry(d.ino, name, inode);
                }
                SubOp::CreateDir { path, object } => b.put_dir(path, object),
                SubOp::ShareInode { dir, name, shard, .. } => self.commit_share(dir, name, *shard, &mut b)?,
                SubOp::ExchangeEntry { dir, name, shard } => {
                    let Some((_, _, inode)) = payload.swap_in.iter().find(|(d, n, _)| d == dir && n == name) else {
                        return Err(err(Errno::EIO, format!("no inode to exchange into '{dir}/{name}'")));
                    };
                    let key = load(&mut hosts, dir, *shard)?;
                    let d = hosts.get_mut(&key).expect("loaded");
                    d.mtime = Timespec::now();
                    d.ctime = d.mtime;
                    let mut inode = inode.clone();
                    if inode.link_home.is_none() {
                        inode.ctime = d.mtime;
                    }
                    b.put_entry(d.ino, name, &inode);
                }
                _ => {}
            }
        }
        for dump in &payload.imports {
            b.put_dir(&dump.path, &dump.object);
            for (name, inode) in &dump.entries {
                b.put_entry(dump.object.ino, name, inode);
            }
        }
        for ((path, shard), d) in &hosts {
            if *shard {
                b.put_shard(path, d);
            } else {
                b.put_dir(path, d);
            }
        }
        Ok((b, remote))
    }

    /// The vote of a `Reancestry`: the directory must still have the search element the
    /// change replaces.
    fn check_unchanged(&self, root: &str, old: &SearchElem) -> OpResult<()> {
        match self.store.get_dir(root).map_err(eio)? {
            Some(d) if d.search_elem() != *old => {
                Err(OpError::Conflict(format!("'{root}' changed during the operation")))
            }
            _ => Ok(()),
        }
    }

    /// Applies a `Reancestry`: `root`'s objects here take the new attributes (and ACL
    /// attributes, when given), every object at or below it replaces one `old` by `new`,
    /// and `root`'s entry records the owner.
    fn commit_reancestry(
        &self,
        root: &str,
        (old, new): (SearchElem, SearchElem),
        (mode, uid, gid): (u32, u32, u32),
        acls: Option<&[(String, Vec<u8>)]>,
        b: &mut Batch,
    ) -> OpResult<()> {
        let now = Timespec::now();
        let fix = |path: &str, d: &mut DirObject| {
            if path == root {
                (d.mode, d.uid, d.gid, d.ctime) = (mode, uid, gid, now);
                if let Some(acls) = acls {
                    plusfs_proto::acl::replace_acl_xattrs(&mut d.xattrs, acls);
                }
            }
            d.ancestry = d.ancestry.take().map(|a| a.replace(old.clone(), new.clone()));
        };
        for (path, mut d) in self.store.dirs_within(root).map_err(eio)? {
            fix(&path, &mut d);
            b.put_dir(&path, &d);
        }
        for (path, mut d) in self.store.shards_within(root).map_err(eio)? {
            fix(&path, &mut d);
            b.put_shard(&path, &d);
        }
        let Some((dir, name)) = plusfs_proto::path::split(root) else { return Ok(()) };
        let host = match self.store.get_dir(dir).map_err(eio)? {
            Some(d) if d.dist.state != DistState::Distributed => Some(d),
            _ => self.store.get_shard(dir).map_err(eio)?,
        };
        if let Some(h) = host {
            if let Some(mut e) = self.store.get_entry(h.ino, name).map_err(eio)? {
                if e.kind == FileKind::Dir && e.uid != uid {
                    e.uid = uid;
                    b.put_entry(h.ino, name, &e);
                }
            }
        }
        Ok(())
    }

    /// The current inodes of the `ExchangeEntry` entries in `ops`, and of the non-directory
    /// entries a `RemoveEntry` takes away (a rename moves them): read under the prepared
    /// locks for the vote, so what the other side writes is the inode as it is now, not the
    /// copy its coordinator read before it locked anything (a write committed meanwhile
    /// would otherwise be lost, and its new data records with it).
    pub(crate) fn swap_out(&self, ops: &[SubOp]) -> OpResult<Vec<(String, String, Inode)>> {
        let mut out = Vec::new();
        for op in ops {
            let (dir, name, shard) = match op {
                SubOp::ExchangeEntry { dir, name, shard } => (dir, name, shard),
                SubOp::RemoveEntry { dir, name, ino, shard } if *ino != 0 => (dir, name, shard),
                _ => continue,
            };
            let p = plusfs_proto::path::join(dir, name);
            let e = self.entry(&self.sub_host(dir, *shard)?.obj, &p, name)?;
            if matches!(op, SubOp::ExchangeEntry { .. }) || e.kind != FileKind::Dir {
                out.push((dir.clone(), name.clone(), e));
            }
        }
        Ok(out)
    }
}
