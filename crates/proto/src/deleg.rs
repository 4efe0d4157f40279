//! Directory delegations: what a server grants a client, and the work the client writes
//! back (`docs/semantics.md`, "Delegations").
//!
//! A *write delegation* on a directory lets one client session answer lookups in it and
//! create, write (small files), change, rename and remove its entries locally. The client
//! writes that work back later as one [`DelegOp`] list per flush, applied by the
//! directory's server atomically and at most once (flushes are numbered). Any other
//! session's request that touches the directory makes the server recall the delegation
//! first. [`touched`] says which directories a request touches, for both sides.

use crate::attr::SetAttr;
use crate::cred::Cred;
use crate::errno::Errno;
use crate::ids::Ino;
use crate::message::Request;
use crate::peer::SubOp;
use crate::record::{DirObject, FileKind, Inode, Timespec};
use serde::{Deserialize, Serialize};

/// What a server grants with a delegation: the directory as it is (object and every entry)
/// and inode numbers for the entries the client will create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelegGrant {
    /// Names this delegation in flushes and recalls.
    pub id: u64,
    /// The directory object (mode, owner, ancestry, counts, times).
    pub dir: DirObject,
    /// Every entry, in name order.
    pub entries: Vec<(String, Inode)>,
    /// Inode numbers `first .. first + count` for new entries.
    pub first_ino: Ino,
    pub ino_count: u32,
}

/// One change made under a delegation, replayed by the server in order. Times are the
/// client's, so the directory the server ends with is the one the client showed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DelegOp {
    /// A new entry `name` (regular file, symlink, FIFO, socket or device; never a
    /// directory) with inode `ino`, owner and mode as the client computed them for the
    /// caller `by` (an index into the flush's credentials).
    Create {
        name: String,
        ino: Ino,
        kind: FileKind,
        mode: u32,
        uid: u32,
        gid: u32,
        rdev: u32,
        target: Option<String>,
        time: Timespec,
        by: u32,
    },
    /// The whole contents of regular file `name` (created under this delegation), and
    /// the file's modification and change times after it was written.
    Contents { name: String, data: Vec<u8>, mtime: Timespec, ctime: Timespec },
    /// `setattr` of entry `name` (no size: sizes travel as contents) at `time`, by `by`.
    SetAttr { name: String, set: SetAttr, time: Timespec, by: u32 },
    /// Removes non-directory entry `name` at `time`, by `by`.
    Unlink { name: String, time: Timespec, by: u32 },
    /// Renames non-directory entry `from` to `to`, replacing a non-directory there.
    Rename { from: String, to: String, time: Timespec, by: u32 },
}

impl DelegOp {
    /// Bytes of file data the operation carries.
    pub fn data_len(&self) -> usize {
        match self {
            DelegOp::Contents { data, .. } => data.len(),
            _ => 0,
        }
    }
}

/// The reply to a flush.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Flushed {
    /// Operations the server refused (index in the flush, errno): none unless the client
    /// and the server disagree about the directory, which is a bug worth a log line.
    pub failed: Vec<(u32, Errno)>,
    /// The delegation ended with this flush: asked for, or the directory grew past its
    /// huge-directory threshold and is being distributed.
    pub ended: bool,
}

/// The credential of the callers of a flush's operations, deduplicated.
pub fn cred_index(creds: &mut Vec<Cred>, c: &Cred) -> u32 {
    match creds.iter().position(|x| x.uid == c.uid && x.gid == c.gid && x.groups == c.groups) {
        Some(i) => i as u32,
        None => {
            creds.push(Cred::new(c.uid, c.gid, c.groups.clone()));
            (creds.len() - 1) as u32
        }
    }
}

/// How a request touches a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Touch {
    /// Reads entry `name` (or, with `None`, the directory itself or its listing).
    Read(Option<String>),
    /// Changes entry `name`.
    Entry(String),
    /// Changes the directory object itself (attributes, removal, distribution) or
    /// everything at or below it (a rename of an ancestor, a re-ancestry).
    Object,
}

/// The directories a request touches and how; a delegation on any of them held by
/// another session must be recalled before the request is served. Requests about a
/// directory at or below a moved or re-ancestried root report [`Touch::Object`] on the
/// root with `subtree` true.
pub fn touched(req: &Request) -> Vec<(String, Touch, bool)> {
    use Request::*;
    let mut out = Vec::new();
    let entry = |p: &str, change: bool, out: &mut Vec<(String, Touch, bool)>| {
        if let Some((dir, name)) = crate::path::split(p) {
            let t = if change { Touch::Entry(name.to_string()) } else { Touch::Read(Some(name.to_string())) };
            out.push((dir.to_string(), t, false));
        }
    };
    match req {
        Shard { op, .. } | OnInode { op, .. } => return touched(op),
        Stat { path } | Readlink { path } | Read { path, .. } | Open { path, .. } => entry(path, false, &mut out),
        Xattr { path, op } => entry(path, !op.is_read(), &mut out),
        Create { path, .. }
        | Symlink { path, .. }
        | Unlink { path }
        | SetAttr { path, .. }
        | Write { path, .. }
        | Fsync { path } => entry(path, true, &mut out),
        Mkdir { path, .. } => entry(path, true, &mut out),
        Rmdir { path } => {
            entry(path, true, &mut out);
            out.push((path.clone(), Touch::Object, false));
        }
        DirStat { path } | Readdir { path, .. } | DistStatus { path } => {
            out.push((path.clone(), Touch::Read(None), false))
        }
        DirXattr { path, op } if op.is_read() => out.push((path.clone(), Touch::Read(None), false)),
        DirSetAttr { path, .. } | DirXattr { path, .. } | SetPolicy { path, .. } => {
            out.push((path.clone(), Touch::Object, false))
        }
        Rename { src, dst } | Link { src, dst } => {
            entry(src, true, &mut out);
            entry(dst, true, &mut out);
            // A directory renamed moves every delegated directory below it.
            out.push((src.clone(), Touch::Object, true));
        }
        Exchange { a, b } => {
            entry(a, true, &mut out);
            entry(b, true, &mut out);
        }
        Batch { dir, names, op, .. } => {
            let change = !matches!(op, crate::batch::BatchOp::Stat | crate::batch::BatchOp::Open);
            for n in names {
                let t = if change { Touch::Entry(n.clone()) } else { Touch::Read(Some(n.clone())) };
                out.push((dir.clone(), t, false));
            }
        }
        BatchRead { dir, names, .. } => {
            out.extend(names.iter().map(|n| (dir.clone(), Touch::Read(Some(n.clone())), false)))
        }
        BatchWrite { dir, files, .. } => {
            out.extend(files.iter().map(|f| (dir.clone(), Touch::Entry(f.name.clone()), false)))
        }
        TxPrepare { ops, .. } | CxExec { ops, .. } | SubExec { ops } => {
            for op in ops {
                subop_touches(op, &mut out);
            }
        }
        ShardImport { path, .. } => out.push((path.clone(), Touch::Object, false)),
        _ => {}
    }
    out
}

/// What a sub-operation of a cross-server operation touches.
fn subop_touches(op: &SubOp, out: &mut Vec<(String, Touch, bool)>) {
    match op {
        SubOp::InsertEntry { dir, name, .. }
        | SubOp::RemoveEntry { dir, name, .. }
        | SubOp::ShareInode { dir, name, .. }
        | SubOp::ExchangeEntry { dir, name, .. } => out.push((dir.clone(), Touch::Entry(name.clone()), false)),
        SubOp::CreateDir { path, .. } | SubOp::RemoveDir { path, .. } | SubOp::RemoveShard { path, .. } => {
            out.push((path.clone(), Touch::Object, false))
        }
        SubOp::ExportSubtree { root, .. } | SubOp::Reancestry { root, .. } => {
            out.push((root.clone(), Touch::Object, true))
        }
        SubOp::AdjustLinks { .. } => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_requests_touch_their_parent() {
        let t = touched(&Request::Stat { path: "/d/f".into() });
        assert_eq!(t, vec![("/d".into(), Touch::Read(Some("f".into())), false)]);
        let t = touched(&Request::Unlink { path: "/d/f".into() });
        assert_eq!(t, vec![("/d".into(), Touch::Entry("f".into()), false)]);
        let t = touched(&Request::Readdir { path: "/d".into(), after: None, limit: 1 });
        assert_eq!(t, vec![("/d".into(), Touch::Read(None), false)]);
        let t = touched(&Request::Rename { src: "/a/x".into(), dst: "/b/y".into() });
        assert!(t.contains(&("/a/x".into(), Touch::Object, true)));
        assert!(t.contains(&("/b".into(), Touch::Entry("y".into()), false)));
    }

    #[test]
    fn credentials_are_listed_once() {
        let mut creds = Vec::new();
        let a = Cred::new(5, 5, vec![]);
        assert_eq!(cred_index(&mut creds, &a), 0);
        assert_eq!(cred_index(&mut creds, &Cred::new(6, 6, vec![])), 1);
        assert_eq!(cred_index(&mut creds, &a), 0);
    }
}
