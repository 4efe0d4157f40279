//! Extended attributes, kept in the embedded inode of a file (or the object of a
//! directory), so they change in the same store write as the rest of its metadata.

use super::Namespace;
use crate::engine::call::Call;
use crate::engine::errors::{check_dir_path, err, OpResult};
use crate::engine::host::Via;
use crate::engine::locks::Scope;
use crate::engine::perm;
use crate::engine::xattrs::apply;
use crate::links::Found;
use plusfs_proto::{Errno, FileKind, Reply, Request, Timespec, XattrOp};
use plusfs_store::Batch;
use std::sync::Arc;

impl Namespace {
    /// `Xattr` on the entry's server: files, symlinks and FIFOs; `IsDir` for directories.
    pub(crate) async fn xattr(self: &Arc<Self>, p: &str, op: &XattrOp, via: Via, c: &Call) -> OpResult<Reply> {
        let mut t = match self.links.find(p, via, !matches!(op, XattrOp::Get { .. } | XattrOp::List), c).await? {
            Found::Here(t) => t,
            Found::Elsewhere { home, ino } => {
                return self.links.forward(home, ino, Request::Xattr { path: p.into(), op: op.clone() }, c).await
            }
        };
        if t.inode.kind == FileKind::Dir {
            return Ok(Reply::IsDir { ino: t.inode.ino });
        }
        let i = &t.inode;
        perm::check_xattr(c, &perm::Owned::of_inode(i), op, p)?;
        if t.inode.kind == FileKind::Symlink && op.changes_acl() {
            return Err(err(Errno::EOPNOTSUPP, format!("'{p}' is a symbolic link: it has no ACL")));
        }
        let gid = t.inode.gid;
        let (reply, changed) = apply(&mut t.inode.xattrs, (&mut t.inode.mode, gid), op, p, c)?;
        if changed {
            t.inode.ctime = Timespec::now();
            let mut b = Batch::new();
            t.save(&mut b);
            c.answer_with_next_batch(&Ok(reply.clone()));
            self.engine.apply_for(c, b).await?;
        }
        Ok(reply)
    }

    /// `DirXattr` on the directory's home.
    pub(crate) async fn dir_xattr(self: &Arc<Self>, p: &str, op: &XattrOp, c: &Call) -> OpResult<Reply> {
        check_dir_path(p)?;
        let _g = self.engine.locks().lock(&[(p.to_string(), Scope::Whole)], None, true).await;
        let mut d = self.engine.dir_object(p)?;
        perm::check_search_above(c, &d, p)?;
        perm::check_xattr(c, &perm::Owned::of_dir(&d), op, p)?;
        let gid = d.gid;
        let (reply, changed) = apply(&mut d.xattrs, (&mut d.mode, gid), op, p, c)?;
        if changed {
            d.ctime = Timespec::now();
            let mut b = Batch::new();
            b.put_dir(p, &d);
            c.answer_with_next_batch(&Ok(reply.clone()));
            self.engine.apply_for(c, b).await?;
        }
        Ok(reply)
    }
}
