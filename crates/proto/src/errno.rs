//! POSIX error numbers as they travel on the wire.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A POSIX errno value (Linux numbering), the result code of every failed operation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Errno(pub i32);

impl Errno {
    pub const EPERM: Errno = Errno(libc::EPERM);
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    pub const EIO: Errno = Errno(libc::EIO);
    pub const EBADF: Errno = Errno(libc::EBADF);
    pub const EAGAIN: Errno = Errno(libc::EAGAIN);
    pub const EACCES: Errno = Errno(libc::EACCES);
    pub const EBUSY: Errno = Errno(libc::EBUSY);
    pub const EEXIST: Errno = Errno(libc::EEXIST);
    pub const EXDEV: Errno = Errno(libc::EXDEV);
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    /// A quota's limit is reached.
    pub const EDQUOT: Errno = Errno(libc::EDQUOT);
    pub const EFBIG: Errno = Errno(libc::EFBIG);
    pub const ENODATA: Errno = Errno(libc::ENODATA);
    pub const E2BIG: Errno = Errno(libc::E2BIG);
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    pub const EMLINK: Errno = Errno(libc::EMLINK);
    pub const ENAMETOOLONG: Errno = Errno(libc::ENAMETOOLONG);
    pub const ENOTEMPTY: Errno = Errno(libc::ENOTEMPTY);
    pub const ELOOP: Errno = Errno(libc::ELOOP);
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    pub const EPROTO: Errno = Errno(libc::EPROTO);
    pub const EMSGSIZE: Errno = Errno(libc::EMSGSIZE);
    pub const ETIMEDOUT: Errno = Errno(libc::ETIMEDOUT);
    pub const ECONNRESET: Errno = Errno(libc::ECONNRESET);
    pub const ECANCELED: Errno = Errno(libc::ECANCELED);
    /// The directory's distribution changed (redirect to its storing servers).
    pub const EREMCHG: Errno = Errno(libc::EREMCHG);
    /// A cached distribution is out of date (another incarnation of the directory).
    pub const ESTALE: Errno = Errno(libc::ESTALE);
    /// Success, as it appears in a batch reply's list of results.
    pub const OK: Errno = Errno(0);

    /// The raw value, as `errno` would hold it.
    pub fn raw(self) -> i32 {
        self.0
    }

    /// The symbolic name (`"ENOENT"`), or `"E<n>"` for values this table does not know.
    pub fn name(self) -> String {
        let known = [
            (Self::EPERM, "EPERM"),
            (Self::ENOENT, "ENOENT"),
            (Self::EIO, "EIO"),
            (Self::EBADF, "EBADF"),
            (Self::EAGAIN, "EAGAIN"),
            (Self::EACCES, "EACCES"),
            (Self::EBUSY, "EBUSY"),
            (Self::EEXIST, "EEXIST"),
            (Self::EXDEV, "EXDEV"),
            (Self::ENOTDIR, "ENOTDIR"),
            (Self::EISDIR, "EISDIR"),
            (Self::EINVAL, "EINVAL"),
            (Self::ENOSPC, "ENOSPC"),
            (Self::EDQUOT, "EDQUOT"),
            (Self::EFBIG, "EFBIG"),
            (Self::ENODATA, "ENODATA"),
            (Self::E2BIG, "E2BIG"),
            (Self::EOPNOTSUPP, "EOPNOTSUPP"),
            (Self::ERANGE, "ERANGE"),
            (Self::EMLINK, "EMLINK"),
            (Self::ENAMETOOLONG, "ENAMETOOLONG"),
            (Self::ENOTEMPTY, "ENOTEMPTY"),
            (Self::ELOOP, "ELOOP"),
            (Self::ENOSYS, "ENOSYS"),
            (Self::EPROTO, "EPROTO"),
            (Self::EMSGSIZE, "EMSGSIZE"),
            (Self::ETIMEDOUT, "ETIMEDOUT"),
            (Self::ECONNRESET, "ECONNRESET"),
            (Self::ECANCELED, "ECANCELED"),
            (Self::EREMCHG, "EREMCHG"),
            (Self::ESTALE, "ESTALE"),
            (Self::OK, "OK"),
        ];
        known.iter().find(|(e, _)| *e == self).map(|(_, n)| n.to_string()).unwrap_or_else(|| format!("E{}", self.0))
    }

    /// The C library's description (`"No such file or directory"`).
    pub fn description(self) -> String {
        let text = std::io::Error::from_raw_os_error(self.0).to_string();
        // std appends " (os error N)"; users expect the bare strerror text.
        match text.rfind(" (os error") {
            Some(i) => text[..i].to_string(),
            None => text,
        }
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.description())
    }
}

impl From<Errno> for std::io::Error {
    fn from(e: Errno) -> Self {
        std::io::Error::from_raw_os_error(e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_descriptions() {
        assert_eq!(Errno::ENOENT.name(), "ENOENT");
        assert_eq!(Errno::ENOENT.description(), "No such file or directory");
        assert_eq!(Errno(9999).name(), "E9999");
    }
}
