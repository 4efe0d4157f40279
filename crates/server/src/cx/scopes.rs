//! Which objects a client request reads or changes, so it can wait for (and hurry) the
//! pending transactions on them first.

use crate::engine::locks::Scope;
use plusfs_proto::quota::{QuotaOp, QuotaTarget};
use plusfs_proto::Request;

/// The (directory, scope) pairs a client request reads or changes, for
/// [`LockTable::settle`](crate::engine::locks::LockTable::settle): its entry in the parent and the
/// path itself as a directory.
pub(crate) fn request_scopes(req: &Request) -> Vec<(String, Scope)> {
    use Request::*;
    let of_path = |p: &str, out: &mut Vec<(String, Scope)>| {
        if let Some((dir, name)) = plusfs_proto::path::split(p) {
            out.push((dir.to_string(), Scope::Name(name.to_string())));
        }
        out.push((p.to_string(), Scope::Whole));
    };
    let mut out = Vec::new();
    match req {
        Shard { op, .. } | OnInode { op, .. } => return request_scopes(op),
        Mkdir { path, .. }
        | Rmdir { path }
        | Create { path, .. }
        | Open { path, .. }
        | Stat { path }
        | DirStat { path }
        | Unlink { path }
        | Readdir { path, .. }
        | SetAttr { path, .. }
        | DirSetAttr { path, .. }
        | Symlink { path, .. }
        | Readlink { path }
        | SetPolicy { path, .. }
        | DistStatus { path }
        | Write { path, .. }
        | CommitWrite { path, .. }
        | Read { path, .. }
        | Layout { path, .. }
        | Xattr { path, .. }
        | DirXattr { path, .. } => of_path(path, &mut out),
        // The directory object only, not its entries: a new subdirectory's server asks
        // while the operation's other half may hold the new entry's lock here.
        DirPerms { path } => out.push((path.clone(), Scope::object_only())),
        // A delegation starts from the committed directory: pending Cx work on it first.
        DelegAcquire { dir, .. } => out.push((dir.clone(), Scope::Whole)),
        // A tree quota starts from the committed tree.
        Quota { op: QuotaOp::Set { target: QuotaTarget::Tree(path), .. } } => of_path(path, &mut out),
        Fsync { path } if !path.is_empty() => of_path(path, &mut out),
        Rename { src, dst } | Link { src, dst } => {
            of_path(src, &mut out);
            of_path(dst, &mut out);
        }
        Exchange { a, b } => {
            of_path(a, &mut out);
            of_path(b, &mut out);
        }
        Batch { dir, names, .. } | BatchRead { dir, names, .. } => {
            out.extend(names.iter().map(|n| (dir.clone(), Scope::Name(n.clone()))));
        }
        BatchWrite { dir, files, .. } => {
            out.extend(files.iter().map(|f| (dir.clone(), Scope::Name(f.name.clone()))));
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_cover_entry_and_directory() {
        let s = request_scopes(&Request::Stat { path: "/a/b".into() });
        assert_eq!(s, vec![("/a".into(), Scope::Name("b".into())), ("/a/b".into(), Scope::Whole)]);
        let s = request_scopes(&Request::Shard {
            incarnation: 3,
            op: Box::new(Request::Readdir { path: "/a".into(), after: None, limit: 10 }),
        });
        assert_eq!(s, vec![("/".into(), Scope::Name("a".into())), ("/a".into(), Scope::Whole)]);
    }
}
