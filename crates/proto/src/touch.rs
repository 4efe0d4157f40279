//! Which directories a request touches, and how: a server recalls other sessions'
//! delegations on them before serving it, a client writes its own queued work on them
//! back before sending it (`deleg`).

use crate::message::Request;
use crate::peer::SubOp;

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
        Stat { path } | Readlink { path } | Read { path, .. } | Layout { path, .. } | Open { path, .. } => {
            entry(path, false, &mut out)
        }
        Xattr { path, op } => entry(path, !op.is_read(), &mut out),
        Create { path, .. }
        | Symlink { path, .. }
        | Unlink { path }
        | SetAttr { path, .. }
        | Write { path, .. }
        | CommitWrite { path, .. }
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
        // A tree quota counts (and from then on limits) everything below its root.
        Quota { op: crate::quota::QuotaOp::Set { target: crate::quota::QuotaTarget::Tree(path), .. } } => {
            out.push((path.clone(), Touch::Object, true))
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
        // A directory handed to its new home: delegations on it are recalled first, so
        // their holders' queued work is in what moves.
        MigrateOut { paths } => out.extend(paths.iter().map(|p| (p.clone(), Touch::Object, false))),
        // A shard handed to another storing server: the same, for delegations of the shard.
        ShardOut { path, .. } => out.push((path.clone(), Touch::Object, false)),
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
        SubOp::ExportSubtree { root, .. } | SubOp::Reancestry { root, .. } | SubOp::ReancestryAcl { root, .. } => {
            out.push((root.clone(), Touch::Object, true))
        }
        // A tree quota changes the ancestry of everything below its root; a user or group
        // quota ends every write delegation (quotas are counted on the servers).
        SubOp::SetQuota { def, .. } => out.push((def.path.clone().unwrap_or_else(|| "/".into()), Touch::Object, true)),
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
}
