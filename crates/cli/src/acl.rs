//! `plusfs getfacl` and `plusfs setfacl`: POSIX ACLs of files and directories through
//! the library, in the text form of the `acl` package's tools (numeric ids).

use crate::files::{exit, report};
use clap::Args;
use plusfs_client::{Acl, AclKind, Client, FsError};
use plusfs_proto::acl::{Entry, Tag};
use plusfs_proto::Errno;

#[derive(Args)]
pub struct GetfaclArgs {
    #[arg(required = true)]
    paths: Vec<String>,
}

#[derive(Args)]
pub struct SetfaclArgs {
    /// Replace the ACL by this one (`user::rwx,user:1001:r-x,group::r--,mask::r-x,other::---`).
    #[arg(long = "set", value_name = "ACL", conflicts_with_all = ["modify", "remove_all"])]
    set: Option<String>,
    /// Add or change these entries (`user:1001:rwx,group:2000:r-x`); the mask becomes the
    /// union of the group class unless one is given.
    #[arg(short = 'm', long = "modify", value_name = "ENTRIES", conflicts_with = "remove_all")]
    modify: Option<String>,
    /// Work on the default ACL (directories) instead of the access ACL.
    #[arg(short = 'd', long = "default")]
    default: bool,
    /// Remove the ACL (with `--default`, the default ACL; else both).
    #[arg(short = 'b', long = "remove-all")]
    remove_all: bool,
    #[arg(required = true)]
    paths: Vec<String>,
}

/// `plusfs getfacl`: each path's owner, group, access ACL (its mode bits as an ACL when
/// it has none) and default ACL, as `getfacl -n` prints them.
pub async fn getfacl(c: &Client, a: GetfaclArgs) -> std::process::ExitCode {
    let mut failed = false;
    for p in &a.paths {
        match describe(c, p).await {
            Ok(text) => println!("{text}"),
            Err(e) => report(&mut failed, FsError { op: "get the ACL of", ..e }),
        }
    }
    exit(failed)
}

async fn describe(c: &Client, p: &str) -> Result<String, FsError> {
    let attr = c.lstat(p).await?;
    let access = c.get_acl(p, AclKind::Access).await?.unwrap_or_else(|| Acl::from_mode(attr.mode));
    let mut out = format!("# file: {p}\n# owner: {}\n# group: {}\n", attr.uid, attr.gid);
    for line in access.to_text().split(',') {
        out.push_str(line);
        out.push('\n');
    }
    if attr.kind == plusfs_proto::FileKind::Dir {
        if let Some(d) = c.get_acl(p, AclKind::Default).await? {
            for line in d.to_text().split(',') {
                out.push_str(&format!("default:{line}\n"));
            }
        }
    }
    Ok(out)
}

/// `plusfs setfacl`.
pub async fn setfacl(c: &Client, a: SetfaclArgs) -> std::process::ExitCode {
    let kind = if a.default { AclKind::Default } else { AclKind::Access };
    let mut failed = false;
    for p in &a.paths {
        if let Err(e) = set_one(c, p, &a, kind).await {
            report(&mut failed, FsError { op: "set the ACL of", ..e });
        }
    }
    exit(failed)
}

async fn set_one(c: &Client, p: &str, a: &SetfaclArgs, kind: AclKind) -> Result<(), FsError> {
    let invalid =
        |e: plusfs_proto::acl::AclError| FsError::new("set the ACL of", p, Errno::EINVAL).with_detail(e.to_string());
    if a.remove_all {
        c.set_acl(p, kind, None).await?;
        if !a.default && c.lstat(p).await?.kind == plusfs_proto::FileKind::Dir {
            c.set_acl(p, AclKind::Default, None).await?;
        }
        return Ok(());
    }
    let acl = match (&a.set, &a.modify) {
        (Some(t), _) => Acl::from_text(t).map_err(invalid)?,
        (None, Some(m)) => {
            let current = match c.get_acl(p, kind).await? {
                Some(acl) => acl,
                None => Acl::from_mode(c.lstat(p).await?.mode),
            };
            merge(&current, m).map_err(invalid)?
        }
        (None, None) => {
            return Err(FsError::new("set the ACL of", p, Errno::EINVAL).with_detail("nothing to do: --set, -m or -b"))
        }
    };
    c.set_acl(p, kind, Some(&acl)).await
}

/// `current` with the entries of `text` added or replaced; without a mask in `text`, the
/// mask (needed once there are named entries) is the union of the group class.
fn merge(current: &Acl, text: &str) -> Result<Acl, plusfs_proto::acl::AclError> {
    let mut entries: Vec<Entry> = current.entries().to_vec();
    let mut mask_given = false;
    for raw in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let e = Entry::from_text(raw)?;
        mask_given |= e.tag == Tag::Mask;
        match entries.iter_mut().find(|x| x.tag == e.tag) {
            Some(x) => x.perm = e.perm,
            None => entries.push(e),
        }
    }
    if !mask_given {
        let class = entries.iter().filter(|e| matches!(e.tag, Tag::User(_) | Tag::GroupObj | Tag::Group(_)));
        let union = class.fold(0, |m, e| m | e.perm);
        let named = entries.iter().any(|e| matches!(e.tag, Tag::User(_) | Tag::Group(_)));
        match entries.iter_mut().find(|x| x.tag == Tag::Mask) {
            Some(m) => m.perm = union,
            None if named => entries.push(Entry { tag: Tag::Mask, perm: union }),
            None => {}
        }
    }
    entries.sort_by_key(|e| e.tag);
    Acl::new(entries)
}
