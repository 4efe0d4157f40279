//! Directory permissions across servers: the ancestry of new directory objects made
//! from a client's sub-operations (Cx, serial), and directory `chmod`/`chown`, which
//! changes the ancestry of every directory below on every server (`SubOp::Reancestry`
//! in one two-phase commit, so it is applied exactly once everywhere and survives
//! crashes like any transaction).
//!
//! Under Cx the parent's home is usually the operation's coordinator: it pushes the
//! parent's permissions to the new directory's server (`CxPerms`) as it starts executing,
//! so that server does not spend a round trip asking for them after the client's request
//! reached it (the ancestry is read at the same point of the operation either way).

use crate::backoff::Backoff;
use crate::engine::call::Call;
use crate::engine::errors::{check_dir_path, err, OpError, OpResult};
use crate::engine::locks::Scope;
use crate::engine::perm;
use crate::engine::Engine;
use crate::hugedir::HugeDirs;
use crate::peers::Peers;
use crate::pushed::PUSH_WAIT;
use crate::twopc::{add_part, Parts};
use crate::twopc::{Plan, TwoPhase};
use plusfs_proto::acl::{self, Acl};
use plusfs_proto::{
    Cred, CxRole, DirObject, Errno, FileKind, OpId, ParentPerms, Replace, Reply, Request, ServerId, SetAttr, SubOp,
    Timespec, XattrOp,
};
use plusfs_store::Batch;
use std::sync::Arc;
use std::time::Duration;

/// How long the server of a new directory's object waits for its parent's home when it
/// cannot do without (serial execution, commitment).
pub(crate) const PARENT_WAIT: Duration = Duration::from_secs(30);
/// How long a Cx participant waits for it before leaving the ancestry to the commitment.
pub(crate) const CX_PARENT_WAIT: Duration = Duration::from_secs(1);

/// What a new directory made by a caller of umask `umask` takes from its parent: the
/// group and setgid bit of a setgid parent, the parent's default ACL (as its own default
/// ACL, and as its access ACL within its mode; no umask then), and the parent's ancestry
/// with its own element.
fn inherit(object: &mut DirObject, parent: ParentPerms, umask: u32) {
    if parent.mode & libc::S_ISGID != 0 {
        object.gid = parent.gid;
        object.mode |= libc::S_ISGID;
    }
    let default = parent.default_acl.as_deref().and_then(|v| Acl::from_xattr(v).ok().flatten());
    let (mode, acls) = acl::on_create(default.as_ref(), object.mode, umask, true);
    object.mode = mode;
    acl::replace_acl_xattrs(&mut object.xattrs, &acls);
    object.ancestry = parent.ancestry.map(|a| a.with(object.search_elem()));
}

/// The Cx operation a participant executes, and its coordinator (which may push the
/// parents' permissions).
pub(crate) type CxSide = (OpId, ServerId);

/// Directory permissions: the ancestry of new directories, pushed or asked for, and
/// directory attribute changes that move down a subtree.
pub(crate) struct DirPerms {
    engine: Arc<Engine>,
    peers: Arc<Peers>,
    twopc: Arc<TwoPhase>,
    hugedirs: Arc<HugeDirs>,
    /// Parents' permissions pushed by Cx coordinators for new subdirectories here.
    pub(crate) pushed_perms: crate::pushed::PermsInbox,
}

impl DirPerms {
    pub(crate) fn new(
        engine: Arc<Engine>,
        peers: Arc<Peers>,
        twopc: Arc<TwoPhase>,
        hugedirs: Arc<HugeDirs>,
    ) -> DirPerms {
        DirPerms { engine, peers, twopc, hugedirs, pushed_perms: Default::default() }
    }
}

impl DirPerms {
    /// Completes the sub-operations a client sent (Cx, serial) with what only servers
    /// know: each new directory object (`CreateDir` without ancestry) gets its owner (the
    /// caller's unless root), and setgid inheritance and ancestry from its parent, read
    /// from the parent's home (waiting for it up to `wait`); a new subdirectory entry
    /// records the caller as owner. With `defer`, a parent's home that does not answer
    /// (under Cx it is the operation's coordinator, maybe restarting) leaves the object
    /// without ancestry, for [`fill_at_commit`](Self::fill_at_commit). A Cx participant
    /// (`cx`) first takes what its coordinator pushed, when that is the parent's home.
    pub(crate) async fn fill_new_dirs(
        self: &Arc<Self>,
        ops: &mut [SubOp],
        c: &Call,
        wait: Duration,
        defer: bool,
        cx: Option<CxSide>,
    ) -> OpResult<()> {
        for op in ops.iter_mut() {
            match op {
                SubOp::CreateDir { path, object } if object.ancestry.is_none() => {
                    let asked = (object.uid, object.gid);
                    (object.uid, object.gid, object.mode) = perm::new_owner(c, 0, 0, asked, object.mode, true);
                    let Some((parent, _)) = plusfs_proto::path::split(path) else { continue };
                    match self.pushed_or_asked(parent, wait, cx).await {
                        Ok(perms) => inherit(object, perms, c.umask),
                        Err(e) if defer && e.errno() == Errno::EIO => {
                            // The umask applies now (a default ACL found at commit then
                            // meets the masked mode).
                            object.mode &= !(c.umask & 0o777);
                            tracing::info!(path = %path, cause = %e.message(), "ancestry filled at commit");
                        }
                        Err(e) => return Err(e),
                    }
                }
                SubOp::InsertEntry { inode, replace: Replace::Never, .. }
                    if inode.kind == FileKind::Dir && !c.is_root() =>
                {
                    inode.uid = c.uid;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// At the commitment of sub-operations executed with [`fill_new_dirs`]'s `defer`: the
    /// new directory objects still without ancestry take their parent's (which the
    /// coordinator, sending the decision, can answer). An object under a parent without
    /// ancestry is asked about again, with the same answer.
    pub(crate) async fn fill_at_commit(self: &Arc<Self>, ops: &mut [SubOp]) -> OpResult<()> {
        for op in ops.iter_mut() {
            if let SubOp::CreateDir { path, object } = op {
                if object.ancestry.is_none() {
                    let Some((parent, _)) = plusfs_proto::path::split(path) else { continue };
                    inherit(object, self.parent_perms(parent, PARENT_WAIT).await?, 0);
                }
            }
        }
        Ok(())
    }

    /// The parent's permissions for a new directory: pushed by the Cx coordinator `cx`
    /// when it is `parent`'s home, else (or if the push does not come) asked for.
    async fn pushed_or_asked(
        self: &Arc<Self>,
        parent: &str,
        wait: Duration,
        cx: Option<CxSide>,
    ) -> OpResult<ParentPerms> {
        if let Some((op, coordinator)) = cx.filter(|(_, co)| self.engine.map().home_of_dir(parent) == *co) {
            match self.pushed_perms.take(op, parent, PUSH_WAIT).await {
                Some(answer) => return answer.map_err(OpError::from),
                None => tracing::debug!(%op, coordinator, parent, "no pushed permissions; asking"),
            }
        }
        self.parent_perms(parent, wait).await
    }

    /// On a Cx coordinator, as it starts executing operation `op` with participant `peer`:
    /// for each new subdirectory entry of a parent homed here whose object `peer` makes,
    /// sends `peer` the parent's permissions (read as a `DirPerms` request would).
    pub(crate) fn push_parent_perms(self: &Arc<Self>, op: OpId, role: CxRole, peer: ServerId, ops: &[SubOp]) {
        if role != CxRole::Coordinator {
            return;
        }
        for sub in ops {
            let SubOp::InsertEntry { dir, name, inode, replace: Replace::Never, .. } = sub else { continue };
            if inode.kind != FileKind::Dir || self.engine.map().home_of_dir(dir) != self.engine.id() {
                continue;
            }
            if self.engine.map().home_of_dir(&plusfs_proto::path::join(dir, name)) != peer {
                continue;
            }
            let (osd, path) = (self.clone(), dir.clone());
            tokio::spawn(async move {
                if osd.engine.locks().tx_count() > 0 {
                    osd.engine.locks().settle(&[(path.clone(), Scope::object_only())], true).await;
                }
                let answer = osd.engine.dir_object(&path).map(ParentPerms::of);
                let req = Request::CxPerms { op, path, answer: answer.map_err(plusfs_proto::WireError::from) };
                if let Err(e) = osd.peers.call(peer, req, &Cred::server()).await {
                    tracing::debug!(%op, peer, cause = %e.message, "cannot push a parent's permissions");
                }
            });
        }
    }

    /// Mode, group and ancestry of directory `dir`, from its home (once pending
    /// operations on it have ended, as for any read), asking again for `wait` while the
    /// home cannot be reached.
    async fn parent_perms(self: &Arc<Self>, dir: &str, wait: Duration) -> OpResult<ParentPerms> {
        let home = self.engine.map().home_of_dir(dir);
        let req = Request::DirPerms { path: dir.into() };
        if home == self.engine.id() && self.engine.locks().tx_count() > 0 {
            self.engine.locks().settle(&[(dir.to_string(), Scope::object_only())], true).await;
        }
        let deadline = tokio::time::Instant::now() + wait;
        // The deadline is checked before each pause, not within it: the last ask may come
        // a pause after the deadline (a failover of the parent's home takes about that).
        let mut backoff = Backoff::parent(&self.engine.map());
        loop {
            match self.peers.call(home, req.clone(), &Cred::server()).await {
                Ok(Reply::DirPerms { mode, gid, ancestry, default_acl, .. }) => {
                    return Ok(ParentPerms { mode, gid, ancestry, default_acl })
                }
                Ok(other) => return Err(err(Errno::EIO, format!("unexpected reply {other:?}"))),
                Err(e) if e.errno == Errno::EIO && tokio::time::Instant::now() < deadline => {
                    tracing::debug!(dir, cause = %e.message, "parent's home unreachable; asking again");
                    backoff.wait().await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// `DirSetAttr` on the directory's home: checked for `c`; a change of owner, group or
    /// search bits (or of any of mode, owner, group of a distributed directory, whose
    /// shards check writes) goes to every server as one transaction.
    pub(crate) async fn dir_set_attr(self: &Arc<Self>, p: &str, set: &SetAttr, c: &Call) -> OpResult<Reply> {
        check_dir_path(p)?;
        if set.size.is_some() {
            return Err(err(Errno::EISDIR, format!("'{p}' is a directory")));
        }
        self.twopc.retrying(|plan| self.dir_set_attr_once(plan, p, set, c)).await?;
        Ok(Reply::Attr(self.hugedirs.dir_attr(p, c.session).await?))
    }

    async fn dir_set_attr_once(self: &Arc<Self>, plan: Plan, p: &str, set: &SetAttr, c: &Call) -> OpResult<Reply> {
        let g = self.engine.locks().lock(&[(p.to_string(), Scope::Whole)], None, true).await;
        let d = self.engine.dir_object(p)?;
        perm::check_search_above(c, &d, p)?;
        let set = perm::check_setattr(c, &perm::Owned::of_dir(&d), set, p)?;
        let n = d.with_set(&set, Timespec::now());
        if !self.store_change(plan, p, (&d, &n), g, c).await? {
            return Ok(Reply::Done);
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let _g = self.engine.locks().lock(&[(p.to_string(), Scope::Whole)], None, true).await;
            let mut now = self.engine.dir_object(p)?;
            (now.atime, now.mtime) = (n.atime, n.mtime);
            let mut b = Batch::new();
            b.put_dir(p, &now);
            self.engine.apply_for(c, b).await?;
        }
        Ok(Reply::Done)
    }

    /// `DirXattr` setting or removing one of the ACL attributes of directory `p` (its
    /// home): checked for `c`; a change of its search rule that directories below hold
    /// in their ancestries, or of a distributed directory (whose shards check writes and
    /// inherit), goes to every server as one transaction, like a `chmod`.
    pub(crate) async fn dir_acl(self: &Arc<Self>, p: &str, op: &XattrOp, c: &Call) -> OpResult<Reply> {
        check_dir_path(p)?;
        self.twopc.retrying(|plan| self.dir_acl_once(plan, p, op, c)).await?;
        Ok(Reply::Done)
    }

    async fn dir_acl_once(self: &Arc<Self>, plan: Plan, p: &str, op: &XattrOp, c: &Call) -> OpResult<Reply> {
        let g = self.engine.locks().lock(&[(p.to_string(), Scope::Whole)], None, true).await;
        let d = self.engine.dir_object(p)?;
        perm::check_search_above(c, &d, p)?;
        perm::check_xattr(c, &perm::Owned::of_dir(&d), op, p)?;
        let mut n = d.clone();
        crate::engine::xattrs::apply(&mut n.xattrs, (&mut n.mode, d.gid), op, p, c)?;
        n.ctime = Timespec::now();
        n.ancestry = n.ancestry.take().map(|a| a.replace(d.search_elem(), n.search_elem()));
        self.store_change(plan, p, (&d, &n), g, c).await?;
        Ok(Reply::Done)
    }

    /// Stores directory `p`'s new object `n` in place of `d` (read under `g`): in its own
    /// object when the change stays there, else by a re-ancestry on every server (after
    /// `g` is released). Returns whether it took the re-ancestry.
    async fn store_change(
        self: &Arc<Self>,
        plan: Plan,
        p: &str,
        (d, n): (&DirObject, &DirObject),
        g: impl Send,
        c: &Call,
    ) -> OpResult<bool> {
        if d.change_stays_here(n) {
            let mut b = Batch::new();
            b.put_dir(p, n);
            self.engine.apply_for(c, b).await?;
            return Ok(false);
        }
        drop(g);
        self.reancestry(plan, p, d, n).await?;
        Ok(true)
    }

    /// Runs `SubOp::Reancestry` for directory `p` going from `old` to `new` on every
    /// server (the peers' trusted credential: the caller was checked here).
    async fn reancestry(self: &Arc<Self>, plan: Plan, p: &str, old: &DirObject, new: &DirObject) -> OpResult<()> {
        let mut parts = Parts::new();
        for s in &self.engine.map().servers {
            let op = SubOp::ReancestryAcl {
                root: p.to_string(),
                old: old.search_elem(),
                new: new.search_elem(),
                mode: new.mode,
                uid: new.uid,
                gid: new.gid,
                acls: acl::acl_xattrs(&new.xattrs),
                was: plusfs_proto::DirAttrs::of(old),
            };
            add_part(&mut parts, s.id, op);
        }
        self.twopc.run(plan, parts, &Call::server()).await
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::host::Via;
    use crate::testkit::{root, Kit};
    use plusfs_proto::{SetAttr, Threshold};

    #[tokio::test]
    async fn a_directory_chmod_reaches_its_object_and_the_ancestry_below() {
        let kit = Kit::new().await;
        let plan = crate::twopc::Plan::now(&kit.osd.engine);
        let policy = (Threshold::Never, 0);
        kit.osd.twopc.mkdir(plan, "/p", 0o755, (0, 0), policy, Via::Home, &root()).await.unwrap();
        let plan = crate::twopc::Plan::now(&kit.osd.engine);
        kit.osd.twopc.mkdir(plan, "/p/q", 0o755, (0, 0), policy, Via::Home, &root()).await.unwrap();
        let set = SetAttr { mode: Some(0o700), ..SetAttr::default() };
        kit.osd.dirperms.dir_set_attr("/p", &set, &root()).await.unwrap();
        let p = kit.osd.engine.dir_object("/p").unwrap();
        assert_eq!(p.mode & 0o7777, 0o700);
        let q = kit.osd.engine.dir_object("/p/q").unwrap();
        assert_eq!(q.ancestry, p.ancestry.map(|a| a.with(q.search_elem())), "the child's ancestry follows");
    }
}
