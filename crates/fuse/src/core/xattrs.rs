//! Extended attributes.

use super::{Caller, Errno, MountCore, XattrReply};
use std::ffi::OsStr;

/// A name as UTF-8 (EINVAL otherwise).
fn utf8(name: &OsStr) -> Result<&str, Errno> {
    name.to_str().ok_or(Errno::EINVAL)
}

impl MountCore {
    /// `getxattr` for a buffer of `size` bytes. plusfs never stores the `system.` and
    /// `security.` namespaces (setting them is EOPNOTSUPP), so the ACL and label probes
    /// `ls -l` makes per entry are answered ENODATA here.
    pub async fn getxattr(&self, caller: &Caller, ino: u64, name: &OsStr, size: u32) -> Result<XattrReply, Errno> {
        let p = self.path(ino)?;
        let name = utf8(name)?;
        if name.starts_with("system.") || name.starts_with("security.") {
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
        self.run(self.as_caller(caller).setxattr(&p, name, value, create, replace)).await
    }

    /// `removexattr`.
    pub async fn removexattr(&self, caller: &Caller, ino: u64, name: &OsStr) -> Result<(), Errno> {
        let p = self.path(ino)?;
        self.run(self.as_caller(caller).removexattr(&p, utf8(name)?)).await
    }
}
