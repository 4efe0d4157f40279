//! Invalidations the mount sends the kernel through `/dev/fuse` (whichever transport
//! serves requests): names are *expired* (`FUSE_EXPIRE_ONLY`), attributes dropped.
//!
//! fuser's notifier has no flags: it unhashes the name (`d_invalidate`), which drops the
//! dentries below it and makes the kernel forget their inodes. Expiring keeps the dentry
//! and makes the kernel ask the mount again at its next use. Either way the kernel takes
//! the directory's lock, so a notification waits while a request of that directory is
//! being served.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// `FUSE_NOTIFY_INVAL_INODE` and `FUSE_NOTIFY_INVAL_ENTRY` (`<linux/fuse.h>`).
const NOTIFY_INVAL_INODE: i32 = 2;
const NOTIFY_INVAL_ENTRY: i32 = 3;
/// `fuse_notify_inval_entry_out.flags`: mark the entry expired, do not unhash it.
const FUSE_EXPIRE_ONLY: u32 = 1;
/// `fuse_out_header`: length, error (the notification's code), unique (0).
const OUT_HEADER: usize = 16;

/// Writes invalidations to a duplicate of the session's `/dev/fuse` descriptor.
pub(crate) struct Notifier(OwnedFd);

impl Notifier {
    /// A notifier writing to a duplicate of `dev` (the session's descriptor).
    pub fn new(dev: impl AsFd) -> std::io::Result<Notifier> {
        Ok(Notifier(dev.as_fd().try_clone_to_owned()?))
    }

    /// Sends notification `code` with body `body`; a missing inode or name (`ENOENT`) is
    /// not an error: the kernel had nothing to drop.
    fn send(&self, code: i32, body: &[u8]) -> std::io::Result<()> {
        let len = OUT_HEADER + body.len();
        let mut msg = Vec::with_capacity(len);
        msg.extend_from_slice(&(len as u32).to_le_bytes());
        msg.extend_from_slice(&code.to_le_bytes());
        msg.extend_from_slice(&0u64.to_le_bytes());
        msg.extend_from_slice(body);
        // SAFETY: writes `msg` (owned, `len` bytes) to a descriptor this notifier owns.
        let n = unsafe { libc::write(self.0.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
        match n {
            n if n >= 0 => Ok(()),
            _ => match std::io::Error::last_os_error() {
                e if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
                e => Err(e),
            },
        }
    }
}

/// The body of an entry invalidation of `name` in `parent` (expired only).
fn inval_entry_body(parent: u64, name: &str) -> Vec<u8> {
    let mut body = Vec::with_capacity(16 + name.len() + 1);
    body.extend_from_slice(&parent.to_le_bytes());
    body.extend_from_slice(&(name.len() as u32).to_le_bytes());
    body.extend_from_slice(&FUSE_EXPIRE_ONLY.to_le_bytes());
    body.extend_from_slice(name.as_bytes());
    body.push(0);
    body
}

/// The body of an attribute invalidation of `ino` (a negative offset: the cached pages
/// stay).
fn inval_attributes_body(ino: u64) -> Vec<u8> {
    let mut body = Vec::with_capacity(24);
    body.extend_from_slice(&ino.to_le_bytes());
    body.extend_from_slice(&(-1i64).to_le_bytes());
    body.extend_from_slice(&0i64.to_le_bytes());
    body
}

impl crate::core::Invalidate for Notifier {
    fn entry(&self, parent: u64, name: &str) {
        if let Err(e) = self.send(NOTIFY_INVAL_ENTRY, &inval_entry_body(parent, name)) {
            tracing::debug!(parent, name, error = %e, "cannot expire a kernel entry");
        }
    }

    fn attributes(&self, ino: u64) {
        if let Err(e) = self.send(NOTIFY_INVAL_INODE, &inval_attributes_body(ino)) {
            tracing::debug!(ino, error = %e, "cannot invalidate kernel attributes");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_follow_the_kernel_layout() {
        let b = inval_entry_body(7, "ab");
        assert_eq!(b.len(), 8 + 4 + 4 + 3);
        assert_eq!(&b[..8], &7u64.to_le_bytes());
        assert_eq!(&b[8..12], &2u32.to_le_bytes());
        assert_eq!(&b[12..16], &FUSE_EXPIRE_ONLY.to_le_bytes());
        assert_eq!(&b[16..], b"ab\0");
        let a = inval_attributes_body(9);
        assert_eq!(a.len(), 24);
        assert_eq!(&a[8..16], &(-1i64).to_le_bytes());
    }
}
