//! Extended attributes, kept in the embedded inode of a file (or the object of a
//! directory), so they change in the same store write as the rest of its metadata.

use super::Namespace;
use crate::engine::call::Call;
use crate::engine::errors::{check_dir_path, err, OpResult};
use crate::engine::host::Via;
use crate::engine::locks::Scope;
use crate::engine::perm;
use crate::links::Found;
use plusfs_proto::filedata::{MAX_XATTR_NAME, MAX_XATTR_TOTAL, MAX_XATTR_VALUE};
use plusfs_proto::{Errno, FileKind, Reply, Request, Timespec, XattrOp};
use plusfs_store::Batch;
use std::sync::Arc;

/// Namespaces plusfs stores; others (`security.`, `system.`) get EOPNOTSUPP when set.
const STORED_NAMESPACES: [&str; 2] = ["user.", "trusted."];

/// Applies `op` to `attrs` (sorted by name). Returns the reply and whether they changed.
pub(crate) fn apply(attrs: &mut Vec<(String, Vec<u8>)>, op: &XattrOp, p: &str) -> OpResult<(Reply, bool)> {
    let find = |attrs: &Vec<(String, Vec<u8>)>, name: &str| attrs.binary_search_by(|(n, _)| n.as_str().cmp(name));
    let missing = |name: &str| err(Errno::ENODATA, format!("'{p}' has no attribute '{name}'"));
    match op {
        XattrOp::List => Ok((Reply::Names(attrs.iter().map(|(n, _)| n.clone()).collect()), false)),
        XattrOp::Get { name } => {
            check_name(name, p)?;
            match find(attrs, name) {
                Ok(i) => Ok((Reply::Data(attrs[i].1.clone().into()), false)),
                Err(_) => Err(missing(name)),
            }
        }
        XattrOp::Remove { name } => {
            check_name(name, p)?;
            match find(attrs, name) {
                Ok(i) => {
                    attrs.remove(i);
                    Ok((Reply::Done, true))
                }
                Err(_) => Err(missing(name)),
            }
        }
        XattrOp::Set { name, value, create, replace } => {
            check_name(name, p)?;
            if !STORED_NAMESPACES.iter().any(|ns| name.starts_with(ns)) {
                return Err(err(Errno::EOPNOTSUPP, format!("attribute '{name}': only user. and trusted. are stored")));
            }
            if value.len() > MAX_XATTR_VALUE {
                return Err(err(Errno::E2BIG, format!("attribute '{name}': value over {MAX_XATTR_VALUE} bytes")));
            }
            let at = find(attrs, name);
            match at {
                Ok(_) if *create => return Err(err(Errno::EEXIST, format!("'{p}' already has '{name}'"))),
                Err(_) if *replace => return Err(missing(name)),
                _ => {}
            }
            let used: usize = attrs.iter().filter(|(n, _)| n != name).map(|(n, v)| n.len() + v.len()).sum();
            if used + name.len() + value.len() > MAX_XATTR_TOTAL {
                return Err(err(Errno::ENOSPC, format!("'{p}': no room for more extended attributes")));
            }
            match at {
                Ok(i) => attrs[i].1 = value.clone(),
                Err(i) => attrs.insert(i, (name.clone(), value.clone())),
            }
            Ok((Reply::Done, true))
        }
    }
}

fn check_name(name: &str, p: &str) -> OpResult<()> {
    if name.is_empty() || name.contains('\0') {
        return Err(err(Errno::EINVAL, format!("'{p}': bad attribute name")));
    }
    if name.len() > MAX_XATTR_NAME {
        return Err(err(Errno::ERANGE, format!("'{p}': attribute name over {MAX_XATTR_NAME} bytes")));
    }
    Ok(())
}

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
        perm::check_xattr(c, perm::Owned { mode: i.mode, uid: i.uid, gid: i.gid, dir: false }, op, p)?;
        let (reply, changed) = apply(&mut t.inode.xattrs, op, p)?;
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
        perm::check_xattr(c, perm::Owned { mode: d.mode, uid: d.uid, gid: d.gid, dir: true }, op, p)?;
        let (reply, changed) = apply(&mut d.xattrs, op, p)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_list_remove_and_limits() {
        let mut a = Vec::new();
        let set = |name: &str, v: &[u8], create, replace| XattrOp::Set {
            name: name.into(),
            value: v.to_vec(),
            create,
            replace,
        };
        assert!(apply(&mut a, &set("user.b", b"2", false, false), "/f").unwrap().1);
        apply(&mut a, &set("user.a", b"1", true, false), "/f").unwrap();
        assert_eq!(apply(&mut a, &set("user.a", b"x", true, false), "/f").unwrap_err().errno(), Errno::EEXIST);
        assert_eq!(apply(&mut a, &set("user.c", b"x", false, true), "/f").unwrap_err().errno(), Errno::ENODATA);
        assert_eq!(apply(&mut a, &set("security.x", b"x", false, false), "/f").unwrap_err().errno(), Errno::EOPNOTSUPP);
        let big = vec![0u8; MAX_XATTR_VALUE + 1];
        assert_eq!(apply(&mut a, &set("user.big", &big, false, false), "/f").unwrap_err().errno(), Errno::E2BIG);
        assert_eq!(apply(&mut a, &set(&"u".repeat(300), b"", false, false), "/f").unwrap_err().errno(), Errno::ERANGE);
        assert_eq!(
            apply(&mut a, &XattrOp::List, "/f").unwrap().0,
            Reply::Names(vec!["user.a".into(), "user.b".into()])
        );
        assert_eq!(
            apply(&mut a, &XattrOp::Get { name: "user.b".into() }, "/f").unwrap().0,
            Reply::Data(b"2".to_vec().into())
        );
        apply(&mut a, &XattrOp::Remove { name: "user.a".into() }, "/f").unwrap();
        assert_eq!(apply(&mut a, &XattrOp::Get { name: "user.a".into() }, "/f").unwrap_err().errno(), Errno::ENODATA);
        // The total per object is bounded.
        let half = vec![0u8; MAX_XATTR_VALUE / 2];
        apply(&mut a, &set("user.h1", &half, false, false), "/f").unwrap();
        assert_eq!(apply(&mut a, &set("user.h2", &half, false, false), "/f").unwrap_err().errno(), Errno::ENOSPC);
    }
}
