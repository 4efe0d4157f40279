//! POSIX ACLs through the library: read and set a file's or directory's access ACL and a
//! directory's default ACL. They travel as the `system.posix_acl_*` extended attributes,
//! which the servers validate, keep in step with the mode and check.

use crate::error::FsError;
use crate::fs::Client;
use plusfs_proto::acl::{Acl, ACCESS_XATTR, DEFAULT_XATTR};
use plusfs_proto::Errno;

/// Which of an object's two ACLs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AclKind {
    /// What decides access to the object itself (`system.posix_acl_access`).
    Access,
    /// What new entries of a directory inherit (`system.posix_acl_default`).
    Default,
}

impl AclKind {
    fn xattr(self) -> &'static str {
        match self {
            AclKind::Access => ACCESS_XATTR,
            AclKind::Default => DEFAULT_XATTR,
        }
    }
}

impl Client {
    /// The ACL of `kind` of `path` (not following a last symlink): `None` when it has
    /// none (for the access ACL: its mode bits say it all, see `Acl::from_mode`).
    pub async fn get_acl(&self, path: &str, kind: AclKind) -> Result<Option<Acl>, FsError> {
        match self.getxattr(path, kind.xattr()).await {
            Ok(v) => Acl::from_xattr(&v)
                .map_err(|e| FsError::new("get the ACL of", path, Errno::EIO).with_detail(e.to_string())),
            Err(e) if e.errno == Errno::ENODATA => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The ACL of `kind` of `path` as `getfacl` shows it: without an access ACL, its mode
    /// bits as one; `None` only for a directory without a default ACL.
    pub async fn shown_acl(&self, path: &str, kind: AclKind) -> Result<Option<Acl>, FsError> {
        match self.get_acl(path, kind).await? {
            None if kind == AclKind::Access => Ok(Some(Acl::from_mode(self.lstat(path).await?.mode))),
            acl => Ok(acl),
        }
    }

    /// Sets the ACL of `kind` of `path` (`None` removes it). Setting an access ACL sets
    /// the mode's permission bits; only the owner or root may (`EPERM`); only a directory
    /// has a default ACL (`EACCES`).
    pub async fn set_acl(&self, path: &str, kind: AclKind, acl: Option<&Acl>) -> Result<(), FsError> {
        match acl {
            Some(a) => self.setxattr(path, kind.xattr(), &a.to_xattr(), false, false).await,
            None => self.removexattr(path, kind.xattr()).await,
        }
    }
}
