//! Replaying a delegation flush: the operations in order over the directory's entries,
//! with the same permission rules as single requests, file contents in one data append
//! (as `BatchWrite`), and everything in the caller's one store batch.

use super::Delegations;
use crate::engine::errors::{err, OpResult};
use crate::engine::host::Host;
use crate::engine::perm;
use plusfs_proto::filedata::records;
use plusfs_proto::path::check_name;
use plusfs_proto::{apply_set_at, Cred, DelegOp, Errno, FileKind, Inode, Piece, ServerId, SetAttr, Timespec};
use plusfs_store::Batch;
use std::collections::HashMap;
use std::sync::Arc;

/// The directory's entries as the replay changes them (`None`: removed).
struct Overlay<'a> {
    osd: &'a Delegations,
    dir_ino: u64,
    entries: HashMap<String, Option<Inode>>,
}

impl Overlay<'_> {
    fn get(&mut self, name: &str) -> OpResult<Option<Inode>> {
        if let Some(e) = self.entries.get(name) {
            return Ok(e.clone());
        }
        let e = self.osd.engine.store().get_entry(self.dir_ino, name).map_err(crate::engine::errors::eio)?;
        self.entries.insert(name.to_string(), e.clone());
        Ok(e)
    }

    /// A plain (non-directory, not hard-linked) entry: what delegated work may change.
    fn plain(&mut self, name: &str) -> Result<Inode, Errno> {
        match self.get(name).map_err(|e| e.errno())? {
            None => Err(Errno::ENOENT),
            Some(e) if e.kind == FileKind::Dir => Err(Errno::EISDIR),
            Some(e) if e.link_home.is_some() => Err(Errno::EXDEV),
            Some(e) => Ok(e),
        }
    }
}

/// The non-empty contents an operation carries.
fn contents(op: &DelegOp) -> Option<&[u8]> {
    match op {
        DelegOp::Contents { data, .. } if !data.is_empty() => Some(data),
        _ => None,
    }
}

/// What a replay leaves to do after its batch commits.
pub(super) type Replayed = (Vec<(u32, Errno)>, Vec<(ServerId, u64)>);

impl Delegations {
    /// Replays `ops` over `dir` (`host`), adding the changes to `b`. Returns the refused
    /// operations and the remote records no longer used.
    /// `shard`: the delegation is of this server's shard of a distributed directory;
    /// `lease`: its inode numbers (new entries take theirs from it, contents go only to
    /// files created under it).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn apply_deleg_ops(
        self: &Arc<Self>,
        dir: &str,
        host: &mut Host,
        (shard, lease): (bool, &mut super::table::Lease),
        creds: &[Cred],
        ops: Vec<DelegOp>,
        b: &mut Batch,
    ) -> OpResult<Replayed> {
        let small = self.engine.map().data.small_file_bytes;
        let (ops, extents) = self.append_contents(ops, small).await?;
        let mut extents = extents.into_iter();
        let mut ov = Overlay { osd: self, dir_ino: host.obj.ino, entries: HashMap::new() };
        let (mut failed, mut gone) = (Vec::new(), std::collections::BTreeSet::new());
        for (i, op) in ops.iter().enumerate() {
            let by = |k: u32| creds.get(k as usize).ok_or(Errno::EINVAL);
            let r = match op {
                DelegOp::Contents { name, data, mtime, ctime } if !data.is_empty() => {
                    let extent = extents.next().ok_or_else(|| err(Errno::EIO, "fewer extents than contents"))?;
                    let times = (*mtime, *ctime);
                    let new = (data.len() as u64, Some(extent));
                    self.replay_contents(&mut ov, name, new, times, lease, b, &mut gone).await
                }
                DelegOp::Contents { name, mtime, ctime, .. } => {
                    self.replay_contents(&mut ov, name, (0, None), (*mtime, *ctime), lease, b, &mut gone).await
                }
                DelegOp::Touch { time } => {
                    (host.obj.mtime, host.obj.ctime) = (*time, *time);
                    Ok(())
                }
                DelegOp::DirAttr { set, time, by: k } => match by(*k) {
                    Ok(c) => replay_dir_attr(host, dir, c, set, *time, shard),
                    Err(e) => Err(e),
                },
                op => match op_cred(op).map(by).transpose() {
                    Ok(c) => replay_namespace(&mut ov, (host, dir), c, op, (small, &mut *lease), &mut gone),
                    Err(e) => Err(e),
                },
            };
            if let Err(e) = r {
                failed.push((i as u32, e));
            }
        }
        for (name, e) in ov.entries {
            match e {
                Some(inode) => b.put_entry(host.obj.ino, &name, &inode),
                None => b.del_entry(host.obj.ino, &name),
            }
        }
        let remote = self.engine.drop_unused(&gone, &Default::default(), b)?;
        Ok((failed, remote))
    }

    /// Appends the non-empty contents of `ops` to the data store in one append (the
    /// operations go to the blocking task and come back, so their data is not copied);
    /// `ops` and the contents' extents, in order.
    async fn append_contents(
        &self,
        ops: Vec<DelegOp>,
        small: u64,
    ) -> OpResult<(Vec<DelegOp>, Vec<plusfs_data::Extent>)> {
        let sizes: Vec<usize> = ops.iter().filter_map(contents).map(<[u8]>::len).collect();
        if sizes.is_empty() {
            return Ok((ops, Vec::new()));
        }
        if sizes.iter().any(|n| *n as u64 > small) {
            return Err(err(Errno::EFBIG, "delegated contents larger than a small file"));
        }
        let data = self.engine.data().clone();
        crate::filedata::blocking(move || {
            let recs: Vec<(u64, &[u8])> = ops.iter().filter_map(contents).map(|d| (0, d)).collect();
            let extents = data.append_records(&recs)?;
            Ok((ops, extents))
        })
        .await
    }

    /// `Contents`: file `name`, created under the delegation (`lease`), now holds `len`
    /// bytes at `extent`.
    #[allow(clippy::too_many_arguments)]
    async fn replay_contents(
        &self,
        ov: &mut Overlay<'_>,
        name: &str,
        (len, extent): (u64, Option<plusfs_data::Extent>),
        (mtime, ctime): (Timespec, Timespec),
        lease: &super::table::Lease,
        b: &mut Batch,
        gone: &mut std::collections::BTreeSet<(ServerId, u64)>,
    ) -> Result<(), Errno> {
        let mut e = ov.plain(name)?;
        if e.kind != FileKind::File {
            return Err(Errno::EINVAL);
        }
        if !lease.holds(e.ino) {
            // A holder writes whole contents only of files it created under the
            // delegation; any other file's bytes go through `Write`, checked as its caller.
            return Err(Errno::EPERM);
        }
        gone.extend(records(&e.pieces));
        e.pieces.clear();
        if let Some(extent) = extent {
            let id = self.engine.index_record(extent, e.ino, b).await.map_err(|e| e.errno())?;
            e.pieces.push(Piece { file_off: 0, len, server: self.engine.id(), record: id, skip: 0 });
        }
        e.size = len;
        (e.mtime, e.ctime) = (mtime, ctime);
        ov.entries.insert(name.to_string(), Some(e));
        Ok(())
    }
}

/// The credential index an operation names.
fn op_cred(op: &DelegOp) -> Option<u32> {
    match op {
        DelegOp::Create { by, .. }
        | DelegOp::SetAttr { by, .. }
        | DelegOp::Unlink { by, .. }
        | DelegOp::Rename { by, .. } => Some(*by),
        DelegOp::Contents { .. } | DelegOp::Touch { .. } | DelegOp::DirAttr { .. } => None,
    }
}

/// Replays `setattr` of the delegated directory itself by `c` at `time`, with the checks
/// of `DirSetAttr`; refused (EINVAL) for a shard, or for a change that must reach other
/// servers, which a client never queues.
fn replay_dir_attr(
    host: &mut Host,
    dir: &str,
    c: &Cred,
    set: &SetAttr,
    time: Timespec,
    shard: bool,
) -> Result<(), Errno> {
    if shard || set.size.is_some() {
        return Err(Errno::EINVAL);
    }
    perm::check_search_above(c, &host.obj, dir).map_err(errno_of)?;
    let set = perm::check_setattr(c, &perm::Owned::of_dir(&host.obj), set, dir).map_err(errno_of)?;
    let n = host.obj.with_set(&set, time);
    if !host.obj.change_stays_here(&n) {
        return Err(Errno::EINVAL);
    }
    host.obj = n;
    Ok(())
}

/// Replays one namespace operation (not contents) by caller `c`, new entries taking their
/// inode numbers from `lease`.
fn replay_namespace(
    ov: &mut Overlay<'_>,
    (host, dir): (&mut Host, &str),
    c: Option<&Cred>,
    op: &DelegOp,
    (small, lease): (u64, &mut super::table::Lease),
    gone: &mut std::collections::BTreeSet<(ServerId, u64)>,
) -> Result<(), Errno> {
    let c = c.ok_or(Errno::EINVAL)?;
    match op {
        DelegOp::Create { name, ino, kind, mode, uid, gid, rdev, target, time, .. } => {
            check_name(name).map_err(|x| x.errno)?;
            if *kind == FileKind::Dir {
                return Err(Errno::EINVAL);
            }
            if ov.get(name).map_err(errno_of)?.is_some() {
                return Err(Errno::EEXIST);
            }
            perm::check_dir_write(c, &host.obj, dir).map_err(errno_of)?;
            perm::check_mknod(c, *kind, name).map_err(errno_of)?;
            if !lease.take(*ino) {
                return Err(Errno::EINVAL); // not a number of this delegation, or used
            }
            let (uid, gid, mode) = perm::new_owner(c, host.obj.mode, host.obj.gid, (*uid, *gid), *mode, false);
            let size = target.as_ref().map_or(0, |t| t.len() as u64);
            let rdev = if matches!(kind, FileKind::BlockDev | FileKind::CharDev) { *rdev } else { 0 };
            // What a default ACL of the directory gives (the holder derived the same mode
            // and ACL with `perm::new_entry`, its umask already in `mode`); symbolic links
            // take none.
            let (mode, acls) = match kind {
                FileKind::Symlink => (mode, Vec::new()),
                _ => plusfs_proto::acl::on_create(host.obj.default_acl().as_ref(), mode, 0, false),
            };
            let mut inode = Inode { size, target: target.clone(), rdev, ..Inode::new(*ino, *kind, mode, uid, gid) };
            inode.xattrs = acls;
            (inode.atime, inode.mtime, inode.ctime) = (*time, *time, *time);
            host.obj.count_entry(*kind, 1, *time);
            ov.entries.insert(name.clone(), Some(inode));
        }
        DelegOp::SetAttr { name, set, time, .. } => {
            let mut i = ov.plain(name)?;
            let set = perm::check_setattr(c, &perm::Owned::of_inode(&i), set, name).map_err(errno_of)?;
            if set.size.is_some_and(|s| s > small) {
                return Err(Errno::EFBIG);
            }
            apply_set_at(
                &set,
                *time,
                (&mut i.mode, &mut i.uid, &mut i.gid),
                (&mut i.atime, &mut i.mtime, &mut i.ctime),
            );
            if let Some(m) = set.mode {
                plusfs_proto::acl::chmod_xattrs(&mut i.xattrs, m);
            }
            ov.entries.insert(name.clone(), Some(i));
        }
        DelegOp::Unlink { name, time, .. } => {
            let i = ov.plain(name)?;
            perm::check_dir_write(c, &host.obj, dir).map_err(errno_of)?;
            perm::check_sticky(c, &host.obj, i.uid, name).map_err(errno_of)?;
            gone.extend(records(&i.pieces));
            host.obj.count_entry(i.kind, -1, *time);
            ov.entries.insert(name.clone(), None);
        }
        DelegOp::Rename { from, to, time, .. } => {
            check_name(to).map_err(|x| x.errno)?;
            let mut i = ov.plain(from)?;
            perm::check_dir_write(c, &host.obj, dir).map_err(errno_of)?;
            perm::check_sticky(c, &host.obj, i.uid, from).map_err(errno_of)?;
            if from == to {
                return Ok(());
            }
            if let Some(old) = ov.get(to).map_err(errno_of)? {
                let old = ov.plain(to).map(|_| old)?;
                perm::check_sticky(c, &host.obj, old.uid, to).map_err(errno_of)?;
                gone.extend(records(&old.pieces));
                host.obj.count_entry(old.kind, -1, *time);
            }
            i.ctime = *time;
            (host.obj.mtime, host.obj.ctime) = (*time, *time);
            ov.entries.insert(from.clone(), None);
            ov.entries.insert(to.clone(), Some(i));
        }
        DelegOp::Contents { .. } | DelegOp::Touch { .. } | DelegOp::DirAttr { .. } => return Err(Errno::EINVAL),
    }
    Ok(())
}

/// The errno of an operation's or a permission check's error.
fn errno_of(e: impl Into<crate::engine::errors::OpError>) -> Errno {
    e.into().errno()
}
