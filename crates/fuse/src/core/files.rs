//! Operations on files: attributes, open and create, reads, gathered writes, close.

use super::{Caller, Errno, MountCore};
use plusfs_proto::{Attr, FileKind, SetAttr};
use std::ffi::OsStr;

impl MountCore {
    /// `getattr`, after sending the file's gathered writes.
    pub fn getattr(&self, ino: u64) -> Result<Attr, Errno> {
        self.flush_ino(ino)?;
        let p = self.path(ino)?;
        Ok(self.shown(self.run(self.client().lstat(&p))?))
    }

    /// `setattr` (`chmod`, `chown`, `utimens`, `truncate`), after sending the file's
    /// gathered writes.
    pub fn setattr(&self, ino: u64, set: SetAttr) -> Result<Attr, Errno> {
        self.flush_ino(ino)?;
        let path = self.path(ino)?;
        self.run(self.client().setattr(&path, set))
    }

    /// `readlink`.
    pub fn readlink(&self, ino: u64) -> Result<String, Errno> {
        let p = self.path(ino)?;
        self.run(self.client().readlink(&p))
    }

    /// `access`: permission bits are checked by the kernel (`default_permissions`), so
    /// this checks that the entry exists.
    pub fn access(&self, ino: u64) -> Result<(), Errno> {
        let p = self.path(ino)?;
        self.run(self.client().lstat(&p)).map(drop)
    }

    /// `open` with the `open(2)` `flags`: `O_TRUNC` empties a regular file on behalf of
    /// `caller`. No cached pages survive an open (close-to-open consistency).
    pub fn open(&self, caller: Caller, ino: u64, flags: i32) -> Result<(), Errno> {
        let p = self.path(ino)?;
        let a = self.run(self.client().lstat(&p))?;
        if flags & libc::O_TRUNC != 0 && a.kind == FileKind::File && a.size > 0 {
            self.run(self.as_caller(caller).truncate(&p, 0))?;
        }
        self.open_files().opened(ino);
        Ok(())
    }

    /// `create`: creates (or with `O_EXCL` in `flags`, only creates) and opens `name` in
    /// `parent` for `caller`, emptying an existing file for `O_TRUNC`.
    pub fn create(
        &self,
        caller: Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<Attr, Errno> {
        let p = self.child(parent, name)?;
        let c = self.as_caller(caller);
        let fh = self.run(c.create(&p, mode & !umask & 0o7777, flags & libc::O_EXCL != 0))?;
        let mut attr = fh.attr;
        if flags & libc::O_TRUNC != 0 && attr.size > 0 {
            attr = self.run(c.truncate(&p, 0))?;
        }
        self.remember(&p, &attr);
        self.open_files().opened(attr.ino);
        Ok(attr)
    }

    /// `read`: up to `size` bytes at `offset`, after sending the file's gathered writes.
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        self.flush_ino(ino)?;
        let p = self.path(ino)?;
        self.run(self.client().read(&p, offset, size as usize))
    }

    /// `write` of `data` at `offset`; `flags` are the file's open flags (`O_APPEND`
    /// writes at the end, at once). Other writes are gathered. Returns the bytes taken.
    pub fn write(&self, ino: u64, offset: u64, data: &[u8], flags: i32) -> Result<u32, Errno> {
        let p = self.path(ino)?;
        if flags & libc::O_APPEND != 0 {
            self.flush_ino(ino)?;
            self.run(self.client().append(&p, data))?;
        } else if let Some(earlier) = self.writes.gather(ino, &p, offset, data) {
            self.run(self.client().write(&earlier.path, earlier.offset, &earlier.data))?;
        }
        Ok(data.len() as u32)
    }

    /// `flush` (each `close`): gathered writes are stored before it returns.
    pub fn flush(&self, ino: u64) -> Result<(), Errno> {
        self.flush_ino(ino)
    }

    /// `fsync`: gathered writes are sent, and the file is durable when it returns.
    pub fn fsync(&self, ino: u64) -> Result<(), Errno> {
        self.flush_ino(ino)?;
        let p = self.path(ino)?;
        self.run(self.client().fsync(&p))
    }

    /// `release` (the last close of one open): sends gathered writes and, after the last
    /// release of a file unlinked while open, removes its kept name. The error is the
    /// gathered writes'; a kept name that cannot be removed is only logged.
    pub fn release(&self, ino: u64) -> Result<(), Errno> {
        let flushed = self.flush_ino(ino);
        let orphan = self.open_files().released(ino);
        if let Some(hidden) = orphan {
            match self.bridge.block_on(self.client().unlink(&hidden)) {
                Ok(()) => self.inodes().unlinked(&hidden),
                Err(e) => tracing::warn!(path = hidden, error = %e, "cannot remove a closed orphan"),
            }
        }
        flushed
    }
}
