//! Extended attributes of one object (an inode or a directory object): the plain ones
//! (`user.`, `trusted.`), kept as given within bounds, and the POSIX ACLs, validated and
//! kept in step with the mode.

use crate::engine::errors::{err, OpResult};
use plusfs_proto::acl;
use plusfs_proto::filedata::{MAX_XATTR_NAME, MAX_XATTR_TOTAL, MAX_XATTR_VALUE};
use plusfs_proto::{Cred, Errno, Reply, XattrOp};

/// Namespaces plusfs stores besides the two ACLs; others (`security.`, other `system.`
/// names) get EOPNOTSUPP when set.
const STORED_NAMESPACES: [&str; 2] = ["user.", "trusted."];

/// Applies `op` to `attrs` (sorted by name) of an object of `mode` owned by group `gid`
/// (setting an access ACL changes the mode, and clears its set-group-ID bit when `c` is
/// neither root nor a member of `gid`, as a chmod would). Returns the reply and whether
/// they changed.
pub(crate) fn apply(
    attrs: &mut Vec<(String, Vec<u8>)>,
    (mode, gid): (&mut u32, u32),
    op: &XattrOp,
    p: &str,
    c: &Cred,
) -> OpResult<(Reply, bool)> {
    if let Some(r) = apply_acl(attrs, mode, op, p) {
        if matches!(op, XattrOp::Set { name, .. } if name == acl::ACCESS_XATTR) && !c.is_root() && !c.in_group(gid) {
            *mode &= !libc::S_ISGID;
        }
        return r;
    }
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

/// `op` when it sets or removes an ACL (`None` otherwise): the value is validated and
/// the mode follows an access ACL (`system.posix_acl_*` are not plain attributes).
fn apply_acl(
    attrs: &mut Vec<(String, Vec<u8>)>,
    mode: &mut u32,
    op: &XattrOp,
    p: &str,
) -> Option<OpResult<(Reply, bool)>> {
    let (name, value) = match op {
        XattrOp::Set { name, value, .. } if acl::is_acl_name(name) => (name, Some(value.as_slice())),
        XattrOp::Remove { name } if acl::is_acl_name(name) => (name, None),
        _ => return None,
    };
    let before = (attrs.clone(), *mode);
    Some(match acl::store(attrs, mode, name, value) {
        Ok(()) => Ok((Reply::Done, (attrs.clone(), *mode) != before)),
        Err(e) => Err(err(e.errno(), format!("'{p}': {e}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_list_remove_and_limits() {
        let mut a = Vec::new();
        let mut m = 0o644;
        let set = |name: &str, v: &[u8], create, replace| XattrOp::Set {
            name: name.into(),
            value: v.to_vec(),
            create,
            replace,
        };
        assert!(apply(&mut a, (&mut m, 0), &set("user.b", b"2", false, false), "/f", &Cred::server()).unwrap().1);
        apply(&mut a, (&mut m, 0), &set("user.a", b"1", true, false), "/f", &Cred::server()).unwrap();
        assert_eq!(
            apply(&mut a, (&mut m, 0), &set("user.a", b"x", true, false), "/f", &Cred::server()).unwrap_err().errno(),
            Errno::EEXIST
        );
        assert_eq!(
            apply(&mut a, (&mut m, 0), &set("user.c", b"x", false, true), "/f", &Cred::server()).unwrap_err().errno(),
            Errno::ENODATA
        );
        assert_eq!(
            apply(&mut a, (&mut m, 0), &set("security.x", b"x", false, false), "/f", &Cred::server())
                .unwrap_err()
                .errno(),
            Errno::EOPNOTSUPP
        );
        let big = vec![0u8; MAX_XATTR_VALUE + 1];
        assert_eq!(
            apply(&mut a, (&mut m, 0), &set("user.big", &big, false, false), "/f", &Cred::server())
                .unwrap_err()
                .errno(),
            Errno::E2BIG
        );
        assert_eq!(
            apply(&mut a, (&mut m, 0), &set(&"u".repeat(300), b"", false, false), "/f", &Cred::server())
                .unwrap_err()
                .errno(),
            Errno::ERANGE
        );
        assert_eq!(
            apply(&mut a, (&mut m, 0), &XattrOp::List, "/f", &Cred::server()).unwrap().0,
            Reply::Names(vec!["user.a".into(), "user.b".into()])
        );
        assert_eq!(
            apply(&mut a, (&mut m, 0), &XattrOp::Get { name: "user.b".into() }, "/f", &Cred::server()).unwrap().0,
            Reply::Data(b"2".to_vec().into())
        );
        apply(&mut a, (&mut m, 0), &XattrOp::Remove { name: "user.a".into() }, "/f", &Cred::server()).unwrap();
        assert_eq!(
            apply(&mut a, (&mut m, 0), &XattrOp::Get { name: "user.a".into() }, "/f", &Cred::server())
                .unwrap_err()
                .errno(),
            Errno::ENODATA
        );
        // The total per object is bounded.
        let half = vec![0u8; MAX_XATTR_VALUE / 2];
        apply(&mut a, (&mut m, 0), &set("user.h1", &half, false, false), "/f", &Cred::server()).unwrap();
        assert_eq!(
            apply(&mut a, (&mut m, 0), &set("user.h2", &half, false, false), "/f", &Cred::server())
                .unwrap_err()
                .errno(),
            Errno::ENOSPC
        );
    }
}
