//! Extended attributes.

use super::{Caller, Errno, MountCore, XattrReply};
use std::ffi::OsStr;

/// A name as UTF-8 (EINVAL otherwise).
fn utf8(name: &OsStr) -> Result<&str, Errno> {
    name.to_str().ok_or(Errno::EINVAL)
}

impl MountCore {
    /// `getxattr` for a buffer of `size` bytes. plusfs stores no `security.` names and no
    /// `system.` names but the POSIX ACLs (setting others is EOPNOTSUPP), so the label
    /// probes `ls -l` makes per entry are answered ENODATA here, and so are ACLs on a
    /// mount whose kernel does not check them.
    pub async fn getxattr(&self, caller: &Caller, ino: u64, name: &OsStr, size: u32) -> Result<XattrReply, Errno> {
        let p = self.path(ino)?;
        let name = utf8(name)?;
        let acl = plusfs_proto::acl::is_acl_name(name) && self.acls.load(std::sync::atomic::Ordering::Relaxed);
        if !acl && (name.starts_with("system.") || name.starts_with("security.")) {
            return Err(Errno::ENODATA);
        }
        XattrReply::fit(self.run(self.as_caller(caller).getxattr(&p, name)).await?, size)
    }

    /// `listxattr` for a buffer of `size` bytes: the names, each ended by a NUL.
    pub async fn listxattr(&self, caller: &Caller, ino: u64, size: u32) -> Result<XattrReply, Errno> {
        let p = self.path(ino)?;
        let mut buf = Vec::new();
        for n in self.run(self.as_caller(caller).listxattr(&p)).await? {
            buf.extend_from_slice(n.as_bytes());
            buf.push(0);
        }
        XattrReply::fit(buf, size)
    }

    /// `setxattr`; `flags` may hold `XATTR_CREATE` or `XATTR_REPLACE`.
    pub async fn setxattr(
        &self,
        caller: &Caller,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> Result<(), Errno> {
        let p = self.path(ino)?;
        let name = utf8(name)?;
        let (create, replace) = (flags & libc::XATTR_CREATE != 0, flags & libc::XATTR_REPLACE != 0);
        self.run(self.as_caller(caller).setxattr(&p, name, value, create, replace)).await?;
        self.acl_changed(ino, name);
        Ok(())
    }

    /// An ACL set or removed may have changed the mode and the ctime: the attributes this
    /// mount kept for `ino` are stale (the kernel drops its own copy).
    fn acl_changed(&self, ino: u64, name: &str) {
        if plusfs_proto::acl::is_acl_name(name) {
            self.attrs.stale(ino);
        }
    }

    /// `removexattr`.
    pub async fn removexattr(&self, caller: &Caller, ino: u64, name: &OsStr) -> Result<(), Errno> {
        let p = self.path(ino)?;
        let name = utf8(name)?;
        self.run(self.as_caller(caller).removexattr(&p, name)).await?;
        self.acl_changed(ino, name);
        Ok(())
    }
}
